"""Merge a hooktrace run into a torch.profiler (kineto) Chrome trace, and attribute its ops.

The output is the profiler's trace, byte for byte, plus hooktrace's module
spans on the profiler's timeline, so one Perfetto view shows which module each
``aten::`` op, autograd node and kernel belongs to.

**Time base (measured with torch 2.13's kineto on CPU).** The profiler writes
``"baseTimeNanoseconds"`` (a whole second, weeks before the run: 1790857026 s
in two different processes on one day) and every ``ts`` as microseconds since
it with three decimals, i.e. exact nanoseconds, as decimal text
(``"ts": 4389865968648.250``). Both recorders read ``c10::getApproximateTime``
converted to Unix ns by ``ApproximateClockToUnixTimeConverter``, so a span's
Unix ns minus ``baseTimeNanoseconds`` is directly a profiler ``ts``: every
``aten::linear`` of a ``Linear.forward`` lies inside that call's span, to the
nanosecond. All arithmetic here is on integers; ``ts`` is never parsed as a
float (a float64 of ~4.4e12 µs is only good to ~1 ns). A trace without
``baseTimeNanoseconds`` (old kineto) is read with base 0, absolute µs.

**Threads.** Host slices use the OS pid and the OS thread id (``gettid``, the
``threading.get_native_id()``) as ``pid``/``tid``, the same ids hooktrace
records, so hooktrace spans go to the profiler's own thread row. The
``"Fwd thread id"`` arg of autograd nodes is *not* an OS tid but
``RecordFunction::currentThreadId()`` (1, 2, ...), which hooktrace records as
``rf_tid`` next to the OS tid. The profiler records only the threads where it
is enabled (the thread that started it and autograd's workers), not other
Python threads.

**Rows.** Perfetto needs the slices of a row to nest strictly. A forward span
shares its thread's row when it nests with every profiler slice on it (the
usual case: a module call contains its ops); one that would cross a profiler
slice goes to the adjacent track "hooktrace modules (thread T)" instead.
Backward spans (``cat`` 1: per-module spans of the backward pass, which can
overlap without nesting) always go to "hooktrace backward (thread T)" tracks,
laid out in as many lanes as nesting needs. Synthetic track ids are
``T + TRACK_STRIDE * k`` (Linux tids are below 2**22), with
``thread_sort_index`` T to keep them next to the thread (viewers that honour it).

**Window.** Spans are clipped to the profiler's window (its "PyTorch Profiler
(N)" span, else the extent of its events): with ``torch.profiler.schedule``
each exported trace gets the spans of its own active steps only. A trace that
does not overlap the run in time, or of another process, is refused.

**Memory.** The profiler trace is streamed (see ``hooktrace._kineto``): read in
4 MiB blocks, each event decoded on its own and its original bytes copied to
the output; only compact columns of the run's own host slices are kept (about
64 bytes per slice) plus the run's spans. A 1 GB trace is never held as text,
let alone as parsed JSON. The output is written to a temporary file next to
``out_path`` and renamed at the end, so a refused merge leaves nothing behind.

Example::

    import torch, hooktrace
    from hooktrace.merge import merge_traces
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with hooktrace.trace(model) as tr, torch.profiler.profile() as prof:
        model(torch.randn(4, 8))
    prof.export_chrome_trace("profiler.json")
    merge_traces(tr, "profiler.json", "merged.json.gz")   # open in ui.perfetto.dev
"""

from __future__ import annotations

import gzip
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import numpy as np

import torch
from hooktrace import _C
from hooktrace._kineto import ProfilerTraceError
from hooktrace.chrome import _dumps, module_json
from hooktrace._profiler_events import ProfilerEvents, collect
from hooktrace.reading import CAT_BACKWARD, CAT_NAMES, TraceData, load

if TYPE_CHECKING:
    from hooktrace.attribution import Attribution
    from hooktrace.recording import Trace

__all__ = [
    "MergeError",
    "MergeResult",
    "MergedTraceHandler",
    "Profile",
    "ProfilerTraceError",
    "TRACK_STRIDE",
    "assign_lanes",
    "attribute",
    "merge_traces",
    "merged_trace_handler",
    "profile",
]

# Synthetic track k of thread T has tid T + TRACK_STRIDE * k: Linux tids are
# < 2**22 (pid_max limit), and k up to 428 still fits the uint32 tids we write.
TRACK_STRIDE = 10_000_000
TRACK_FORWARD = 1  # forward spans that would cross a profiler slice
TRACK_BACKWARD = 2  # first backward lane; lane L is TRACK_BACKWARD + L
MAX_LANES = 400

