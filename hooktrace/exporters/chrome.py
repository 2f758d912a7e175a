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
  export), ``hooktrace.autograd_node`` and ``hooktrace.autograd_unattributed``
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

import torch  # noqa: F401  (loads libc10 for _C)
from hooktrace import _C
from hooktrace._filters import SPAN_CLIPPED, Cut, Filters, cut
from hooktrace._output import open_output
from hooktrace.reading import CAT_BACKWARD, CAT_NAMES, Spans
from hooktrace.tracefile import FORMAT_VERSION

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
    "write_steps",
]

# Event categories, the same in exports and merged traces.
SPAN_CATS = tuple(f"hooktrace.{c}" for c in CAT_NAMES)  # indexed by Spans.cat
NODE_CAT = "hooktrace.autograd_node"
UNATTRIBUTED_CAT = "hooktrace.autograd_unattributed"

# Track kinds, in the order a thread's tracks are listed below it.
KIND_FORWARD, KIND_BACKWARD, KIND_UNATTRIBUTED = 0, 1, 2
_KIND_NAMES = ("forward", "backward", "unattributed")

# Bytes handed to each file.write(): big enough to amortize the Python call and
# gzip's per-call cost, small enough not to matter for memory.
CHUNK_BYTES = 1 << 20


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


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def module_json(modules: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Per module slot: the JSON event name (class name for the root) and the
    ``{"module":...,"type":...`` args prefix that ``_C.write_chrome_events`` completes."""
    names = [_dumps(name if name else type_name) for name, type_name in modules]
    args = ['{"module":' + _dumps(name) + ',"type":' + _dumps(type_name)
            for name, type_name in modules]
    return names, args


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


def write_steps(write: Any, trace: TraceData, tid: int, base_ns: int,
                window: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """The run's steps as ``,\n{event}`` items on their own row ``tid`` named "steps"
    (placed above the threads), clipped to ``window``; returns the row's entry for the
    ``"tracks"`` table, or None when the run has no steps in the window.

    Each step is an X event ``"step N"`` (category ``hooktrace.step``, args ``step``
    and ``complete``: False for the last one when no mark ended it).
    """
    steps = trace.steps()
    lo, hi = window if window is not None else (-(1 << 62), 1 << 62)
    keep = np.flatnonzero((steps.end_ns >= lo) & (steps.start_ns <= hi))
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


def _micros(ns: int) -> str:
    """Exact ``<us>.<3 digits>`` text of integer nanoseconds (as csrc/chrome_writer does)."""
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def write_span_events(
    write: Any, trace: TraceData, index: np.ndarray, start: np.ndarray, end: np.ndarray,
    tid: np.ndarray, base_ns: int, *, node_counts: np.ndarray | None = None,
    chunk_bytes: int = CHUNK_BYTES, flags: np.ndarray | None = None,
) -> None:
    """Spans ``index`` (with these times and rows) as ``,\\n{event}`` items;
    ``flags`` (per written span) replaces the spans' own (adds SPAN_CLIPPED)."""
    spans = trace.spans()
    names_json, args_json = module_json(trace.modules)
    _C.write_chrome_events(
        write,
        np.ascontiguousarray(start, np.int64),
        np.ascontiguousarray(end, np.int64),
        np.ascontiguousarray(spans.module[index]),
        np.ascontiguousarray(tid, np.uint32),
        np.ascontiguousarray(spans.call[index]),
        np.ascontiguousarray(spans.flags[index] if flags is None else flags, np.uint8),
        np.ascontiguousarray(spans.cat[index]),
        _empty() if node_counts is None else np.ascontiguousarray(node_counts[index]),
        names_json,
        args_json,
        list(SPAN_CATS),
        base_ns,
        trace.pid,
        chunk_bytes,
    )


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
    _C.write_chrome_nodes(
        write,
        np.ascontiguousarray(start, np.int64),
        np.ascontiguousarray(end, np.int64),
        np.ascontiguousarray(node_table.name[index]),
        np.ascontiguousarray(tid, np.uint32),
        np.ascontiguousarray(node_table.seq[index]),
        np.ascontiguousarray(node_table.pass_id[index]),
        module,
        np.zeros(0, np.uint8) if flags is None else np.ascontiguousarray(flags, np.uint8),
        node_names_json,
        module_names_json,
        cat,
        base_ns,
        trace.pid,
        chunk_bytes,
    )


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
    lo, hi = c.window
    in_window = ((steps.end_ns >= (lo if lo is not None else -(1 << 62)))
                 & (steps.start_ns <= (hi if hi is not None else 1 << 62)))
    step_starts = np.maximum(steps.start_ns[in_window], lo if lo is not None else -(1 << 62))
    starts = [int(a.min()) for a in (c.span_start[kept], c.node_start[on_backward],
                                     c.node_start[loose], step_starts) if len(a)]
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


def info_block(trace: TraceData, plan: ExportPlan,
               step_track: dict[str, Any] | None = None) -> dict[str, Any]:
    """The export's ``"hooktrace"`` block: versions, loss counts, steps, tracks, filters."""
    from hooktrace import __version__

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

    first_free = max([t["tid"] for t in plan.layout.track_table()]
                     + plan.os_threads.tolist() + [0]) + 1
    lo, hi = plan.cut.window
    step_track = write_steps(f.write, trace, first_free, base_ns,
                             None if lo is None and hi is None else
                             (-(1 << 62) if lo is None else lo, 1 << 62 if hi is None else hi))
    tail = (
        '\n],\n"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(base_ns)
        + ',\n"hooktrace":' + _dumps(info_block(trace, plan, step_track)) + "}\n"
    )
    f.write(tail.encode("utf-8"))
