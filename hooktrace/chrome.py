"""Chrome / Perfetto trace export (JSON object format), streamed in ~1 MB chunks.

Span times are written relative to ``baseTimeNanoseconds`` (the earliest span
start, floored to a microsecond) as exact ``<us>.<3 digits>`` decimals printed
from integer nanoseconds: absolute Unix microseconds do not fit a double to the
nanosecond, and exact decimals keep children inside their parents. This is the
convention of the PyTorch profiler's (kineto's) traces.

Rows (Chrome "tid"s). Forward and recompute spans are drawn on their OS
thread's own row (tid = OS tid), with cat "forward" / "recompute"; they nest
strictly there. Backward spans (cat "backward") may overlap their siblings, so
each OS thread T gets backward tracks of its own, split into lanes by
``_C.assign_lanes`` (each span preferring its parent's lane, each node its
span's) so that every row nests strictly:

* ``"<T's name> backward"`` (lane 0), ``"<T's name> backward (overlap k)"``
  (lane k >= 1): backward spans run on T, plus with ``nodes=True`` the autograd
  nodes (cat "autograd_node") attributed to a module, laid out together with
  the spans so that a node sits inside its span where the lanes allow;
* ``"<T's name> autograd (unattributed)"`` (``", overlap k)"`` for extra
  lanes): autograd nodes attributed to no module call (cat
  "autograd_unattributed"), always written so that no backward time vanishes.

Track tids are synthetic: ``TRACK_TID_BASE`` (2**30, above any Linux tid;
raised past the largest OS tid if need be) plus a dense index over the tracks
ordered by (OS tid, backward before unattributed, lane). ``thread_sort_index``
metadata places each thread's tracks right below it, and the top-level
"hooktrace" block lists them under "tracks" as ``{"tid", "thread", "kind",
"lane"}``.

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
    >>> x["name"], x["ts"], x["dur"], doc["baseTimeNanoseconds"]
    ('Net', 0.5, 2.501, 1000)
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import numpy as np

import torch  # noqa: F401  (loads libc10 for _C)
from hooktrace import _C
from hooktrace.reading import CAT_BACKWARD, CAT_NAMES, Spans
from hooktrace.tracefile import FORMAT_VERSION

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["export_chrome", "write_chrome", "CHUNK_BYTES", "TRACK_TID_BASE"]

# First synthetic tid of the backward / unattributed tracks: Linux tids stay
# below 2**22 (PID_MAX_LIMIT), and Perfetto reads JSON tids as 32-bit.
TRACK_TID_BASE = 1 << 30
_BACKWARD, _UNATTRIBUTED = 0, 1
_TRACK_KINDS = ("backward", "unattributed")

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
    docstring); unattributed nodes are written either way.

    ``compresslevel`` 1 is the default because zlib is the bottleneck of a
    gzip export: on this JSON, level 1 runs at 320 MB/s with ratio 9.4, level 6
    at 114 MB/s with ratio 11.2, and gzip.open's default 9 slower still
    (measured on 100 MB of a synthetic export, 2-core machine).
    """
    if os.fspath(path).endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=compresslevel) as f:
            write_chrome(trace, f, nodes=nodes)
    else:
        with open(path, "wb") as f:
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


def _thread_name(thread_names: Any, tid: int) -> str:
    if isinstance(thread_names, dict):
        for key in (tid, str(tid)):
            if key in thread_names:
                return str(thread_names[key])
    return f"thread {tid}"


