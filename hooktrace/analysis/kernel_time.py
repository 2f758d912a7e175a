"""Kernel busy time per module (issue #49): CUPTI's device records joined to the module
spans that launched them (recorded by ``trace(gpu=True)`` on CUDA: csrc/cupti.h,
:mod:`hooktrace.record.cupti`).

The join, off the hot path:

* a record's launch is the CUPTI_LAUNCH event with its correlation id: the thread that
  launched it and when; the module is the innermost span of that thread holding that
  time (forward, recompute, or the backward span on an autograd device thread);
* a CUDA graph replay's kernels carry their graph node's id: the node created during
  the capture (on the capturing thread, inside the span that launched the captured
  kernel) names them, through the clone made at instantiation. A node hooktrace did not
  see created (a capture before the trace, a child or conditional graph) leaves its
  kernels on the span that launched the replay, counted as ``graph_unnamed``;
* records whose launch the trace does not hold (launched before it, or dropped) are
  counted (``unmatched``), never placed.

Per module and phase, three numbers (:class:`KernelTimeColumns`, the column provider):

* ``kernel_ns``: **busy time**, the union of its kernels' device intervals per stream
  (concurrent kernels on two streams both count; overlapping ones on one stream once),
  over the kernels launched anywhere inside its calls (children included: what
  torch.profiler attributes to a ``record_function`` range); ``kernel_self_ns`` the same
  over the kernels launched with no child module open;
* ``kernels``: how many kernels, copies and sets that is;
* ``kernel_idle_ns``: per call, its device extent less its busy time, summed: the
  device interval of the call where event intervals were recorded too
  (``gpu_mode="both"``), else from its first kernel's start to its last kernel's end.
  Large idle against small busy is a launch-bound module.

NCCL kernels (their time includes waiting for peers) are their own column,
``nccl_ns``, and not in busy time.

Example:
    >>> import numpy as np
    >>> union_ns(np.array([0, 0, 1]), np.array([0, 5, 0]), np.array([10, 12, 4])).tolist()
    [12, 4]
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace._events import CUPTI_GRAPH_NODE, CUPTI_KERNEL, CUPTI_KERNEL_MORE, CUPTI_LAUNCH
from hooktrace.analysis._summary_columns import COLUMNS, COMPILE_ROW, UNATTRIBUTED, group_mode
from hooktrace.analysis.device_time import gpu_spans, span_gpu
from hooktrace.analysis.kernels import Kernels
from hooktrace.analysis.column_provider import (
    Column,
    ColumnProvider,
    SpanColumn,
    SummaryPart,
    TextColumn,
    WindowGroup,
    measured_only,
)
from hooktrace._span_tables import GPU_FIELDS
from hooktrace.reading import (
    CAT_BACKWARD,
    NO_PASS,
    SPAN_EVAL,
    GpuSpans,
    Spans,
    TraceData,
)
from hooktrace.text import format_ns

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls

__all__ = ["KERNEL_COLUMNS", "device_table", "KernelRecords", "KernelTimeColumns", "SpanKernels",
           "kernel_records", "kernels_recorded", "span_kernels", "union_ns"]

KERNEL_COLUMNS = ("kernel_ns", "kernel_self_ns", "kernels", "kernel_idle_ns",
                  "kernel_bwd_ns", "kernel_bwd_self_ns", "kernels_bwd", "kernel_bwd_idle_ns",
                  "nccl_ns")
KIND_NAMES = {1: "kernel", 2: "memcpy", 3: "memset"}
SATURATED = 0xFFFF_FFFF


def kernels_recorded(trace: TraceData) -> bool:
    """Whether the run recorded kernel busy time (CUPTI)."""
    info = trace.info.get("kernels")
    return isinstance(info, dict) and "library" in info


def union_ns(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per group 0..max(group): the length of the union of its intervals [start, end)."""
    if not len(group):
        return np.zeros(0, np.int64)
    n = int(group.max()) + 1
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order].astype(np.int64), end[order].astype(np.int64)
    gmin = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(gmin, g, s)
    gmax = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(gmax, g, e)
    width = np.where(gmax >= gmin, gmax - gmin + 1, 0)
    offset = np.concatenate([[0], np.cumsum(width)[:-1]])
    # a running maximum of the ends that restarts at each group: groups are shifted
    # apart so that no earlier group's end exceeds a later group's values
    running = np.maximum.accumulate(e - gmin[g] + offset[g]) - offset[g] + gmin[g]
    first = np.r_[True, g[1:] != g[:-1]]
    prev = np.where(first, s, np.r_[s[:1], running[:-1]])
    add = np.maximum(0, e - np.maximum(s, prev))
    return np.bincount(g, weights=add, minlength=n).astype(np.int64)


