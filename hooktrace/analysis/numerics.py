"""Numeric health per module call (issue #19): ``trace(model, numerics=True)``.

The recorder (csrc/numerics.h) writes one NUMERICS event per module call and phase:

* **forward**: the call's floating-point output (tensors in nested tuples, lists,
  dicts and dataclasses, flattened in order), right after its EXIT on the same thread;
* **backward**: the gradient with respect to the call's *inputs* (the tensors among
  its arguments that require grad), when all of them have arrived. The inputs, not
  the output: a module whose backward produces a NaN shows it in its inputs'
  gradient, while its output's gradient is still finite; so the first non-finite
  backward value names the module that made it.

Each holds ``absmax`` (max |x|), ``rms`` (sqrt of the mean of squares over all the
call's elements) and ``nonfinite`` (NaN and ±Inf values); calls with no
floating-point tensor (integer or boolean outputs, no input needing grad) are
*skipped* and counted, as are tensors that could not be reduced (*failed*: nested
tensors, subclasses without the reductions); tuples, lists, dicts and dataclasses
nested deeper than 4 levels are not walked, and the calls holding some are counted
(*not_walked*).

:class:`Numerics` reads them: per event, the module, phase, step (numbered as the
steps are: the first is 0), call (0-based among that module's calls of that phase in
that step, in time order) and whether the call was an eval call or a recompute
(activation checkpointing; left out of the statistics). :func:`first_nonfinite`
names the earliest call holding a non-finite value; a tensor that is the input of a
module and of its parent gives both the same gradient at the same moment (their
events are adjacent), and then the innermost module is named.

:class:`NumericsColumns`, the column provider (hooktrace.analysis.columns), shows them:
the summary's :data:`NUMERIC_COLUMNS`, the spans table's ``absmax``/``rms``/
``nonfinite``, the aggregates' ``nonfinite``/``absmax``.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> def stats(absmax, rms):
    ...     return int(np.array([absmax, rms], np.float32).view(np.uint64)[0])
    >>> ev = np.zeros(6, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 12, 2, 12]; ev["id"] = [0, 1, 1, 1, 0, 0]
    >>> ev["t"] = [0, 10, 20, 21, 30, 31]
    >>> ev["seq"][3] = stats(float("inf"), float("inf")); ev["rf_tid"][3] = 2
    >>> ev["seq"][5] = stats(3.0, 1.5)
    >>> info = {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0,
    ...         "numerics": {"every": 1}}
    >>> trace = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0), info)
    >>> n = Numerics.from_trace(trace)
    >>> n.module.tolist(), n.absmax.tolist(), n.nonfinite.tolist()
    ([1, 0], [inf, 3.0], [2, 0])
    >>> first_nonfinite(trace)["module"]
    'fc'
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace._events import (
    NUM_BACKWARD,
    NUM_DEFERRED,
    NUM_FAILED,
    NUM_NOT_WALKED,
    NUM_SKIPPED,
    NUMERICS,
    NUMERICS_VALUE,
)
from hooktrace.reading import (
    CAT_FORWARD,
    CAT_RECOMPUTE,
    SPAN_EVAL,
    TraceData,
    counter_changes,
    forward_span_before,
)
from hooktrace.analysis.column_provider import (
    Column,
    ColumnProvider,
    SpanColumn,
    SummaryPart,
    TextColumn,
    WindowGroup,
    measured_only,
)

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls

__all__ = ["COUNTER_NAME", "NUMERIC_COLUMNS", "Numerics", "NumericsColumns", "add_numerics",
           "aggregate", "any_nonfinite", "counter_points", "numerics_by_module",
           "first_nonfinite",
           "history", "number_for_json", "numerics_info"]

# The summary's columns (recorded only with numerics=True): forward output and
# backward input gradient; abs-max is the max over calls, rms the mean over calls,
# nonfinite the sum over calls.
NUMERIC_COLUMNS = ("absmax", "rms", "nonfinite", "bwd_absmax", "bwd_rms", "bwd_nonfinite")


# The exports' counter track: non-finite values seen so far (outputs and input
# gradients of every measured call, recomputes left out), a step up at each call
# holding some; flat at 0 in a healthy run.
COUNTER_NAME = "non-finite values (hooktrace)"


def counter_points(trace: TraceData, window: tuple[int, int] | None = None,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(Unix ns, non-finite values so far) of the counter track: the first and last
    measured calls and every call that adds some, inside ``window`` when given."""
    n = Numerics.from_trace(trace)
    sel = np.flatnonzero(~n.recompute)
    return counter_changes(n.t_ns[sel], np.cumsum(n.nonfinite[sel]), window)