MERGED_CAT_NAMES = tuple(f"hooktrace.{c}" for c in CAT_NAMES)

RunLike = TraceData | str | os.PathLike[str]


class MergeError(ValueError):
    """The profiler trace cannot be merged with this run (other run, other process, ...)."""


@dataclass
class MergeResult:
    """What :func:`merge_traces` wrote (counts of spans by where they went)."""

    out_path: str
    profiler_events: int
    shared: int  # forward spans on the profiler's thread rows
    adjacent: int  # forward spans moved to "hooktrace modules (thread T)"
    backward: int  # backward spans, on "hooktrace backward (thread T)" lanes
    clipped: int  # spans cut at the profiler window's edges
    outside_window: int  # spans left out: entirely outside the window
    lanes: int  # most backward lanes any thread needed


def _as_run(run_or_path: RunLike) -> TraceData:
    if isinstance(run_or_path, TraceData):
        if getattr(run_or_path, "events", None) is None:
            raise MergeError("the hooktrace.trace() block has not exited yet: its spans are "
                             "readable only after the with block")
        return run_or_path
    return load(run_or_path)


def _fmt_ns(unix_ns: int) -> str:
    import datetime

    t = datetime.datetime.fromtimestamp(unix_ns // 10**9, datetime.timezone.utc)
    return f"{t:%Y-%m-%d %H:%M:%S}.{unix_ns % 10**9 // 1000:06d} UTC"


def run_interval(run: TraceData) -> tuple[int, int]:
    """The run's time span in Unix ns: its spans' extent, else its recording interval."""
    spans = run.spans()
    if len(spans):
        return int(spans.start_ns.min()), int(spans.end_ns.max())
    info = run.info
    start = int(info.get("start_unix_ns", run.clock.unix_ns0))
    return start, int(info.get("stop_unix_ns", start))


def check_compatible(run: TraceData, p: ProfilerEvents, run_name: str) -> tuple[int, int]:
    """Refuse a profiler trace of another process or time; return its window (Unix ns)."""
    window = p.window_abs()
    if window is None:
        raise MergeError(f"{p.path}: the profiler trace has no timed events (no 'X' slices); "
                         "nothing to merge with")
    if p.pids and run.pid not in p.pids:
        raise MergeError(f"{p.path}: the profiler trace is of process {sorted(p.pids)} but "
                         f"{run_name} is of pid {run.pid} on {run.hostname!r}: merge the trace "
                         "recorded by the same process")
    r0, r1 = run_interval(run)
    if r1 < window[0] or r0 > window[1]:
        raise MergeError(
            f"{p.path}: the profiler trace ({_fmt_ns(window[0])} to {_fmt_ns(window[1])}) does not "
            f"overlap {run_name} ({_fmt_ns(r0)} to {_fmt_ns(r1)}): it was recorded by another "
            "run; merge the trace recorded alongside this run"
        )
    return window


# -- nesting and lanes -----------------------------------------------------


def _range_max(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(v[lo[i]:hi[i]]) per i; int64 min where the range is empty."""
    low = np.iinfo(np.int64).min
    out = np.full(len(lo), low, dtype=np.int64)
    ok = lo < hi
    if ok.any():
        idx = np.empty(2 * int(ok.sum()), dtype=np.int64)
        idx[0::2], idx[1::2] = lo[ok], hi[ok]
        # reduceat over [idx[2k], idx[2k+1]); the sentinel makes hi == len(v) valid.
        out[ok] = np.maximum.reduceat(np.append(v, low), idx)[0::2]
    return out


def crossing(s: np.ndarray, e: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each interval [s, e]: does it cross (partially overlap) any of [a, b]?

    Touching ends and containment either way are fine (strict nesting allows them).

    Example:
        >>> import numpy as np
        >>> crossing(np.array([0, 10, 20]), np.array([10, 20, 30]),
        ...          np.array([2, 15, 20]), np.array([5, 25, 30])).tolist()
        [False, True, True]
    """
    out = np.zeros(len(s), dtype=bool)
    if not len(s) or not len(a):
        return out
    # A slice starting strictly inside [s, e] and ending after e.
    o = np.argsort(a, kind="stable")
    a1, b1 = a[o], b[o]
    out |= _range_max(b1, np.searchsorted(a1, s, "right"), np.searchsorted(a1, e, "left")) > e
    # A slice ending strictly inside [s, e] and starting before s.
    o = np.argsort(b, kind="stable")
    a2, b2 = a[o], b[o]
    lo, hi = np.searchsorted(b2, s, "right"), np.searchsorted(b2, e, "left")
    out |= (lo < hi) & (-_range_max(-a2, lo, hi) < s)  # (empty ranges: -min overflows)
    return out


def assign_lanes(start: np.ndarray, end: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Lane per interval so that, within each group, every lane nests strictly.

    Greedy first fit in start order (longest first on ties): ``_C.assign_lanes``
    (csrc/lanes.h), the layout the Chrome export uses too.

    Example:
        >>> import numpy as np
        >>> assign_lanes(np.array([0, 5, 1, 8]), np.array([10, 15, 2, 9]),
        ...              np.zeros(4, np.int64)).tolist()
        [0, 1, 0, 0]
    """
    return np.asarray(
        _C.assign_lanes(
            np.ascontiguousarray(start, dtype=np.int64),
            np.ascontiguousarray(end, dtype=np.int64),
            np.ascontiguousarray(group, dtype=np.uint32),
        ),
        dtype=np.int64,
    )


# -- the merge -------------------------------------------------------------


@dataclass
class _Placement:
    index: np.ndarray  # spans written (indices into Spans)
    start: np.ndarray
    end: np.ndarray
    tid: np.ndarray  # row (uint32)
    tracks: dict[int, str] = field(default_factory=dict)  # synthetic tid -> name
    thread_rows: dict[int, str] = field(default_factory=dict)  # new real rows -> name
    result: dict[str, int] = field(default_factory=dict)


def _thread_name(run: TraceData, tid: int) -> str:
    names = run.info.get("thread_names")
    if isinstance(names, dict):
        for key in (tid, str(tid)):
            if key in names:
                return f"thread {tid} ({names[key]})"
    return f"thread {tid}"


def _backward_extents(run: TraceData, p: ProfilerEvents) -> tuple[np.ndarray, np.ndarray]:
    """Span start/end, backward spans widened to cover the profiler's own node ranges.

    hooktrace and the profiler time the same autograd-node RecordFunction from two
    callbacks that run one after the other, so their clock reads differ by the
    other callback's cost (~0.1 µs): a profiler node range can stick out of the
    module's backward span by that much. Each node hooktrace attributed is matched
    to the profiler's range of the same name, sequence number and forward thread
    that starts nearest to it, and its span and the span's ancestors are widened
    to contain that range.
    """
    spans = run.spans()
    start, end = spans.start_ns.copy(), spans.end_ns.copy()
    nodes = spans.nodes
    if not len(nodes) or not len(p):
        return start, end
    cols = p.columns()
    has_seq = cols["seq"] >= 0
    by_key: dict[tuple[str, int, int], list[int]] = {}
    for j in np.flatnonzero(has_seq).tolist():
        key = (p.names[int(cols["name"][j])], int(cols["seq"][j]), int(cols["fwd_tid"][j]))
        by_key.setdefault(key, []).append(j)
    node_names = run.node_names
    for i in np.flatnonzero(nodes.span >= 0).tolist():
        name_id = int(nodes.name[i])
        if name_id >= len(node_names):
            continue
        cands = by_key.get((node_names[name_id], int(nodes.seq[i]), int(nodes.fwd_tid[i])))
        if not cands:
            continue
        t = int(nodes.start_ns[i])
        j = min(cands, key=lambda k: abs(int(cols["start"][k]) - t))
        ps, pe = int(cols["start"][j]), int(cols["end"][j])
        b = int(nodes.span[i])
        while b >= 0:
            start[b] = min(int(start[b]), ps)
            end[b] = max(int(end[b]), pe)
            b = int(spans.parent[b])
    return start, end


def place_spans(run: TraceData, p: ProfilerEvents, window: tuple[int, int]) -> _Placement:
    """Decide the row of every span inside ``window`` (see the module docstring)."""
    spans = run.spans()
    w0, w1 = window
    span_start, span_end = _backward_extents(run, p)
    keep = np.flatnonzero((span_end >= w0) & (span_start <= w1))
    start = np.maximum(span_start[keep], w0)
    end = np.minimum(span_end[keep], w1)
    clipped = int(np.count_nonzero((start != span_start[keep]) | (end != span_end[keep])))
    tid = spans.tid[keep].astype(np.int64)
    row = tid.copy()
    backward = spans.cat[keep] == CAT_BACKWARD
    cols = p.columns()
    place = _Placement(keep, start, end, row)
    adjacent = 0
    for t in np.unique(tid).tolist():
        fwd = np.flatnonzero((tid == t) & ~backward)
        on_row = cols["tid"] == t
        cross = crossing(start[fwd], end[fwd], cols["start"][on_row], cols["end"][on_row])
        if cross.any():
            row[fwd[cross]] = t + TRACK_STRIDE * TRACK_FORWARD
            place.tracks[t + TRACK_STRIDE * TRACK_FORWARD] = f"hooktrace modules (thread {t})"
            adjacent += int(cross.sum())
        if (~cross).any() and t not in p.thread_names:
            place.thread_rows[t] = _thread_name(run, t)
    bwd = np.flatnonzero(backward)
    lanes_needed = 0
    if len(bwd):
        lanes = assign_lanes(start[bwd], end[bwd], tid[bwd])
        if int(lanes.max()) >= MAX_LANES:
            raise MergeError(f"backward spans need {int(lanes.max()) + 1} lanes on one thread; "
                             f"at most {MAX_LANES} are supported")
        row[bwd] = tid[bwd] + TRACK_STRIDE * (TRACK_BACKWARD + lanes)
        lanes_needed = int(lanes.max()) + 1
        for t, lane in set(zip(tid[bwd].tolist(), lanes.tolist())):
            suffix = f" #{lane + 1}" if lane else ""
            place.tracks[t + TRACK_STRIDE * (TRACK_BACKWARD + lane)] = (
                f"hooktrace backward (thread {t}){suffix}")
    place.tid = row.astype(np.uint32)
    place.result = {
        "shared": int(len(keep) - len(bwd) - adjacent),
        "adjacent": adjacent,
        "backward": int(len(bwd)),
        "clipped": clipped,
        "outside_window": int(len(spans) - len(keep)),
        "lanes": lanes_needed,
    }
    return place


def write_spans(
    write: Callable[[bytes], Any], run: TraceData, place: _Placement, base_ns: int,
    first: bool,
) -> None:
    """Write the placed spans (and their tracks' metadata) as ``,\\n{event}`` items."""
    spans = run.spans()
    pid = run.pid
    meta: list[dict[str, Any]] = []
    for t, name in sorted(place.thread_rows.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                     "args": {"name": name}})
    for t, name in sorted(place.tracks.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                     "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t,
                     "args": {"sort_index": t % TRACK_STRIDE}})
    text = "".join(",\n" + _dumps(m) for m in meta).encode("utf-8")
    if first and text:
        text, first = text[1:], False
    write(text)
    if not len(place.index):
        return
    names_json, args_json = module_json(run.modules)
    idx = place.index
    if first:  # the writer starts every event with ",\n"; drop the first one's comma
        def write_first(data: bytes, _state: list[bool] = [True]) -> None:
            if _state[0] and data:
                data, _state[0] = data[1:], False
            write(data)
        out: Callable[[bytes], Any] = write_first
    else:
        out = write
    _C.write_chrome_events(
        out,
        np.ascontiguousarray(place.start),
        np.ascontiguousarray(place.end),
        np.ascontiguousarray(spans.module[idx]),
        np.ascontiguousarray(place.tid),
        np.ascontiguousarray(spans.call[idx]),
        np.ascontiguousarray(spans.flags[idx]),
        np.ascontiguousarray(spans.cat[idx]),
        np.zeros(0, np.int64),  # no per-span node counts in merged traces
        names_json,
        args_json,
        list(MERGED_CAT_NAMES),
        base_ns,
        pid,
        1 << 20,
    )


def _open_out(path: Path, gz: bool, compresslevel: int) -> IO[bytes]:
    if gz:
        return gzip.open(path, "wb", compresslevel=compresslevel)  # type: ignore[return-value]
    return open(path, "wb")


def merge_traces(
    run_or_path: RunLike,
    profiler_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    compresslevel: int = 1,
) -> MergeResult:
    """Write ``out_path``: the profiler trace unchanged plus the run's module spans.

    ``run_or_path`` is a finished :class:`~hooktrace.Trace`, a ``TraceData`` or
    a ``.htrace`` path; ``profiler_path`` a ``torch.profiler`` Chrome trace
    (``.json`` or gzip); ``out_path`` is gzip-compressed when it ends in
    ``.gz``. Raises :class:`MergeError` when the trace is of another process or
    does not overlap the run, and :class:`~hooktrace._kineto.ProfilerTraceError`
    (naming file, line, column and byte) when it is not valid trace JSON.

    Example::

        merge_traces("run.htrace", "profiler.json.gz", "merged.json.gz")
    """
    run = _as_run(run_or_path)
    run_name = os.fspath(run_or_path) if isinstance(run_or_path, (str, os.PathLike)) else "the run"
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    known_base: int | None = None
    result: dict[str, int] = {}

    def array_end(out: IO[bytes]) -> Callable[[ProfilerEvents, bool], bytes]:
        def insert(p: ProfilerEvents, nonempty: bool) -> bytes:
            if not p.base_known and known_base is None:
                raise _BaseAfterEvents
            base = p.base_ns if p.base_known else int(known_base or 0)
            p.base_ns = base
            window = check_compatible(run, p, run_name)
            place = place_spans(run, p, window)
            result.update(place.result, profiler_events=p.n_events)
            write_spans(out.write, run, place, base, first=not nonempty)
            return b""
        return insert

    def object_end(p: ProfilerEvents) -> bytes:
        from hooktrace import __version__

        if "hooktrace" in p.top:
            raise MergeError(f"{p.path}: already merged with a hooktrace run (it has a "
                             "top-level 'hooktrace' key); merge the original profiler trace")

        block = {"version": __version__, "pid": run.pid, "hostname": run.hostname,
                 "track_tid_stride": TRACK_STRIDE, **result}
        return (',\n"hooktrace":' + _dumps(block) + "\n").encode("utf-8")

    for attempt in range(2):
        try:
            with _open_out(tmp, out_path.name.endswith(".gz"), compresslevel) as out:
                collect(profiler_path, pid=run.pid, out=out,
                        before_array_end=array_end(out), before_object_end=object_end)
            break
        except _BaseAfterEvents:
            tmp.unlink(missing_ok=True)
            # baseTimeNanoseconds follows traceEvents: learn it first (one more pass).
            known_base = collect(profiler_path, pid=run.pid).base_ns
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, out_path)
    return MergeResult(out_path=os.fspath(out_path), **result)  # type: ignore[arg-type]


class _BaseAfterEvents(Exception):
    pass


# -- attribution -----------------------------------------------------------


def attribute(
    run_or_path: RunLike, profiler_path: str | os.PathLike[str], *, top_ops: int = 3
) -> Attribution:
    """Attribute the profiler's ops (and kernels) to the run's modules.

    See :mod:`hooktrace.attribution`. Example::

        table = attribute("run.htrace", "profiler.json.gz")
        print(table.to_text())
    """
    from hooktrace.attribution import attribute_events

    run = _as_run(run_or_path)
    run_name = os.fspath(run_or_path) if isinstance(run_or_path, (str, os.PathLike)) else "the run"
    p = collect(profiler_path, pid=run.pid)
    check_compatible(run, p, run_name)
    return attribute_events(run, p, top_ops=top_ops)


# -- one-liners: profile() and an on_trace_ready handler ---------------------


class MergedTraceHandler:
    """``on_trace_ready`` handler that writes one merged trace per profiler window.

    hooktrace's spans are readable only once the ``hooktrace.trace`` block has
    exited, so while it is still recording each window's profiler trace is
    saved (``<name>.profiler.json``) and merged by :meth:`finish`; windows
    ending after the run is finished are merged at once. Each merged file gets
    only the spans inside its window (clipped at its edges).

    Example::

        handler = merged_trace_handler(tr, "traces")
        with hooktrace.trace(model) as tr, torch.profiler.profile(
                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
                on_trace_ready=handler) as prof:
            for batch in loader:
                step(batch); prof.step()
        handler.finish()   # -> ['traces/<host>_<pid>.<step>.merged.json.gz', ...]
    """

    def __init__(
        self, run: TraceData | Callable[[], TraceData], out_dir: str | os.PathLike[str], *,
        worker_name: str | None = None, keep_profiler_traces: bool = False,
    ) -> None:
        self._run = run
        self.out_dir = Path(out_dir)
        self.worker_name = worker_name or f"{_hostname()}_{os.getpid()}"
        self.keep_profiler_traces = keep_profiler_traces
        self.pending: list[tuple[Path, Path]] = []
        self.outputs: list[str] = []
        self.results: list[MergeResult] = []

    def _current_run(self) -> TraceData | None:
        run = self._run() if callable(self._run) and not isinstance(self._run, TraceData) \
            else self._run
        return run if getattr(run, "events", None) is not None else None

    def __call__(self, prof: torch.profiler.profile) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{self.worker_name}.{getattr(prof, 'step_num', len(self.outputs))}"
        raw = self.out_dir / f"{stem}.profiler.json"
        prof.export_chrome_trace(os.fspath(raw))
        self.pending.append((raw, self.out_dir / f"{stem}.merged.json.gz"))
        if self._current_run() is not None:
            self.finish()

    def finish(self) -> list[str]:
        """Merge every saved window (the run must be finished); return all merged paths."""
        run = self._current_run()
        if run is None and self.pending:
            raise MergeError("MergedTraceHandler.finish(): the hooktrace.trace() block has not "
                             "exited yet; call finish() after it")
        while self.pending:
            raw, out = self.pending.pop(0)
            assert run is not None
            self.results.append(merge_traces(run, raw, out))
            self.outputs.append(os.fspath(out))
            if not self.keep_profiler_traces:
                raw.unlink(missing_ok=True)
        return list(self.outputs)


def merged_trace_handler(
    run: TraceData | Callable[[], TraceData], out_dir: str | os.PathLike[str], *,
    worker_name: str | None = None, keep_profiler_traces: bool = False,
) -> MergedTraceHandler:
    """An ``on_trace_ready`` handler merging each profiler window with ``run``.

    ``run`` is the ``hooktrace.Trace`` (or a callable returning the run). See
    :class:`MergedTraceHandler`.
    """
    return MergedTraceHandler(run, out_dir, worker_name=worker_name,
                              keep_profiler_traces=keep_profiler_traces)


def _hostname() -> str:
    import socket

    return socket.gethostname()


class Profile:
    """Context manager of :func:`profile`: ``.trace``, ``.profiler``, ``.outputs``."""

    def __init__(
        self, model: torch.nn.Module, out: str | os.PathLike[str], *,
        schedule: Callable[[int], Any] | None = None,
        trace_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any,
    ) -> None:
        import hooktrace

        if "on_trace_ready" in profiler_kwargs:
            raise TypeError("hooktrace.profile writes the merged traces itself; use "
                            "hooktrace.merge.merged_trace_handler for a custom on_trace_ready")
        self.out = Path(out)
        self.trace: Trace = hooktrace.trace(model, **(trace_kwargs or {}))
        self.handler: MergedTraceHandler | None = None
        if schedule is not None:
            self.handler = MergedTraceHandler(self.trace, self.out)
            profiler_kwargs.update(schedule=schedule, on_trace_ready=self.handler)
        self.profiler = torch.profiler.profile(**profiler_kwargs)
        self.outputs: list[str] = []
        self.result: MergeResult | None = None

    def __enter__(self) -> Profile:
        self.trace.__enter__()
        try:
            self.profiler.__enter__()
        except BaseException:
            self.trace.__exit__(None, None, None)
            raise
        return self

    def step(self) -> None:
        """``torch.profiler.profile.step()``: call once per training step with a schedule."""
        self.profiler.step()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.profiler.__exit__(exc_type, exc, tb)
        finally:
            self.trace.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        if self.handler is not None:
            self.outputs = self.handler.finish()
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.out.parent) as d:
            raw = os.path.join(d, "profiler.json")
            self.profiler.export_chrome_trace(raw)
            self.result = merge_traces(self.trace, raw, self.out)
        self.outputs = [os.fspath(self.out)]


def profile(
    model: torch.nn.Module, out: str | os.PathLike[str], *,
    schedule: Callable[[int], Any] | None = None,
    trace_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any,
) -> Profile:
    """Run ``torch.profiler`` and ``hooktrace.trace`` together; write the merged trace.

    Without ``schedule``, ``out`` is the merged file (``.json`` or ``.json.gz``)
    written when the block exits. With a ``torch.profiler.schedule``, ``out``
    is a folder receiving one merged file per active window (call ``.step()``
    once per step). Other keyword arguments go to ``torch.profiler.profile``;
    ``trace_kwargs`` to ``hooktrace.trace``.

    Example::

        with hooktrace.profile(model, "merged.json.gz") as prof:
            loss = model(x).sum(); loss.backward()
        print(prof.outputs)    # ['merged.json.gz']
    """
    return Profile(model, out, schedule=schedule, trace_kwargs=trace_kwargs, **profiler_kwargs)

