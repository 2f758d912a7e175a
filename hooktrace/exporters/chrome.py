"""Chrome / Perfetto trace export (JSON object format), streamed in ~1 MB chunks.

Span times are written relative to ``baseTimeNanoseconds`` (the earliest span
start, floored to a microsecond) as exact ``<us>.<3 digits>`` decimals printed
from integer nanoseconds. Small relative times matter: Perfetto converts each
``ts`` and ``dur`` to nanoseconds separately through a double
(``llround(x * 1000.0)``), which is exact below ~2**40 µs (12 days) but not
for absolute Unix or kineto-base microseconds (~4.4e12 µs), where a child
ending at its parent's nanosecond comes out 1 ns past it and is dropped
(issue #7). ``hooktrace.merge`` rebases the profiler's events for the same
reason.

**One convention** for this export and the merged traces of
``hooktrace.merge`` (both use :class:`TrackLayout` and the names below):

* categories: ``hooktrace.forward``, ``hooktrace.backward``,
  ``hooktrace.recompute`` (spans; args ``module``, ``type``, ``call``, and
  ``error``/``unfinished`` when set, ``nodes`` on backward spans of an
  export; in a run recorded with ``flops=True``, ``flops`` and ``tflops`` or
  ``flops_counted`` on forward and backward spans, see :mod:`hooktrace.flops`),
  ``hooktrace.autograd_node`` and ``hooktrace.autograd_unattributed``
  (autograd nodes; args ``seq``, ``module``, ``pass``);
* rows: forward and recompute spans on their OS thread's own row (named by the
  Python thread name), in a merge the profiler's row for that thread; then,
  per thread T, tracks named ``"T forward"`` (merge only: forward spans that
  would cross a profiler slice), ``"T backward"`` and ``"T backward (overlap
  k)"`` (backward spans, laid out by ``_C.assign_lanes`` so each row nests
  strictly; with ``nodes=True`` the attributed autograd nodes too), and
  ``"T autograd (unattributed)"`` (nodes that belong to no module call, always
  written, so no backward time vanishes); and one row ``"steps"`` at the top
  with the training steps (category ``hooktrace.step``, args ``step``,
  ``complete``) when the run has step marks;
* track tids: the smallest integers above every tid in the file (so Perfetto,
  which shows "name tid", shows a short number), with ``thread_sort_index``
  placing each thread's tracks right below it (see
  :meth:`TrackLayout.metadata`); the top-level
  ``"hooktrace"`` block lists them under ``"tracks"`` as ``{"tid", "thread",
  "kind", "lane"}``.

Example:
    >>> import io, json, numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(2, EVENT_DTYPE); ev["kind"] = [1, 2]; ev["t"] = [1500, 4001]
    >>> trace = TraceData(ev, [("", "Net")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 7, "hostname": "h", "dropped_events": 0,
    ...                    "overwritten_events": 0})
    >>> buf = io.BytesIO(); write_chrome(trace, buf)
    >>> doc = json.loads(buf.getvalue())
    >>> x = [e for e in doc["traceEvents"] if e["ph"] == "X"][0]
    >>> x["name"], x["cat"], x["ts"], x["dur"], doc["baseTimeNanoseconds"]
    ('Net', 'hooktrace.forward', 0.5, 2.501, 1000)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

from hooktrace._native import load_native
from hooktrace._filters import OPEN_WINDOW, Filters
from hooktrace._output import open_output
from hooktrace.exporters._chrome_json import dumps as _dumps
from hooktrace.exporters._chrome_json import micros as _micros
from hooktrace.exporters._extra_args import extra_args
from hooktrace.kernels import kernel_sites
from hooktrace.numerics import COUNTER_NAME as NUMERICS_COUNTER
from hooktrace.numerics import counter_points as numerics_counter
from hooktrace.numerics import numerics_info
from hooktrace.exporters._layout import (
    CHUNK_BYTES,
    KERNEL_CAT,
    NODE_CAT,
    SPAN_CATS,
    STEP_CAT,
    UNATTRIBUTED_CAT,
    ExportPlan,
    KernelSlices,
    TrackLayout,
    flop_args,
    info_block,
    kernel_slices,
    plan_export,
)

_C = load_native()  # torch's libraries, not torch (hooktrace._native)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = [
    "CHUNK_BYTES",
    "ExportPlan",
    "NODE_CAT",
    "SPAN_CATS",
    "STEP_CAT",
    "TrackLayout",
    "UNATTRIBUTED_CAT",
    "export_chrome",
    "plan_export",
    "write_chrome",
    "write_memory_counters",
    "write_steps",
]



class _Writable(Protocol):
    def write(self, data: bytes, /) -> Any: ...


def export_chrome(
    trace: TraceData, path: str | os.PathLike[str], *, nodes: bool = False,
    compresslevel: int = 1, filters: Filters | None = None,
) -> None:
    """Write ``trace`` as Chrome trace JSON to ``path``; gzip when it ends in ``.gz``.

    ``nodes=True`` adds one event per attributed autograd node (see the module
    docstring); unattributed nodes are written either way. A regular file is
    written through a temporary file next to it and renamed when complete, so
    a failure leaves no partial file (see ``hooktrace._output``).

    ``compresslevel`` 1 is the default because zlib is the bottleneck of a
    gzip export: on this JSON, level 1 runs at 320 MB/s with ratio 9.4, level 6
    at 114 MB/s with ratio 11.2, and gzip.open's default 9 slower still
    (measured on 100 MB of a synthetic export, 2-core machine).
    """
    with open_output(path, compresslevel=compresslevel) as f:
        write_chrome(trace, f, nodes=nodes, filters=filters)


def module_json(modules: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Per module slot: the JSON event name (class name for the root) and the
    ``{"module":...,"type":...`` args prefix that ``_C.write_chrome_events`` completes."""
    names = [_dumps(name if name else type_name) for name, type_name in modules]
    args = ['{"module":' + _dumps(name) + ',"type":' + _dumps(type_name)
            for name, type_name in modules]
    return names, args


