"""Per-module time inside compiled regions, from the kernels they ran (issue #18).

A region that torch.compile generated while a trace was active carries kernel marks
(hooktrace/record/kernels.py): every kernel call of its wrapper is a KERNEL_BEGIN /
KERNEL_END pair whose id is a *site*, ``info["kernel_sites"][id]`` = ``[kernel name,
module path relative to the region's module, "forward" | "backward"]``.

:class:`Kernels` pairs them and places each kernel run in its region: the innermost
autograd node running on that thread (a compiled backward runs inside its
``CompiledFunctionBackward`` node, attributed to the region's module call), else
the innermost forward span on that thread. The kernel's module is the region's
module name joined with the site's path, looked up in the module table.

:func:`derived_spans` turns them into per-module entries, one per (region call,
module inside it): ``total_ns`` = the summed time of the kernels of the module and
its submodules in that call, ``self_ns`` = of the kernels attributed to it
directly. These are *kernel-derived* times: what running the module's kernels
cost, without the wrapper's glue between kernels (allocation, views), which stays
in the region's own time. A kernel fusing ops of several modules counts in their
nearest common ancestor (record/kernels.py says why), so a parent's total can
exceed the sum of its children's.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(6, EVENT_DTYPE)
    >>> ev["kind"] = [1, 8, 9, 8, 9, 2]; ev["id"] = [0, 0, 0, 1, 1, 0]
    >>> ev["t"] = [0, 10, 30, 40, 100, 120]
    >>> info = {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0,
    ...         "kernel_sites": [["cpp_fused_0", "norm", "forward"],
    ...                          ["extern_kernels.mm", "fc", "forward"]]}
    >>> trace = TraceData(ev, [("", "Block"), ("norm", "LayerNorm"), ("fc", "Linear")], [],
    ...                   Clock(0, 0, 1.0), info)
    >>> k = Kernels.from_trace(trace)
    >>> k.module.tolist(), k.duration_ns.tolist()
    ([1, 2], [20, 60])
    >>> d = derived_spans(trace)
    >>> d.module.tolist(), d.total_ns.tolist(), d.region_self_ns.tolist()
    ([1, 2], [20, 60], [40])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hooktrace._events import KERNEL_BEGIN, KERNEL_END
from hooktrace.reading import (
    CAT_BACKWARD,
    CAT_FORWARD,
    CONTAINER_TYPES,
    SPAN_EVAL,
    RunOrder,
    Spans,
    TraceData,
    join_name,
    kernel_sites,
    site_modules,
)

__all__ = ["CONTAINER_TYPES", "MODULE_SITE", "Derived", "Kernels", "compiled_regions",
           "derived_spans", "fused_modules", "kernel_sites", "silent_in_regions"]

# A site with this kernel name names a module of a compiled graph, not a kernel (no mark
# carries its id): the record side registers one per module whose ops the graph holds.
MODULE_SITE = ""

@dataclass
class Kernels:
    """Kernel runs of a trace, parallel arrays: ``start_ns``/``end_ns``, ``site``,
    ``tid``, ``span`` (the region span it ran in: a forward span, or the backward span
    of the region's call; -1 when none), ``cat`` (CAT_FORWARD or CAT_BACKWARD of that
    span), ``module`` (slot of the module it is attributed to; the region's own slot
    when the site's path names no module of the table; -1 when placed in no span).
    Counts: ``unpaired`` (a begin without its end: the kernel raised, or the buffer cut
    it), ``unplaced`` (ran outside any recorded span), ``unnamed`` (site paths the
    module table lacks, counted in the region itself)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    site: np.ndarray
    tid: np.ndarray
    span: np.ndarray
    cat: np.ndarray
    module: np.ndarray
    sites: list[tuple[str, str, str]] = field(default_factory=list)
    unpaired: int = 0
    unplaced: int = 0
    unnamed: int = 0

    order: RunOrder | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.start_ns)

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    def holding(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per interval [start, end] on thread ``tid``: the placed kernel run (index)
        whose marks hold it, or -1 (a thread's kernel runs never overlap: a wrapper calls
        them in turn; the rules: :class:`hooktrace.reading.SpanIndex`)."""
        if self.order is None:
            self.order = RunOrder(self.tid, self.start_ns, self.module >= 0)
        return self.order.holding(tid, start, end, self.end_ns)

    @classmethod
    def from_trace(cls, trace: TraceData) -> Kernels:
        return trace.derived("kernels", lambda: cls._build(trace))

    @classmethod
    def _build(cls, trace: TraceData) -> Kernels:
        ev = trace.events
        sites = kernel_sites(trace.info)
        idx = np.flatnonzero((ev["kind"] == KERNEL_BEGIN) | (ev["kind"] == KERNEL_END))
        empty = np.zeros(0, np.int64)
        if not len(idx):
            return cls(empty, empty, empty.astype(np.uint32), empty.astype(np.uint32), empty,
                       empty.astype(np.uint8), empty, sites)
        k = ev[idx]
        order = np.argsort(k["tid"], kind="stable")  # per thread, in recorded order
        k = k[order]
        kind, site, tid = k["kind"], k["id"], k["tid"]
        begin = np.flatnonzero((kind[:-1] == KERNEL_BEGIN) & (kind[1:] == KERNEL_END)
                               & (site[:-1] == site[1:]) & (tid[:-1] == tid[1:]))
        known = site[begin] < len(sites)
        begin = begin[known]
        unpaired = int(np.count_nonzero(kind == KERNEL_BEGIN)) - len(begin)
        t = trace.clock.to_unix_ns(k["t"]).astype(np.int64)
        start, end = t[begin], t[begin + 1]
        ksite, ktid = site[begin].astype(np.uint32), tid[begin].astype(np.uint32)
        spans = trace.spans()
        span = np.full(len(begin), -1, np.int64)
        cat = np.full(len(begin), CAT_FORWARD, np.uint8)
        # backward: the autograd node running the kernel, attributed to a module call
        nodes = spans.nodes
        if len(nodes):
            node = spans.index().order("nodes").holding(ktid, start, end, nodes.end_ns)
            hit = node >= 0
            span[hit] = nodes.span[node[hit]]
            cat[hit & (span >= 0)] = CAT_BACKWARD
            # a node of no module call (a compiled function called outside any module)
            span[hit & (span < 0)] = -1
        rest = span < 0
        if rest.any() and len(spans):
            inner = spans.index().innermost(ktid[rest], start[rest], end[rest], "forward")
            span[rest] = inner
            cat[rest] = np.where(inner >= 0, spans.cat[np.maximum(inner, 0)], CAT_FORWARD)
        module = np.full(len(begin), -1, np.int64)
        placed = span >= 0
        unnamed = 0
        if placed.any():
            region = spans.module[span[placed]].astype(np.int64)
            module[placed], named = site_modules(trace.modules, sites, region, ksite[placed])
            unnamed = int(np.count_nonzero(~named))
        return cls(start, end, ksite, ktid, span, cat, module, sites, unpaired,
                   int(np.count_nonzero(~placed)), unnamed)


@dataclass
class Derived:
    """Kernel-derived module entries, one per (region span, module inside it):
    ``span`` (the region span), ``module`` (slot), ``cat``, ``flags`` (the region
    span's: SPAN_EVAL), ``total_ns``, ``self_ns``, ``start_ns``/``end_ns`` (first
    kernel start, last kernel end); and per region span with kernels
    (``region_span``): ``region_self_ns``, the region's own time once the derived
    modules directly inside it are taken out (its glue and own kernels)."""

    span: np.ndarray
    module: np.ndarray
    cat: np.ndarray
    flags: np.ndarray
    total_ns: np.ndarray
    self_ns: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    region_span: np.ndarray
    region_self_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.span)


def derived_spans(trace: TraceData) -> Derived:
    """The kernel-derived entries of ``trace`` (cached on it); see the module docstring."""
    return trace.derived("kernel_spans", lambda: _derive(trace))


def _derive(trace: TraceData) -> Derived:
    k = Kernels.from_trace(trace)
    spans = trace.spans()
    sel = np.flatnonzero((k.span >= 0) & (k.module >= 0))
    e64 = np.zeros(0, np.int64)
    if not len(sel):
        return Derived(e64, e64, e64.astype(np.uint8), e64.astype(np.uint8), e64, e64, e64, e64,
                       e64, e64)
    names = [n for n, _ in trace.modules]
    slots = {n: i for i, n in enumerate(names)}
    span, module = k.span[sel], k.module[sel]
    region = spans.module[span].astype(np.int64)
    # per (region module, kernel module): the chain of slots from the first module below
    # the region down to the kernel's module (empty when it is the region itself)
    key = region * len(names) + module
    uniq, inv = np.unique(key, return_inverse=True)
    chains = [_chain(names, slots, trace.modules, *divmod(u, len(names))) for u in uniq.tolist()]
    length = np.array([len(c) for c in chains], np.int64)[inv]
    flat = np.array([s for c in chains for s in c], np.int64)
    offsets = np.r_[0, np.cumsum([len(c) for c in chains])][inv]
    # one entry per (kernel, module of its chain)
    rep = np.repeat(np.arange(len(sel)), length)
    pos = np.arange(len(rep)) - np.repeat(np.cumsum(length) - length, length)
    ent_mod = flat[offsets[rep] + pos]
    ent_self = pos == length[rep] - 1
    ent_top = pos == 0
    dur = k.duration_ns[sel]
    ent_span = span[rep]
    n_mod = max(len(names), 1)
    gkey = ent_span * n_mod + ent_mod
    g, ginv = np.unique(gkey, return_inverse=True)
    total = np.bincount(ginv, weights=dur[rep], minlength=len(g)).astype(np.int64)
    self_ = np.bincount(ginv, weights=np.where(ent_self, dur[rep], 0),
                        minlength=len(g)).astype(np.int64)
    start = np.full(len(g), np.iinfo(np.int64).max, np.int64)
    end = np.full(len(g), np.iinfo(np.int64).min, np.int64)
    np.minimum.at(start, ginv, k.start_ns[sel][rep])
    np.maximum.at(end, ginv, k.end_ns[sel][rep])
    g_span = g // n_mod
    # the regions' own time: their self time less the derived modules directly inside
    top_total = np.bincount(np.searchsorted(np.unique(span), ent_span[ent_top]),
                            weights=dur[rep][ent_top], minlength=len(np.unique(span)))
    regions = np.unique(span)
    region_self = spans.self_ns[regions] - top_total.astype(np.int64)
    return Derived(g_span, g % n_mod, spans.cat[g_span], spans.flags[g_span] & SPAN_EVAL,
                   total, self_, start, end, regions, np.maximum(region_self, 0))


def fused_modules(trace: TraceData) -> set[tuple[int, bool, str]]:
    """The modules of compiled regions that ran with no kernel of their own: (slot,
    eval, phase) with phase "forward" | "backward", for each module that a graph of a
    region names (its MODULE_SITE sites: a node of the graph belongs to it) while no
    kernel was attributed to it in a call of that region in that phase: its ops were
    fused into kernels counted in an enclosing module (or were views). Only regions
    that ran kernels in that phase count; containers are left out (never called)."""
    paths: dict[str, set[str]] = {"forward": set(), "backward": set()}
    for kernel, path, phase in kernel_sites(trace.info):
        if kernel == MODULE_SITE and path and phase in paths:
            paths[phase].add(path)
    if not (paths["forward"] or paths["backward"]):
        return set()
    regions = compiled_regions(trace)
    if not regions:
        return set()
    attributed = _attributed(trace)
    slots = {name: i for i, (name, _) in enumerate(trace.modules)}
    out = set()
    for region, eval_, phase in regions:
        base = trace.modules[region][0]
        for path in paths[phase]:
            slot = slots.get(join_name(base, path))
            if (slot is None or slot == region or trace.modules[slot][1] in CONTAINER_TYPES
                    or (slot, eval_, phase) in attributed):
                continue
            out.add((slot, eval_, phase))
    return out


def compiled_regions(trace: TraceData) -> set[tuple[int, bool, str]]:
    """The compiled regions that ran kernels: (slot, eval, phase) of the module whose
    call ran them, phase "forward" | "backward"."""
    k = Kernels.from_trace(trace)
    spans = trace.spans()
    placed = np.flatnonzero((k.span >= 0) & (k.module >= 0))
    return {(int(spans.module[s]), bool(spans.flags[s] & SPAN_EVAL),
             "backward" if c == CAT_BACKWARD else "forward")
            for s, c in set(zip(k.span[placed].tolist(), k.cat[placed].tolist()))}


def _attributed(trace: TraceData) -> set[tuple[int, bool, str]]:
    d = derived_spans(trace)
    return {(int(m), bool(f), "backward" if c == CAT_BACKWARD else "forward")
            for m, f, c in zip(d.module.tolist(), d.flags.tolist(), d.cat.tolist())}


def silent_in_regions(trace: TraceData) -> set[tuple[int, bool, str]]:
    """The modules below a compiled region that ran kernels with no kernel of their own
    in that phase, whether or not a graph of the region names them: those
    :func:`fused_modules` finds, and modules that have no ops at all (``nn.Identity``,
    ``Dropout(p=0)``: Dynamo traces through them and no graph node is theirs). ``diff``
    of an eager run against a compiled one reads them as fused, not as missing (issue
    #47: 65 of convnext's 177 modules were "only in A"). (slot, eval, phase), as
    fused_modules'; modules that ran calls of their own in that phase are not silent."""
    regions = compiled_regions(trace)
    if not regions:
        return set()
    attributed = _attributed(trace)
    spans = trace.spans()
    called = {(int(m), bool(f & SPAN_EVAL), "backward" if c == CAT_BACKWARD else "forward")
              for m, f, c in zip(spans.module.tolist(), spans.flags.tolist(),
                                 spans.cat.tolist())}
    out = set()
    for region, eval_, phase in regions:
        base = trace.modules[region][0]
        for slot, (name, type_name) in enumerate(trace.modules):
            if slot == region or type_name in CONTAINER_TYPES or not (
                    base == "" or name.startswith(base + ".")):
                continue
            key = (slot, eval_, phase)
            if key not in attributed and key not in called:
                out.add(key)
    return out


def _chain(names: list[str], slots: dict[str, int], modules: list[tuple[str, str]],
           region: int, leaf: int) -> list[int]:
    """Slots from the first module below ``region`` down to ``leaf`` (containers left
    out); [] when ``leaf`` is the region or not below it."""
    if leaf == region:
        return []
    base, name = names[region], names[leaf]
    if base and not name.startswith(base + "."):
        return []
    rel = name[len(base) + 1:] if base else name
    parts = rel.split(".")
    out = []
    for i in range(1, len(parts) + 1):
        slot = slots.get(join_name(base, ".".join(parts[:i])))
        if slot is not None and (slot == leaf or modules[slot][1] not in CONTAINER_TYPES):
            out.append(slot)
    return out


def span_self_ns(spans: Spans, derived: Derived | None,
                 compiles: np.ndarray | None) -> np.ndarray:
    """The one definition of a span's self time (issue #37), for every view that groups
    spans (summary, diff, the Parquet tables): its measured self time, except that a
    compiled region's is what its kernels leave it (``derived.region_self_ns``: glue and
    its own kernels), and less the compile time that ran directly inside it (that is the
    ``<torch.compile>`` row's; ``compiles``: [start, end, thread] rows of
    reading.compile_intervals), never below 0."""
    from hooktrace.reading import compile_parents

    self_ns = spans.self_ns
    has_derived = derived is not None and len(derived) > 0
    has_compiles = compiles is not None and len(compiles) > 0 and len(spans) > 0
    if not has_derived and not has_compiles:
        return self_ns
    self_ns = self_ns.copy()
    if has_derived:
        assert derived is not None
        self_ns[derived.region_span] = derived.region_self_ns
    if has_compiles:
        assert compiles is not None
        parent = compile_parents(spans, compiles)
        ok = parent >= 0
        taken = np.zeros(len(spans), np.int64)
        np.add.at(taken, parent[ok], compiles[ok, 1] - compiles[ok, 0])
        self_ns = np.maximum(self_ns - taken, 0)
    return self_ns
