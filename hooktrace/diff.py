"""Run-to-run comparison: per module and phase, how much slower or faster B is than A.

One row per (module, phase) present in both runs, ``phase`` being ``"forward"``
or ``"backward"``, with p50 time per call and per step in A and B, their
absolute and relative change, and the number of calls (per step when both
runs have steps). Rows are sorted by impact: the absolute change of the
module's *self* time per step (per run when a run has no steps; forward self
excludes the children's calls, backward self is the module's own autograd
nodes), largest first, then by the change of its total time. Self time puts
the module where the time was added first: a slowed leaf adds the same total
time to every ancestor, but self time only to itself. Modules seen in one run
only are listed apart, and the step itself is compared when both runs have
complete steps.

Modules are matched by qualified name, so the same model traced twice (or a
model whose code changed inside one module) compares row for row.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> def run(fc_ns):
    ...     ev = np.zeros(4, EVENT_DTYPE)
    ...     ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]
    ...     ev["t"] = [0, 1000, 1000 + fc_ns, 2000 + fc_ns]
    ...     return TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                      {"pid": 1, "hostname": "h", "dropped_events": 0,
    ...                       "overwritten_events": 0})
    >>> d = compare(run(1000), run(3000))
    >>> [(r["module"], r["phase"], r["p50_a_ns"], r["p50_b_ns"]) for r in d.rows]
    [('fc', 'forward', 1000.0, 3000.0), ('', 'forward', 3000.0, 5000.0)]
    >>> d.failures(50.0, min_share=0.0)
    ['fc forward: +200.0%', '<root> forward: +66.7%']
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, TraceData

__all__ = ["Diff", "PHASES", "compare"]

PHASES = {"forward": CAT_FORWARD, "backward": CAT_BACKWARD}
_STEP = "<step>"  # the row name of the step itself

_COLUMNS = ("module", "type", "phase", "p50_a_ns", "p50_b_ns", "p50_change_ns", "p50_change_pct",
            "per_step_a_ns", "per_step_b_ns", "per_step_change_ns", "per_step_change_pct",
            "self_per_step_change_ns", "calls_a", "calls_b", "share_a")


@dataclass
class _PhaseStats:
    """One run's numbers for a (module, phase): p50 per call, time and calls per step."""

    type: str
    p50_ns: float
    per_step_ns: float
    self_per_step_ns: float
    calls: float


@dataclass
class _RunStats:
    per_key: dict[tuple[str, str], _PhaseStats]
    steps: int  # complete steps (0: the whole run counts as one)
    step_p50_ns: float | None
    total_ns: float  # time per step of the root calls, forward + backward: the run's scale


def _stats(trace: TraceData) -> _RunStats:
    spans = trace.spans()
    steps = trace.steps()
    complete = np.flatnonzero(steps.complete)
    n_steps = len(complete)
    span_step = trace.span_steps() if n_steps else np.zeros(len(spans), np.int64)
    # per span: its column among the complete steps (-1: outside them)
    if n_steps:
        col = np.full(len(steps) + 1, -1, np.int64)
        col[complete] = np.arange(n_steps)
        span_col = col[span_step]
    else:
        span_col = np.zeros(len(spans), np.int64)
    width = max(n_steps, 1)
    dur = spans.duration_ns
    out: dict[tuple[str, str], _PhaseStats] = {}
    root_total = 0.0
    for phase, cat in PHASES.items():
        sel = np.flatnonzero(spans.cat == cat)
        if not len(sel):
            continue
        module = spans.module[sel].astype(np.int64)
        order = np.lexsort((dur[sel], module))
        m_sorted = module[order]
        d_sorted = dur[sel][order]
        starts = np.flatnonzero(np.r_[True, m_sorted[1:] != m_sorted[:-1]])
        counts = np.diff(np.r_[starts, len(m_sorted)])
        ids = m_sorted[starts]
        lo = (counts - 1) // 2
        hi = counts // 2
        p50 = (d_sorted[starts + lo] + d_sorted[starts + hi]) / 2.0  # np.percentile(.., 50)
        n_mod = int(module.max()) + 1
        in_step = span_col[sel] >= 0
        cell = module[in_step] * width + span_col[sel][in_step]
        per_step = np.bincount(cell, weights=dur[sel][in_step],
                               minlength=n_mod * width).reshape(n_mod, width)
        self_step = np.bincount(cell, weights=spans.self_ns[sel][in_step],
                                minlength=n_mod * width).reshape(n_mod, width)
        calls = np.bincount(cell, minlength=n_mod * width).reshape(n_mod, width)
        for k, m in enumerate(ids.tolist()):
            name, type_name = (trace.modules[m] if m < len(trace.modules)
                               else (f"<module {m}>", "?"))
            out[(name, phase)] = _PhaseStats(type_name, float(p50[k]),
                                             float(np.percentile(per_step[m], 50)),
                                             float(np.percentile(self_step[m], 50)),
                                             float(np.percentile(calls[m], 50)))
        roots = spans.parent[sel] < 0
        root_total += float(dur[sel][roots & (span_col[sel] >= 0)].sum()) / width
    step_p50 = (float(np.percentile(steps.duration_ns[complete], 50)) if n_steps else None)
    return _RunStats(out, n_steps, step_p50, step_p50 if step_p50 else root_total)