def write_steps(write: Any, trace: TraceData, tid: int, base_ns: int,
                window: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """The run's steps as ``,\n{event}`` items on their own row ``tid`` named "steps"
    (placed above the threads), clipped to ``window``; returns the row's entry for the
    ``"tracks"`` table, or None when the run has no steps in the window.

    Each step is an X event ``"step N"`` (category ``hooktrace.step``, args ``step``
    and ``complete``: False for the last one when no mark ended it).
    """
    steps = trace.steps()
    lo, hi = window if window is not None else OPEN_WINDOW
    # (strictly: a step that only touches the window's edge would be drawn empty)
    keep = np.flatnonzero((steps.end_ns > lo) & (steps.start_ns < hi))
    if not len(keep):
        return None
    pid = trace.pid
    items = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
              "args": {"name": "steps"}},
             {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
              "args": {"sort_index": 0}}]
    text = "".join(",\n" + _dumps(m) for m in items)
    for i in keep.tolist():
        start = max(int(steps.start_ns[i]), lo) - base_ns
        end = min(int(steps.end_ns[i]), hi) - base_ns
        n = int(steps.number[i])
        text += (f',\n{{"ph":"X","cat":"{STEP_CAT}","name":"step {n}","pid":{pid},"tid":{tid},'
                 f'"ts":{_micros(start)},"dur":{_micros(end - start)},'
                 f'"args":{{"step":{n},"complete":{"true" if steps.complete[i] else "false"}}}}}')
    write(text.encode("utf-8"))
    return {"tid": tid, "thread": 0, "kind": "steps", "lane": 0}


def write_memory_counters(write: Any, trace: TraceData, base_ns: int,
                          window: tuple[int, int] | None = None) -> int:
    """One counter track per recorded device (``trace(memory=True)``): ``C`` events
    named ``memory <device> (hooktrace)`` with arg ``allocated_bytes``, at every sample
    where the value changes, clipped to ``window``; with ``numerics=True`` also
    ``non-finite values (hooktrace)`` (arg ``nonfinite``, :func:`hooktrace.numerics.
    counter_points`); returns how many were written."""
    from hooktrace.memory import counter_name, counter_points, memory_devices

    tracks = [(counter_name(device), "allocated_bytes", *counter_points(trace, device, window))
              for device in memory_devices(trace)]
    if numerics_info(trace.info) is not None:  # non-finite values so far (numerics=True)
        tracks.append((NUMERICS_COUNTER, "nonfinite", *numerics_counter(trace, window)))
    written = 0
    for name, arg, t, values in tracks:
        head = f',\n{{"ph":"C","name":{_dumps(name)},"pid":{trace.pid},"ts":'
        parts = [f'{head}{_micros(ts - base_ns)},"args":{{"{arg}":{v}}}}}'
                 for ts, v in zip(t.tolist(), values.tolist())]
        for i in range(0, len(parts), 65536):
            write("".join(parts[i:i + 65536]).encode("utf-8"))
        written += len(parts)
    return written


