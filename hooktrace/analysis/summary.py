"""Per-module call statistics of one run, computed with vectorized numpy.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 1000, 3000, 5000]
    >>> trace = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 1, "hostname": "h", "dropped_events": 0,
    ...                    "overwritten_events": 0})
    >>> s = Summary.from_trace(trace)
    >>> [(r["module"], r["calls"], r["total_ns"], r["self_ns"]) for r in s.rows]
    [('', 1, 5000, 3000), ('fc', 1, 2000, 2000)]
    >>> print(s)  # doctest: +NORMALIZE_WHITESPACE
    module  type    calls  total    self     p50
    <root>  Net         1  5.00 µs  3.00 µs  5.00 µs
    fc      Linear      1  2.00 µs  2.00 µs  2.00 µs
    sorted by forward total + backward total, descending
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.analysis._summary_columns import (
    COLUMNS,
    COMPILE_ROW,
    UNATTRIBUTED,
    kernel_notes,
)
from hooktrace.analysis.calls import KERNELS, MEASURED, Calls
from hooktrace.analysis.columns import PROVIDERS, cell_text
from hooktrace.analysis.groups import Groups
from hooktrace.analysis.kernels import fused_modules
from hooktrace.reading import (
    CAT_BACKWARD,
    CAT_FORWARD,
    CAT_RECOMPUTE,
    SPAN_EVAL,
    Spans,
    attached_compiled,
    compile_intervals,
    compile_steps,
)
from hooktrace.text import (
    CUT_NOTE,
    align_columns,
    csv_text,
    describe_dump,
    format_ns,
    printable,
    shorten_distinct,
    text_lines,
)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["StepTable", "Summary", "TEXT_WIDTH", "UNATTRIBUTED", "format_ns"]

TEXT_WIDTH = 120  # the default text table fits this many columns (issue #7)
# hooktrace attach to a model compiled before it (issue #47: the summary showed <root>
# alone, with no word why)
ATTACHED_COMPILED = ("the model was compiled (torch.compile) before hooktrace attached: each "
                     "compiled region is one span, the module whose call entered it; trace "
                     "from the start (hooktrace run) to see its modules (docs/compiled.md)")


class Summary:
    """Per-module statistics, forward and backward side by side (times in ns).

    One row per module and mode (``module`` = qualified name, ``""`` for the root;
    ``type`` = class name; ``mode`` = ``"train"``, or ``"eval"`` for its calls made
    with grad off or in eval mode, a row of their own), with the keys, in CSV
    column order:

    * forward calls: ``calls``, ``total_ns``, ``self_ns``, ``mean_ns``,
      ``p50_ns``, ``p99_ns`` (percentiles of call durations);
    * backward spans (one per forward call and backward pass): ``bwd_calls``,
      ``bwd_total_ns``, ``bwd_self_ns`` (time of the autograd nodes attributed
      directly to the module), ``bwd_p50_ns``, ``bwd_p99_ns``;
    * ``bwd_fwd_ratio`` = ``bwd_total_ns / total_ns``;
    * activation-checkpoint recompute: ``recompute_calls``, ``recompute_total_ns``;
    * ``timing``: ``"measured"`` (module calls), ``"kernels"`` (a module inside a
      compiled region: per call of the region, the time of the kernels that ran its
      ops, hooktrace.analysis.kernels), or ``"measured+kernels"`` when it has both.

    Counts and totals are 0 when a phase has no calls; means, percentiles and
    the ratio are None (blank in CSV) then. Autograd time attributed to no
    module gets one row per node name, with ``module`` = ``"<unattributed>"``,
    ``type`` = the node name, and only the backward keys filled (``bwd_calls`` =
    node executions, ``bwd_total_ns`` = ``bwd_self_ns`` = their summed self
    time, percentiles of that self time); the others are None.

    **What the times mean.** Forward: ``total`` is the wall time of the calls
    and ``self`` is total minus the direct children's totals, so a parent's
    total = its self + its children's totals, exactly. Backward: ``bwd_total``
    runs from the first to the last autograd node of the call and of its
    submodules' calls; ``bwd_self`` is the time inside the nodes attributed to
    the module itself. The nodes of a backward pass do not tile it: between
    them the autograd engine schedules, and unattributed nodes
    (``AccumulateGrad``, the loss's) run, so ``bwd_total`` - ``bwd_self`` -
    the children's ``bwd_total`` is that time between nodes (``>= 0`` when the
    children ran one after another on one thread). Modules that are never
    called (containers such as ``nn.ModuleList``) have no row.

    Rows are sorted by ``total_ns + bwd_total_ns``, descending (ties in module
    order). ``str(summary)`` is an aligned table that fits 120 columns
    (``to_text(top=10)`` for the first rows, ``to_text(wide=True)`` for every
    column; backward columns appear when the run has backward data, recompute
    columns when there was any recompute), ``to_csv()`` and ``to_json()`` give
    ``rows`` (a list of dicts) in those forms. A footer says how rows are
    sorted, names lost or partial data (dropped / overwritten events, orphan
    exits, unfinished spans) and unattributed autograd nodes whenever there
    are any.
    """

    def __init__(self, rows: list[dict[str, Any]], counts: dict[str, int],
                 notes: Sequence[str] = (), columns: Sequence[str] = COLUMNS) -> None:
        self.rows = rows
        self.counts = counts
        self.notes = list(notes)  # about the file itself: a dump's where-abouts, a cut
        self.columns = tuple(columns)  # the row keys, in CSV order
        # what the host times are on a GPU (hooktrace.analysis.device_time): "device" when the run
        # recorded device time (the GPU columns lead), "launch" on a CUDA run without it
        # (host times are launch times), "" elsewhere (a CPU run: host time is compute time)
        self.time_kind = "device" if "gpu_total_ns" in self.columns else ""
        # where a complete step's time went, on average (ns): forward, eval, backward and
        # other (the optimizer, data, code outside the model); None without steps or
        # where the source has no spans (a Parquet export's summary)
        self.step_split: dict[str, int] | None = None

    @property
    def gpu(self) -> bool:
        """Whether the run recorded device time (the ``gpu_*`` columns are there)."""
        return "gpu_total_ns" in self.columns

    @property
    def kernels_label(self) -> str:
        """How a kernel-derived row is labelled: "kernel launches" where its host time
        is launch time (CUDA without device time), else "kernels"."""
        return "kernel launches" if self.time_kind == "launch" else "kernels"

    @classmethod
    def from_trace(cls, trace: TraceData, *, peak_tflops: float | None = None) -> Summary:
        """The summary of ``trace``; ``peak_tflops`` (the device's peak, TFLOP/s) gives
        the ``mfu`` column of a run recorded with FLOPs (default: known GPUs' peaks)."""
        spans = trace.spans()
        nodes = spans.nodes
        unattributed = nodes.span < 0
        counts = {
            "dropped_events": trace.dropped_events,
            "overwritten_events": trace.overwritten_events,
            "orphan_exits": spans.orphan_exits,
            "unfinished_spans": spans.unfinished,
            "unattributed_nodes": int(np.count_nonzero(unattributed)),
            "unattributed_ns": int(nodes.self_ns[unattributed].sum()),
        }
        calls = Calls.from_trace(trace)
        rows = _with_fused(module_rows(calls, _unattributed_rows(nodes, trace.node_names)),
                           trace)
        steps = trace.steps()
        # Steps that compiled (torch.compile's first calls, recompiles) are left out of
        # the per-step statistics: they measure the compiler, not the step.
        compiling = compile_steps(steps, compile_intervals(trace.info))
        complete = np.flatnonzero(steps.complete & ~compiling)
        counts["steps"] = len(complete)
        counts["compile_steps"] = int(np.count_nonzero(steps.complete & compiling))
        add_per_step_columns(rows, calls, steps.number[complete])
        step_split = None
        if len(complete):
            d = steps.duration_ns[complete]
            counts["step_p50_ns"] = int(np.percentile(d, 50))
            counts["step_p99_ns"] = int(np.percentile(d, 99))
            step_split = _step_split(spans, trace.span_steps(), complete, d)
        notes = [f"dump ({trace.info['dump'].get('reason')}): {line}"
                 for line in describe_dump(trace.info)]
        notes += kernel_notes(trace, rows)
        if isinstance(trace.info.get("cut"), str):
            notes.append(trace.info["cut"])
        if attached_compiled(trace.info):
            notes.append(ATTACHED_COMPILED)
        # each recorded quantity's columns (hooktrace.analysis.columns): the leading ones
        # after module, type, mode, timing (they sort the rows), the others last
        lead: tuple[str, ...] = ()
        tail: tuple[str, ...] = ()
        attributes: dict[str, Any] = {}
        for provider in PROVIDERS:
            part = (provider.summary(rows, trace, {"peak_tflops": peak_tflops})
                    if provider.recorded(trace) else provider.unrecorded(trace))
            if part.lead:
                lead += part.columns
            else:
                tail += part.columns
            notes += part.notes
            attributes.update(part.attributes)
        columns = COLUMNS[:4] + lead + COLUMNS[4:] + tail
        if lead:  # every row's keys in column order: the leading columns first (--json, report)
            rows = [{key: row.get(key) for key in columns} for row in rows]
        out = cls(rows, counts, notes, columns)
        for name, value in attributes.items():
            setattr(out, name, value)
        out.step_split = step_split
        return out

    def footer(self, shown: Sequence[str] | None = None) -> str:
        """How rows are sorted, one short line per shown column that needs one, then
        lost or partial data and unattributed nodes when there are any. ``shown``: the
        row keys of the columns shown (None: every column), so that nothing explains
        a column the table does not have."""
        c = self.counts
        keys = set(self.columns if shown is None else shown)
        lines = (["sorted by gpu_total + gpu_bwd_total (device time), descending; host_*: host "
                  "time"] if self.gpu else
                 ["sorted by forward total + backward total, descending"])
        if c.get("steps"):
            lines.append(f"{c['steps']} complete steps: p50 {format_ns(c['step_p50_ns'])}, "
                         f"p99 {format_ns(c['step_p99_ns'])} per step"
                         + ("; step_p50/step_p99: a module's forward + backward time per step"
                            if "step_p50_ns" in keys else ""))
        split = self.step_split
        if split and split["step"] > 0:
            parts = [(what, split[what]) for what in ("forward", "eval", "backward", "other")
                     if what != "eval" or split["eval"]]
            line = "a step on average: " + ", ".join(
                f"{what} {format_ns(ns)} ({100 * ns / split['step']:.0f}%)" for what, ns in parts)
            why = " (other: optimizer, data)"
            lines.append(line + why if len(line + why) <= 120 else line)  # (the table's width)
        if c.get("compile_steps") or any(r["module"] == COMPILE_ROW for r in self.rows):
            lines.append(f"{COMPILE_ROW}: compile time, out of its callers' self time; "
                         f"{c.get('compile_steps', 0)} compile steps left out of step statistics")
        if any(r.get("mode") == "eval" for r in self.rows):
            lines.append("[eval]: the calls made with grad off (no_grad, inference_mode) or the "
                         "module in eval mode")
        if any(r.get("timing") == "kernels" for r in self.rows):
            if self.time_kind == "launch":
                lines.append("[kernel launches]: in a compiled region: per call of the region, "
                             "the host time launching the module's kernels (not their run time)")
            elif self.gpu:
                lines.append("[kernels]: in a compiled region: gpu_*: the device time of the "
                             "module's kernels; host_*: the host time launching them")
            else:
                lines.append("[kernels]: in a compiled region: per call of the region, the time "
                             "of the kernels that ran the module's ops")
            if fused_phases(self.rows):
                lines.append("fused: no kernel of its own in that phase; its ops ran in kernels "
                             "counted in an enclosing module")
        if keys & {"bwd_total_ns", "bwd_self_ns"} and any(r["bwd_calls"] for r in self.rows):
            lines.append("bwd_total: first to last autograd node of a call and its submodules; "
                         "bwd_self: in its own nodes")
        lost = [(c.get("dropped_events", 0), "events dropped (buffer full)"),
                (c.get("overwritten_events", 0), "events overwritten (ring buffer)"),
                (c.get("orphan_exits", 0), "orphan exits"),
                (c.get("unfinished_spans", 0), "unfinished spans")]
        if any(n for n, _ in lost):
            lines.append("note: " + ", ".join(f"{n} {what}" for n, what in lost if n)
                         + " - totals may be incomplete")
        if c.get("unattributed_nodes", 0):
            lines.append(
                f"note: {c['unattributed_nodes']} autograd nodes "
                f"({format_ns(c['unattributed_ns'])}) ran outside any traced module call "
                f"(rows {UNATTRIBUTED})"
            )
        # (a note explaining a quantity's columns: with them, as its provider says)
        lines += [f"note: {n}" for n in self.notes
                  if all(p.note_shown(n, keys) is not False for p in PROVIDERS)]
        lines += [line for p in PROVIDERS for line in p.footer(self)]
        return text_lines(lines)

    def to_text(self, top: int | None = None, *, wide: bool = False,
                width: int = TEXT_WIDTH, **shown: bool) -> str:
        """Aligned text table of the first ``top`` rows (all when None).

        Fits ``width`` columns (long module names are shortened from the left)
        unless ``wide``, which shows every column and full names. A recorded quantity's
        flag (its provider's ``text_flag``: ``flops=True``, ``memory=True``,
        ``numerics=True``) adds its columns to the narrow table (``wide`` has them when
        recorded; the narrow one shows the CUDA device's memory when recorded, else
        the CPU's).
        """
        rows = self.rows[:top]
        has_bwd = any(r["bwd_calls"] for r in self.rows)
        has_rec = any(r["recompute_calls"] for r in self.rows)
        has_steps = any(r["step_p50_ns"] is not None for r in self.rows)
        if wide:
            columns = list(_TEXT_FORWARD) + (_TEXT_BACKWARD if has_bwd else []) + (
                _TEXT_RECOMPUTE if has_rec else []) + (_TEXT_STEPS if has_steps else [])
        else:
            columns = list(_TEXT_NARROW) + (_TEXT_NARROW_BACKWARD if has_bwd else []) + (
                _TEXT_RECOMPUTE[:1] if has_rec else [])
        # each recorded quantity's columns, from its provider (hooktrace.analysis.columns)
        unknown = set(shown) - {p.text_flag for p in PROVIDERS if p.text_flag}
        if unknown:
            raise TypeError(f"to_text() got an unexpected keyword argument {min(unknown)!r}")
        for p in PROVIDERS:
            if wide or shown.get(p.text_flag, False):
                columns += p.text_columns(self.columns, self.rows, wide=wide, backward=has_bwd)
        for p in PROVIDERS:
            columns = p.text_layout(columns, self.columns, wide=wide, backward=has_bwd)
        header = [title for title, _ in columns]
        fused = fused_phases(self.rows)
        label = self.kernels_label
        # (cells printable before they are measured: an escaped name keeps the columns)
        table = [header] + [[printable(_cell(r, key, fused.get((r["module"], r.get("mode")), ()),
                                             label))
                             for _, key in columns] for r in rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        cut_names = False
        if not wide:  # shorten the names (type to 24 first, then module, then type) to fit
            for col, floor in ((1, 24), (0, 16), (1, 8)):
                excess = sum(widths) + 2 * (len(widths) - 1) - width
                if excess > 0 and widths[col] > floor:
                    keep = max(widths[col] - excess, len(header[col]), floor)
                    # two different names never read the same (text.shorten_distinct),
                    # rows left out by `top` included: the cut keeps what tells a shown
                    # row from every other row of the run
                    every = [printable(_cell(r, columns[col][1], (), label))
                             for r in self.rows]
                    # (module names cut at their dots, never into a string that is not
                    # a name; class names in their middle)
                    cut = shorten_distinct(every, keep, names=col == 0)
                    for line, text in zip(table[1:], cut):
                        cut_names = cut_names or line[col] != text
                        line[col] = text
                    widths[col] = max(len(line[col]) for line in table)
        lines = align_columns(table, 2)  # module and type left-aligned; numbers right
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more rows")
        foot = self.footer([key for _, key in columns])
        if foot:
            lines += foot.split("\n")  # (its lines are printable already: text_lines)
        if cut_names:
            lines.append(CUT_NOTE)
        return text_lines(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Summary {len(self.rows)} rows>"

    def to_csv(self, top: int | None = None) -> str:
        """CSV text of the first ``top`` rows (all when None) with a header row
        (the keys above); durations in ns, None blank."""
        return csv_text(self.rows[:top], self.columns)

    def to_json(self, top: int | None = None) -> str:
        """JSON text: ``{"rows": [...], "counts": {...}, "notes": [...]}`` (first ``top``
        rows; the notes the text prints, e.g. where a killed run's file was cut);
        durations in ns; what the recorded quantities' providers add (numerics:
        ``"first_nonfinite"``, null when every value was finite)."""
        doc: dict[str, Any] = {"rows": self.rows[:top], "counts": self.counts,
                               "notes": self.notes}
        for p in PROVIDERS:
            doc.update(p.summary_json(self))
        return json.dumps(doc, ensure_ascii=False)


# (text header, row key) per text column
_TEXT_FORWARD = [("module", "module"), ("type", "type"), ("calls", "calls"),
                 ("total", "total_ns"), ("self", "self_ns"), ("mean", "mean_ns"),
                 ("p50", "p50_ns"), ("p99", "p99_ns")]
_TEXT_BACKWARD = [("bwd_calls", "bwd_calls"), ("bwd_total", "bwd_total_ns"),
                  ("bwd_self", "bwd_self_ns"), ("bwd_p50", "bwd_p50_ns"),
                  ("bwd_p99", "bwd_p99_ns"), ("bwd/fwd", "bwd_fwd_ratio")]
_TEXT_RECOMPUTE = [("recompute", "recompute_calls"), ("recompute_total", "recompute_total_ns")]
_TEXT_STEPS = [("step_p50", "step_p50_ns"), ("step_p99", "step_p99_ns")]
# The default table: what fits 120 columns with typical module names.
_TEXT_NARROW = [("module", "module"), ("type", "type"), ("calls", "calls"),
                ("total", "total_ns"), ("self", "self_ns"), ("p50", "p50_ns")]
_TEXT_NARROW_BACKWARD = [("bwd_total", "bwd_total_ns"), ("bwd_self", "bwd_self_ns"),
                         ("bwd/fwd", "bwd_fwd_ratio")]


def module_rows(calls: Calls, extra: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The summary's rows of a per-call table (every view's one reduction, issue #37):
    per module and mode, its forward, backward and recompute calls grouped
    (hooktrace.analysis.groups.Groups), in COLUMNS; ``extra`` rows (``<unattributed>``)
    join before the ``<torch.compile>`` row; sorted by forward + backward total,
    descending (stable: equal totals keep slot order, train before eval)."""
    group, n = calls.group_ids()
    per_cat = [Groups(group[sel], calls.dur[sel], calls.self_ns[sel], 2 * n)
               for sel in (calls.cat == cat for cat in (CAT_FORWARD, CAT_BACKWARD, CAT_RECOMPUTE))]
    measured = set(np.unique(group[calls.timing != KERNELS]).tolist())
    kernels = set(np.unique(group[calls.timing == KERNELS]).tolist())
    fwd, bwd, rec = per_cat
    rows: list[dict[str, Any]] = []
    compile_rows: list[dict[str, Any]] = []
    # train rows by slot, then eval rows, the compile row last
    ids = np.union1d(np.union1d(fwd.ids, bwd.ids), rec.ids).tolist()
    for g in sorted(ids, key=lambda g: (g % n == calls.compile_module, g >= n, g % n)):
        m = g % n
        row: dict[str, Any] = {"module": calls.names[m], "type": calls.types[m],
                               "mode": "eval" if g >= n else "train",
                               "timing": "+".join(w for w, on in (("measured", g in measured),
                                                                  ("kernels", g in kernels)) if on)}
        row.update(_stats(fwd, g, ""))
        row.update(_stats(bwd, g, "bwd_"))
        row["bwd_fwd_ratio"] = (row["bwd_total_ns"] / row["total_ns"]
                                if row["bwd_calls"] and row["total_ns"] else None)
        row.update(_stats(rec, g, "recompute_"))  # (keys not in COLUMNS: dropped below)
        if m == calls.compile_module:  # (compile time: no ratio)
            row["bwd_fwd_ratio"] = None
            compile_rows.append(row)
        else:
            rows.append(row)
    rows = rows + list(extra) + compile_rows
    rows.sort(key=lambda r: -((r.get("total_ns") or 0) + r["bwd_total_ns"]))
    return [{key: row.get(key) for key in COLUMNS} for row in rows]  # (a key not set: None)


def _unattributed_rows(nodes: Any, node_names: Sequence[str]) -> list[dict[str, Any]]:
    """The ``<unattributed>`` rows: per autograd node name, the self time of its
    executions outside every module's backward (the loss's nodes, AccumulateGrad)."""
    loose = nodes.span < 0
    if not loose.any():
        return []
    name_id = nodes.name[loose].astype(np.int64)
    self_ns = nodes.self_ns[loose]
    groups = Groups(name_id, self_ns, self_ns, int(name_id.max()) + 1)
    rows = []
    for k in groups.ids.tolist():
        row: dict[str, Any] = {"module": UNATTRIBUTED,
                               "type": node_names[k] if k < len(node_names) else f"<node {k}>",
                               "mode": "train", "timing": "measured"}
        row.update(_stats(groups, k, "bwd_"))  # (the forward keys: None, in module_rows)
        rows.append(row)
    return rows


def add_per_step_columns(rows: list[dict[str, Any]], calls: Calls,
                         complete: np.ndarray) -> None:
    """Each train row's ``step_p50_ns``/``step_p99_ns``: the median and p99 over the
    ``complete`` steps (step numbers) of the module's measured forward + backward time
    in the step (0 in a step it did not run); None without complete steps."""
    per_step: dict[str, np.ndarray] = {}
    if len(complete) and len(calls):
        col = calls.step_columns(complete)
        keep = ((col >= 0) & (calls.timing == MEASURED) & (calls.cat != CAT_RECOMPUTE)
                & ~calls.eval)
        module, c = calls.module[keep], col[keep]
        n_mod = len(calls.names)
        totals = np.bincount(module * len(complete) + c, weights=calls.dur[keep],
                             minlength=n_mod * len(complete)).reshape(n_mod, len(complete))
        per_step = {calls.names[m]: totals[m] for m in np.unique(module).tolist()}
    for row in rows:
        values = (per_step.get(row["module"])
                  if row["module"] != UNATTRIBUTED and row["mode"] == "train" else None)
        row["step_p50_ns"] = None if values is None else float(np.percentile(values, 50))
        row["step_p99_ns"] = None if values is None else float(np.percentile(values, 99))


def _stats(groups: Groups, gid: int, prefix: str) -> dict[str, Any]:
    """The row entries of group ``gid`` (zeros and Nones when it had no calls)."""
    pos = groups.index(gid)
    if pos < 0:
        return {f"{prefix}calls": 0, f"{prefix}total_ns": 0, f"{prefix}self_ns": 0,
                f"{prefix}mean_ns": None, f"{prefix}p50_ns": None, f"{prefix}p99_ns": None}
    n = int(groups.counts[pos])
    total = int(groups.total[pos])
    return {f"{prefix}calls": n, f"{prefix}total_ns": total,
            f"{prefix}self_ns": int(groups.self_total[pos]), f"{prefix}mean_ns": total / n,
            f"{prefix}p50_ns": float(groups.percentile(50)[pos]),
            f"{prefix}p99_ns": float(groups.percentile(99)[pos])}


def _step_split(spans: Spans, span_steps: np.ndarray, complete: np.ndarray,
                durations: np.ndarray) -> dict[str, int]:
    """Where the complete steps' time went, per step on average (ns): outermost training
    forward, eval and backward spans, and ``other`` (>= 0: threads may overlap)."""
    in_complete = np.zeros(int(span_steps.max(initial=-1)) + 2, bool)
    in_complete[complete[complete < len(in_complete)]] = True
    sel = (span_steps >= 0) & in_complete[np.maximum(span_steps, 0)] & (spans.parent < 0)
    dur = spans.duration_ns
    eval_ = (spans.flags & SPAN_EVAL) != 0
    n = max(1, len(complete))
    out = {"forward": int(dur[sel & (spans.cat == CAT_FORWARD) & ~eval_].sum()) // n,
           "eval": int(dur[sel & (spans.cat == CAT_FORWARD) & eval_].sum()) // n,
           "backward": int(dur[sel & (spans.cat == CAT_BACKWARD)].sum()) // n,
           "step": int(durations.sum()) // n}
    out["other"] = max(0, out["step"] - out["forward"] - out["eval"] - out["backward"])
    return out


class StepTable:
    """One row per step: ``step``, ``start_s`` (seconds from the first step's start),
    ``duration_ns``, ``forward_ns`` / ``backward_ns`` (the time of the step's outermost
    forward / backward spans), ``spans``, ``complete``; ``to_text``/``to_csv``/``to_json``.

    Example:
        >>> t = StepTable([{"step": 0, "start_s": 0.0, "duration_ns": 2_000_000,
        ...                 "forward_ns": 500_000, "backward_ns": 900_000, "spans": 12,
        ...                 "complete": True}])
        >>> print(t.to_text())  # doctest: +NORMALIZE_WHITESPACE
        step  start_s  duration  forward   backward  spans
           0    0.000   2.00 ms   500 µs     900 µs     12
        1 steps: p50 2.00 ms, p99 2.00 ms
    """

    COLUMNS = ("step", "start_s", "duration_ns", "forward_ns", "backward_ns", "spans", "complete",
               "compile")

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    @classmethod
    def from_trace(cls, trace: TraceData) -> StepTable:
        steps = trace.steps()
        spans = trace.spans()
        row_of = trace.span_steps()
        outer = spans.parent < 0
        t0 = int(steps.start_ns[0]) if len(steps) else 0
        # One pass per column, not one per step: a mask per step made a 2,000-step,
        # 1.1 M-span run take 9.4 s here (benchmarks/diff_report.py); this takes ~0.05 s.
        n = len(steps)
        dur = spans.duration_ns
        inside = row_of >= 0

        def per_step(sel: np.ndarray) -> np.ndarray:
            return np.bincount(row_of[sel], weights=dur[sel], minlength=n).astype(np.int64)

        fwd = per_step(inside & outer & (spans.cat == CAT_FORWARD))
        bwd = per_step(inside & outer & (spans.cat == CAT_BACKWARD))
        count = np.bincount(row_of[inside], minlength=n)
        compiling = compile_steps(steps, compile_intervals(trace.info))
        return cls([{"step": int(steps.number[i]),
                     "start_s": (int(steps.start_ns[i]) - t0) / 1e9,
                     "duration_ns": int(steps.duration_ns[i]),
                     "forward_ns": int(fwd[i]), "backward_ns": int(bwd[i]),
                     "spans": int(count[i]), "complete": bool(steps.complete[i]),
                     "compile": bool(compiling[i])} for i in range(n)])

    def to_text(self, top: int | None = None, *, wide: bool = False) -> str:
        if not self.rows:
            return ("no steps: the run has no step marks (hooktrace.trace() ends a step at "
                    "each Optimizer.step(), or call trace.step())")
        header = ["step", "start_s", "duration", "forward", "backward", "spans"]
        table = [header] + [
            [str(r["step"]) + ("c" if r.get("compile") else "") + ("" if r["complete"] else "*"),
             f"{r['start_s']:.3f}",
             format_ns(r["duration_ns"]), format_ns(r["forward_ns"]),
             format_ns(r["backward_ns"]), str(r["spans"])] for r in self.rows[:top]]
        lines = align_columns(table, 0)
        done = [r["duration_ns"] for r in self.rows if r["complete"] and not r.get("compile")]
        compiled = sum(1 for r in self.rows if r["complete"] and r.get("compile"))
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more steps")
        if done:
            lines.append(f"{len(done)} steps: p50 {format_ns(float(np.percentile(done, 50)))}, "
                         f"p99 {format_ns(float(np.percentile(done, 99)))}"
                         + (f" ({compiled} compile steps left out)" if compiled else ""))
        if any(r.get("compile") for r in self.rows):
            lines.append("c: torch.compile compiled during the step (first calls, recompiles)")
        if not all(r["complete"] for r in self.rows):
            lines.append("* not ended by a step mark: recorded after the last one")
        return text_lines(lines)

    def to_csv(self, top: int | None = None) -> str:
        return csv_text(self.rows[:top], self.COLUMNS)

    def to_json(self, top: int | None = None) -> str:
        return json.dumps({"steps": self.rows[:top]})


_PHASE_KEYS = {"calls": ("calls", "total_ns", "self_ns", "mean_ns", "p50_ns", "p99_ns",
                          "step_p50_ns", "step_p99_ns", "bwd_fwd_ratio"),
               "bwd_calls": ("bwd_calls", "bwd_total_ns", "bwd_self_ns", "bwd_p50_ns",
                             "bwd_p99_ns", "bwd_fwd_ratio")}


def fused_phases(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str | None], list[str]]:
    """(module, mode) -> the phases ("forward", "backward") in which a kernel-timed row
    (a module inside a compiled region) ran no kernel of its own while a module
    enclosing it did: its ops there were fused into kernels counted in an enclosing
    module (or were views). Its 0 calls there is not 0 ns of work."""
    active = {(r["module"], r.get("mode"), key) for r in rows
              for key in ("calls", "bwd_calls") if r.get(key)}
    out: dict[tuple[str, str | None], list[str]] = {}
    for r in rows:
        if r.get("timing") != "kernels":
            continue
        name = r["module"]
        ancestors = [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)] + [""]
        phases = [phase for phase, key in (("forward", "calls"), ("backward", "bwd_calls"))
                  if r.get(key) == 0
                  and any((a, r.get("mode"), key) in active for a in ancestors if a != name)]
        if phases:
            out[(name, r.get("mode"))] = phases
    return out


def _with_fused(rows: list[dict[str, Any]], trace: TraceData) -> list[dict[str, Any]]:
    """``rows`` plus a row for each module of a compiled region that ran with no kernel
    of its own (hooktrace.analysis.kernels.fused_modules: its ops were all fused into other
    modules' kernels), and every row's ``fused`` key: the phases ("forward",
    "backward", "forward+backward") in which the module's ops ran in kernels counted
    in an enclosing module, or None. A fused phase's times are None (not 0 ns: the
    work was done, in another row's kernels); its call count stays 0."""
    have = {(r["module"], r["mode"]) for r in rows}
    added: dict[tuple[str, str], dict[str, Any]] = {}
    for slot, eval_, _phase in sorted(fused_modules(trace)):
        name, type_name = trace.modules[slot]
        mode = "eval" if eval_ else "train"
        if (name, mode) in have or (name, mode) in added:
            continue
        row = dict.fromkeys(COLUMNS)
        row.update(module=name, type=type_name, mode=mode, timing="kernels", calls=0,
                   bwd_calls=0, recompute_calls=0, recompute_total_ns=0)
        added[(name, mode)] = row
    rows = rows + list(added.values())
    fused = fused_phases(rows)
    for row in rows:
        phases = fused.get((row["module"], row.get("mode")), [])
        row["fused"] = "+".join(phases) or None
        for phase in phases:
            for key in (("total_ns", "self_ns") if phase == "forward"
                        else ("bwd_total_ns", "bwd_self_ns")):
                row[key] = None
    return rows


def _cell(row: dict[str, Any], key: str, fused: Sequence[str] = (),
          kernels: str = "kernels") -> str:
    value = row[key]
    for phase, calls in (("forward", "calls"), ("backward", "bwd_calls")):
        if key in _PHASE_KEYS[calls] and phase in fused:
            return "fused" if key in _PHASE_KEYS[calls][:2] else ""
    if key == "module":
        return ((value or "<root>") + (" [eval]" if row.get("mode") == "eval" else "")
                + (f" [{kernels}]" if row.get("timing") == "kernels" else ""))
    if value is None or (key in _PHASE_KEYS["bwd_calls"] and not row.get("bwd_calls")):
        return ""  # (a row without backward, an [eval] one: blank, not "0 ns": issue #38)
    if key == "bwd_fwd_ratio":
        return f"{value:.2f}"
    text = cell_text(key, value)  # a recorded quantity's cells read as its provider says
    if text is not None:
        return text
    return format_ns(value) if key.endswith("_ns") else str(value)
