"""Perfetto's native protobuf trace (``.pftrace``, ``.perfetto-trace``), streamed in ~1 MB chunks.

The same slices, names, categories, arguments and rows as the Chrome export
(``hooktrace.exporters.chrome``: the one convention, laid out by the same
:class:`~hooktrace.exporters.chrome.TrackLayout` through
:func:`~hooktrace.exporters.chrome.plan_export`), written as TrackEvent
SLICE_BEGIN/SLICE_END pairs, with names, categories and argument names and
string values interned and timestamps as integer Unix ns. About 1/3 of the
JSON's size and faster to write and to load (benchmarks/RESULTS.md).

Tracks (TrackDescriptor):

* one process track (uuid 1: ``ProcessDescriptor{pid, process_name}``);
* per OS thread, a thread track (``ThreadDescriptor{pid, tid, thread_name}``)
  holding its forward and recompute calls;
* per thread, its hooktrace rows (``"T backward"``, ``"T backward (overlap
  k)"``, ``"T autograd (unattributed)"``) as named child tracks of the thread
  track (``parent_uuid``), ordered as in the Chrome export (``child_ordering``
  EXPLICIT + ``sibling_order_rank``): no synthetic tids at all.

Arguments are debug annotations (``module``, ``type``, ``call``, ``error``,
``unfinished``, ``nodes``, ``flops`` (int), ``tflops`` (double),
``flops_counted``, ``clipped``; nodes: ``seq``, ``module``, ``pass``;
a node's unknown pass, ``null`` in the JSON, is left out). What the Chrome
file's top-level ``"hooktrace"`` block holds (versions, dropped / overwritten
events, orphan exits, unfinished spans, node counts, filters) is on an instant
event ``hooktrace info`` (category ``hooktrace.info``) on the process track at
the first written time: click it in Perfetto to read its arguments. The track
list is the descriptors themselves.

Encoding (csrc/perfetto_writer.h): one packet sequence per track, each with an
incremental clock, so a timestamp is a small delta; the track descriptors and
the info event are on sequence 1 with absolute timestamps.

Example:
    >>> import io, numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(2, EVENT_DTYPE); ev["kind"] = [1, 2]; ev["t"] = [1500, 4001]
    >>> trace = TraceData(ev, [("", "Net")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 7, "hostname": "h", "dropped_events": 0,
    ...                    "overwritten_events": 0})
    >>> buf = io.BytesIO(); write_perfetto(trace, buf)["slices"]
    1
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from hooktrace._native import load_native
from hooktrace.analysis._filters import OPEN_WINDOW, Filters
from hooktrace._output import open_output
from hooktrace.exporters._layout import (
    CHUNK_BYTES,
    GPU_CATS,
    KERNEL_CAT,
    NODE_CAT,
    SPAN_CATS,
    STEP_CAT,
    UNATTRIBUTED_CAT,
    counter_tracks,
    gpu_slices,
    gpu_track_name,
    info_block,
    kernel_slices,
    plan_export,
    span_args,
    thread_label,
    track_name,
)
from hooktrace.exporters._extra_args import extra_args
from hooktrace.analysis.device_time import launch_time_only
from hooktrace.analysis.kernel_time import device_table
from hooktrace.analysis.kernels import kernel_sites
from hooktrace.reading import NO_PASS

_C = load_native()  # torch's libraries, not torch (hooktrace._native)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["PERFETTO_SUFFIXES", "export_perfetto", "write_perfetto"]

PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace")
INFO_CAT = "hooktrace.info"
_SLICE_NODE = 0x80  # csrc/perfetto_writer.h kSliceNode
_SLICE_KERNEL = 0x40  # csrc/perfetto_writer.h kSliceKernel
_PROCESS_UUID = 1
_TYPE_COUNTER = 4  # TrackEvent.Type
_UNIT_SIZE_BYTES = 3  # CounterDescriptor.Unit
_DESCRIPTOR_SEQUENCE = 1  # descriptors and the info event; tracks use 2, 3, ...
_GPU_UUID = 1 << 40  # the first device stream track's uuid (trace(gpu=True))
_CHILD_ORDERING_EXPLICIT = 3
# an argument column's absent value, by dtype kind (csrc/slice_columns.h ArgColumn)
_ABSENT = {"i": -1, "f": np.nan, "b": False}


def export_perfetto(trace: TraceData, path: str | os.PathLike[str], *, nodes: bool = False,
                    filters: Filters | None = None) -> dict[str, int]:
    """Write ``trace`` as a Perfetto protobuf trace to ``path`` (through a
    temporary file, like every output; ``.gz`` compresses it, which Perfetto
    also opens). Returns :func:`write_perfetto`'s counts."""
    with open_output(path) as f:
        return write_perfetto(trace, f, nodes=nodes, filters=filters)


