"""The Chrome trace JSON events a run's pieces become, as ``,\n{event}`` items: spans,
autograd nodes, kernel-derived slices, steps and counters (the ``_C.write_chrome_*``
call sites). A helper, not an exporter (issue #27): it writes no file, and the
exporters that write Chrome JSON (``chrome``, ``merged``, ``ranks``) all use it.
``hooktrace.exporters.chrome`` re-exports these names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace._native import load_native
from hooktrace.analysis._filters import OPEN_WINDOW
from hooktrace.analysis.kernel_time import device_table
from hooktrace.exporters._chrome_json import dumps as _dumps
from hooktrace.exporters._chrome_json import micros as _micros
from hooktrace.exporters._extra_args import extra_args
from hooktrace.exporters._layout import (
    CHUNK_BYTES,
    GPU_CATS,
    KERNEL_CAT,
    SPAN_CATS,
    STEP_CAT,
    GpuSlices,
    KernelSlices,
    counter_tracks,
    gpu_track_name,
    span_args,
)
from hooktrace.analysis.device_time import launch_time_only
from hooktrace.analysis.kernels import kernel_sites

_C = load_native()  # torch's libraries, not torch (hooktrace._native)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = [
    "GPU_SORT_INDEX",
    "module_json",
    "write_gpu_events",
    "write_kernel_events",
    "write_memory_counters",
    "write_node_events",
    "write_span_events",
    "write_steps",
]


def module_json(modules: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Per module slot: the JSON event name (class name for the root) and the
    ``{"module":...,"type":...`` args prefix that ``_C.write_chrome_events`` completes."""
    names = [_dumps(name if name else type_name) for name, type_name in modules]
    args = ['{"module":' + _dumps(name) + ',"type":' + _dumps(type_name)
            for name, type_name in modules]
    return names, args


GPU_SORT_INDEX = 1 << 20  # the GPU rows' thread_sort_index: below every thread's rows


def write_gpu_events(write: Any, trace: TraceData, gs: GpuSlices, first_tid: int,
                     base_ns: int, *, chunk_bytes: int = CHUNK_BYTES) -> list[dict[str, Any]]:
    """The device intervals (``trace(gpu=True)``) as ``,\n{event}`` items: one row per
    device and stream, ``"GPU 0 stream 7"`` (tids from ``first_tid``, below the
    threads), each interval an X event named by its module (the class for the root),
    category ``hooktrace.gpu_forward`` / ``gpu_backward`` / ``gpu_recompute``, args
    ``module``, ``type``, ``call``, ``device``, ``stream``, ``self_ns`` (less the
    intervals nested in it). Returns the rows' entries for the ``"tracks"`` table."""
    if not len(gs.rows):
        return []
    pid = trace.pid
    gpu, label = device_table(trace)
    names, args = module_json(trace.modules)
    kernel_names = trace.info.get("kernels", {}).get("names", [])
    entries = []
    items = []
    for k, (device, stream, lane) in enumerate(gs.tracks):
        tid = first_tid + k
        items += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                   "args": {"name": gpu_track_name(device, stream, lane)}},
                  {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                   "args": {"sort_index": GPU_SORT_INDEX + k}}]
        entries.append({"tid": tid, "thread": 0, "kind": "gpu", "lane": lane,
                        "device": device, "stream": stream})
    text = "".join(",\n" + _dumps(m) for m in items)
    n_mod = len(trace.modules)
    for j, i in enumerate(gs.rows.tolist()):
        m = int(gpu.module[i])
        name, arg = ((names[m], args[m]) if m < n_mod else
                     (_dumps(f"<module {m}>"), '{"module":' + _dumps(f"<module {m}>")
                      + ',"type":"?"'))
        if label[i] >= 0:  # a kernel (CUPTI): its name, its module in the args
            kname = kernel_names[label[i]] if label[i] < len(kernel_names) else "?"
            name, arg = _dumps(str(kname)), arg + ',"kernel":true'
        device, stream, _ = gs.tracks[int(gs.track[j])]
        start, end = int(gs.start[j]), int(gs.end[j])
        text += (f',\n{{"ph":"X","cat":"{GPU_CATS[int(gpu.cat[i])]}","name":{name},'
                 f'"pid":{pid},"tid":{first_tid + int(gs.track[j])},'
                 f'"ts":{_micros(start - base_ns)},"dur":{_micros(end - start)},'
                 f'"args":{arg},"call":{int(gs.call[j])},"device":{device},'
                 f'"stream":{stream},"self_ns":{int(gpu.self_ns[i])}}}}}')
        if len(text) >= chunk_bytes:
            write(text.encode("utf-8"))
            text = ""
    write(text.encode("utf-8"))
    return entries


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
    ``non-finite values (hooktrace)`` (arg ``nonfinite``, :func:`hooktrace.analysis.numerics.
    counter_points`); returns how many were written."""
    written = 0
    for name, arg, t, values in counter_tracks(trace, window):
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
    ``flags`` (per written span) replaces the spans' own (adds SPAN_CLIPPED). The
    recorded quantities add their args (``span_args``: FLOPs with ``flops=True``)."""
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
    columns["flags"] = np.ascontiguousarray(flags, np.uint8)
    extra, extra_json = _extra_json(trace, index)
    columns["extra"] = extra
    _C.write_chrome_events(
        write, columns, names_json=names_json, args_json=args_json, cat_names=list(SPAN_CATS),
        extra_json=extra_json, base_ns=base_ns, pid=trace.pid, chunk_bytes=chunk_bytes,
        args=span_args(trace, index),
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
    """The kernel-derived slices (``hooktrace.analysis.kernels``) as ``,\n{event}`` items: named
    by their module, category ``hooktrace.kernel``, args ``module``, ``type``,
    ``kernel`` (the generated kernel's name) and ``derived: true``; on a CUDA run
    without device time also ``launch: true`` (the slice is the host time launching
    the kernel, not its run time: hooktrace.analysis.device_time)."""
    if not len(ks.start):
        return
    launch = ',"launch":true' if launch_time_only(trace) else ""
    names, args = module_json(trace.modules)
    sites = [_dumps(s[0]) for s in kernel_sites(trace.info)]
    pid, cat = trace.pid, _dumps(KERNEL_CAT)
    parts: list[str] = []
    size = 0
    for start, end, row, module, site in zip(ks.start.tolist(), ks.end.tolist(), ks.row.tolist(),
                                             ks.module.tolist(), ks.site.tolist()):
        item = (f',\n{{"ph":"X","cat":{cat},"name":{names[module]},"pid":{pid},"tid":{row},'
                f'"ts":{_micros(start - base_ns)},"dur":{_micros(end - start)},'
                f'"args":{args[module]},"kernel":{sites[site]},"derived":true{launch}}}}}')
        parts.append(item)
        size += len(item)
        if size >= chunk_bytes:
            write("".join(parts).encode("utf-8"))
            parts, size = [], 0
    if parts:
        write("".join(parts).encode("utf-8"))