def numerics_info(info: dict[str, Any]) -> dict[str, Any] | None:
    """``info["numerics"]`` when the run recorded numerics, else None."""
    value = info.get("numerics")
    return value if isinstance(value, dict) else None


@dataclass
class Numerics:
    """The NUMERICS events of a trace, parallel arrays in time order."""

    module: np.ndarray  # slot
    backward: np.ndarray  # bool
    step: np.ndarray  # step number (0 without step marks)
    call: np.ndarray  # among the module's calls of that phase in that step
    t_ns: np.ndarray
    tid: np.ndarray
    absmax: np.ndarray  # float64 (recorded as float32)
    rms: np.ndarray
    nonfinite: np.ndarray  # int64
    skipped: np.ndarray  # bool: no floating-point tensor
    failed: np.ndarray  # bool: a reduction raised (a nested tensor, a subclass without the ops)
    eval: np.ndarray  # bool: a forward call with grad off or the module in eval mode
    recompute: np.ndarray  # bool: a forward call recomputed in backward (checkpointing)
    raw: np.ndarray  # index of the event in trace.events (per thread in recorded order)
    span: np.ndarray  # forward: the call's span in trace.spans() (-1: backward, not found)
    every: int = 1
    # bool: its output held tuples/lists/dicts/dataclasses nested deeper than the walk
    # goes (4 levels): their tensors are not in the statistics
    not_walked: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.module)

    @classmethod
    def from_trace(cls, trace: TraceData) -> Numerics:
        return trace.derived("numerics", lambda: cls._build(trace))

    @classmethod
    def _build(cls, trace: TraceData) -> Numerics:
        ev = trace.events
        raw = np.flatnonzero(ev["kind"] == NUMERICS)
        e = _with_deferred_values(ev, ev[raw])
        t = trace.clock.to_unix_ns(e["t"]).astype(np.int64)
        order = np.argsort(t, kind="stable")
        raw, e, t = raw[order], e[order], t[order]
        pair = e["seq"].astype(np.uint64).view(np.float32).reshape(-1, 2) if len(e) else (
            np.zeros((0, 2), np.float32))
        absmax, rms = pair[:, 0].astype(np.float64), pair[:, 1].astype(np.float64)
        flags = e["flags"]
        backward = (flags & NUM_BACKWARD) != 0
        module = e["id"].astype(np.int64)
        tid = e["tid"].astype(np.int64)
        steps = trace.steps()
        if len(steps):
            row = steps.index_of(t)
            step = np.where(row >= 0, steps.number[np.maximum(row, 0)], 0)
        else:
            step = np.zeros(len(t), np.int64)
        # forward: the call whose EXIT it follows, the module's latest span on that
        # thread ending at or before it
        is_eval = np.zeros(len(t), bool)
        recompute = np.zeros(len(t), bool)
        span_of = np.full(len(t), -1, np.int64)
        fwd = np.flatnonzero(~backward)
        if len(fwd):
            span = forward_span_before(trace, tid[fwd], module[fwd], t[fwd])
            span_of[fwd] = span
            spans = trace.spans()
            ok = span >= 0
            is_eval[fwd[ok]] = (spans.flags[span[ok]] & SPAN_EVAL) != 0
            recompute[fwd[ok]] = spans.cat[span[ok]] == CAT_RECOMPUTE
        # the call's number among its module's calls of that phase in that step
        key = np.stack([module, backward.astype(np.int64), step])
        call = np.zeros(len(t), np.int64)
        if len(t):
            o = np.lexsort((np.arange(len(t)), key[2], key[1], key[0]))
            ko = key[:, o]
            new = np.r_[True, (ko[:, 1:] != ko[:, :-1]).any(axis=0)]
            start = np.maximum.accumulate(np.where(new, np.arange(len(t)), 0))
            call[o] = np.arange(len(t)) - start
        info = numerics_info(trace.info) or {}
        every = info.get("every", 1)
        return cls(module, backward, step.astype(np.int64), call, t, tid, absmax, rms,
                   e["rf_tid"].astype(np.int64), (flags & NUM_SKIPPED) != 0,
                   (flags & NUM_FAILED) != 0, is_eval, recompute, raw, span_of,
                   every if isinstance(every, int) and every >= 1 else 1,
                   (flags & NUM_NOT_WALKED) != 0)

    def measured(self) -> np.ndarray:
        """Events that count in the statistics: reduced, not a recompute."""
        return ~self.skipped & ~self.failed & ~self.recompute