def write_span_events(
    write: Any, trace: TraceData, index: np.ndarray, start: np.ndarray, end: np.ndarray,
    tid: np.ndarray, base_ns: int, *, node_counts: np.ndarray | None = None,
    chunk_bytes: int = CHUNK_BYTES, flags: np.ndarray | None = None,
) -> None:
    """Spans ``index`` (with these times and rows) as ``,\\n{event}`` items;
    ``flags`` (per written span) replaces the spans' own (adds SPAN_CLIPPED). A run
    recorded with ``flops=True`` adds the FLOP args (``hooktrace.flops``)."""
    spans = trace.spans()
    names_json, args_json = module_json(trace.modules)
    flags = spans.flags[index] if flags is None else flags
    columns = {
        "start_ns": np.ascontiguousarray(start, np.int64),
        "end_ns": np.ascontiguousarray(end, np.int64),
        "module": np.ascontiguousarray(spans.module[index], np.uint32),
        "tid": np.ascontiguousarray(tid, np.uint32),
        "call": np.ascontiguousarray(spans.call[index], np.uint32),
        "cat": np.ascontiguousarray(spans.cat[index], np.uint8),
    }
    if node_counts is not None:
        columns["nodes"] = np.ascontiguousarray(node_counts[index], np.int64)
    fl = flop_args(trace, index)
    if fl is not None:
        columns["flops"] = np.ascontiguousarray(fl[0], np.int64)
        columns["tflops"] = np.ascontiguousarray(fl[1], np.float64)
        flags = flags | fl[2]
    columns["flags"] = np.ascontiguousarray(flags, np.uint8)
    extra, extra_json = _extra_json(trace, index)
    columns["extra"] = extra
    _C.write_chrome_events(
        write, columns, names_json=names_json, args_json=args_json, cat_names=list(SPAN_CATS),
        extra_json=extra_json, base_ns=base_ns, pid=trace.pid, chunk_bytes=chunk_bytes,
    )


