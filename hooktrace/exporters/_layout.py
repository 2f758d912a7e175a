"""The one convention every hooktrace trace follows, whatever its format.

Categories, row (track) names, and which row every written span and autograd
node goes on: :class:`TrackLayout` (lanes so that every row nests strictly) and
:func:`plan_export` (a run, cut down by filters, as the slices an exporter
writes). The Chrome JSON exporter, the Perfetto protobuf exporter and the merge
with profiler traces all use it, and none of them imports another; the rules
are described in :mod:`hooktrace.exporters.chrome`'s docstring and the README.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from hooktrace._native import load_native
from hooktrace.analysis.kernel_time import device_table
from hooktrace.analysis.kernels import Kernels
from hooktrace.analysis._filters import OPEN_WINDOW, SPAN_CLIPPED, Cut, Filters, cut
from hooktrace.analysis.columns import PROVIDERS
from hooktrace.analysis.numerics import COUNTER_NAME as NUMERICS_COUNTER
from hooktrace.analysis.numerics import counter_points as numerics_counter
from hooktrace.analysis.numerics import numerics_info
from hooktrace.reading import CAT_BACKWARD, CAT_NAMES, Spans
from hooktrace.format import FORMAT_VERSION

_C = load_native()  # torch's libraries, not torch (hooktrace._native)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

# Bytes handed to each file.write(): big enough to amortize the Python call and
# gzip's per-call cost, small enough not to matter for memory.
CHUNK_BYTES = 1 << 20

# Event categories, the same in exports and merged traces.
SPAN_CATS = tuple(f"hooktrace.{c}" for c in CAT_NAMES)  # indexed by Spans.cat
NODE_CAT = "hooktrace.autograd_node"
# Kernel-derived slices (hooktrace.analysis.kernels): one per kernel run inside a compiled region,
# named by the module it is attributed to, on its region span's row.
KERNEL_CAT = "hooktrace.kernel"
UNATTRIBUTED_CAT = "hooktrace.autograd_unattributed"
# Device time of module calls (trace(gpu=True), hooktrace.analysis.device_time): one slice per
# timed interval, on a row per device and stream ("GPU 0 stream 7"), indexed by cat.
GPU_CATS = tuple(f"hooktrace.gpu_{c}" for c in CAT_NAMES)

# Track kinds, in the order a thread's tracks are listed below it.
KIND_FORWARD, KIND_BACKWARD, KIND_UNATTRIBUTED = 0, 1, 2
_KIND_NAMES = ("forward", "backward", "unattributed")

def thread_label(thread_names: Any, tid: int) -> str:
    """The Python thread name recorded for OS thread ``tid``, else ``"thread <tid>"``."""
    if isinstance(thread_names, dict):
        for key in (tid, str(tid)):
            name = thread_names.get(key)
            if isinstance(name, str) and name:
                return name
    return f"thread {tid}"


def track_name(thread: str, kind: int, lane: int) -> str:
    """Row name of a hooktrace track of ``thread`` (see the module docstring).

    Example:
        >>> track_name("MainThread", KIND_BACKWARD, 0), track_name("MainThread", KIND_BACKWARD, 2)
        ('MainThread backward', 'MainThread backward (overlap 2)')
        >>> track_name("w", KIND_UNATTRIBUTED, 1), track_name("w", KIND_FORWARD, 0)
        ('w autograd (unattributed, overlap 1)', 'w forward')
    """
    if kind == KIND_FORWARD:
        return f"{thread} forward" + (f" (overlap {lane})" if lane else "")
    if kind == KIND_BACKWARD:
        return f"{thread} backward" + (f" (overlap {lane})" if lane else "")
    return f"{thread} autograd (unattributed" + (f", overlap {lane}" if lane else "") + ")"


def gpu_track_name(device: int, stream: int, lane: int) -> str:
    """Row name of a device stream's slices (``lane`` > 0: intervals that did not nest).

    Example:
        >>> gpu_track_name(0, 7, 0), gpu_track_name(1, 13, 1)
        ('GPU 0 stream 7', 'GPU 1 stream 13 (overlap 1)')
    """
    return f"GPU {device} stream {stream}" + (f" (overlap {lane})" if lane else "")


class GpuSlices(NamedTuple):
    """The device intervals to write (:func:`gpu_slices`): ``rows`` of the run's
    GpuSpans, ``start``/``end`` (Unix ns, clipped to the window), ``track`` (index into
    ``tracks``: ``(device, stream, lane)``, in that order) and ``call`` (the host
    call's ordinal; a kernel site's: its n-th interval of the module)."""

    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    track: np.ndarray
    call: np.ndarray
    tracks: list[tuple[int, int, int]]


def gpu_slices(trace: TraceData, window: tuple[int, int] | None = None) -> GpuSlices:
    """The run's device intervals (``device_time.gpu_spans(trace)``) that overlap ``window``, on
    one row per (device, stream), with overlap lanes (``_C.assign_lanes``) wherever
    intervals of one stream would not nest strictly. Times are the device's, aligned
    to the host clock, so the rows sit under the host's. With kernel busy time (CUPTI),
    each kernel under its module (:func:`hooktrace.analysis.kernel_time.device_table`)."""
    gpu = device_table(trace)[0]
    lo, hi = window if window is not None else (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
    keep = np.flatnonzero((gpu.end_ns >= lo) & (gpu.start_ns <= hi)
                          & (gpu.end_ns >= gpu.start_ns))
    start = np.maximum(gpu.start_ns[keep], lo).astype(np.int64)
    end = np.minimum(gpu.end_ns[keep], hi).astype(np.int64)
    dev, stream = gpu.device[keep].astype(np.int64), gpu.stream[keep].astype(np.int64)
    pairs, group = (np.unique(np.stack([dev, stream], 1), axis=0, return_inverse=True)
                    if len(keep) else (np.zeros((0, 2), np.int64), np.zeros(0, np.int64)))
    group = group.reshape(-1)
    lane = (_C.assign_lanes(np.ascontiguousarray(start), np.ascontiguousarray(end),
                            group.astype(np.uint32)).astype(np.int64)
            if len(keep) else np.zeros(0, np.int64))
    keys, track = (np.unique(group * (1 << 20) + lane, return_inverse=True)
                   if len(keep) else (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    tracks = [(int(pairs[k >> 20][0]), int(pairs[k >> 20][1]), int(k & ((1 << 20) - 1)))
              for k in keys.tolist()]
    spans = trace.spans()
    span = gpu.span[keep]
    has = (span >= 0) & (span < len(spans))
    call = np.zeros(len(keep), np.int64)
    if len(spans):
        call[has] = spans.call[span[has]]
    loose = np.flatnonzero(~has)  # kernel sites: the n-th of the module's, in time order
    if len(loose):
        order = loose[np.lexsort((gpu.start_ns[keep][loose], gpu.module[keep][loose]))]
        m = gpu.module[keep][order].astype(np.int64)
        first = np.r_[0, np.flatnonzero(np.diff(m)) + 1]
        call[order] = np.arange(len(order)) - np.repeat(first, np.diff(np.r_[first, len(m)]))
    return GpuSlices(keep, start, end, track.reshape(-1).astype(np.int64), call, tracks)


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


class TrackLayout:
    """The synthetic tracks of one run's events, and which track each event goes on.

    ``backward``: span indices of the backward spans to write, on the backward
    lanes of their thread, each preferring its parent span's lane;
    ``nodes_on_backward``: autograd node indices drawn on those lanes too
    (export ``nodes=True``), each preferring its span's lane; ``unattributed``:
    node indices for the unattributed lanes; ``forward``: span indices of forward
    spans moved off their thread's row (merge). ``span_start``/``span_end`` and
    ``node_start``/``node_end`` are the (possibly clipped or widened) times of
    all spans and nodes. Synthetic tids start above ``max(used_tids)``.
    """

    def __init__(
        self, spans: Spans, *, span_start: np.ndarray, span_end: np.ndarray,
        node_start: np.ndarray, node_end: np.ndarray, backward: np.ndarray,
        nodes_on_backward: np.ndarray, unattributed: np.ndarray, forward: np.ndarray,
        used_tids: np.ndarray,
    ) -> None:
        nodes = spans.nodes
        b, a, u, f = backward, nodes_on_backward, unattributed, forward
        position = np.full(len(spans), -1, np.int64)
        position[b] = np.arange(len(b))
        parent = spans.parent[b]
        prefer = np.concatenate([
            np.where(parent >= 0, position[np.maximum(parent, 0)], -1) if len(b) else _empty(),
            position[nodes.span[a]] if len(a) else _empty(),
        ])
        b_tid = np.concatenate([spans.tid[b], nodes.tid[a]]).astype(np.uint32)
        b_lane = _C.assign_lanes(np.concatenate([span_start[b], node_start[a]]),
                                 np.concatenate([span_end[b], node_end[a]]), b_tid, prefer)
        u_tid = nodes.tid[u].astype(np.uint32)
        u_lane = _C.assign_lanes(np.ascontiguousarray(node_start[u]),
                                 np.ascontiguousarray(node_end[u]), u_tid)
        f_tid = spans.tid[f].astype(np.uint32)
        f_lane = _C.assign_lanes(np.ascontiguousarray(span_start[f]),
                                 np.ascontiguousarray(span_end[f]), f_tid)

        def keys(tid: np.ndarray, kind: int, lane: np.ndarray) -> np.ndarray:
            return ((tid.astype(np.uint64) << np.uint64(32)) | np.uint64(kind << 30)
                    | lane.astype(np.uint64))

        all_keys = np.concatenate([keys(f_tid, KIND_FORWARD, f_lane),
                                   keys(b_tid, KIND_BACKWARD, b_lane),
                                   keys(u_tid, KIND_UNATTRIBUTED, u_lane)])
        track_keys, track_of = np.unique(all_keys, return_inverse=True)
        used = np.asarray(used_tids, np.int64)
        first = int(used.max()) + 1 if len(used) else 1
        if first + len(track_keys) > 1 << 31:
            raise ValueError(f"too many tracks for 32-bit Chrome tids: tids up to {first - 1}, "
                             f"{len(track_keys)} hooktrace tracks")
        track_tid = (first + track_of.reshape(-1)).astype(np.uint32)
        nf, nb = len(f), len(b)
        self.forward_tid = np.ascontiguousarray(track_tid[:nf])
        self.backward_tid = np.ascontiguousarray(track_tid[nf:nf + nb])
        self.node_tid = np.ascontiguousarray(track_tid[nf + nb:nf + nb + len(a)])
        self.unattributed_tid = np.ascontiguousarray(track_tid[nf + nb + len(a):])
        # (synthetic tid, OS tid, kind, lane), in tid order = display order
        self.tracks = [(first + i, int(k >> 32), int(k >> 30) & 3, int(k) & 0x3FFF_FFFF)
                       for i, k in enumerate(track_keys.tolist())]
        self.next_tid = first + len(track_keys)  # the first tid above every used one
        self.lanes = max((lane + 1 for _, _, kind, lane in self.tracks if kind == KIND_BACKWARD),
                         default=0)

    def metadata(self, pid: int, thread_names: Any, named: Sequence[int] = (),
                 sorted_too: Sequence[int] = ()) -> list[dict[str, Any]]:
        """thread_name events for the OS rows ``named`` and every track, and
        thread_sort_index events placing each OS thread's tracks right below it
        (for ``named``, ``sorted_too`` and the tracks' threads).

        Sort index of OS thread T: ``T * 64``; of its k-th track: ``T * 64 + 1 + k``
        (k capped at 62): Linux tids < 2**22 keep this below 2**28, and kineto's
        own index for a thread row (its tid) is replaced by the same rule.
        """
        out: list[dict[str, Any]] = []

        def row(tid: int, name: str | None, order: int) -> None:
            if name is not None:
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": order}})

        named_set = set(named)
        threads = sorted(named_set | set(sorted_too) | {t[1] for t in self.tracks})
        k_of: dict[int, int] = {}
        for t in threads:
            row(t, thread_label(thread_names, t) if t in named_set else None, t * 64)
        for tid, os_tid, kind, lane in self.tracks:
            k = k_of[os_tid] = k_of.get(os_tid, -1) + 1
            row(tid, track_name(thread_label(thread_names, os_tid), kind, lane),
                os_tid * 64 + 1 + min(k, 62))
        return out

    def track_table(self) -> list[dict[str, Any]]:
        return [{"tid": t, "thread": os_tid, "kind": _KIND_NAMES[kind], "lane": lane}
                for t, os_tid, kind, lane in self.tracks]


STEP_CAT = "hooktrace.step"


def counter_tracks(trace: TraceData, window: tuple[int, int] | None
                   ) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """The counters of every format, clipped to ``window``: per recorded device
    (``trace(memory=True)``) its allocated bytes, and with ``numerics=True`` the
    non-finite values so far; each ``(name, arg name, times, values)``."""
    from hooktrace.analysis.memory import counter_name, counter_points, memory_devices

    tracks = [(counter_name(device), "allocated_bytes", *counter_points(trace, device, window))
              for device in memory_devices(trace)]
    if numerics_info(trace.info) is not None:
        tracks.append((NUMERICS_COUNTER, "nonfinite", *numerics_counter(trace, window)))
    return tracks


def span_args(trace: TraceData, index: np.ndarray) -> list[tuple[str, np.ndarray | None]]:
    """The recorded quantities' arguments of spans ``index``, every column provider's
    (:meth:`~hooktrace.analysis.column_provider.ColumnProvider.export_args`), as the
    native writers' ``args``: ``(name, values or None)``, in order."""
    return [(a.name, None if a.values is None else np.ascontiguousarray(a.values))
            for p in PROVIDERS for a in p.export_args(trace, index)]


@dataclass
class ExportPlan:
    """What an export writes and where: the one convention applied to a (cut) run.

    Shared by this exporter and ``hooktrace.exporters.perfetto`` so both write
    the same slices on the same rows. Per written span (span order: forward and
    recompute, then backward): ``spans`` (indices), ``start``/``end`` (clipped),
    ``row`` (OS tid or the synthetic tid of its track), ``flags`` (with
    SPAN_CLIPPED), ``node_counts`` (args ``nodes`` on backward spans, else -1;
    None when the run has no nodes). ``node_groups``: (node indices, start, end,
    row, category, flags) for the attributed nodes (``nodes=True``) and the
    unattributed ones, in that order.
    """

    spans: np.ndarray
    start: np.ndarray
    end: np.ndarray
    row: np.ndarray
    flags: np.ndarray
    node_counts: np.ndarray | None
    node_groups: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str, np.ndarray]]
    layout: TrackLayout
    os_threads: np.ndarray  # every OS thread of the run (its own named row)
    base_ns: int  # earliest written time, floored to a microsecond
    cut: Cut