@dataclass
class KernelRecords:
    """The run's device records (kernels, copies, sets), one row each, with where the
    join placed them: ``span`` (the innermost module span that launched them, -1: none),
    ``stream`` (device << 32 | stream id), ``kind`` (1 kernel, 2 memcpy, 3 memset),
    ``nccl``; ``graph``: replayed from a CUDA graph, ``by_node``: and named
    through the node its capture created; ``site_module`` / ``site_cat``: for a kernel launched from a kernel site of
    compiled code (between its marks, hooktrace.analysis.kernels), the module and phase
    the site names (-1: none; its ``span`` is the compiled region's call); and what
    could not be placed, counted."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    stream: np.ndarray
    kind: np.ndarray
    name: np.ndarray
    span: np.ndarray
    nccl: np.ndarray
    launch_ns: np.ndarray
    site_module: np.ndarray
    site_cat: np.ndarray
    graph: np.ndarray
    by_node: np.ndarray
    unmatched: int
    graph_kernels: int
    graph_unnamed: int
    unpaired: int

    def __len__(self) -> int:
        return len(self.start_ns)


def _clock(info: Mapping[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """CUPTI ns to Unix ns: the offset of the first sampled pair, and the drift between
    it and the last one where they are minutes apart (each pair is read within
    microseconds: over seconds the slope would be that jitter, not drift)."""
    pairs = [p for p in info.get("clock", []) if isinstance(p, list) and len(p) == 2
             and all(isinstance(v, int) for v in p)]
    if not pairs:
        return lambda c: c.astype(np.int64)
    (c0, u0), (c1, u1) = pairs[0], pairs[-1]
    slope = (u1 - u0) / (c1 - c0) if c1 - c0 > 60_000_000_000 else 1.0
    return lambda c: u0 + np.round((c.astype(np.int64) - c0) * slope).astype(np.int64)


def _lookup(keys: np.ndarray, values: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per ``want``: the index into ``values`` of the first equal key, or -1."""
    if not len(keys):
        return np.full(len(want), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.minimum(np.searchsorted(keys[order], want), len(keys) - 1)
    return np.where(keys[order][pos] == want, values[order][pos], -1)


def _records_of(trace: TraceData) -> KernelRecords:
    ev = trace.events
    kind = ev["kind"]
    info = trace.info.get("kernels")
    info = info if isinstance(info, dict) else {}
    # each record's two events, one after the other on its thread (a streamed file
    # interleaves threads' runs of events: pair them per thread, in recorded order)
    both = np.flatnonzero((kind == CUPTI_KERNEL) | (kind == CUPTI_KERNEL_MORE))
    both = both[np.argsort(ev["tid"][both], kind="stable")]
    first, second = both[:-1], both[1:]
    pair = ((kind[first] == CUPTI_KERNEL) & (kind[second] == CUPTI_KERNEL_MORE)
            & (ev["tid"][first] == ev["tid"][second]))
    rec, more = first[pair], second[pair]
    unpaired = int(np.count_nonzero(kind == CUPTI_KERNEL)) - len(rec)
    to_unix = _clock(info)
    start = to_unix(ev["seq"][rec])
    end = start + ev["rf_tid"][rec].astype(np.int64)
    flags = ev["flags"][rec]
    stream = (flags >> 2).astype(np.int64) << 32 | ev["id"][more].astype(np.int64)
    node = ev["seq"][more]
    name = ev["rf_tid"][more].astype(np.int64)
    raw = info.get("names")
    names: list[Any] = raw if isinstance(raw, list) else []
    nccl_names = np.array([isinstance(n, str) and n.startswith("nccl") for n in names] + [False],
                          dtype=bool)
    nccl = nccl_names[np.minimum(name, len(names))]
    # the launch point of each record: its launch (thread, time), or its graph node's
    launch = np.flatnonzero(kind == CUPTI_LAUNCH)
    at = _lookup(ev["id"][launch], launch, ev["id"][rec])
    graph = node != 0
    nodes = np.flatnonzero(kind == CUPTI_GRAPH_NODE)
    created = nodes[ev["flags"][nodes] == 1]
    cloned = nodes[ev["flags"][nodes] == 2]
    origin = node[graph].copy()
    # node -> the node it was cloned from -> ... -> the node a capture created. Follow
    # the clones first: at the end of a capture CUDA creates the executable graph's
    # nodes (outside any module call) and reports them cloned from the captured ones
    # (seen on an H200, CUDA 13.0).
    for _ in range(8):
        if not len(cloned):
            break
        src = _lookup(ev["seq"][cloned], cloned, origin)
        found = src >= 0
        if not found.any():
            break
        origin[found] = ev["id"][src[found]].astype(np.uint64) | (
            ev["rf_tid"][src[found]].astype(np.uint64) << np.uint64(32))
    node_at = _lookup(ev["seq"][created], created, origin)
    named = node_at >= 0
    renamed = np.flatnonzero(graph)[named]  # a graph kernel named through its captured node
    at[renamed] = node_at[named]
    by_node = np.zeros(len(rec), bool)
    by_node[renamed] = True
    placed = at >= 0
    spans = trace.spans()
    span = np.full(len(rec), -1, np.int64)
    launch_ns = np.zeros(len(rec), np.int64)
    site_module = np.full(len(rec), -1, np.int64)
    site_cat = np.zeros(len(rec), np.uint8)
    if placed.any():
        t = trace.clock.to_unix_ns(ev["t"][at[placed]])
        tid = ev["tid"][at[placed]]
        launch_ns[placed] = t
        if len(spans):
            span[placed] = _node_span(spans, tid, t, spans.index().innermost(tid, t))
        runs = Kernels.from_trace(trace)
        if len(runs):  # launched from a kernel site of compiled code: the site's module
            run = runs.holding(tid, t, t)
            hit = np.flatnonzero(placed)[run >= 0]
            site_module[hit] = runs.module[run[run >= 0]]
            site_cat[hit] = runs.cat[run[run >= 0]]
    return KernelRecords(start, end, stream, (flags & 3).astype(np.uint8), name, span, nccl,
                         launch_ns, site_module, site_cat, graph, by_node, int((~placed).sum()),
                         int(graph.sum()), int((~named).sum()), unpaired)


def _node_span(spans: Spans, tid: np.ndarray, t: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Launches in backward go with the autograd node that made them, as torch.profiler
    attributes them (``evaluate_function: <Node>`` holds the node's apply and the
    accumulation of its outputs into the next node's inputs): the node of that thread
    that started last before the launch, while it runs or until the next node of its
    pass starts; its module's backward span. Elsewhere (forward, a node of no module
    call such as AccumulateGrad) ``inner``, the innermost span holding the launch."""
    nodes = spans.nodes
    if not len(nodes):
        return inner.copy()
    node, nxt = spans.index().latest_node(tid, t)
    at, after = np.maximum(node, 0), np.maximum(nxt, 0)
    running = t <= nodes.end_ns[at]
    between = ((nxt >= 0) & (nodes.pass_id[after] == nodes.pass_id[at])
               & (nodes.pass_id[at] != NO_PASS))
    take = (node >= 0) & (running | between) & (nodes.span[at] >= 0)
    return np.where(take, nodes.span[at], inner)


def kernel_records(trace: TraceData) -> KernelRecords:
    """The run's device records and where they were launched (cached on the trace)."""
    return trace.derived("kernel_records", lambda: _records_of(trace))


@dataclass
class SpanKernels:
    """Per span of the run: busy time (children included, and its own), kernel count,
    idle inside it, and NCCL time (ns, int64)."""

    busy: np.ndarray
    self_busy: np.ndarray
    count: np.ndarray
    idle: np.ndarray
    nccl: np.ndarray


def _per_span(spans: Any, k: KernelRecords, intervals: np.ndarray | None) -> SpanKernels:
    n = len(spans)
    zero = np.zeros(n, np.int64)
    if not n or not len(k):
        return SpanKernels(zero, zero.copy(), zero.copy(), zero.copy(), zero.copy())
    streams, stream_of = np.unique(k.stream, return_inverse=True)
    width = np.int64(len(streams))
    own = np.flatnonzero((k.span >= 0) & ~k.nccl & (k.site_module < 0))
    self_busy = np.zeros(n, np.int64)
    if len(own):
        u = union_ns(k.span[own] * width + stream_of[own], k.start_ns[own], k.end_ns[own])
        self_busy = np.bincount(np.arange(len(u)) // width, weights=u, minlength=n)[:n]
    # every (ancestor span, record) pair: the record counts to each span holding it
    placed = np.flatnonzero(k.span >= 0)
    ps, pr = _holding_pairs(spans.parent, k.span[placed], placed)
    comm = k.nccl[pr]
    nccl = np.bincount(ps[comm], weights=(k.end_ns - k.start_ns)[pr[comm]], minlength=n)[:n]
    ps, pr = ps[~comm], pr[~comm]
    count = np.bincount(ps, minlength=n)[:n]
    u = union_ns(ps * width + stream_of[pr], k.start_ns[pr], k.end_ns[pr])
    busy = np.bincount(np.arange(len(u)) // width, weights=u, minlength=n)[:n].astype(np.int64)
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    last = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(first, ps, k.start_ns[pr])
    np.maximum.at(last, ps, k.end_ns[pr])
    extent = np.where(count > 0, last - first, 0)
    if intervals is not None:
        extent = np.where(intervals > 0, intervals, extent)
    idle = np.maximum(0, extent - busy)
    return SpanKernels(busy, self_busy.astype(np.int64), count.astype(np.int64),
                       idle.astype(np.int64), nccl.astype(np.int64))


def _holding_pairs(parent: np.ndarray, span: np.ndarray, rec: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Every (span, record) pair of the records ``rec`` launched in spans ``span`` (>= 0)
    and the spans holding them: their own spans, then their parents', and so on up."""
    ps, pr = [span], [rec]
    while len(span):
        up = parent[span].astype(np.int64)
        span, rec = up[up >= 0], rec[up >= 0]
        ps.append(span)
        pr.append(rec)
    return np.concatenate(ps), np.concatenate(pr)


def span_kernels(trace: TraceData) -> SpanKernels:
    """:class:`SpanKernels` of ``trace``'s spans (cached on the trace)."""
    def build() -> SpanKernels:
        intervals = span_gpu(trace)[0] if len(gpu_spans(trace)) else None
        return _per_span(trace.spans(), kernel_records(trace), intervals)
    return trace.derived("span_kernels", build)


def kernel_notes(trace: TraceData) -> list[str]:
    """The lines under a table with kernel columns: what they are, and what was not
    placed (counted, never guessed)."""
    info = trace.info.get("kernels")
    info = info if isinstance(info, dict) else {}
    k = kernel_records(trace)
    lines = ["kernel: device busy time of the kernels, copies and sets each module launched "
             "(CUPTI; children included, union per stream); kernel_self: launched with no "
             "child open; kernel_idle: the device's idle time inside its calls"]
    parts = [f"{len(k)} device records"]
    lost = [(info.get("lost"), "records lost by CUPTI (buffers full)"),
            (k.unmatched, "records whose launch the trace does not hold"),
            (k.graph_unnamed, f"of {k.graph_kernels} graph-replay records left on the "
                              "replay's span (node not seen captured)"),
            (info.get("yielded"), "times CUPTI was yielded to torch.profiler")]
    parts += [f"{n} {what}" for n, what in lost if isinstance(n, int) and n]
    if info.get("not_resumed"):
        parts.append(f"not resumed after torch.profiler: {info['not_resumed']}")
    lines.append("kernels: " + "; ".join(parts))
    return lines


def add_kernels(rows: list[dict[str, Any]], trace: TraceData) -> list[str]:
    """Fill the kernel columns of the summary's ``rows`` (per module and mode, summed
    over its calls), adding a row for a module seen only through its kernels; returns
    the notes."""
    spans = trace.spans()
    sk = span_kernels(trace)
    # (every slot: a kernel site names modules that never ran a call of their own)
    n_mod = max(len(trace.modules), int(spans.module.max()) + 1 if len(spans) else 0)
    eval_ = (spans.flags & SPAN_EVAL) != 0
    group = spans.module.astype(np.int64) + n_mod * eval_
    values: dict[tuple[str, str], dict[str, int]] = {}
    for backward, suffix in ((False, ""), (True, "_bwd")):
        sel = (spans.cat == CAT_BACKWARD) == backward
        g = group[sel]
        sums = {key: np.bincount(g, weights=arr[sel], minlength=2 * n_mod)
                for key, arr in (("kernel{}_ns", sk.busy), ("kernel{}_self_ns", sk.self_busy),
                                 ("kernels{}", sk.count), ("kernel{}_idle_ns", sk.idle),
                                 ("nccl_ns", sk.nccl))}
        for k in np.flatnonzero(sums["kernels{}"] + sums["nccl_ns"]).tolist():
            slot = k % n_mod
            name = trace.modules[slot][0] if slot < len(trace.modules) else f"<module {slot}>"
            v = values.setdefault((name, group_mode(k, n_mod)), {})
            for key, arr in sums.items():
                col = key.format(suffix)
                v[col] = v.get(col, 0) + int(arr[k])
    for (site, is_eval, backward), site_sums in _site_sums(trace).items():
        v = values.setdefault((trace.modules[site][0], group_mode(site + n_mod * is_eval,
                                                                   n_mod)), {})
        for key, value in site_sums.items():
            col = key.format("_bwd" if backward else "")
            v[col] = v.get(col, 0) + value
    for row in rows:
        v = values.get((row["module"], row["mode"]), {})
        special = row["module"] in (UNATTRIBUTED, COMPILE_ROW)
        for key in KERNEL_COLUMNS:
            row[key] = None if special else v.get(key, 0)
    seen = {(r["module"], r["mode"]) for r in rows}
    for (name, mode), v in values.items():
        if (name, mode) not in seen:
            row = dict.fromkeys(COLUMNS)
            row.update(module=name, type=next((t for n_, t in trace.modules if n_ == name), "?"),
                       mode=mode, timing="kernels", **{key: v.get(key, 0) for key in KERNEL_COLUMNS})
            rows.append(row)
    rows.sort(key=lambda r: -((r.get("kernel_ns") or 0) + (r.get("kernel_bwd_ns") or 0)))
    return kernel_notes(trace)


def _site_sums(trace: TraceData) -> dict[tuple[int, bool, bool], dict[str, int]]:
    """Per (module slot, eval, backward) named by kernel sites of compiled code: busy
    time (the site's module and the modules between it and the region's), its own busy
    time and count. The region's call holds them too (its ``kernel_ns``), not its self."""
    k = kernel_records(trace)
    sited = np.flatnonzero((k.site_module >= 0) & ~k.nccl)
    if not len(sited):
        return {}
    spans = trace.spans()
    slots = {name: i for i, (name, _) in enumerate(trace.modules)}
    region = spans.module[k.span[sited]].astype(np.int64)
    eval_ = (spans.flags[k.span[sited]] & SPAN_EVAL) != 0
    chains: dict[tuple[int, int], list[int]] = {}
    pairs: list[tuple[int, int, bool]] = []  # (slot, record, own)
    for j, (site, r) in enumerate(zip(k.site_module[sited].tolist(), region.tolist(),
                                      strict=True)):
        chain = chains.get((site, r))
        if chain is None:  # the site's module and its parents below the region's
            chain, name, top = [], trace.modules[site][0], trace.modules[r][0]
            while name and name != top and name in slots:
                chain.append(slots[name])
                name = name.rpartition(".")[0]
            chains[(site, r)] = chain
        pairs += [(slot, j, i == 0) for i, slot in enumerate(chain)]
    if not pairs:
        return {}
    slot_a, j_a, own = (np.array(a) for a in zip(*pairs, strict=True))
    rec = sited[j_a]
    key = (slot_a * 2 + eval_[j_a]) * 2 + (k.site_cat[rec] == CAT_BACKWARD)
    streams, stream_of = np.unique(k.stream[rec], return_inverse=True)
    width = len(streams)
    out: dict[tuple[int, bool, bool], dict[str, int]] = {}
    for col, sel in (("kernel{}_ns", np.ones(len(rec), bool)), ("kernel{}_self_ns", own)):
        uk, inv = np.unique(key[sel], return_inverse=True)
        busy = union_ns(inv.reshape(-1) * width + stream_of[sel], k.start_ns[rec[sel]],
                        k.end_ns[rec[sel]])
        per = np.bincount(np.arange(len(busy)) // width, weights=busy, minlength=len(uk))
        for u, b in zip(uk.tolist(), per.tolist(), strict=True):
            out.setdefault((u // 4, bool(u // 2 % 2), bool(u % 2)), {})[col] = int(b)
    uk, counts = np.unique(key, return_counts=True)
    for u, c in zip(uk.tolist(), counts.tolist(), strict=True):
        out[(u // 4, bool(u // 2 % 2), bool(u % 2))]["kernels{}"] = int(c)
    return out


class KernelTimeColumns(ColumnProvider):
    """Kernel busy time's columns (CUPTI, ``trace(gpu=True)`` on CUDA) in the summary,
    the spans table and the aggregates."""

    name = "kernel time"
    columns = (
        Column("kernel_ns", "int64", "busy time of the kernels the call launched, children "
               "included (CUPTI, trace(gpu=True) on CUDA); null: none", order=20,
               check="nonnegative"),
        Column("kernel_self_ns", "int64", "kernel_ns less what its children launched",
               order=20, check="nonnegative", at_most="kernel_ns"),
        Column("kernels", "int64", "kernels, copies and sets the call launched", order=20,
               check="nonnegative"),
        Column("kernel_idle_ns", "int64", "the device's idle time inside the call", order=20,
               check="nonnegative"),
        Column("kernel_ms", "float32", "kernel busy time (CUPTI); null when not recorded",
               "aggregates", 20, reduce="per_step", title="kernel ms/step",
               tip="kernel busy time per step (CUPTI), when recorded",
               fact="kernel busy time recorded"))
    headers = {
        "kernel_ns": ("kernel", "device busy time of the kernels launched in its forward calls "
                                "(children included; union per stream)"),
        "kernel_self_ns": ("kernel_self", "kernel less what its children launched"),
        "kernels": ("kernels", "kernels, copies and sets its forward calls launched"),
        "kernel_idle_ns": ("kernel_idle", "device idle time inside its forward calls"),
        "kernel_bwd_ns": ("kernel_bwd", "device busy time of its backward's kernels"),
        "kernel_bwd_self_ns": ("kernel_bwd_self", "kernel_bwd less its children's"),
        "kernels_bwd": ("kernels_bwd", "kernels its backward launched"),
        "kernel_bwd_idle_ns": ("kernel_bwd_idle", "device idle time inside its backward"),
        "nccl_ns": ("nccl", "NCCL kernels' time (waiting for peers included)"),
    }

    def recorded(self, trace: TraceData) -> bool:
        return kernels_recorded(trace)

    def summary(self, rows: list[dict[str, Any]], trace: TraceData,
                options: Mapping[str, Any]) -> SummaryPart:
        lead = not len(gpu_spans(trace))
        return SummaryPart(KERNEL_COLUMNS, add_kernels(rows, trace), lead=lead,
                           attributes={"time_kind": "device"} if lead else {})

    def text_layout(self, columns: list[TextColumn], keys: Collection[str], *,
                    wide: bool, backward: bool) -> list[TextColumn]:
        """Kernel time first (after module and type) when it is the run's device time."""
        if "kernel_ns" not in keys or "gpu_total_ns" in keys:
            return columns
        mine = [(title, k) for k, (title, _) in self.headers.items()
                if (backward or "bwd" not in k) and (wide or k in (
                    "kernel_ns", "kernels", "kernel_idle_ns", "kernel_bwd_ns"))]
        rest = [c for c in columns[2:] if c[1] not in self.headers]
        return columns[:2] + mine + [
            ("host_" + title if key.endswith("_ns") else title, key) for title, key in rest
            if wide or key not in ("self_ns", "p50_ns", "bwd_self_ns", "bwd_fwd_ratio")]

    def text_columns(self, keys: Collection[str], rows: Sequence[dict[str, Any]], *,
                     wide: bool, backward: bool) -> list[TextColumn]:
        return [(title, k) for k, (title, _) in self.headers.items()
                if k in keys and (backward or "bwd" not in k)]

    def format_cell(self, key: str, value: Any) -> str | None:
        if key not in self.headers:
            return None
        if value is None:
            return ""
        return str(value) if key.startswith("kernels") else format_ns(int(value))

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        sk = span_kernels(trace)
        if not len(sk.busy):
            return {}
        has = (sk.count > 0)[:n]
        return {"kernel_ns": measured_only(sk.busy[:n], has, m),
                "kernel_self_ns": measured_only(sk.self_busy[:n], has, m),
                "kernels": measured_only(sk.count[:n], has, m),
                "kernel_idle_ns": measured_only(sk.idle[:n], has, m)}

    def aggregate(self, trace: TraceData, calls: Calls
                  ) -> Callable[[WindowGroup], dict[str, list[Any]]] | None:
        sk = span_kernels(trace)
        if not sk.count.any():
            return None
        spans = trace.spans()
        eval_ = (spans.flags & SPAN_EVAL) != 0
        cat = np.where(eval_ & (spans.cat != CAT_BACKWARD), -1, spans.cat.astype(np.int64))
        per: dict[tuple[int, int], float] = {}
        for m, c, b in zip(spans.module.tolist(), cat.tolist(), (sk.busy / 1e6).tolist(),
                           strict=True):
            if b:
                per[(m, c)] = per.get((m, c), 0.0) + b

        def values(group: WindowGroup) -> dict[str, list[Any]]:
            if group.mode not in ("forward", "eval", "backward"):
                return {}
            key = -1 if group.mode == "eval" else group.cat
            return {"kernel_ms": [per.get((m, key)) for m in group.modules]}

        return values


def device_table(trace: TraceData) -> tuple[GpuSpans, np.ndarray]:
    """What the exports draw on the device's rows (one per device and stream): the
    run's event intervals (:func:`~hooktrace.analysis.device_time.gpu_spans`), and, with kernel busy time, each placed
    kernel, copy and set under its module: where no event interval was recorded, a
    module's slice is the extent of what its call launched on that stream (first start
    to last end, children included; ``self_ns``: their busy time). Returns the table
    and, per row, its kernel's name index in ``info["kernels"]["names"]`` (-1: a
    module's slice). Cached on the trace."""
    return trace.derived("device_table", lambda: _device_table(trace))


def _device_table(trace: TraceData) -> tuple[GpuSpans, np.ndarray]:
    gpu = gpu_spans(trace)
    k = kernel_records(trace)
    spans = trace.spans()
    placed = np.flatnonzero(k.span >= 0)
    if not len(placed) or not len(spans):
        return gpu, np.full(len(gpu), -1, np.int64)
    parts = [{f: getattr(gpu, f) for f in GPU_FIELDS}]
    labels = [np.full(len(gpu), -1, np.int64)]
    if not len(gpu):  # kernels only: each module call's extent per stream
        span_of, rec = _holding_pairs(spans.parent, k.span[placed], placed)
        keys, group = np.unique(np.stack([span_of, k.stream[rec]]), axis=1, return_inverse=True)
        group = group.reshape(-1)
        first = np.full(keys.shape[1], np.iinfo(np.int64).max, np.int64)
        last = np.full(keys.shape[1], np.iinfo(np.int64).min, np.int64)
        np.minimum.at(first, group, k.start_ns[rec])
        np.maximum.at(last, group, k.end_ns[rec])
        s = keys[0]
        parts.append({"start_ns": first, "end_ns": last,
                      "self_ns": union_ns(group, k.start_ns[rec], k.end_ns[rec]),
                      "span": s, "module": spans.module[s], "cat": spans.cat[s],
                      "device": keys[1] >> 32, "stream": keys[1] & 0xFFFF_FFFF})
        labels.append(np.full(len(s), -1, np.int64))
    s = k.span[placed]
    parts.append({"start_ns": k.start_ns[placed], "end_ns": k.end_ns[placed],
                  "self_ns": k.end_ns[placed] - k.start_ns[placed], "span": s,
                  "module": spans.module[s], "cat": spans.cat[s],
                  "device": k.stream[placed] >> 32, "stream": k.stream[placed] & 0xFFFF_FFFF})
    info = trace.info.get("kernels")
    names = info.get("names") if isinstance(info, dict) else None
    n_names = len(names) if isinstance(names, list) else 0
    # (a name index past the table, in a file written by something else: no name)
    labels.append(np.where(k.name[placed] < n_names, k.name[placed], -1))
    table = GpuSpans({f: np.concatenate([np.asarray(p[f]) for p in parts]).astype(dtype)
                      for f, dtype in GPU_FIELDS.items()})
    return table, np.concatenate(labels)
