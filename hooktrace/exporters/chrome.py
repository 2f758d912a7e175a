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
  ``flops_counted`` on forward and backward spans, see :mod:`hooktrace.analysis.flops`),
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

import os
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

from hooktrace.analysis._filters import Filters
from hooktrace._output import open_output
from hooktrace.exporters._chrome_json import dumps as _dumps
from hooktrace.exporters._chrome_events import (  # re-exported: their old home
    module_json,
    write_gpu_events,
    write_kernel_events,
    write_memory_counters,
    write_node_events,
    write_span_events,
    write_steps,
)
from hooktrace.exporters._layout import (
    CHUNK_BYTES,
    NODE_CAT,
    SPAN_CATS,
    STEP_CAT,
    UNATTRIBUTED_CAT,
    ExportPlan,
    TrackLayout,
    gpu_slices,
    info_block,
    kernel_slices,
    plan_export,
)

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
    "module_json",
    "plan_export",
    "write_chrome",
    "write_kernel_events",
    "write_memory_counters",
    "write_node_events",
    "write_span_events",
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


def write_chrome(
    trace: TraceData, f: _Writable | BinaryIO, *, nodes: bool = False,
    chunk_bytes: int = CHUNK_BYTES, filters: Filters | None = None,
) -> None:
    """Stream ``trace`` as Chrome trace JSON into the binary file object ``f``.

    Events come in span order (forward and recompute, then backward), then the
    attributed autograd nodes (``nodes=True`` only), then the unattributed ones.
    ``filters`` cuts the run down first (``hooktrace.analysis._filters``); the block's
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
    # device time (trace(gpu=True)): a row per device and stream, below the threads
    gpu_tracks = write_gpu_events(f.write, trace, gpu_slices(trace, window),
                                  plan.layout.next_tid + 1, base_ns, chunk_bytes=chunk_bytes)
    write_memory_counters(f.write, trace, base_ns, window)
    block = info_block(trace, plan, step_track)
    block["tracks"] += gpu_tracks
    tail = (
        '\n],\n"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(base_ns)
        + ',\n"hooktrace":' + _dumps(block) + "}\n"
    )
    f.write(tail.encode("utf-8"))