def _with_deferred_values(ev: np.ndarray, e: np.ndarray) -> np.ndarray:
    """NUMERICS events ``e`` with each deferred one's statistics taken from the
    NUMERICS_VALUE event of its id (csrc/numerics.h); one whose value never came (the
    run cut before the flush, a ring that overwrote it) counts as failed."""
    deferred = (e["flags"] & NUM_DEFERRED) != 0
    if not deferred.any():
        return e
    e = e.copy()
    values = ev[ev["kind"] == NUMERICS_VALUE]
    order = np.argsort(values["id"], kind="stable")
    ids = values["id"][order]
    want = np.flatnonzero(deferred)
    pos = np.searchsorted(ids, e["rf_tid"][want])
    found = (pos < len(ids)) & (ids[np.minimum(pos, max(len(ids) - 1, 0))] == e["rf_tid"][want]) \
        if len(ids) else np.zeros(len(want), bool)
    src = values[order][np.minimum(pos[found], len(ids) - 1)] if found.any() else values[:0]
    hit = want[found]
    e["seq"][hit] = src["seq"]
    e["rf_tid"][hit] = src["rf_tid"]
    e["flags"][hit] = (src["flags"] & ~np.uint8(NUM_DEFERRED)) | (e["flags"][hit] & NUM_BACKWARD)
    miss = want[~found]
    e["seq"][miss] = 0
    e["rf_tid"][miss] = 0
    e["flags"][miss] = (e["flags"][miss] & NUM_BACKWARD) | NUM_FAILED
    return e


def _depth(name: str) -> int:
    return 0 if not name else name.count(".") + 1


def first_nonfinite(trace: TraceData) -> dict[str, Any] | None:
    """The earliest module call holding a NaN or Inf, or None (also when the run
    recorded no numerics): ``module``, ``type``, ``phase`` (``"forward"``: its output,
    ``"backward"``: the gradient of its inputs), ``step``, ``call``, ``nonfinite``
    (values), ``absmax``, and ``steps_checked`` ("every step" or which)."""
    n = Numerics.from_trace(trace)
    bad = np.flatnonzero((n.nonfinite > 0) & ~n.recompute)
    if not len(bad):
        return None
    i = int(bad[0])
    # the events right after it on its thread, with nothing recorded in between,
    # saw the same tensor (a module and its parent share an input): the innermost
    ev = trace.events
    tie = [i]
    pos = {int(r): k for k, r in enumerate(n.raw.tolist())}
    j = int(n.raw[i]) + 1
    while j < len(ev) and ev["kind"][j] == NUMERICS and ev["tid"][j] == ev["tid"][n.raw[i]]:
        k = pos.get(j)
        if k is not None and n.nonfinite[k] > 0 and n.backward[k] == n.backward[i]:
            tie.append(k)
        j += 1
    names = [trace.modules[int(n.module[k])][0] if n.module[k] < len(trace.modules) else ""
             for k in tie]
    best = max(range(len(tie)), key=lambda x: (_depth(names[x]), -x))
    k = tie[best]
    m = int(n.module[k])
    name, type_name = trace.modules[m] if m < len(trace.modules) else (f"<module {m}>", "?")
    return {"module": name, "type": type_name,
            "phase": "backward" if n.backward[k] else "forward",
            "step": int(n.step[k]), "call": int(n.call[k]), "nonfinite": int(n.nonfinite[k]),
            "absmax": number_for_json(float(n.absmax[k])),
            "steps_checked": ("every step" if n.every == 1
                              else f"every {n.every}th step (0, {n.every}, {2 * n.every}, ...)")}


def number_for_json(value: float | None) -> float | str | None:
    """A float for JSON: NaN and ±Inf as the strings "nan", "inf", "-inf" (None stays)."""
    if value is None or np.isfinite(value):
        return value
    return "nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")


def aggregate(n: Numerics, sel: np.ndarray, *keys: np.ndarray
              ) -> tuple[list[tuple[int, ...]], dict[str, np.ndarray]]:
    """The statistics of the events ``sel`` per distinct value of ``keys`` (arrays over
    all events): the keys in sorted order, and per key ``calls``, ``absmax`` (the max:
    a NaN sticks), ``rms`` (the mean over calls) and ``nonfinite`` (the sum)."""
    if not len(sel):
        return [], {c: np.zeros(0) for c in ("calls", "absmax", "rms", "nonfinite")}
    uniq, inverse = np.unique(np.stack([k[sel] for k in keys]), axis=1, return_inverse=True)
    inverse = inverse.reshape(-1)
    g = uniq.shape[1]
    calls = np.bincount(inverse, minlength=g)
    values = n.absmax[sel]
    absmax = np.full(g, -np.inf)
    # np.maximum.at would propagate a NaN but warns "invalid value" on it: take the
    # max of the other values (np.fmax skips NaN quietly), then put the NaN back
    np.fmax.at(absmax, inverse, values)
    absmax[np.bincount(inverse, weights=np.isnan(values), minlength=g) > 0] = np.nan
    return [tuple(int(x) for x in col) for col in uniq.T], {
        "calls": calls, "absmax": absmax,
        "rms": np.bincount(inverse, weights=n.rms[sel], minlength=g) / calls,
        "nonfinite": np.bincount(inverse, weights=n.nonfinite[sel], minlength=g).astype(np.int64)}


