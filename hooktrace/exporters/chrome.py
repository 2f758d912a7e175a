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
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

import torch  # noqa: F401  (loads libc10 for _C)
from hooktrace import _C
from hooktrace._output import open_output
from hooktrace.reading import CAT_BACKWARD, CAT_NAMES, Spans
from hooktrace.tracefile import FORMAT_VERSION

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = [
    "CHUNK_BYTES",
    "NODE_CAT",
    "SPAN_CATS",
    "STEP_CAT",
    "TrackLayout",
    "UNATTRIBUTED_CAT",
    "export_chrome",
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
    compresslevel: int = 1,
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
        write_chrome(trace, f, nodes=nodes)


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
    chunk_bytes: int = CHUNK_BYTES,
) -> None:
    """Spans ``index`` (with these times and rows) as ``,\\n{event}`` items."""
    spans = trace.spans()
    names_json, args_json = module_json(trace.modules)
    _C.write_chrome_events(
        write,
        np.ascontiguousarray(start, np.int64),
        np.ascontiguousarray(end, np.int64),
        np.ascontiguousarray(spans.module[index]),
        np.ascontiguousarray(tid, np.uint32),
        np.ascontiguousarray(spans.call[index]),
        np.ascontiguousarray(spans.flags[index]),
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
) -> None:
    """Autograd nodes ``index`` (with these times and rows) as ``,\\n{event}`` items."""
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
        node_names_json,
        module_names_json,
        cat,
        base_ns,
        trace.pid,
        chunk_bytes,
    )


def write_chrome(
    trace: TraceData, f: _Writable | BinaryIO, *, nodes: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
) -> None:
    """Stream ``trace`` as Chrome trace JSON into the binary file object ``f``.

    Events come in span order (forward and recompute, then backward), then the
    attributed autograd nodes (``nodes=True`` only), then the unattributed ones.
    """
    from hooktrace import __version__

    spans = trace.spans()
    node_table = spans.nodes
    pid = trace.pid
    steps = trace.steps()
    if len(spans) or len(node_table) or len(steps):
        base_ns = min(int(a.min()) for a in (spans.start_ns, node_table.start_ns, steps.start_ns)
                      if len(a))
        base_ns = base_ns // 1000 * 1000
    else:
        base_ns = int(trace.info.get("start_unix_ns", trace.clock.unix_ns0)) // 1000 * 1000
    attributed = node_table.span >= 0
    backward = np.flatnonzero(spans.cat == CAT_BACKWARD)
    os_threads = np.union1d(np.union1d(spans.threads, spans.tid), node_table.tid).astype(np.int64)
    layout = TrackLayout(
        spans, span_start=spans.start_ns, span_end=spans.end_ns,
        node_start=node_table.start_ns, node_end=node_table.end_ns, backward=backward,
        nodes_on_backward=np.flatnonzero(attributed) if nodes else _empty(),
        unattributed=np.flatnonzero(~attributed), forward=_empty(), used_tids=os_threads,
    )
    thread_names = trace.info.get("thread_names")
    meta_events: list[dict[str, Any]] = [
        {
            "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": f"hooktrace {trace.hostname} pid {pid}"},
        }
    ]
    meta_events += layout.metadata(pid, thread_names, named=os_threads.tolist())
    head = '{"traceEvents":[\n' + ",\n".join(_dumps(e) for e in meta_events)
    f.write(head.encode("utf-8"))

    node_counts = None
    if len(node_table):
        node_counts = np.bincount(node_table.span[attributed],
                                  minlength=len(spans)).astype(np.int64)
        node_counts[spans.cat != CAT_BACKWARD] = -1
    row = spans.tid.copy()
    row[backward] = layout.backward_tid
    write_span_events(f.write, trace, np.arange(len(spans)), spans.start_ns, spans.end_ns, row,
                      base_ns, node_counts=node_counts, chunk_bytes=chunk_bytes)
    for idx, tid, cat in ((np.flatnonzero(attributed) if nodes else _empty(), layout.node_tid,
                           NODE_CAT),
                          (np.flatnonzero(~attributed), layout.unattributed_tid,
                           UNATTRIBUTED_CAT)):
        write_node_events(f.write, trace, idx, node_table.start_ns[idx], node_table.end_ns[idx],
                          tid, cat, base_ns, chunk_bytes=chunk_bytes)

    tracks = layout.track_table()
    first_free = max([t["tid"] for t in tracks] + os_threads.tolist() + [0]) + 1
    step_track = write_steps(f.write, trace, first_free, base_ns)
    if step_track is not None:
        tracks.append(step_track)

    unattributed = ~attributed
    block = {
        "version": __version__,
        "format_version": FORMAT_VERSION,
        "dropped_events": trace.dropped_events,
        "overwritten_events": trace.overwritten_events,
        "orphan_exits": spans.orphan_exits,
        "unfinished_spans": spans.unfinished,
        "backward_spans": len(backward),
        "autograd_nodes": len(node_table),
        "unattributed_nodes": int(np.count_nonzero(unattributed)),
        "unattributed_ns": int(node_table.self_ns[unattributed].sum()),
        "steps": len(trace.steps()),
        "tracks": tracks,
    }
    tail = (
        '\n],\n"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(base_ns)
        + ',\n"hooktrace":' + _dumps(block) + "}\n"
    )
    f.write(tail.encode("utf-8"))
