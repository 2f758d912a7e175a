"""A run's tables (:mod:`hooktrace.data.schema`) as Arrow record batches.

:func:`batches` yields one table of one run in record batches of at most
``batch_rows`` rows, each built from slices of the run's numpy arrays: the Arrow side
holds one batch at a time, whatever the size of the run, so a writer that writes each
batch as it comes (:mod:`hooktrace.data.parquet`) stays in bounded memory. (The span
arrays themselves, ~60 bytes per span, are built whole: pairing calls needs the run;
``hooktrace.load(path, mmap=True)`` maps the events instead of reading them.)

:func:`to_arrow` gathers the batches into one ``pyarrow.Table``.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 1000, 3000, 5000]
    >>> run = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                 {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0})
    >>> t = to_arrow(run, "spans")
    >>> t.column("module").to_pylist(), t.column("dur_ns").to_pylist()
    (['', 'fc'], [5000, 2000])
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hooktrace.analysis.calls import MODES, PHASES, TIMINGS
from hooktrace.analysis.columns import PROVIDERS
from hooktrace.data.schema import PARTITION_COLUMNS, file_schema, pa
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD
from hooktrace.reading import TraceData
from hooktrace.analysis.intervals import union_per_step
from hooktrace.text import display_path

__all__ = ["DEFAULT_BATCH_ROWS", "Where", "batches", "to_arrow"]

DEFAULT_BATCH_ROWS = 1 << 20
_OWNERS = {1: "enter", 2: "exit", 3: "node_begin", 4: "node_end"}


@dataclass(frozen=True)
class Where:
    """Where a run's rows go: its ``rank`` and ``window`` (None: not a rank / not a
    window), its file ``path`` (the ``runs`` row), and whether the output is a
    partitioned dataset (then ``rank``/``window`` are left out of the rows)."""

    rank: int | None = None
    window: int | None = None
    path: str = ""
    partitioned: bool = False

    @classmethod
    def of(cls, trace: TraceData, path: str = "") -> Where:
        """One run on its own: the rank its metadata holds (null without), no window."""
        rank = trace.info.get("rank")
        return cls(rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                   path=path)


def _dict(indices: np.ndarray, names: list[str], valid: np.ndarray | None = None) -> Any:
    """Strings as a dictionary array; the dictionary made unique (pandas' categoricals
    require it: many modules share a class name)."""
    uniq, inv = np.unique(np.asarray(names, dtype=object).astype(str), return_inverse=True)
    if len(uniq) < len(names):
        indices = inv.ravel()[np.asarray(indices, np.int64)] if len(names) else indices
        names = uniq.tolist()
    idx = pa.array(np.asarray(indices, np.int32), mask=None if valid is None else ~valid)
    return pa.DictionaryArray.from_arrays(idx, pa.array(names, pa.string()))


def _i64(a: np.ndarray, valid: np.ndarray | None = None) -> Any:
    return pa.array(np.asarray(a, np.int64), mask=None if valid is None else ~valid)


def _batch(table: str, where: Where, columns: dict[str, Any], n: int) -> Any:
    schema = file_schema(table, partitioned=where.partitioned)
    arrays = []
    for fld in schema:
        if fld.name == "rank" or fld.name == "window":
            v = where.rank if fld.name == "rank" else where.window
            arrays.append(pa.nulls(n, pa.int64()) if v is None
                          else pa.array(np.full(n, v, np.int64)))
        else:
            arrays.append(columns[fld.name])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _names(trace: TraceData, n_mod: int) -> tuple[list[str], list[str]]:
    names = [n for n, _ in trace.modules] + [f"<module {m}>"
                                             for m in range(len(trace.modules), n_mod)]
    types = [t for _, t in trace.modules] + ["?"] * (n_mod - len(trace.modules))
    return names, types


def _offset(trace: TraceData) -> int:
    off = trace.info.get("clock_offset_ns", 0)
    return off if isinstance(off, int) and not isinstance(off, bool) else 0


# -- spans -------------------------------------------------------------------------


class _SpanColumns:
    """The whole run's per-row arrays of the spans table (the measured spans, then the
    kernel-derived entries, then one row per torch.compile compile), extras only where
    recorded. Times count as in the summary: a kernel-derived row's ``dur_ns`` is the
    summed time of its kernels, and compile time is its own rows' (out of the self time
    of the span it ran in)."""

    def __init__(self, trace: TraceData) -> None:
        from hooktrace.analysis.calls import Calls

        c = Calls.from_trace(trace)  # (the one per-call table, issue #37)
        self.c, self.n = c, len(c)
        off = _offset(trace)
        self.start, self.end = c.start - off, c.end - off
        n = len(trace.spans())
        self.extras = self._extras(trace, n, len(c) - n)

    def _extras(self, trace: TraceData, n: int, m: int) -> dict[str, Any]:
        """Per recorded quantity's column (hooktrace.analysis.columns): (values over the
        rows, validity mask[, dictionary]); missing = all null."""
        out: dict[str, Any] = {}
        for provider in PROVIDERS:
            if not provider.recorded(trace):
                continue
            got = provider.spans(trace, n, m)
            unknown = set(got) - set(provider.span_columns)
            if unknown:  # (a provider's bug: the table's columns are its declared ones)
                raise ValueError(f"{provider.name}: spans columns {sorted(unknown)} not declared "
                                 "in its columns")
            out.update(got)
        assert all(len(v[0]) == n + m for v in out.values())
        return out

    def batch(self, a: int, b: int, where: Where) -> Any:
        s = slice(a, b)
        c = self.c
        cols: dict[str, Any] = {
            "module": _dict(c.module[s], c.names),
            "slot": _i64(c.slot[s]),
            "type": _dict(c.module[s], c.types),
            "phase": _dict(c.cat[s], list(PHASES)),
            "mode": _dict(c.eval[s].astype(np.int32), list(MODES)),
            "timing": _dict(c.timing[s], list(TIMINGS)),
            "call": _i64(c.call[s]),
            "step": _i64(c.step[s], c.step_valid[s]),
            "thread": _i64(c.thread[s]),
            "start_ns": _i64(self.start[s]),
            "end_ns": _i64(self.end[s]),
            "dur_ns": _i64(c.dur[s]),
            "self_ns": _i64(c.self_ns[s]),
            "depth": _i64(c.depth[s]),
            "span": _i64(c.span[s], c.span[s] >= 0),
            "parent": _i64(c.parent[s], c.parent[s] >= 0),
            "error": pa.array(c.error[s]),
            "unfinished": pa.array(c.unfinished[s]),
        }
        schema = file_schema("spans", partitioned=where.partitioned)
        # the recorded quantities' columns: the schema's after these (null where not recorded)
        for fld in schema:
            name, t = fld.name, fld.type
            if name in cols or name in PARTITION_COLUMNS:
                continue
            extra: Any = self.extras.get(name)
            if extra is None:
                cols[name] = pa.nulls(b - a, t)
            elif pa.types.is_dictionary(t):
                cols[name] = _dict(extra[0][s], extra[2], extra[1][s])
            else:
                cols[name] = pa.array(extra[0][s], t, mask=~extra[1][s])
        return _batch("spans", where, cols, b - a)


# -- the other tables ---------------------------------------------------------------


def _steps(trace: TraceData, where: Where) -> Any:
    spans = trace.spans()
    steps = trace.steps()
    row = trace.span_steps()
    sel = ((spans.cat == CAT_FORWARD) | (spans.cat == CAT_BACKWARD)) & (row >= 0)
    top = np.flatnonzero(sel & (spans.parent < 0))
    covered = union_per_step(spans.start_ns[top], spans.end_ns[top], steps.start_ns,
                               steps.end_ns)
    off = _offset(trace)
    return _batch("steps", where, {
        "step": _i64(steps.number), "start_ns": _i64(steps.start_ns - off),
        "end_ns": _i64(steps.end_ns - off), "dur_ns": _i64(steps.duration_ns),
        "complete": pa.array(steps.complete), "outside_ns": _i64(steps.duration_ns - covered),
    }, len(steps))


def _modules(trace: TraceData, where: Where) -> Any:
    n = len(trace.modules)
    names, types = _names(trace, n)
    idx = np.arange(n)
    return _batch("modules", where, {
        "slot": _i64(idx), "module": _dict(idx, names), "type": _dict(idx, types),
        "depth": _i64(np.array([nm.count(".") + 1 if nm else 0 for nm in names], np.int64)),
    }, n)


def _memory(trace: TraceData, where: Where) -> Iterator[Any]:
    from hooktrace.analysis.memory import memory_devices, samples

    off = _offset(trace)
    owners = [_OWNERS.get(k, str(k)) for k in range(max(_OWNERS) + 1)]
    for device in memory_devices(trace):
        s = samples(trace, device)
        yield _batch("memory", where, {
            "device": _dict(np.zeros(len(s), np.int64), [device]), "t_ns": _i64(s.t_ns - off),
            "bytes": _i64(s.bytes), "peak_bytes": _i64(s.peak), "thread": _i64(s.tid),
            "owner": _dict(s.owner.astype(np.int64), owners)}, len(s))


def _numerics(trace: TraceData, where: Where) -> Iterator[Any]:
    from hooktrace.analysis.numerics import Numerics, numerics_info

    if numerics_info(trace.info) is None:
        return
    num = Numerics.from_trace(trace)
    n_mod = max(len(trace.modules), int(num.module.max(initial=-1)) + 1)
    names, types = _names(trace, n_mod)
    yield _batch("numerics", where, {
        "module": _dict(num.module, names), "type": _dict(num.module, types),
        "phase": _dict(num.backward.astype(np.int64), ["forward", "backward"]),
        "mode": _dict(num.eval.astype(np.int64), list(MODES)), "step": _i64(num.step),
        "call": _i64(num.call), "t_ns": _i64(num.t_ns - _offset(trace)),
        "thread": _i64(num.tid), "absmax": pa.array(num.absmax), "rms": pa.array(num.rms),
        "nonfinite": _i64(num.nonfinite), "skipped": pa.array(num.skipped),
        "failed": pa.array(num.failed), "recompute": pa.array(num.recompute),
        "span": _i64(num.span, num.span >= 0)}, len(num))


def _gpu(trace: TraceData, where: Where) -> Iterator[Any]:
    """One row per device interval (``device_time.gpu_spans``), grouped as the straggler
    tables' pool path groups them (:func:`hooktrace.analysis.device_time.module_gpu`)."""
    from hooktrace.analysis.device_time import gpu_spans, module_gpu

    gpu = gpu_spans(trace)
    if not len(gpu):
        return
    m = module_gpu(trace, len(trace.modules))
    names, types = _names(trace, m.n_mod)
    module = gpu.module.astype(np.int64)
    steps = trace.steps()
    valid = m.step >= 0
    step = steps.number[np.maximum(m.step, 0)] if len(steps) else np.zeros(len(gpu), np.int64)
    off = _offset(trace)
    has = gpu.span >= 0
    yield _batch("gpu", where, {
        "slot": _i64(module), "module": _dict(module, names), "type": _dict(module, types),
        "phase": _dict(gpu.cat.astype(np.int64), list(PHASES)),
        "mode": _dict((m.group >= m.n_mod).astype(np.int32), list(MODES)),
        "timing": _dict((~has).astype(np.int32), list(TIMINGS)),
        "step": _i64(step, valid), "span": _i64(gpu.span.astype(np.int64), has),
        "device": _i64(gpu.device.astype(np.int64)), "stream": _i64(gpu.stream.astype(np.int64)),
        "start_ns": _i64(gpu.start_ns - off), "end_ns": _i64(gpu.end_ns - off),
        "dur_ns": _i64(gpu.duration_ns), "self_ns": _i64(gpu.self_ns.astype(np.int64))},
        len(gpu))