def history(trace: TraceData) -> list[dict[str, Any]]:
    """Per (module, phase, step): ``calls``, ``absmax`` (max), ``rms`` (mean over
    calls), ``nonfinite`` (sum); training calls only (eval calls and recomputes left
    out), in step order."""
    n = Numerics.from_trace(trace)
    sel = np.flatnonzero(n.measured() & ~n.eval)
    keys, v = aggregate(n, sel, n.module, n.backward.astype(np.int64), n.step)
    out = [{"module": trace.modules[m][0] if m < len(trace.modules) else "",
            "phase": "backward" if backward else "forward", "step": step,
            "calls": int(v["calls"][i]), "absmax": number_for_json(float(v["absmax"][i])),
            "rms": number_for_json(float(v["rms"][i])), "nonfinite": int(v["nonfinite"][i])}
           for i, (m, backward, step) in enumerate(keys)]
    return sorted(out, key=lambda r: (r["step"], r["phase"], r["module"]))


def add_numerics(rows: list[dict[str, Any]], trace: TraceData) -> list[str]:
    """Fill the numerics columns of the summary's ``rows``; returns notes."""
    n = Numerics.from_trace(trace)
    keys, v = aggregate(n, np.flatnonzero(n.measured()), n.module, n.eval.astype(np.int64),
                        n.backward.astype(np.int64))
    by_row = {(trace.modules[m][0], "eval" if is_eval else "train", backward): i
              for i, (m, is_eval, backward) in enumerate(keys) if m < len(trace.modules)}
    for row in rows:
        for backward, prefix in ((0, ""), (1, "bwd_")):
            i = by_row.get((row["module"], row["mode"], backward))
            row[prefix + "absmax"] = None if i is None else number_for_json(float(v["absmax"][i]))
            row[prefix + "rms"] = None if i is None else number_for_json(float(v["rms"][i]))
            row[prefix + "nonfinite"] = None if i is None else int(v["nonfinite"][i])
    skipped = int(np.count_nonzero(n.skipped & ~n.recompute))
    failed = int(np.count_nonzero(n.failed))
    every = n.every
    notes = ["numerics: absmax/rms/nonfinite of each call's output (max, mean, sum over calls); "
             "bwd_: of the gradient of its inputs"
             + ("" if every == 1 else f"; steps 0, {every}, {2 * every}, ... only")]
    not_walked = int(np.count_nonzero(n.not_walked & ~n.recompute))
    if skipped or failed or not_walked:
        notes.append(f"numerics: {skipped} calls without a floating-point tensor (skipped)"
                     + (f", {failed} that could not be reduced" if failed else "")
                     + (f", {not_walked} whose output nests tuples/lists/dicts/dataclasses "
                        "deeper than 4 levels (not walked: their tensors are left out)"
                        if not_walked else ""))
    return notes


def numerics_by_module(trace: TraceData, split_eval: bool
                       ) -> dict[tuple[int, str], tuple[int, float]] | None:
    """(non-finite count, abs-max) per (module, row mode: forward, eval or backward), or
    None when the trace recorded no numerics. ``split_eval``: the window's eval calls
    have rows of their own (the aggregates), else they are its forward calls."""
    if "numerics" not in trace.info:
        return None
    n = Numerics.from_trace(trace)
    out: dict[tuple[int, str], tuple[int, float]] = {}
    measured = ~(n.skipped | n.failed)
    for i in np.flatnonzero(measured):
        mode = ("backward" if n.backward[i] else
                "eval" if split_eval and n.eval[i] else "forward")
        key = (int(n.module[i]), mode)
        nf, am = out.get(key, (0, float("nan")))
        out[key] = (nf + int(n.nonfinite[i]), float(np.fmax(am, n.absmax[i])))
    return out