# -- a few protobuf fields, for the handful of packets written from Python ----------

def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negative int64 as two's complement, as protobuf does
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _uint(field: int, v: int) -> bytes:
    return _varint(field << 3) + _varint(v)


def _bytes(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _bytes(field, text.encode("utf-8"))


def _packet(body: bytes) -> bytes:
    return _bytes(1, _uint(10, _DESCRIPTOR_SEQUENCE) + body)  # Trace.packet


def _annotation(name: str, value: Any) -> bytes:
    """DebugAnnotation{name = 10, bool 2 / int 4 / string 6 / dict_entries 11 / array_values 12}."""
    body = _str(10, name)
    if isinstance(value, bool):
        body += _uint(2, int(value))
    elif isinstance(value, int):
        body += _uint(4, value)
    elif isinstance(value, Mapping):
        body += b"".join(_bytes(11, _annotation(str(k), v)) for k, v in value.items()
                         if v is not None)
    elif isinstance(value, (list, tuple)):
        body += b"".join(_bytes(12, _annotation("", v)) for v in value if v is not None)
    else:
        body += _str(6, str(value))
    return body


def _extra_annotations(trace: TraceData, span_index: np.ndarray, n_slices: int
                       ) -> tuple[np.ndarray, list[bytes]]:
    """Shapes / numerics args (exporters/_extra_args.py) of the written spans (the first
    slices) as encoded debug_annotations fields; -1 for every other slice."""
    extra = extra_args(trace, span_index)
    if extra is None:
        return np.zeros(0, np.int64), []
    which, dicts = extra
    out = np.full(n_slices, -1, np.int64)
    out[: len(which)] = which
    return out, [b"".join(_bytes(4, _annotation(k, v)) for k, v in d.items()) for d in dicts]


def _descriptors(trace: TraceData, os_threads: list[int],
                 tracks: list[tuple[int, int, int, int]]) -> bytes:
    pid = trace.pid
    names = trace.info.get("thread_names")
    out = _packet(_bytes(60, _uint(1, _PROCESS_UUID) + _bytes(3, _uint(1, pid) + _str(
        6, f"hooktrace {trace.hostname} pid {pid}"))))
    for k, tid in enumerate(os_threads):
        thread = _uint(1, pid) + _uint(2, tid) + _str(5, thread_label(names, tid))
        out += _packet(_bytes(60, _uint(1, 2 + k) + _bytes(4, thread)
                              + _uint(11, _CHILD_ORDERING_EXPLICIT)))
    rank: dict[int, int] = {}
    thread_of = {tid: k for k, tid in enumerate(os_threads)}
    for j, (_, os_tid, kind, lane) in enumerate(tracks):
        rank[os_tid] = rank.get(os_tid, 0) + 1
        out += _packet(_bytes(60, _uint(1, 2 + len(os_threads) + j)
                              + _uint(5, 2 + thread_of[os_tid])
                              + _str(2, track_name(thread_label(names, os_tid), kind, lane))
                              + _uint(12, rank[os_tid])))
    return out


def _info_event(ts: int, block: Mapping[str, Any]) -> bytes:
    event = (_uint(9, 3) + _uint(11, _PROCESS_UUID) + _str(22, INFO_CAT)
             + _str(23, "hooktrace info")
             + b"".join(_bytes(4, _annotation(k, v)) for k, v in block.items()
                        if k != "tracks" and v is not None))
    return _packet(_uint(8, ts) + _bytes(11, event))


def _steps(trace: TraceData, plan: Any, uuid: int) -> tuple[bytes, int]:
    """The "steps" track (a child of the process track, above its threads) with one
    slice per step in the export's window, as in the Chrome export; and how many."""
    steps = trace.steps()
    lo, hi = plan.cut.bounds or OPEN_WINDOW
    keep = np.flatnonzero((steps.end_ns > lo) & (steps.start_ns < hi))  # as chrome.py
    if not len(keep):
        return b"", 0
    out = _packet(_bytes(60, _uint(1, uuid) + _uint(5, _PROCESS_UUID) + _str(2, "steps")
                         + _uint(12, 0)))
    for i in keep.tolist():
        n = int(steps.number[i])
        begin = (_uint(9, 1) + _uint(11, uuid) + _str(22, STEP_CAT) + _str(23, f"step {n}")
                 + _bytes(4, _annotation("step", n))
                 + _bytes(4, _annotation("complete", bool(steps.complete[i]))))
        out += _packet(_uint(8, max(int(steps.start_ns[i]), lo)) + _bytes(11, begin))
        out += _packet(_uint(8, min(int(steps.end_ns[i]), hi))
                       + _bytes(11, _uint(9, 2) + _uint(11, uuid)))
    return out, len(keep)


def _memory_counters(trace: TraceData, plan: Any, first_uuid: int) -> bytes:
    """Per recorded device, a counter track (bytes, a child of the process track), and
    with numerics=True the non-finite values so far, with the Chrome export's points:
    TrackEvent TYPE_COUNTER with counter_value."""
    out = b""
    for k, (name, arg, t, values) in enumerate(counter_tracks(trace, plan.cut.bounds)):
        uuid = first_uuid + k
        # CounterDescriptor.unit: bytes for memory
        counter = _uint(3, _UNIT_SIZE_BYTES) if arg == "allocated_bytes" else b""
        out += _packet(_bytes(60, _uint(1, uuid) + _uint(5, _PROCESS_UUID)
                              + _str(2, name) + _bytes(8, counter)))
        head = _uint(9, _TYPE_COUNTER) + _uint(11, uuid)
        out += b"".join(_packet(_uint(8, ts) + _bytes(11, head + _uint(30, v)))
                        for ts, v in zip(t.tolist(), values.tolist()))
    return out


def write_perfetto(
    trace: TraceData, f: BinaryIO | Any, *, nodes: bool = False,
    filters: Filters | None = None, chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, int]:
    """Stream ``trace`` as a Perfetto protobuf trace into the binary file ``f``.

    Same arguments as :func:`hooktrace.exporters.chrome.write_chrome`.
    Returns ``{"slices": written, "not_nested": skipped}``; ``not_nested`` is 0
    unless rows fail to nest, which the layout rules out.
    """
    write = f.write
    spans = trace.spans()
    node_table = spans.nodes
    plan = plan_export(trace, nodes=nodes, filters=filters)
    layout = plan.layout
    os_threads = plan.os_threads.tolist()
    n_threads = len(os_threads)
    first_tid = layout.tracks[0][0] if layout.tracks else 0
    n_modules = len(trace.modules)

    def track_of(row: np.ndarray) -> np.ndarray:
        """Track index: OS thread k -> k; synthetic tid -> after the threads."""
        row = row.astype(np.int64)
        synthetic = row >= first_tid if layout.tracks else np.zeros(len(row), bool)
        out = np.searchsorted(plan.os_threads, row)
        out[synthetic] = n_threads + row[synthetic] - first_tid
        return out.astype(np.uint32)

    span_index = plan.spans
    node_index = [g[0] for g in plan.node_groups]
    n_node_names = max([len(trace.node_names)]
                       + [int(node_table.name[i].max()) + 1 for i in node_index if len(i)])
    names = [name or type_name for name, type_name in trace.modules] + [
        trace.node_names[i] if i < len(trace.node_names) else f"<node {i}>"
        for i in range(n_node_names)]
    strings = ([name for name, _ in trace.modules] + [t for _, t in trace.modules] + [""])
    cats = [*SPAN_CATS, NODE_CAT, UNATTRIBUTED_CAT, KERNEL_CAT, *GPU_CATS]

    # Columns: the written spans, then each node group (the Chrome file's order).
    start = [plan.start]
    end = [plan.end]
    track = [track_of(plan.row)]
    name = [spans.module[span_index].astype(np.uint32)]
    cat = [spans.cat[span_index].astype(np.uint8)]
    flags = [plan.flags.astype(np.uint8)]
    str_a = [spans.module[span_index].astype(np.int64)]
    str_b = [n_modules + spans.module[span_index].astype(np.int64)]
    int_a = [spans.call[span_index].astype(np.int64)]
    int_b = [plan.node_counts if plan.node_counts is not None
             else np.full(len(span_index), -1, np.int64)]
    for idx, g_start, g_end, g_row, g_cat, g_flags in plan.node_groups:
        start.append(g_start)
        end.append(g_end)
        track.append(track_of(g_row))
        name.append((n_modules + node_table.name[idx]).astype(np.uint32))
        cat.append(np.full(len(idx), cats.index(g_cat), np.uint8))
        flags.append(g_flags | np.uint8(_SLICE_NODE))
        span = node_table.span[idx]
        module = np.full(len(idx), 2 * n_modules, np.int64)  # "" when unattributed
        module[span >= 0] = spans.module[span[span >= 0]]
        str_a.append(module)
        str_b.append(np.full(len(idx), -1, np.int64))
        int_a.append(node_table.seq[idx].astype(np.int64))
        pass_id = node_table.pass_id[idx].astype(np.int64)
        int_b.append(np.where(node_table.pass_id[idx] == NO_PASS, -1, pass_id))

    # kernel-derived slices (hooktrace.analysis.kernels), on their region span's row
    ks = kernel_slices(trace, plan.spans, plan.start, plan.end, plan.row)
    kernels_at = sum(len(a) for a in start)
    if len(ks.start):
        site_strings = len(strings)
        strings += [site[0] for site in kernel_sites(trace.info)]
        start.append(ks.start)
        end.append(ks.end)
        track.append(track_of(ks.row))
        name.append(ks.module.astype(np.uint32))
        cat.append(np.full(len(ks.start), cats.index(KERNEL_CAT), np.uint8))
        flags.append(np.full(len(ks.start), _SLICE_KERNEL, np.uint8))
        str_a.append(ks.module.astype(np.int64))
        str_b.append(n_modules + ks.module.astype(np.int64))
        int_a.append(site_strings + ks.site.astype(np.int64))
        int_b.append(np.full(len(ks.start), -1, np.int64))

    # device intervals (trace(gpu=True)): a track per device and stream, under the
    # process, with the Chrome export's slices (args device, stream, self_ns as extras)
    n_tracks = n_threads + len(layout.tracks)
    gs = gpu_slices(trace, plan.cut.bounds)
    gpu_at = sum(len(a) for a in start)
    gpu_extras: list[bytes] = []
    if len(gs.rows):
        gpu, label = device_table(trace)
        mod = gpu.module[gs.rows].astype(np.int64)
        if int(mod.max()) >= n_modules:  # (a slot past the module table: named "?")
            strings.append("?")
            names.append("?")
        unknown = mod >= n_modules
        slice_name = np.where(unknown, len(names) - 1, mod)
        kernel = label[gs.rows]
        if (kernel >= 0).any():  # kernels (CUPTI) are named by their kernel's name
            slice_name = np.where(kernel >= 0, len(names) + kernel, slice_name)
            names.extend(str(n) for n in trace.info["kernels"]["names"])  # (checked there)
        start.append(gs.start)
        end.append(gs.end)
        track.append((n_tracks + gs.track).astype(np.uint32))
        name.append(slice_name.astype(np.uint32))
        cat.append((cats.index(GPU_CATS[0]) + gpu.cat[gs.rows]).astype(np.uint8))
        flags.append(np.zeros(len(gs.rows), np.uint8))
        str_a.append(np.where(unknown, len(strings) - 1, mod))
        str_b.append(np.where(unknown, len(strings) - 1, n_modules + mod))
        int_a.append(gs.call)
        int_b.append(np.full(len(gs.rows), -1, np.int64))
        for j, i in enumerate(gs.rows.tolist()):
            device, stream, _ = gs.tracks[int(gs.track[j])]
            gpu_extras.append(b"".join(_bytes(4, _annotation(k, v)) for k, v in (
                ("device", device), ("stream", stream), ("self_ns", int(gpu.self_ns[i])))))

    def col(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate(parts).astype(dtype, copy=False))

    all_start = col(start, np.int64)
    rest = len(all_start) - len(span_index)  # slices past the spans: their args absent
    args = [(name, v if v is None else np.r_[v, np.full(rest, _ABSENT[v.dtype.kind], v.dtype)])
            for name, v in span_args(trace, span_index)]
    write(_descriptors(trace, os_threads, layout.tracks))
    write(b"".join(_packet(_bytes(60, _uint(1, _GPU_UUID + k) + _uint(5, _PROCESS_UUID)
                                  + _str(2, gpu_track_name(*t))))
                   for k, t in enumerate(gs.tracks)))
    steps_packets, n_steps = _steps(trace, plan, 2 + n_tracks)
    write(steps_packets)
    write(_memory_counters(trace, plan, 3 + n_tracks))
    block = info_block(trace, plan)
    write(_info_event(int(all_start.min()) if len(all_start) else plan.base_ns, block))
    extra, extra_annotations = _extra_annotations(trace, span_index, len(all_start))
    if len(ks.start) and launch_time_only(trace):  # their host time is launch time
        if not len(extra):
            extra = np.full(len(all_start), -1, np.int64)
        extra[kernels_at:kernels_at + len(ks.start)] = len(extra_annotations)
        extra_annotations = extra_annotations + [_bytes(4, _annotation("launch", True))]
    if gpu_extras:
        if not len(extra):
            extra = np.full(len(all_start), -1, np.int64)
        extra[gpu_at:gpu_at + len(gpu_extras)] = len(extra_annotations) + np.arange(
            len(gpu_extras))
        extra_annotations = extra_annotations + gpu_extras
    columns = {
        "start_ns": all_start, "end_ns": col(end, np.int64), "track": col(track, np.uint32),
        "name": col(name, np.uint32), "cat": col(cat, np.uint8), "flags": col(flags, np.uint8),
        "str_a": col(str_a, np.int64), "str_b": col(str_b, np.int64),
        "int_a": col(int_a, np.int64), "int_b": col(int_b, np.int64), "extra": extra,
    }
    result = _C.write_perfetto_slices(
        write, columns, track_uuid=np.r_[np.arange(2, 2 + n_tracks, dtype=np.uint64),
                                         _GPU_UUID + np.arange(len(gs.tracks), dtype=np.uint64)],
        names=names,
        strings=strings, cat_names=cats, extra_annotations=extra_annotations,
        first_sequence_id=_DESCRIPTOR_SEQUENCE + 1, chunk_bytes=chunk_bytes, args=args,
    )
    return {"slices": int(result["slices"]), "not_nested": int(result["not_nested"])}