def plan_export(trace: TraceData, *, nodes: bool = False,
                filters: Filters | None = None) -> ExportPlan:
    """Decide every written slice's times and row (see :class:`ExportPlan`)."""
    spans = trace.spans()
    node_table = spans.nodes
    c = cut(trace, filters)
    attributed = node_table.span >= 0
    kept = np.flatnonzero(c.spans)
    backward = kept[spans.cat[kept] == CAT_BACKWARD]
    on_backward = np.flatnonzero(attributed & c.nodes) if nodes else _empty()
    loose = np.flatnonzero(~attributed & c.nodes)
    os_threads = np.union1d(np.union1d(spans.threads, spans.tid), node_table.tid).astype(np.int64)
    layout = TrackLayout(
        spans, span_start=c.span_start, span_end=c.span_end,
        node_start=c.node_start, node_end=c.node_end, backward=backward,
        nodes_on_backward=on_backward, unattributed=loose, forward=_empty(),
        used_tids=os_threads,
    )
    steps = trace.steps()
    lo, hi = c.bounds or OPEN_WINDOW
    in_window = (steps.end_ns >= lo) & (steps.start_ns <= hi)
    step_starts = np.maximum(steps.start_ns[in_window], lo)
    # device intervals (trace(gpu=True)) in the window, clipped to it, count too
    gpu = device_table(trace)[0]
    gpu_starts = np.maximum(gpu.start_ns[(gpu.end_ns >= lo) & (gpu.start_ns <= hi)], lo)
    starts = [int(a.min()) for a in (c.span_start[kept], c.node_start[on_backward],
                                     c.node_start[loose], step_starts, gpu_starts) if len(a)]
    if starts:
        base_ns = min(starts) // 1000 * 1000
    else:
        base_ns = int(trace.info.get("start_unix_ns", trace.clock.unix_ns0)) // 1000 * 1000
    node_counts = None
    if len(node_table):
        counts = np.bincount(node_table.span[attributed], minlength=len(spans)).astype(np.int64)
        counts[spans.cat != CAT_BACKWARD] = -1
        node_counts = counts[kept]
    row = spans.tid.copy()
    row[backward] = layout.backward_tid
    flags = spans.flags[kept] | np.where(c.span_clipped[kept], SPAN_CLIPPED, 0).astype(np.uint8)
    groups = []
    for idx, tid, cat_name in ((on_backward, layout.node_tid, NODE_CAT),
                               (loose, layout.unattributed_tid, UNATTRIBUTED_CAT)):
        groups.append((idx, c.node_start[idx], c.node_end[idx], tid, cat_name,
                       np.where(c.node_clipped[idx], SPAN_CLIPPED, 0).astype(np.uint8)))
    return ExportPlan(kept, c.span_start[kept], c.span_end[kept], row[kept], flags, node_counts,
                      groups, layout, os_threads, base_ns, c)