def any_nonfinite(trace: TraceData) -> bool:
    """Whether a call of ``trace`` held a NaN or Inf (False without numerics)."""
    numerics = numerics_by_module(trace, split_eval=False)
    return numerics is not None and any(nf for nf, _ in numerics.values())


class NumericsColumns(ColumnProvider):
    """Numerics' columns (``trace(numerics=True)``) in the summary, the spans table and
    the aggregates."""

    name = "numerics"
    columns = (
        Column("absmax", "float64", "output max |x| (numerics=True)", order=50),
        Column("rms", "float64", "output RMS (numerics=True)", order=50),
        Column("nonfinite", "int64", "output NaN/Inf count (numerics=True)", order=50,
               check="nonnegative"),
        Column("nonfinite", "int64", "NaN/Inf count of the outputs (numerics=True)",
               "aggregates", 50, "nonnegative", reduce="sum", title="nonfinite",
               tip="NaN/Inf values seen (numerics=True)"),
        Column("absmax", "float32", "largest output max |x| (numerics=True)", "aggregates",
               50, reduce="max", title="absmax", tip="the largest magnitude seen "
                                                     "(numerics=True)"))
    text_flag = "numerics"
    flag_help = ("add abs-max, RMS and non-finite counts per module (recorded with "
                 "trace(model, numerics=True) or run --numerics; --wide, --csv and "
                 "--json always have them); with --json also numerics_history, per "
                 "module, phase and step")

    def format_cell(self, key: str, value: Any) -> str | None:
        if key in ("absmax", "rms", "bwd_absmax", "bwd_rms") and isinstance(value, float):
            return f"{value:.3g}"
        return None

    def text_columns(self, keys: Collection[str], rows: Sequence[dict[str, Any]], *,
                     wide: bool, backward: bool) -> list[TextColumn]:
        if "absmax" not in keys:
            return []
        return [(k, k) for k in NUMERIC_COLUMNS if backward or not k.startswith("bwd_")]

    def recorded(self, trace: TraceData) -> bool:
        return numerics_info(trace.info) is not None

    def note_shown(self, note: str, shown: Collection[str]) -> bool | None:
        return "absmax" in shown if note.startswith("numerics: absmax/rms/nonfinite") else None

    def summary(self, rows: list[dict[str, Any]], trace: TraceData,
                options: Mapping[str, Any]) -> SummaryPart:
        return SummaryPart(NUMERIC_COLUMNS, add_numerics(rows, trace),
                           attributes={"first_nonfinite": first_nonfinite(trace)})

    def footer(self, summary: Any) -> list[str]:
        if "absmax" not in summary.columns:
            return []
        f = summary.first_nonfinite
        return ["numerics: no NaN or Inf seen" if f is None else
                f"FIRST NON-FINITE: {f['module'] or '<root>'} {f['phase']} "
                f"({'gradient of its inputs' if f['phase'] == 'backward' else 'output'}), "
                f"step {f['step']}, call {f['call']}: {f['nonfinite']} values"]

    def summary_json(self, summary: Any) -> dict[str, Any]:
        return {"first_nonfinite": summary.first_nonfinite} if "absmax" in summary.columns else {}

    def json_extra(self, trace: TraceData) -> dict[str, Any]:
        return {"numerics_history": history(trace)}

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        num = Numerics.from_trace(trace)
        ok = (num.span >= 0) & num.measured()
        absmax, rms = np.zeros(n), np.zeros(n)
        nonfinite = np.zeros(n, np.int64)
        valid = np.zeros(n, bool)
        absmax[num.span[ok]], rms[num.span[ok]] = num.absmax[ok], num.rms[ok]
        nonfinite[num.span[ok]] = num.nonfinite[ok]
        valid[num.span[ok]] = True
        return {"absmax": measured_only(absmax, valid, m), "rms": measured_only(rms, valid, m),
                "nonfinite": measured_only(nonfinite, valid, m)}

    def aggregate(self, trace: TraceData, calls: Calls
                  ) -> Callable[[WindowGroup], dict[str, list[Any]]] | None:
        s = trace.spans()
        split_eval = bool(((s.cat == CAT_FORWARD) & ((s.flags & SPAN_EVAL) != 0)).any())
        numerics = numerics_by_module(trace, split_eval=split_eval)
        if numerics is None:
            return None

        def values(group: WindowGroup) -> dict[str, list[Any]]:
            got = [numerics.get((m, group.mode)) for m in group.modules]
            return {"nonfinite": [v[0] if v is not None else None for v in got],
                    "absmax": [v[1] if v is not None and np.isfinite(v[1]) else None
                               for v in got]}

        return values