def _change(a: float | None, b: float | None) -> tuple[float | None, float | None]:
    if a is None or b is None:
        return None, None
    if a <= 0:  # no relative change from nothing (a module whose calls took 0 ns)
        return b - a, (0.0 if b == a else None)
    return b - a, (b - a) / a * 100.0


@dataclass
class Diff:
    """A comparison of run B against run A (see the module docstring).

    ``rows``: dicts with the keys of ``COLUMNS`` (times in ns; ``*_change_pct``
    relative to A; ``self_per_step_change_ns`` the change of self time, the sort
    key; ``share_a`` = the row's time per step over A's step time);
    ``step``: the same for the step itself, or None; ``only_a`` / ``only_b``:
    ``(module, phase)`` seen in one run only; ``per_step``: whether both runs
    had complete steps (otherwise "per step" means the whole run).
    """

    rows: list[dict[str, Any]]
    step: dict[str, Any] | None
    only_a: list[tuple[str, str]]
    only_b: list[tuple[str, str]]
    per_step: bool
    names: tuple[str, str] = ("A", "B")
    COLUMNS: tuple[str, ...] = field(default=_COLUMNS, repr=False)

    def failures(self, pct: float, *, min_share: float = 1.0) -> list[str]:
        """Rows (and the step) that got slower by more than ``pct`` percent, one line each.

        A module row is compared on its time per step when both runs have steps
        (so more calls count as slower), else on its p50 time per call; rows
        under ``min_share`` percent of A's step time are left out: a module that
        small moves by large percentages from run to run on timer resolution and
        scheduling alone, and a gate on it would fail at random.
        """
        key = "per_step_change_pct" if self.per_step else "p50_change_pct"
        bad = []
        for r in ([self.step] if self.step else []) + self.rows:
            change = r[key] if r is not self.step else r["per_step_change_pct"]
            if change is None or change <= pct:
                continue
            if r is not self.step and (r["share_a"] or 0.0) * 100.0 < min_share:
                continue
            bad.append(f"{r['module'] or '<root>'} {r['phase']}: +{change:.1f}%")
        return bad

    def to_json(self, top: int | None = None, failed: Sequence[str] | None = None) -> str:
        doc: dict[str, Any] = {
            "a": self.names[0], "b": self.names[1], "per_step": self.per_step,
            "step": self.step, "rows": self.rows if top is None else self.rows[:top],
            "only_a": [{"module": m, "phase": p} for m, p in self.only_a],
            "only_b": [{"module": m, "phase": p} for m, p in self.only_b],
        }
        if failed is not None:
            doc["failed"] = list(failed)
        return json.dumps(doc, ensure_ascii=False, allow_nan=False, default=_json_number)

    def to_text(self, top: int | None = None) -> str:
        from hooktrace.summary import format_ns

        unit = "step" if self.per_step else "run"
        header = ["module", "phase", "p50 A", "p50 B", "Δ/call", f"per {unit} A",
                  f"per {unit} B", f"Δ/{unit}", f"Δself/{unit}", "calls A→B"]
        body = []
        shown = self.rows if top is None else self.rows[:top]
        for r in ([self.step] if self.step else []) + shown:
            is_step = r is self.step
            calls = "" if is_step else (_num(r["calls_a"]) if r["calls_a"] == r["calls_b"]
                                        else f"{_num(r['calls_a'])}→{_num(r['calls_b'])}")
            body.append([
                r["module"] or "<root>", r["phase"],
                "" if is_step else format_ns(r["p50_a_ns"]),
                "" if is_step else format_ns(r["p50_b_ns"]),
                "" if is_step else _pct(r["p50_change_pct"]),
                format_ns(r["per_step_a_ns"]), format_ns(r["per_step_b_ns"]),
                f"{_signed_ns(r['per_step_change_ns'])} ({_pct(r['per_step_change_pct'])})",
                "" if is_step else _signed_ns(r["self_per_step_change_ns"]),
                calls,
            ])
        table = [header] + body
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(line, widths))).rstrip()
                 for line in table]
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more rows")
        lines.append(f"A = {self.names[0]}, B = {self.names[1]}; sorted by |Δ self time per "
                     f"{unit}|, largest first; Δ% relative to A")
        if not self.per_step:
            lines.append("note: a run has no complete steps, so 'per run' is the whole run's "
                         "time: compare runs of the same length")
        for which, items in (("A", self.only_a), ("B", self.only_b)):
            if items:
                lines.append(f"only in {which}: " + ", ".join(
                    f"{m or '<root>'} {p}" for m, p in items))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def compare(a: TraceData, b: TraceData, names: tuple[str, str] = ("A", "B")) -> Diff:
    """Compare run ``b`` against run ``a`` (see the module docstring)."""
    sa, sb = _stats(a), _stats(b)
    per_step = bool(sa.steps and sb.steps)
    rows: list[dict[str, Any]] = []
    for key in [k for k in sa.per_key if k in sb.per_key]:
        x, y = sa.per_key[key], sb.per_key[key]
        dp, dpp = _change(x.p50_ns, y.p50_ns)
        ds, dsp = _change(x.per_step_ns, y.per_step_ns)
        rows.append({
            "module": key[0], "type": x.type, "phase": key[1],
            "p50_a_ns": x.p50_ns, "p50_b_ns": y.p50_ns, "p50_change_ns": dp,
            "p50_change_pct": dpp, "per_step_a_ns": x.per_step_ns,
            "per_step_b_ns": y.per_step_ns, "per_step_change_ns": ds,
            "per_step_change_pct": dsp,
            "self_per_step_change_ns": y.self_per_step_ns - x.self_per_step_ns,
            "calls_a": x.calls, "calls_b": y.calls,
            "share_a": x.per_step_ns / sa.total_ns if sa.total_ns > 0 else None,
        })
    # Stable: equal impact keeps A's order (forward before backward, module slots).
    rows.sort(key=lambda r: (-abs(r["self_per_step_change_ns"]), -abs(r["per_step_change_ns"])))
    step = None
    if per_step and sa.step_p50_ns is not None and sb.step_p50_ns is not None:
        ds, dsp = _change(sa.step_p50_ns, sb.step_p50_ns)
        step = dict.fromkeys(_COLUMNS)
        step.update({"module": _STEP, "type": "", "phase": "step",
                     "per_step_a_ns": sa.step_p50_ns, "per_step_b_ns": sb.step_p50_ns,
                     "per_step_change_ns": ds, "per_step_change_pct": dsp, "share_a": 1.0})
    only_a = [k for k in sa.per_key if k not in sb.per_key]
    only_b = [k for k in sb.per_key if k not in sa.per_key]
    return Diff(rows, step, only_a, only_b, per_step, names)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _pct(p: float | None) -> str:
    if p is None:
        return ""
    return f"{p:+.1f}%"


def _signed_ns(ns: float | None) -> str:
    from hooktrace.summary import format_ns

    if ns is None:
        return ""
    return ("+" if ns >= 0 else "-") + format_ns(abs(ns))


def _json_number(x: Any) -> Any:
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")
