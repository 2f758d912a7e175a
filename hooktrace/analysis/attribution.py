"""Attribute a profiler trace's CPU ops and GPU kernels to the run's modules.

Rules:

* **Forward**: every op a module's forward runs lies inside that call's span,
  on the same thread (same clock, see :mod:`hooktrace.merge`): an op belongs to
  the innermost forward span containing it.
* **Backward**: the profiler wraps each autograd node in
  ``autograd::engine::evaluate_function: <Node>`` with args
  ``"Sequence number"`` (the node's ``seqNr``) and ``"Fwd thread id"`` (the
  ``RecordFunction`` thread id of the forward thread). hooktrace records the
  sequence number and that thread id at every module enter and exit, so the
  node belongs to the module whose forward was running when the node was
  created: the innermost span open just after the last event of that thread
  with a sequence number <= the node's. The node's ops (nested in it) go with
  it. Nodes without those args (``AccumulateGrad``) or not found fall back to
  the shortest hooktrace backward span (``cat`` 1) containing them, if any.
* **Inside compiled regions** (issue #18): an op that ran inside a kernel mark
  (an extern kernel's ``aten::mm``, a C++ kernel's ``RECORD_FUNCTION`` with
  Inductor's ``cpp.enable_kernel_profile``) belongs to that kernel's module and
  phase (:mod:`hooktrace.analysis.kernels`), forward or backward, instead of the region.
* **GPU**: a kernel (or memcpy/memset) belongs where its launch
  (``cudaLaunchKernel``...) does, found by the ``correlation`` arg, else by the
  ``ac2g`` flow from launch to kernel.

Per module and phase: ``cpu_self_ns`` sums the self time (duration minus
nested ops) of its own ops, ``cpu_total_ns`` adds its submodules' (by
qualified name), likewise for GPU time; ``top_ops`` are the outermost ops of
the module by time.

Example:
    >>> import io, numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.format._profiler_events import collect
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(2, EVENT_DTYPE); ev["kind"] = [1, 2]; ev["t"] = [1000, 9000]; ev["tid"] = 7
    >>> run = TraceData(ev, [("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                 {"pid": 7, "hostname": "h", "dropped_events": 0, "overwritten_events": 0})
    >>> src = (b'{"baseTimeNanoseconds": 0, "traceEvents": ['
    ...        b'{"ph":"X","cat":"cpu_op","name":"aten::linear","pid":7,"tid":7,"ts":2,"dur":5},'
    ...        b'{"ph":"X","cat":"cpu_op","name":"aten::addmm","pid":7,"tid":7,"ts":3,"dur":3}]}')
    >>> table = attribute_events(run, collect(io.BytesIO(src), "p.json", pid=7))
    >>> r = table.rows[0]
    >>> r["module"], r["phase"], r["ops"], r["cpu_self_ns"], r["top_ops"]
    ('fc', 'forward', 2, 5000, [['aten::linear', 5000]])
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from typing import Any

import numpy as np

from hooktrace._events import ENTER, EXIT
from hooktrace.format._profiler_events import (
    CAT_CPU_OP,
    CAT_LAUNCH,
    NODE_PREFIX,
    ProfilerEvents,
)
from hooktrace.analysis.kernels import CONTAINER_TYPES, Kernels
from hooktrace.analysis.phases import CAT_BACKWARD, CAT_RECOMPUTE
from hooktrace.analysis.phases import PHASES as CALL_PHASES
from hooktrace.reading import TraceData
from hooktrace.text import format_ns, text_lines

__all__ = ["Attribution", "attribute_events", "UNATTRIBUTED"]

UNATTRIBUTED = "<unattributed>"
# "optimizer": ops outside every module's forward and backward, inside an optimizer's
# step (the profiler's "Optimizer.step#..." annotation); "other": the rest of those
# (the loss, data loading, the script's own ops) and GPU work without its launch.
PHASES = (*CALL_PHASES[:CAT_RECOMPUTE], "optimizer", "other")  # forward, backward: by CAT_*
_OPTIMIZER, _OTHER = PHASES.index("optimizer"), PHASES.index("other")
_OPTIMIZER_PREFIX = "Optimizer."
_COLUMNS = ("module", "type", "phase", "ops", "cpu_total_ns", "cpu_self_ns", "gpu_total_ns",
            "gpu_self_ns", "top_ops")


class Attribution:
    """Per (module, phase) op and kernel time; ``to_text``/``to_csv``/``to_json``.

    ``rows``: dicts with ``module`` (qualified name, ``""`` for the root,
    ``"<unattributed>"`` for ops outside every span), ``type``, ``phase``,
    ``ops``, ``cpu_total_ns``, ``cpu_self_ns``, ``gpu_total_ns``,
    ``gpu_self_ns``, ``top_ops`` (``[name, ns]`` pairs). ``counts``: how many
    ops and kernels were seen and attributed, and how backward nodes were matched.
    """

    def __init__(self, rows: list[dict[str, Any]], counts: dict[str, int]) -> None:
        self.rows = rows
        self.counts = counts

    @property
    def has_gpu(self) -> bool:
        return self.counts.get("gpu_activities", 0) > 0

    def row(self, module: str, phase: str = "forward") -> dict[str, Any] | None:
        """The row of ``module`` (qualified name) in ``phase``, or None."""
        for r in self.rows:
            if r["module"] == module and r["phase"] == phase:
                return r
        return None

    def to_text(self, top: int | None = None, *, wide: bool = False) -> str:
        """Aligned table of the first ``top`` rows; ``wide`` is accepted for symmetry
        with :meth:`Summary.to_text` (this table has no optional columns)."""
        header = ["module", "type", "phase", "ops", "cpu total", "cpu self"]
        if self.has_gpu:
            header += ["gpu total", "gpu self"]
        header.append("top ops")
        lines = [header]
        for r in self.rows[:top]:
            cells = [r["module"] or "<root>", r["type"], r["phase"], str(r["ops"]),
                     format_ns(r["cpu_total_ns"]), format_ns(r["cpu_self_ns"])]
            if self.has_gpu:
                cells += [format_ns(r["gpu_total_ns"]), format_ns(r["gpu_self_ns"])]
            cells.append(", ".join(f"{n.removeprefix(NODE_PREFIX)} {format_ns(ns)}"
                                   for n, ns in r["top_ops"]))
            lines.append(cells)
        widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
        numeric = {3, 4, 5, 6, 7} if self.has_gpu else {3, 4, 5}
        out = []
        for row in lines:
            out.append("  ".join(
                c if i == len(row) - 1 else c.rjust(widths[i]) if i in numeric else c.ljust(widths[i])
                for i, c in enumerate(row)).rstrip())
        c = self.counts
        out += ["", "sorted by phase (forward, backward, optimizer, other), then CPU total, "
                "descending; unattributed rows last in each phase"]
        if any(r["phase"] in ("optimizer", "other") for r in self.rows):
            out.append("optimizer: ops outside every module call, in an optimizer's step(); "
                       "other: the rest of those (loss, data, the script's own ops)")
        out.append(f"{c['attributed_ops']} of {c['cpu_ops']} CPU ops attributed "
                   f"({c['backward_by_sequence']} backward nodes by sequence number, "
                   f"{c['backward_by_time']} by time)")
        if self.has_gpu:
            out.append(f"{c['attributed_gpu']} of {c['gpu_activities']} GPU activities attributed")
        if c.get("in_kernels"):
            out.append(f"{c['in_kernels']} ops ran inside compiled regions' kernels: attributed "
                       "to the kernels' modules (hooktrace.analysis.kernels)")
        return text_lines(out)

    def __str__(self) -> str:
        return self.to_text()

    def to_csv(self, top: int | None = None) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(_COLUMNS)
        for r in self.rows[:top]:
            w.writerow([*(r[k] for k in _COLUMNS[:-1]),
                        ";".join(f"{n}={ns}" for n, ns in r["top_ops"])])
        return buf.getvalue()

    def to_json(self, top: int | None = None) -> str:
        return json.dumps({"rows": self.rows[:top], "counts": self.counts}, indent=1)


# -- matching backward nodes to forward spans by sequence number ------------


class _SeqOwner:
    """(forward RecordFunction thread id, sequence number) -> forward span index."""

    def __init__(self, run: TraceData) -> None:
        spans = run.spans()
        ev = run.events
        fwd_kinds = (ev["kind"] == ENTER) | (ev["kind"] == EXIT)
        ev = ev[fwd_kinds]
        order = np.argsort(ev["tid"], kind="stable")  # group threads, keep recorded order
        ev = ev[order]
        self.os_tid: dict[int, int] = {}
        self.seqs: dict[int, np.ndarray] = {}
        self.tops: dict[int, np.ndarray] = {}
        if not len(ev):  # no module call recorded (only nodes, kernels): no owner
            return
        enter = ev["kind"] == ENTER
        for rf, tid in set(zip(ev["rf_tid"][enter].tolist(), ev["tid"][enter].tolist())):
            self.os_tid.setdefault(int(rf), int(tid))
        bounds = np.flatnonzero(np.r_[True, ev["tid"][1:] != ev["tid"][:-1], True])
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            tid = int(ev["tid"][lo])
            mine = np.flatnonzero((spans.tid == tid) & (spans.cat != CAT_BACKWARD))
            kinds = ev["kind"][lo:hi]
            # Spans are the thread's ENTERs in order (csrc/spans.h); if not, give up here.
            if int(np.count_nonzero(kinds == ENTER)) != len(mine):
                continue
            ids = ev["id"][lo:hi].tolist()
            tops = np.empty(hi - lo, dtype=np.int64)
            stack: list[tuple[int, int]] = []
            k = 0
            for j, (kind, mod) in enumerate(zip(kinds.tolist(), ids)):
                if kind == ENTER:
                    stack.append((mod, int(mine[k])))
                    k += 1
                else:
                    for depth in range(len(stack) - 1, -1, -1):
                        if stack[depth][0] == mod:
                            del stack[depth:]
                            break
                tops[j] = stack[-1][1] if stack else -1
            self.seqs[tid] = ev["seq"][lo:hi].astype(np.int64)
            self.tops[tid] = tops

    def owner(self, fwd_rf_tid: int, seq: int) -> int:
        tid = self.os_tid.get(fwd_rf_tid)
        if tid is None or tid not in self.seqs:
            return -1
        j = int(np.searchsorted(self.seqs[tid], seq, "right")) - 1
        return int(self.tops[tid][j]) if j >= 0 else -1


def _shortest_backward(run: TraceData, tid: int, start: int, end: int) -> int:
    spans = run.spans()
    m = np.flatnonzero((spans.cat == CAT_BACKWARD) & (spans.tid == tid)
                       & (spans.start_ns <= start) & (spans.end_ns >= end))
    if not len(m):
        return -1
    return int(m[np.argmin(spans.end_ns[m] - spans.start_ns[m])])


# -- the attribution ---------------------------------------------------------


def _ancestors(name: str) -> list[str]:
    """``name`` and its ancestors' qualified names, root ``""`` included."""
    parts = name.split(".") if name else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def _inside_annotation(cols: dict[str, np.ndarray], names: list[str], prefix: str,
                       tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per item (``tid``, ``start``, ``end``): whether it lies inside a profiler
    annotation (``user_annotation``, ...) whose name starts with ``prefix``, on its
    thread."""
    named = np.array([nm.startswith(prefix) for nm in names], dtype=bool)
    if not named.any():
        return np.zeros(len(tid), dtype=bool)
    ann = np.flatnonzero(named[cols["name"]] & (cols["kind"] != CAT_CPU_OP)
                         & (cols["kind"] != CAT_LAUNCH))
    out = np.zeros(len(tid), dtype=bool)
    for t in np.unique(tid).tolist():
        a = ann[cols["tid"][ann] == t]
        if not len(a):
            continue
        a = a[np.argsort(cols["start"][a], kind="stable")]
        a_start, a_end = cols["start"][a], cols["end"][a]
        sel = np.flatnonzero(tid == t)
        # the annotation starting last at or before the item (step annotations do not nest)
        j = np.searchsorted(a_start, start[sel], side="right") - 1
        ok = j >= 0
        out[sel[ok]] = a_end[j[ok]] >= end[sel[ok]]
    return out


def attribute_events(run: TraceData, p: ProfilerEvents, *, top_ops: int = 3) -> Attribution:
    """Attribute the host ops and GPU activities of ``p`` to ``run``'s modules."""
    spans = run.spans()
    cols = p.columns()
    host = np.flatnonzero((cols["kind"] == CAT_CPU_OP) | (cols["kind"] == CAT_LAUNCH))
    host = host[np.lexsort((-cols["end"][host], cols["start"][host], cols["tid"][host]))]
    n = len(host)
    tid, start, end = cols["tid"][host], cols["start"][host], cols["end"][host]
    kind, name = cols["kind"][host], cols["name"][host]
    is_cpu = kind == CAT_CPU_OP
    node_name = np.array([nm.startswith(NODE_PREFIX) for nm in p.names], dtype=bool)
    is_node = is_cpu & (node_name[name] if len(p.names) else np.zeros(n, bool))

    # Nesting of host items per thread: parent op, enclosing autograd node, self time.
    parent = np.full(n, -1, dtype=np.int64)
    node_of = np.full(n, -1, dtype=np.int64)
    child_ns = np.zeros(n, dtype=np.int64)
    stack: list[int] = []
    cur_tid = None
    t_l, s_l, e_l = tid.tolist(), start.tolist(), end.tolist()
    cpu_l, node_l = is_cpu.tolist(), is_node.tolist()
    for i in range(n):
        if t_l[i] != cur_tid:
            cur_tid, stack = t_l[i], []
        while stack and e_l[stack[-1]] <= s_l[i]:
            stack.pop()
        if stack and e_l[i] > e_l[stack[-1]]:  # crosses its enclosing op: treat as top level
            stack = []
        if stack:
            par = stack[-1]
            parent[i] = par
            node_of[i] = node_of[par]
            if cpu_l[i]:
                child_ns[par] += e_l[i] - s_l[i]
        if node_l[i]:
            node_of[i] = i
        if cpu_l[i]:
            stack.append(i)
    self_ns = (end - start) - child_ns

    # Module span and phase of each host item.
    span = spans.index().innermost(tid, start, end, "forward")
    backward = node_of >= 0
    span[backward] = -1
    module = np.full(n, -1, dtype=np.int64)
    fwd_ok = span >= 0
    module[fwd_ok] = spans.module[span[fwd_ok]]
    counts = {"backward_by_sequence": 0, "backward_by_time": 0}
    nodes = np.flatnonzero(is_node)
    node_module = np.full(n, -1, dtype=np.int64)
    seq_all, fwd_all = cols["seq"][host], cols["fwd_tid"][host]
    owner = _SeqOwner(run) if len(nodes) else None
    for i in nodes.tolist():
        m = -1
        if seq_all[i] >= 0 and fwd_all[i] > 0 and owner is not None:
            s = owner.owner(int(fwd_all[i]), int(seq_all[i]))
            if s >= 0:
                m = int(spans.module[s])
                counts["backward_by_sequence"] += 1
        elif seq_all[i] < 0:
            # No sequence number (AccumulateGrad, nodes made outside any forward):
            # unattributed, as in the plain summary (hooktrace's own attribution is
            # by sequence number too), however the node is placed in time.
            node_module[i] = -1
            continue
        if m < 0:
            s = _shortest_backward(run, int(tid[i]), int(start[i]), int(end[i]))
            if s >= 0:
                m = int(spans.module[s])
                counts["backward_by_time"] += 1
        node_module[i] = m
    module[backward] = node_module[node_of[backward]]
    # Ops of the backward pass outside any node event: hooktrace backward spans.
    rest = np.flatnonzero(~backward & ~fwd_ok & (spans.cat == CAT_BACKWARD).any())
    for i in rest.tolist():
        s = _shortest_backward(run, int(tid[i]), int(start[i]), int(end[i]))
        if s >= 0:
            module[i] = int(spans.module[s])
            backward[i] = True
    phase = backward.astype(np.int64)
    # Ops outside every forward and backward: the optimizer's step, or other.
    outside = np.flatnonzero((module < 0) & ~backward)
    phase[outside] = _OTHER
    if len(outside):
        in_step = _inside_annotation(cols, p.names, _OPTIMIZER_PREFIX, tid[outside],
                                     start[outside], end[outside])
        phase[outside[in_step]] = _OPTIMIZER
    # Ops inside a compiled region's kernel marks: the kernel's module and phase.
    kernels = Kernels.from_trace(run)
    in_kernel = kernels.holding(tid, start, end) if len(kernels) else np.full(n, -1)
    hit = np.flatnonzero(in_kernel >= 0)
    module[hit] = kernels.module[in_kernel[hit]]
    phase[hit] = kernels.cat[in_kernel[hit]] == CAT_BACKWARD

    # GPU activities -> launch item -> (module, phase).
    n_gpu = len(p.gpu_start)
    gpu_key: dict[tuple[int, int], int] = defaultdict(int)
    attributed_gpu = 0
    if n_gpu:
        launch = np.flatnonzero(kind == CAT_LAUNCH)
        by_corr = {int(c): int(i) for c, i in zip(cols["corr"][host][launch].tolist(),
                                                  launch.tolist()) if c >= 0}
        by_time = {(int(tid[i]), int(start[i])): int(i) for i in launch.tolist()}
        gpu_start = np.frombuffer(p.gpu_start, dtype=np.int64)
        gpu_dur = np.frombuffer(p.gpu_dur, dtype=np.int64)
        for g, corr in enumerate(np.frombuffer(p.gpu_corr, dtype=np.int64).tolist()):
            i = by_corr.get(corr, -1) if corr >= 0 else -1
            if i < 0:  # no correlation arg: follow the ac2g flow to the launch
                pid_, tid_ = p.gpu_where[g]
                fid = p.flow_finish.get((pid_, tid_, int(gpu_start[g])))
                if fid is not None and fid in p.flow_start:
                    ts, ltid = p.flow_start[fid]
                    if isinstance(ltid, int):  # flow times are relative to the base
                        i = by_time.get((ltid, ts + p.base_ns), -1)
            if i >= 0 and module[i] >= 0:
                gpu_key[(int(module[i]), int(phase[i]))] += int(gpu_dur[g])
                attributed_gpu += 1
            else:
                gpu_key[(-1, int(phase[i]) if i >= 0 else _OTHER)] += int(gpu_dur[g])

    # Aggregate per (module, phase).
    cpu = np.flatnonzero(is_cpu)
    n_ph = len(PHASES)
    key = module[cpu] * n_ph + phase[cpu]  # -n_ph + phase: unattributed
    self_by: dict[tuple[int, int], int] = defaultdict(int)
    ops_by: dict[tuple[int, int], int] = defaultdict(int)
    top_by: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    cpu_parent = parent[cpu]
    par_key = np.where(cpu_parent >= 0,
                       module[np.maximum(cpu_parent, 0)] * n_ph
                       + phase[np.maximum(cpu_parent, 0)], -10 * n_ph)
    cpu_dur = (end - start)[cpu]
    for k, s, pk, nm, d in zip(key.tolist(), self_ns[cpu].tolist(), par_key.tolist(),
                               name[cpu].tolist(), cpu_dur.tolist()):
        mk = (k // n_ph, k % n_ph) if k >= 0 else (-1, k + n_ph)
        self_by[mk] += s
        ops_by[mk] += 1
        if pk != k:  # outermost op of this module
            top_by[mk][p.names[nm]] += d

    # Totals: each module's self time added to it and its ancestors by qualified name.
    # Only modules that were called get a row: a container that is never called
    # (nn.ModuleList) is no place where time was spent.
    called = set(np.unique(spans.module[spans.cat != CAT_BACKWARD]).tolist())
    slot = {nm: j for j, (nm, _) in enumerate(run.modules) if j in called}
    # modules inside compiled regions ran as kernels: they and their ancestors get rows
    # (but containers, never called, as in the summary)
    by_name = {nm: (j, typ) for j, (nm, typ) in enumerate(run.modules)}
    for m in np.unique(kernels.module[kernels.module >= 0]).tolist():
        for anc in _ancestors(run.modules[m][0]):
            j, typ = by_name.get(anc, (-1, ""))
            if j >= 0 and typ not in CONTAINER_TYPES:
                slot.setdefault(anc, j)
    cpu_tot: dict[tuple[int, int], int] = defaultdict(int)
    gpu_tot: dict[tuple[int, int], int] = defaultdict(int)
    for src, dst in ((self_by, cpu_tot), (gpu_key, gpu_tot)):
        for (m, ph), v in src.items():
            if m < 0:
                dst[(m, ph)] += v
                continue
            for anc in _ancestors(run.modules[m][0]):
                if anc in slot:
                    dst[(slot[anc], ph)] += v
    rows: list[dict[str, Any]] = []
    for m, ph in sorted(set(cpu_tot) | set(gpu_tot) | set(ops_by)):
        qual, typ = (UNATTRIBUTED, "") if m < 0 else run.modules[m]
        cpu_total, gpu_total = cpu_tot.get((m, ph), 0), gpu_tot.get((m, ph), 0)
        tops = sorted(top_by[(m, ph)].items(), key=lambda kv: (-kv[1], kv[0]))[:top_ops]
        rows.append({
            "module": qual, "type": typ, "phase": PHASES[ph], "ops": ops_by.get((m, ph), 0),
            "cpu_total_ns": int(cpu_total), "cpu_self_ns": int(self_by.get((m, ph), 0)),
            "gpu_total_ns": int(gpu_total), "gpu_self_ns": int(gpu_key.get((m, ph), 0)),
            "top_ops": [[nm, int(ns)] for nm, ns in tops],
        })
    rows.sort(key=lambda r: (PHASES.index(r["phase"]), r["module"] == UNATTRIBUTED,
                             -r["cpu_total_ns"], -r["gpu_total_ns"], r["module"]))
    counts.update({
        "cpu_ops": int(len(cpu)),
        "attributed_ops": int(np.count_nonzero(module[cpu] >= 0)),
        "backward_nodes": int(len(nodes)),
        "gpu_activities": n_gpu,
        "attributed_gpu": attributed_gpu,
        "in_kernels": int(len(hit)),
    })
    return Attribution(rows, counts)