class _Layout:
    """Which row every written event goes on, and the tracks' metadata."""

    def __init__(self, spans: Spans, with_nodes: bool) -> None:
        nodes = spans.nodes
        self.backward = np.flatnonzero(spans.cat == CAT_BACKWARD)
        attributed = nodes.span >= 0
        self.attributed_nodes = (np.flatnonzero(attributed) if with_nodes
                                 else np.zeros(0, np.int64))
        self.unattributed_nodes = np.flatnonzero(~attributed)
        b, a, u = self.backward, self.attributed_nodes, self.unattributed_nodes

        # Backward spans and the attributed nodes share the backward lanes of
        # the thread that ran them; spans come first so that a node whose
        # interval equals its span's is drawn inside it, not around it. Each
        # span prefers its parent span's lane and each node its span's, so
        # that they land under the right module where the lanes allow.
        position = np.full(len(spans), -1, np.int64)
        position[b] = np.arange(len(b))
        parent = spans.parent[b]
        prefer = np.concatenate([np.where(parent >= 0, position[np.maximum(parent, 0)], -1),
                                 position[nodes.span[a]]])
        b_tid = np.concatenate([spans.tid[b], nodes.tid[a]])
        b_lane = _C.assign_lanes(np.concatenate([spans.start_ns[b], nodes.start_ns[a]]),
                                 np.concatenate([spans.end_ns[b], nodes.end_ns[a]]), b_tid,
                                 prefer)
        u_tid = nodes.tid[u]
        u_lane = _C.assign_lanes(nodes.start_ns[u], nodes.end_ns[u], u_tid)
        keys = np.concatenate([
            (b_tid.astype(np.uint64) << np.uint64(32)) | b_lane.astype(np.uint64),
            (u_tid.astype(np.uint64) << np.uint64(32)) | np.uint64(1 << 31)
            | u_lane.astype(np.uint64),
        ])
        track_keys, track_of = np.unique(keys, return_inverse=True)

        self.os_threads = np.union1d(np.union1d(spans.threads, spans.tid), nodes.tid)
        top = int(self.os_threads.max()) + 1 if len(self.os_threads) else 0
        base = max(TRACK_TID_BASE, top)
        if base + len(track_keys) > 1 << 32:
            raise ValueError(f"too many threads/tracks for 32-bit Chrome tids: OS tids up to "
                             f"{top - 1}, {len(track_keys)} backward tracks")
        track_tid = (base + track_of.reshape(-1)).astype(np.uint32)
        self.span_tid = spans.tid
        if len(b):
            self.span_tid = spans.tid.copy()
            self.span_tid[b] = track_tid[: len(b)]
        self.attributed_tid = np.ascontiguousarray(track_tid[len(b) : len(b) + len(a)])
        self.unattributed_tid = np.ascontiguousarray(track_tid[len(b) + len(a) :])
        # (synthetic tid, OS tid, kind, lane), in tid order = display order
        self.tracks = [
            (base + i, int(k >> 32), int(k >> 31) & 1, int(k) & 0x7FFF_FFFF)
            for i, k in enumerate(track_keys.tolist())
        ]

    def metadata(self, pid: int, thread_names: Any) -> list[dict[str, Any]]:
        """thread_name and thread_sort_index events for every OS thread and track."""
        out: list[dict[str, Any]] = []
        tracks_of: dict[int, list[tuple[int, int, int, int]]] = {}
        for track in self.tracks:
            tracks_of.setdefault(track[1], []).append(track)
        order = 0
        for tid in self.os_threads.tolist():
            name = _thread_name(thread_names, tid)
            rows = [(tid, name)]
            for track_tid, _, kind, lane in tracks_of.get(tid, []):
                if kind == _BACKWARD:
                    label = "backward" + (f" (overlap {lane})" if lane else "")
                else:
                    label = "autograd (unattributed" + (f", overlap {lane}" if lane else "") + ")"
                rows.append((track_tid, f"{name} {label}"))
            for row_tid, row_name in rows:
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": row_tid,
                            "args": {"name": row_name}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": row_tid,
                            "args": {"sort_index": order}})
                order += 1
        return out

    def track_table(self) -> list[dict[str, Any]]:
        return [{"tid": t, "thread": os_tid, "kind": _TRACK_KINDS[kind], "lane": lane}
                for t, os_tid, kind, lane in self.tracks]


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
    if len(spans) or len(node_table):
        base_ns = min(int(a.min()) for a in (spans.start_ns, node_table.start_ns) if len(a))
        base_ns = base_ns // 1000 * 1000
    else:
        base_ns = int(trace.info.get("start_unix_ns", trace.clock.unix_ns0)) // 1000 * 1000
    layout = _Layout(spans, nodes)

    meta_events: list[dict[str, Any]] = [
        {
            "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": f"hooktrace {trace.hostname} pid {pid}"},
        }
    ]
    meta_events += layout.metadata(pid, trace.info.get("thread_names"))
    head = '{"traceEvents":[\n' + ",\n".join(_dumps(e) for e in meta_events)
    f.write(head.encode("utf-8"))

    names_json, args_json = module_json(trace.modules)
    node_counts = np.zeros(0, np.int64)
    if len(node_table):
        attributed = node_table.span[node_table.span >= 0]
        node_counts = np.bincount(attributed, minlength=len(spans)).astype(np.int64)
        node_counts[spans.cat != CAT_BACKWARD] = -1
    _C.write_chrome_events(
        f.write,
        np.ascontiguousarray(spans.start_ns),
        np.ascontiguousarray(spans.end_ns),
        np.ascontiguousarray(spans.module),
        np.ascontiguousarray(layout.span_tid),
        np.ascontiguousarray(spans.call),
        np.ascontiguousarray(spans.flags),
        np.ascontiguousarray(spans.cat),
        node_counts,
        names_json,
        args_json,
        list(CAT_NAMES),
        base_ns,
        pid,
        chunk_bytes,
    )
    if len(node_table):
        _write_nodes(trace, f, layout, base_ns, chunk_bytes)

    unattributed = layout.unattributed_nodes
    block = {
        "version": __version__,
        "format_version": FORMAT_VERSION,
        "dropped_events": trace.dropped_events,
        "overwritten_events": trace.overwritten_events,
        "orphan_exits": spans.orphan_exits,
        "unfinished_spans": spans.unfinished,
        "backward_spans": len(layout.backward),
        "autograd_nodes": len(node_table),
        "unattributed_nodes": len(unattributed),
        "unattributed_ns": int(node_table.self_ns[unattributed].sum()),
        "tracks": layout.track_table(),
    }
    tail = (
        '\n],\n"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(base_ns)
        + ',\n"hooktrace":' + _dumps(block) + "}\n"
    )
    f.write(tail.encode("utf-8"))