def _extra_json(trace: TraceData, index: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Shapes / numerics args (exporters/_extra_args.py) as ``,"key":value`` fragments."""
    extra = extra_args(trace, index)
    if extra is None:
        return np.zeros(0, np.int64), []
    which, dicts = extra
    return (np.ascontiguousarray(which, np.int64),
            ["," + json.dumps(d, separators=(",", ":"), ensure_ascii=False)[1:-1]
             if d else "" for d in dicts])


def write_node_events(
    write: Any, trace: TraceData, index: np.ndarray, start: np.ndarray, end: np.ndarray,
    tid: np.ndarray, cat: str, base_ns: int, *, chunk_bytes: int = CHUNK_BYTES,
    flags: np.ndarray | None = None,
) -> None:
    """Autograd nodes ``index`` (with these times and rows) as ``,\\n{event}`` items;
    ``flags`` (per written node, optional): SPAN_CLIPPED adds ``"clipped": true``."""
    if not len(index):
        return
    spans = trace.spans()
    node_table = spans.nodes
    n_names = max(len(trace.node_names), int(node_table.name[index].max()) + 1)
    node_names_json = [
        _dumps(trace.node_names[i] if i < len(trace.node_names) else f"<node {i}>")
        for i in range(n_names)
    ]
    module_names_json = [_dumps(name) for name, _ in trace.modules]
    span = node_table.span[index]
    module = np.full(len(index), -1, np.int64)
    if len(spans):
        attributed = span >= 0
        module[attributed] = spans.module[span[attributed]]
    columns = {
        "start_ns": np.ascontiguousarray(start, np.int64),
        "end_ns": np.ascontiguousarray(end, np.int64),
        "name": np.ascontiguousarray(node_table.name[index], np.uint32),
        "tid": np.ascontiguousarray(tid, np.uint32),
        "seq": np.ascontiguousarray(node_table.seq[index], np.uint64),
        "pass_id": np.ascontiguousarray(node_table.pass_id[index], np.uint32),
        "span_module": module,
    }
    if flags is not None:
        columns["flags"] = np.ascontiguousarray(flags, np.uint8)
    _C.write_chrome_nodes(
        write, columns, node_names_json=node_names_json, module_names_json=module_names_json,
        cat=cat, base_ns=base_ns, pid=trace.pid, chunk_bytes=chunk_bytes,
    )


def write_kernel_events(write: Any, trace: TraceData, ks: KernelSlices, base_ns: int, *,
                        chunk_bytes: int = CHUNK_BYTES) -> None:
    """The kernel-derived slices (``hooktrace.kernels``) as ``,\n{event}`` items: named
    by their module, category ``hooktrace.kernel``, args ``module``, ``type``,
    ``kernel`` (the generated kernel's name) and ``derived: true``."""
    if not len(ks.start):
        return
    names, args = module_json(trace.modules)
    sites = [_dumps(s[0]) for s in kernel_sites(trace.info)]
    pid, cat = trace.pid, _dumps(KERNEL_CAT)
    parts: list[str] = []
    size = 0
    for start, end, row, module, site in zip(ks.start.tolist(), ks.end.tolist(), ks.row.tolist(),
                                             ks.module.tolist(), ks.site.tolist()):
        item = (f',\n{{"ph":"X","cat":{cat},"name":{names[module]},"pid":{pid},"tid":{row},'
                f'"ts":{_micros(start - base_ns)},"dur":{_micros(end - start)},'
                f'"args":{args[module]},"kernel":{sites[site]},"derived":true}}}}')
        parts.append(item)
        size += len(item)
        if size >= chunk_bytes:
            write("".join(parts).encode("utf-8"))
            parts, size = [], 0
    if parts:
        write("".join(parts).encode("utf-8"))


def write_chrome(
    trace: TraceData, f: _Writable | BinaryIO, *, nodes: bool = False,
    chunk_bytes: int = CHUNK_BYTES, filters: Filters | None = None,
) -> None:
    """Stream ``trace`` as Chrome trace JSON into the binary file object ``f``.

    Events come in span order (forward and recompute, then backward), then the
    attributed autograd nodes (``nodes=True`` only), then the unattributed ones.
    ``filters`` cuts the run down first (``hooktrace._filters``); the block's
    ``"cut"`` entry then says what was left out or clipped.
    """
    trace.spans()
    pid = trace.pid
    plan = plan_export(trace, nodes=nodes, filters=filters)
    base_ns = plan.base_ns
    thread_names = trace.info.get("thread_names")
    meta_events: list[dict[str, Any]] = [
        {
            "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": f"hooktrace {trace.hostname} pid {pid}"},
        }
    ]
    meta_events += plan.layout.metadata(pid, thread_names, named=plan.os_threads.tolist())
    head = '{"traceEvents":[\n' + ",\n".join(_dumps(e) for e in meta_events)
    f.write(head.encode("utf-8"))

    counts = None
    if plan.node_counts is not None:
        counts = np.full(len(trace.spans()), -1, np.int64)
        counts[plan.spans] = plan.node_counts
    write_span_events(f.write, trace, plan.spans, plan.start, plan.end, plan.row, base_ns,
                      node_counts=counts, chunk_bytes=chunk_bytes, flags=plan.flags)
    for idx, start, end, tid, cat, flags in plan.node_groups:
        write_node_events(f.write, trace, idx, start, end, tid, cat, base_ns,
                          chunk_bytes=chunk_bytes,
                          flags=flags if plan.cut.filters.active else None)

    write_kernel_events(f.write, trace,
                        kernel_slices(trace, plan.spans, plan.start, plan.end, plan.row),
                        base_ns, chunk_bytes=chunk_bytes)
    window = plan.cut.bounds
    step_track = write_steps(f.write, trace, plan.layout.next_tid, base_ns, window)
    write_memory_counters(f.write, trace, base_ns, window)
    tail = (
        '\n],\n"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(base_ns)
        + ',\n"hooktrace":' + _dumps(info_block(trace, plan, step_track)) + "}\n"
    )
    f.write(tail.encode("utf-8"))