def _runs(trace: TraceData, where: Where) -> Any:
    info = trace.info

    def integer(key: str) -> int | None:
        v = info.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def text(key: str) -> str | None:
        v = info.get(key)
        return v if isinstance(v, str) else None

    spans = trace.spans()
    off = _offset(trace)
    start = integer("start_unix_ns")
    stop = integer("stop_unix_ns")
    if start is None:
        start = int(spans.start_ns.min()) if len(spans) else int(trace.clock.unix_ns0)
    if stop is None:
        stop = int(spans.end_ns.max()) if len(spans) else start
    window = info.get("window") if isinstance(info.get("window"), dict) else {}
    assert isinstance(window, dict)

    def one(v: Any, t: Any) -> Any:
        return pa.array([v], t)

    return _batch("runs", where, {
        "path": one(display_path(where.path), pa.string()), "hostname": one(trace.hostname, pa.string()),
        "pid": one(trace.pid, pa.int64()), "world_size": one(integer("world_size"), pa.int64()),
        "backend": one(text("backend"), pa.string()),
        "clock_offset_ns": one(off, pa.int64()),
        "clock_offset_uncertainty_ns": one(integer("clock_offset_uncertainty_ns") or 0,
                                           pa.int64()),
        "clock_aligned": one("clock_offset_ns" in info, pa.bool_()),
        "start_ns": one(start - off, pa.int64()), "stop_ns": one(stop - off, pa.int64()),
        "events": one(len(trace.events), pa.int64()),
        "dropped_events": one(trace.dropped_events, pa.int64()),
        "overwritten_events": one(trace.overwritten_events, pa.int64()),
        "cut": one(text("cut"), pa.string()),
        "first_step": one(window.get("first_step") if isinstance(window.get("first_step"), int)
                          else None, pa.int64()),
        "last_step": one(window.get("last_step") if isinstance(window.get("last_step"), int)
                         else None, pa.int64()),
        "hooktrace_version": one(text("version") or text("hooktrace_version"), pa.string()),
        "info": one(json.dumps(info, default=str, sort_keys=True), pa.string()),
    }, 1)


def batches(trace: TraceData, table: str, where: Where = Where(), *,
            batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[Any]:
    """``table`` of ``trace`` as Arrow record batches of at most ``batch_rows`` rows (the
    spans table; the others are small and come whole, one batch per memory device)."""
    file_schema(table, partitioned=where.partitioned)  # (an unknown table: said here)
    if table == "spans":
        cols = _SpanColumns(trace)
        step = max(int(batch_rows), 1)
        for a in range(0, cols.n, step):
            yield cols.batch(a, min(a + step, cols.n), where)
    elif table == "steps":
        yield _steps(trace, where)
    elif table == "modules":
        yield _modules(trace, where)
    elif table == "memory":
        yield from _memory(trace, where)
    elif table == "numerics":
        yield from _numerics(trace, where)
    elif table == "gpu":
        yield from _gpu(trace, where)
    else:
        yield _runs(trace, where)


def to_arrow(trace: TraceData, table: str = "spans", where: Where = Where()) -> Any:
    """``table`` of ``trace`` as one ``pyarrow.Table`` (schema: :func:`file_schema`)."""
    return pa.Table.from_batches(list(batches(trace, table, where)),
                                 schema=file_schema(table, partitioned=where.partitioned))