def _write_nodes(trace: TraceData, f: _Writable | BinaryIO, layout: _Layout, base_ns: int,
                 chunk_bytes: int) -> None:
    """The attributed nodes chosen by ``layout``, then all unattributed nodes."""
    spans = trace.spans()
    node_table = spans.nodes
    n_names = max(len(trace.node_names), int(node_table.name.max()) + 1)
    node_names_json = [
        _dumps(trace.node_names[i] if i < len(trace.node_names) else f"<node {i}>")
        for i in range(n_names)
    ]
    module_names_json = [_dumps(name) for name, _ in trace.modules]
    for idx, tid, cat in ((layout.attributed_nodes, layout.attributed_tid, "autograd_node"),
                          (layout.unattributed_nodes, layout.unattributed_tid,
                           "autograd_unattributed")):
        if not len(idx):
            continue
        span = node_table.span[idx]
        module = np.where(span >= 0, spans.module[np.maximum(span, 0)].astype(np.int64), -1)
        _C.write_chrome_nodes(
            f.write,
            np.ascontiguousarray(node_table.start_ns[idx]),
            np.ascontiguousarray(node_table.end_ns[idx]),
            np.ascontiguousarray(node_table.name[idx]),
            tid,
            np.ascontiguousarray(node_table.seq[idx]),
            np.ascontiguousarray(node_table.pass_id[idx]),
            np.ascontiguousarray(module),
            node_names_json,
            module_names_json,
            cat,
            base_ns,
            trace.pid,
            chunk_bytes,
        )