class KernelSlices(NamedTuple):
    start: np.ndarray
    end: np.ndarray
    row: np.ndarray
    module: np.ndarray
    site: np.ndarray


def kernel_slices(trace: TraceData, spans: np.ndarray, start: np.ndarray, end: np.ndarray,
                  row: np.ndarray) -> KernelSlices:
    """The kernel runs to write (``hooktrace.analysis.kernels``): those whose region span is
    written (``spans``: the written span ids; ``start``/``end``/``row`` parallel to it:
    their written, possibly clipped, times and rows), inside those times, on that row.
    They nest in the region's slice: kernels of a thread run one after another, inside
    it."""
    k = Kernels.from_trace(trace)
    if not len(k):
        e = _empty()
        return KernelSlices(e, e, e.astype(np.uint32), e, e.astype(np.uint32))
    # one more entry, -1, for the kernels outside any recorded span (k.span -1): a run
    # with no span at all (a compiled region entered outside the traced modules) has
    # kernels and an empty span table
    n = len(trace.spans())
    where = np.full(n + 1, -1, np.int64)
    where[spans] = np.arange(len(spans))
    p = where[np.where((k.span >= 0) & (k.span < n), k.span, n)]
    ok = np.flatnonzero((p >= 0) & (k.module >= 0))
    q = p[ok]
    ok = ok[(k.start_ns[ok] >= start[q]) & (k.end_ns[ok] <= end[q])]
    return KernelSlices(k.start_ns[ok], k.end_ns[ok], row[p[ok]].astype(np.uint32),
                        k.module[ok], k.site[ok])


def info_block(trace: TraceData, plan: ExportPlan,
               step_track: dict[str, Any] | None = None) -> dict[str, Any]:
    """The export's ``"hooktrace"`` block: versions, loss counts, steps, tracks, filters."""
    from hooktrace._version import __version__

    spans = trace.spans()
    node_table = spans.nodes
    unattributed = node_table.span < 0
    block: dict[str, Any] = {
        "version": __version__,
        "format_version": FORMAT_VERSION,
        "dropped_events": trace.dropped_events,
        "overwritten_events": trace.overwritten_events,
        "orphan_exits": spans.orphan_exits,
        "unfinished_spans": spans.unfinished,
        "backward_spans": int(np.count_nonzero(spans.cat == CAT_BACKWARD)),
        "autograd_nodes": len(node_table),
        "unattributed_nodes": int(np.count_nonzero(unattributed)),
        "unattributed_ns": int(node_table.self_ns[unattributed].sum()),
        "steps": len(trace.steps()),
        "tracks": plan.layout.track_table() + ([step_track] if step_track else []),
    }
    if plan.cut.filters.active:
        block["cut"] = plan.cut.summary()
    return block


