"""Run-to-run comparison: per module and phase, how much slower or faster B is than A.

One row per (module, phase) present in both runs, ``phase`` being ``"forward"``,
``"backward"`` or ``"eval"`` (forward calls with grad off or in eval mode), with
p50 time per call and per step in A and B, their absolute and relative change,
and the number of calls (per step when both runs have steps). Rows are sorted by impact: the absolute change of the
module's typical *self* time per step (the median call's self time x calls per
step, per run when a run has no steps, so that one stalled call does not outrank
a change of every call; forward self excludes the children's calls, backward
self is the module's own autograd nodes), largest first, then by the change of
its typical total time. ``within_noise`` marks a change no larger than A's
run-to-run spread (the interquartile range of its time per step from 4 steps on,
else of its calls' durations x calls). Self time puts
the module where the time was added first: a slowed leaf adds the same total
time to every ancestor, but self time only to itself. Modules seen in one run
only are listed apart, and the step itself is compared when both runs have
complete steps.

Modules are matched by qualified name, so the same model traced twice (or a
model whose code changed inside one module) compares row for row.

**Inputs** (:func:`compare_paths`, ``hooktrace diff A B``; the rules in
``hooktrace.analysis._diff_inputs``). A and B are each a ``.htrace`` file or a directory
(searched recursively), grouped by the files' metadata:

* *Schedule windows* (files written by ``hooktrace.window_handler(DIR)``, with
  ``info["window"]``) of one process are **pooled**: p50 per call over every
  call of every window, time per step as the median over every complete step
  of every window. ``PATH:N`` compares window ``N`` alone (in step order; 0 the
  first, -1 the last), e.g. ``diff traces:0 traces:-1`` to see a run drift.
* *Rank directories* (files with a ``rank``, one process per rank, e.g. what
  ``hooktrace.record.distributed.default_output_name("DIR/")`` names) are compared
  **rank by rank** with another rank directory; each rank's files may be
  windows, pooled or picked with ``:N`` as above. A row shows the rank where
  the module slowed most (largest change of self time per step, then of time
  per step; in synchronous training the slowest rank sets the pace), that
  rank's numbers, and the median change per step over the ranks that ran the
  module in both runs. Ranks in one run only are listed, as are modules in
  one run only (with their ranks unless on every rank). The gate checks every
  rank and names the rank of each failing module. When a rank has complete steps
  in one run and none in the other, every rank compares whole runs, with a note
  (as one process against one does).
* One process on each side (a file, a window directory, a directory with one
  rank) is the plain comparison above. A single process against a rank
  directory of several ranks is refused (name one rank's file instead).

Anything that is not one run is refused with a one-line :class:`DiffInputError`
naming the path and the files: an empty directory, files of different runs in
one directory (with and without ranks, different world sizes, two processes for
one rank, ranks whose recorded intervals do not overlap, overlapping windows),
a corrupt file (named), a window index a process lacks.

**Cost.** Every file is read once, by :func:`hooktrace.analysis.rankset.map_ranks`
(worker processes from 4 files on, ``workers=``), and reduced there to
per-(module, phase) numbers per complete step; a window file also keeps every
call's duration (8 bytes per call), since a p50 over pooled windows needs them
all. A file given on both sides is read once. A Parquet export of the files
(``hooktrace export DIR -o OUT/``) is reduced by DuckDB instead
(:func:`hooktrace.data.engine.diff_tables`); a DuckDB copy of the ``.htrace``
reduction was slower than the pool at several times its memory and was dropped
(issue #37, benchmarks/RESULTS.md).

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
    >>> r = compare_ranks({0: run(1000), 1: run(1000)}, {0: run(1000), 1: run(3000)})
    >>> [(x["module"], x["rank"], x["median_per_step_change_ns"]) for x in r.rows]
    [('fc', 1, 1000.0), ('', 1, 1000.0)]
    >>> r.failures(50.0, min_share=0.0)
    ['fc forward on rank 1: +200.0%', '<root> forward on rank 1: +66.7%']
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hooktrace.analysis._diff_inputs import DiffInputError, Side, find_files, group, parse_spec
from hooktrace.analysis.rankset import RankFile
from hooktrace.analysis._diff_parts import (
    GPU_PHASES,
    PHASES,
    Key,
    Part,
    RunStats,
    definition_text,
    file_part,
    pool,
    ranks_unit_note,
    result_part,
    trace_parts,
    unit_note,
    whole_run,
)
from hooktrace.analysis.inputs import Input, resolve
from hooktrace.analysis.rankset import map_ranks
from hooktrace.reading import TraceData

__all__ = ["GPU_PHASES", "PHASES", "Diff", "DiffInputError", "compare", "compare_paths", "compare_ranks"]

_STEP = "<step>"  # the row name of the step itself

_COLUMNS = ("module", "type", "phase", "p50_a_ns", "p50_b_ns", "p50_change_ns", "p50_change_pct",
            "per_step_a_ns", "per_step_b_ns", "per_step_change_ns", "per_step_change_pct",
            "self_per_step_change_ns", "typical_a_ns", "typical_b_ns", "typical_change_ns",
            "typical_change_pct", "typical_self_change_ns", "noise_a_ns", "within_noise",
            "calls_a", "calls_b", "share_a", "timing_a", "timing_b")


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
    ``(module, phase)`` seen in one run only; ``fused_a`` / ``fused_b``: those timed
    in the other run that this run ran inside a compiled region with no kernel of
    their own (ops fused into other modules' kernels); ``per_step``: whether both runs
    had complete steps (otherwise "per step" means the whole run).

    Rank directories (``ranks`` is not None): ``by_rank`` holds each rank's own
    comparison; a row is the rank where the module slowed most (its numbers, and
    ``rank``), plus ``n_ranks`` (how many ranks ran it in both runs) and
    ``median_per_step_change_ns`` / ``_pct`` over those ranks; ``only_a`` /
    ``only_b`` are over all ranks, and ``ranks_only_a`` / ``ranks_only_b`` the
    ranks found in one run only. ``sources``: what A and B were (``--json``'s
    ``sources``); ``notes``: lines about the inputs (e.g. ranks without a file).
    """

    rows: list[dict[str, Any]]
    step: dict[str, Any] | None
    only_a: list[Key]
    only_b: list[Key]
    per_step: bool
    names: tuple[str, str] = ("A", "B")
    COLUMNS: tuple[str, ...] = field(default=_COLUMNS, repr=False)
    ranks: list[int] | None = None
    ranks_only_a: list[int] = field(default_factory=list)
    ranks_only_b: list[int] = field(default_factory=list)
    by_rank: dict[int, Diff] = field(default_factory=dict, repr=False)
    sources: tuple[dict[str, Any], dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)
    # both runs recorded device time (trace(gpu=True)): the gate checks the GPU rows
    # ("gpu forward", ...) and the step, not the host rows (launch time on a GPU)
    gpu: bool = False
    # a run is a CUDA run without device time: its kernel rows are launch times
    launch: bool = False
    # (module, phase) timed in one run whose ops the other run fused into other modules'
    # kernels (a compiled region): in both runs, comparable in neither
    fused_a: list[Key] = field(default_factory=list)
    fused_b: list[Key] = field(default_factory=list)

    def _failing(self, pct: float, min_share: float, include_noise: bool = False,
                 noise: bool = False) -> list[tuple[dict[str, Any], float]]:
        """The rows over ``pct``; ``noise``: instead, those left out as within noise."""
        bad = []
        rows = ([r for r in self.rows if r["phase"] in GPU_PHASES] if self.gpu
                else self.rows)
        for r in ([self.step] if self.step else []) + rows:
            # modules: the typical time per step (median call x calls), which one stalled
            # call does not move
            change = r["typical_change_pct"] if r is not self.step else r["per_step_change_pct"]
            if change is None or change <= pct:
                continue
            if r is not self.step and (r["share_a"] or 0.0) * 100.0 < min_share:
                continue
            # a change no larger than A's own run-to-run spread (the table's "noise"):
            # not a regression the gate can tell (issue #38: it failed on such rows)
            within = bool(r.get("within_noise")) and not include_noise
            if within == noise:
                bad.append((r, float(change)))
        return bad

    def noise_left_out(self, pct: float, *, min_share: float = 1.0) -> list[str]:
        """The rows over ``pct`` that :meth:`failures` leaves out as within A's noise."""
        if self.ranks is None:
            return [f"{_label(r, self.launch)}: +{c:.1f}%"
                    for r, c in self._failing(pct, min_share, noise=True)]
        return [f"{_label(r, self.launch)} on rank {rank}: +{c:.1f}%"
                for rank in sorted(self.by_rank)
                for r, c in self.by_rank[rank]._failing(pct, min_share, noise=True)]

    def failures(self, pct: float, *, min_share: float = 1.0,
                 include_noise: bool = False) -> list[str]:
        """Rows (and the step) that got slower by more than ``pct`` percent, one line each.

        When both runs recorded device time (``gpu``), the module rows gated are the
        GPU rows (device time; the host rows are launch times there).

        A module row is compared on its typical time per step (p50 per call x calls
        per step, or per run without steps: more calls count as slower, one stalled
        call does not), the step on its p50; rows
        under ``min_share`` percent of A's step time are left out: a module that
        small moves by large percentages from run to run on timer resolution and
        scheduling alone, and a gate on it would fail at random. A row whose change is
        within A's run-to-run noise (``within_noise``) is left out too unless
        ``include_noise`` (:meth:`noise_left_out` lists them).

        Rank directories: every rank is gated on its own comparison; a line per
        (module, phase) names the rank where it slowed most and, when several
        did, how many.
        """
        if self.ranks is None:
            return [f"{_label(r, self.launch)}: +{c:.1f}%{_beyond(r)}"
                    for r, c in self._failing(pct, min_share, include_noise)]
        worst: dict[Key, tuple[float, int]] = {}
        count: dict[Key, int] = {}
        for rank in sorted(self.by_rank):
            for r, c in self.by_rank[rank]._failing(pct, min_share, include_noise):
                k = (r["module"], r["phase"])
                count[k] = count.get(k, 0) + 1
                if k not in worst or c > worst[k][0]:
                    worst[k] = (c, rank)
        order = [(r["module"], r["phase"]) for r in ([self.step] if self.step else [])
                 + self.rows]
        order += [k for k in worst if k not in order]
        lines = []
        for k in order:
            if k in worst:
                c, rank = worst[k]
                more = (f" ({count[k]} of {len(self.ranks)} ranks above {pct:g}%)"
                        if count[k] > 1 else "")
                lines.append(f"{_label({'module': k[0], 'phase': k[1]}, self.launch)} on rank {rank}: "
                             f"+{c:.1f}%{more}")
        return lines

    def _only_ranks(self, which: str, key: Key) -> list[int]:
        return [r for r, d in sorted(self.by_rank.items())
                if key in (d.only_a if which == "a" else d.only_b)]

    def to_json(self, top: int | None = None, failed: Sequence[str] | None = None) -> str:
        def only(which: str, items: list[Key]) -> list[dict[str, Any]]:
            return [{"module": m, "phase": p} if self.ranks is None
                    else {"module": m, "phase": p, "ranks": self._only_ranks(which, (m, p))}
                    for m, p in items]

        doc: dict[str, Any] = {
            "a": self.names[0], "b": self.names[1], "per_step": self.per_step,
            "step": self.step, "rows": self.rows if top is None else self.rows[:top],
            "only_a": only("a", self.only_a), "only_b": only("b", self.only_b),
            "fused_a": [{"module": m, "phase": p} for m, p in self.fused_a],
            "fused_b": [{"module": m, "phase": p} for m, p in self.fused_b],
            "gpu": self.gpu,
        }
        if self.ranks is not None:
            doc.update(ranks=self.ranks, ranks_only_a=self.ranks_only_a,
                       ranks_only_b=self.ranks_only_b)
        if self.sources is not None:
            doc["sources"] = {"a": self.sources[0], "b": self.sources[1]}
        if self.notes:
            doc["notes"] = list(self.notes)
        if failed is not None:
            doc["failed"] = list(failed)
        return json.dumps(doc, ensure_ascii=False, allow_nan=False, default=_json_number)

    def to_text(self, top: int | None = None) -> str:
        from hooktrace.text import align_columns, format_ns, text_lines

        unit = "step" if self.per_step else "run"
        by_rank = self.ranks is not None
        header = ["module", "phase"] + (["rank"] if by_rank else []) + [
            "p50 A", "p50 B", "Δ/call", f"per {unit} A", f"per {unit} B", f"Δ/{unit}",
            f"Δself/{unit}"] + ([f"median Δ/{unit}"] if by_rank else []) + ["calls A→B"]
        body = []
        shown = self.rows if top is None else self.rows[:top]
        for r in ([self.step] if self.step else []) + shown:
            is_step = r is self.step
            calls = "" if is_step else (_num(r["calls_a"]) if r["calls_a"] == r["calls_b"]
                                        else f"{_num(r['calls_a'])}→{_num(r['calls_b'])}")
            line = [_name(r, self.launch), r["phase"]]
            if by_rank:
                line.append(str(r["rank"]))
            line += [
                "" if is_step else format_ns(r["p50_a_ns"]),
                "" if is_step else format_ns(r["p50_b_ns"]),
                "" if is_step else _pct(r["p50_change_pct"]),
                format_ns(r["per_step_a_ns"]), format_ns(r["per_step_b_ns"]),
                f"{_signed_ns(r['per_step_change_ns'])} ({_pct(r['per_step_change_pct'])})"
                + (" noise" if r.get("within_noise") else ""),
                "" if is_step else _signed_ns(r["typical_self_change_ns"]),
            ]
            if by_rank:
                line.append(f"{_signed_ns(r['median_per_step_change_ns'])} "
                            f"({_pct(r['median_per_step_change_pct'])})")
            body.append(line + [calls])
        table = [header] + body
        lines = align_columns(table, 2)
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more rows")
        src = self.sources
        a = self.names[0] + (f" ({src[0]['text']})" if src and src[0]["text"] else "")
        b = self.names[1] + (f" ({src[1]['text']})" if src and src[1]["text"] else "")
        lines.append(f"A = {a}, B = {b}; sorted by |Δself/{unit}| (median call's self time x "
                     f"calls per {unit}: one stalled call does not move it), largest first; "
                     "Δ% relative to A")
        if any(r.get("within_noise") for r in shown):
            lines.append(f"noise: a change no larger than A's run-to-run spread (interquartile "
                         f"range of its time per {unit})")
        if self.step and self.step.get("within_noise"):
            lines.append("step noise: a change no larger than the runs' own step-to-step "
                         "spread (the interquartile range of their step times; their range "
                         "under 4 steps)")
        if any("kernels" in (r.get("timing_a") or "") + (r.get("timing_b") or "")
               for r in shown):
            if self.launch:
                lines.append("[kernel launches]: inside a compiled region, the module's host "
                             "time launching its kernels (a CUDA run without device time), "
                             "not their run time")
            else:
                lines.append("[kernels]: inside a compiled region, the module's time is its "
                             "kernels' (attributed from Inductor's code), not measured calls")
        if self.gpu:
            lines.append("gpu rows: device time (both runs recorded it), first; the gate "
                         "(--fail-above) checks them and the step, not the host rows")
        if by_rank:
            assert self.ranks is not None
            lines.append(f"each row: the rank where the module slowed most (largest Δself/"
                         f"{unit}) of the {len(self.ranks)} ranks in both runs, and the median "
                         "change over the ranks that ran it")
        if not self.per_step:
            lines.append("note: a run has no complete steps, so 'per run' is the whole run's "
                         "time: compare runs of the same length")
        for which, items in (("A", self.only_a), ("B", self.only_b)):
            if items:
                lines.append(f"only in {which}: " + ", ".join(
                    f"{m or '<root>'} {p}" + self._ranks_note(which.lower(), (m, p))
                    for m, p in items))
        for which, items in (("A", self.fused_a), ("B", self.fused_b)):
            if items:
                lines.append(f"fused in {which} (inside a compiled region: its ops ran in other "
                             "modules' kernels, or it has none; no time of its own): " + ", ".join(f"{m or '<root>'} {p}" for m, p in items))
        for which, ranks in (("A", self.ranks_only_a), ("B", self.ranks_only_b)):
            if ranks:
                lines.append(f"ranks only in {which}: " + ", ".join(map(str, ranks)))
        lines += [f"note: {n}" for n in self.notes]
        return text_lines(lines)

    def _ranks_note(self, which: str, key: Key) -> str:
        if self.ranks is None:
            return ""
        ranks = self._only_ranks(which, key)
        if len(ranks) == len(self.ranks):
            return ""
        return f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"

    def __str__(self) -> str:
        return self.to_text()


def _beyond(row: dict[str, Any]) -> str:
    """What a failing step row's change is beside the runs' own noise (issue #47: two
    identical 3-step runs failed at +12% with no word about noise)."""
    if row.get("phase") != "step":
        return ""
    from hooktrace.text import format_ns

    noise = row.get("noise_a_ns")
    if noise is None:
        return " (a run has a single complete step: its step-to-step noise is unknown)"
    return f" (beyond the runs' step-to-step spread, {format_ns(noise)})"


def _label(row: dict[str, Any], launch: bool = False) -> str:
    return f"{_name(row, launch)} {row['phase']}"


def _name(row: dict[str, Any], launch: bool) -> str:
    """A row's module, a kernel-derived row's tagged: ``[kernel launches]`` (its kernels'
    launch time: a host row of a CUDA run without device time), else ``[kernels]``."""
    if "kernels" not in (row.get("timing_a") or "") + (row.get("timing_b") or ""):
        return row["module"] or "<root>"
    tag = "kernel launches" if launch and row["phase"] not in GPU_PHASES else "kernels"
    return f"{row['module'] or '<root>'} [{tag}]"


def compare(a: TraceData | Sequence[TraceData], b: TraceData | Sequence[TraceData],
            names: tuple[str, str] = ("A", "B")) -> Diff:
    """Compare run ``b`` against run ``a`` (see the module docstring). A run is one
    trace, or a sequence of traces (the schedule windows of one process), pooled."""
    pa, pb = trace_parts(a), trace_parts(b)
    notes = unit_note(pa, pb, names)
    if notes:
        pa, pb = [whole_run(p) for p in pa], [whole_run(p) for p in pb]
    d = _compare_stats(pool(pa), pool(pb), names)
    d.notes += notes
    return d


def _check_definitions(sa: RunStats, sb: RunStats, names: tuple[str, str]) -> None:
    """Module times recorded under different span definitions differ by the hooks'
    time (FSDP2's all-gathers: 80-120 ms per block): refuse rather than report it."""
    if sa.span_definition != sb.span_definition:
        raise DiffInputError(
            f"hooktrace diff: {names[0]} and {names[1]} define a module span differently "
            f"({definition_text(sa.span_definition)} vs {definition_text(sb.span_definition)}), so "
            "their times are not comparable; re-record the older one with this hooktrace")


def _compare_stats(sa: RunStats, sb: RunStats, names: tuple[str, str]) -> Diff:
    _check_definitions(sa, sb, names)
    per_step = bool(sa.steps and sb.steps)
    rows: list[dict[str, Any]] = []
    for key in [k for k in sa.per_key if k in sb.per_key]:
        x, y = sa.per_key[key], sb.per_key[key]
        dp, dpp = _change(x.p50_ns, y.p50_ns)
        ds, dsp = _change(x.per_step_ns, y.per_step_ns)
        # the typical time per step: the median call times the calls per step, which one
        # stalled call (or step) does not move, unlike a sum or a median of 2 steps
        dt, dtp = _change(x.p50_ns * x.calls, y.p50_ns * y.calls)
        rows.append({
            "module": key[0], "type": x.type, "phase": key[1],
            "p50_a_ns": x.p50_ns, "p50_b_ns": y.p50_ns, "p50_change_ns": dp,
            "p50_change_pct": dpp, "per_step_a_ns": x.per_step_ns,
            "per_step_b_ns": y.per_step_ns, "per_step_change_ns": ds,
            "per_step_change_pct": dsp,
            "self_per_step_change_ns": y.self_per_step_ns - x.self_per_step_ns,
            "typical_a_ns": x.p50_ns * x.calls, "typical_b_ns": y.p50_ns * y.calls,
            "typical_change_ns": dt, "typical_change_pct": dtp,
            "typical_self_change_ns": y.p50_self_ns * y.calls - x.p50_self_ns * x.calls,
            # a change (typical or per step) that the typical time keeps within A's spread
            "noise_a_ns": x.spread_ns,
            "within_noise": bool((dt or ds) and abs(dt or 0.0) <= x.spread_ns),
            "calls_a": x.calls, "calls_b": y.calls,
            "share_a": x.per_step_ns / sa.total_ns if sa.total_ns > 0 else None,
            "timing_a": x.timing, "timing_b": y.timing,
        })
    # Stable: equal impact keeps A's order (forward before backward, module slots);
    # with device time in both runs its rows come first.
    gpu = sa.gpu and sb.gpu
    rows.sort(key=lambda r: (gpu and r["phase"] not in GPU_PHASES, *_impact(r)))
    step = None
    if per_step and sa.step_p50_ns is not None and sb.step_p50_ns is not None:
        ds, dsp = _change(sa.step_p50_ns, sb.step_p50_ns)
        step = dict.fromkeys(_COLUMNS)
        # the runs' own noise: the larger of their step-to-step spreads (unknown, None,
        # when a run has a single step)
        spreads = [x for x in (sa.step_spread_ns, sb.step_spread_ns) if x is not None]
        noise = max(spreads) if len(spreads) == 2 else None
        step.update({"module": _STEP, "type": "", "phase": "step",
                     "per_step_a_ns": sa.step_p50_ns, "per_step_b_ns": sb.step_p50_ns,
                     "per_step_change_ns": ds, "per_step_change_pct": dsp, "share_a": 1.0,
                     "noise_a_ns": noise, "within_noise": bool(noise is not None and ds and abs(ds) <= noise)})
    # a module whose ops the other run fused into other modules' kernels ran there too
    fused_b = [k for k in sa.per_key if k not in sb.per_key and k in sb.fused]
    fused_a = [k for k in sb.per_key if k not in sa.per_key and k in sa.fused]
    only_a = [k for k in sa.per_key if k not in sb.per_key and k not in sb.fused]
    only_b = [k for k in sb.per_key if k not in sa.per_key and k not in sa.fused]
    notes = _model_note(sa, sb, names) + _timing_notes(rows, names)
    if sa.gpu != sb.gpu:
        has, lacks = (names[0], names[1]) if sa.gpu else (names[1], names[0])
        notes.append(f"only {has} recorded device time (trace(gpu=True)); {lacks}'s times are "
                     "host time: compared on host time")
    return Diff(rows, step, only_a, only_b, per_step, names, notes=notes, gpu=gpu,
                launch=sa.launch or sb.launch, fused_a=fused_a, fused_b=fused_b)


def _model_note(sa: RunStats, sb: RunStats, names: tuple[str, str]) -> list[str]:
    """One line when A and B look like two different models: the root modules' classes
    differ, or fewer than half of the module names are in both runs."""
    def root(s: RunStats) -> str | None:
        return next((st.type for (m, _), st in s.per_key.items() if m == ""), None)

    ra, rb = root(sa), root(sb)
    mods_a, mods_b = ({m for m, _ in [*s.per_key, *s.fused]} for s in (sa, sb))
    union = mods_a | mods_b
    shared = len(mods_a & mods_b) / len(union) if union else 1.0
    if ra is not None and rb is not None and ra != rb:
        why = f"{names[0]}'s model is {ra}, {names[1]}'s {rb}"
    elif shared < 0.5:
        why = (f"only {len(mods_a & mods_b)} of {len(union)} module names are in both runs "
               f"({len(mods_a)} in {names[0]}, {len(mods_b)} in {names[1]})")
    else:
        return []
    return [f"different models? {why}: the rows compare modules by name"]


def _impact(row: dict[str, Any]) -> tuple[float, float]:
    """The sort key: the change of typical self time per step (median call's self time
    times calls), then of typical time per step, largest first."""
    return (-abs(row["typical_self_change_ns"]), -abs(row["typical_change_ns"] or 0.0))


def _timing_notes(rows: Sequence[dict[str, Any]], names: tuple[str, str]) -> list[str]:
    """A row measured in one run and kernel-derived in the other (eager against
    compiled): its change includes the per-call Python and dispatch time that compiling
    took away, not only the kernels'."""
    mixed = [r for r in rows if r["timing_a"] != r["timing_b"]]
    if not mixed:
        return []
    a = sum("kernels" in r["timing_a"] for r in mixed)
    which = names[0] if a >= len(mixed) - a else names[1]
    return [f"{len(mixed)} rows are kernel time inside a compiled region in one run "
            f"(mostly {which}) and measured calls in the other: their change includes the "
            "Python and dispatch time compiling removes"]


def compare_ranks(a: Mapping[int, TraceData | Sequence[TraceData]],
                  b: Mapping[int, TraceData | Sequence[TraceData]],
                  names: tuple[str, str] = ("A", "B")) -> Diff:
    """Compare two multi-rank runs rank by rank (``{rank: trace or its windows}``);
    see the module docstring."""
    pa, pb = {r: trace_parts(t) for r, t in a.items()}, {r: trace_parts(t) for r, t in b.items()}
    notes = ranks_unit_note(pa, pb, names)
    if notes:
        pa, pb = ({r: [whole_run(p) for p in ps] for r, ps in parts.items()}
                  for parts in (pa, pb))
    d = _compare_rank_stats({r: pool(ps) for r, ps in pa.items()},
                            {r: pool(ps) for r, ps in pb.items()}, names)
    d.notes += notes
    return d


def _compare_rank_stats(sa: Mapping[int, RunStats], sb: Mapping[int, RunStats],
                        names: tuple[str, str]) -> Diff:
    common = sorted(set(sa) & set(sb))
    if not common:
        raise DiffInputError(f"{names[0]} and {names[1]} have no rank in common (ranks "
                             f"{_ranks(sa)} and {_ranks(sb)})")
    by_rank = {r: _compare_stats(sa[r], sb[r], names) for r in common}
    rows = _worst_rows(by_rank, [k for r in common for k in sa[r].per_key if k in sb[r].per_key])
    gpu = all(d.gpu for d in by_rank.values())
    rows.sort(key=lambda r: (gpu and r["phase"] not in GPU_PHASES, *_impact(r)))
    steps = {r: d.step for r, d in by_rank.items() if d.step is not None}
    step = None
    if steps and len(steps) == len(by_rank):
        worst = max(steps, key=lambda r: (steps[r]["per_step_change_ns"], -r))
        step = _with_rank_columns(steps[worst], worst, list(steps.values()))
    only_a, only_b, fused_a, fused_b = (list(dict.fromkeys(k for d in by_rank.values()
                                                           for k in getattr(d, f)))
                                        for f in ("only_a", "only_b", "fused_a", "fused_b"))
    return Diff(rows, step, only_a, only_b, all(d.per_step for d in by_rank.values()), names,
                fused_a=fused_a, fused_b=fused_b,
                notes=_model_note(sa[common[0]], sb[common[0]], names), ranks=common, ranks_only_a=sorted(set(sa) - set(sb)),
                ranks_only_b=sorted(set(sb) - set(sa)), by_rank=by_rank, gpu=gpu,
                launch=any(d.launch for d in by_rank.values()))


def _worst_rows(by_rank: Mapping[int, Diff], order: Sequence[Key]) -> list[dict[str, Any]]:
    """Per (module, phase): the row of the rank where it slowed most (self time per
    step, then time per step; the lowest rank on a tie), with the median over ranks."""
    per_key: dict[Key, list[tuple[int, dict[str, Any]]]] = {}
    for rank, d in by_rank.items():
        for row in d.rows:
            per_key.setdefault((row["module"], row["phase"]), []).append((rank, row))
    out = []
    for key in dict.fromkeys(order):
        cands = per_key[key]
        rank, row = max(cands, key=lambda c: (c[1]["typical_self_change_ns"],
                                             c[1]["typical_change_ns"], -c[0]))
        out.append(_with_rank_columns(row, rank, [c[1] for c in cands]))
    return out


def _with_rank_columns(row: dict[str, Any], rank: int, all_rows: Sequence[dict[str, Any]]
                       ) -> dict[str, Any]:
    out = dict(row)
    pcts = [r["per_step_change_pct"] for r in all_rows if r["per_step_change_pct"] is not None]
    out.update(rank=rank, n_ranks=len(all_rows),
               median_per_step_change_ns=float(np.median([r["per_step_change_ns"]
                                                          for r in all_rows])),
               median_per_step_change_pct=float(np.median(pcts)) if pcts else None)
    return out


def _ranks(stats: Mapping[int, Any]) -> str:
    return ", ".join(map(str, sorted(stats))) or "none"


def compare_paths(a: str, b: str, *, workers: int | None = None,
                  export: Callable[[Input], Mapping[str, tuple[RankFile, Part]] | None]
                  | None = None) -> Diff:
    """Compare the runs at ``a`` and ``b``: each a ``.htrace`` file, a rank directory or
    a directory of schedule windows, optionally ``PATH:N`` for window N (see the
    module docstring). Raises :class:`DiffInputError` (one line, naming the path and
    file) for inputs that are not one run or cannot be compared.

    Worker processes (``workers``, :func:`~hooktrace.analysis.rankset.map_ranks`) reduce
    each ``.htrace`` file with numpy. ``export`` reads a Parquet export of the files
    (``hooktrace export DIR -o OUT/``): per file its metadata and numbers, None for a path
    that is none (:func:`hooktrace.data.paths.compare_paths` passes DuckDB's,
    :func:`hooktrace.data.paths.dataset_parts`)."""
    specs = [parse_spec(a), parse_spec(b)]
    from_dataset: dict[str, tuple[RankFile, Part]] = {}
    files = []
    exports: dict[str, Mapping[str, tuple[RankFile, Part]] | None] = {}  # (each read once)
    for path, _ in specs:
        inp = resolve(path)  # (what the path is, asked once: hooktrace.analysis.inputs)
        real = os.path.realpath(path)
        if real not in exports:
            exports[real] = export(inp) if export is not None else None
        found = exports[real]
        if found is not None:  # a Parquet export of the files
            from_dataset.update((os.path.realpath(f), r) for f, r in found.items())
            files.append(list(found))
        else:
            files.append(find_files(inp))
    first_name: dict[str, str] = {}
    for f in (f for fs in files for f in fs):
        first_name.setdefault(os.path.realpath(f), f)
    unique = [u for u in first_name if u not in from_dataset]
    todo = [first_name[u] for u in unique]
    results: dict[str, tuple[RankFile, Part] | str] = dict(zip(
        unique, map_ranks(file_part, todo, workers=workers)))
    results.update(from_dataset)
    bad = [r for r in results.values() if isinstance(r, str)]
    if bad:
        more = f" (and {len(bad) - 1} more unreadable files)" if len(bad) > 1 else ""
        raise DiffInputError(bad[0] + more)
    sides = []
    for (path, window), spec, fs in zip(specs, (a, b), files):
        metas = []
        for f in fs:
            res = results[os.path.realpath(f)]
            assert not isinstance(res, str)
            metas.append(replace(res[0], path=f))
        sides.append(group(spec, path, window, metas))
    sa, sb = sides

    names = (a, b)
    # both sides in the same unit (steps or whole runs): one run each, or rank by rank
    parts = [{rank: [result_part(results, f.path) for f in fs]
              for rank, fs in side.selected().items()} for side in (sa, sb)]
    if sa.ranked and sb.ranked:
        ranked = [{r: ps for r, ps in side.items() if r is not None} for side in parts]
        unit_notes = ranks_unit_note(ranked[0], ranked[1], names)
    else:
        unit_notes = unit_note([p for ps in parts[0].values() for p in ps],
                                [p for ps in parts[1].values() for p in ps], names)

    def pooled(side: Side) -> dict[int | None, RunStats]:
        return {rank: pool([whole_run(result_part(results, f.path)) if unit_notes
                             else result_part(results, f.path) for f in fs])
                for rank, fs in side.selected().items()}

    if sa.ranked and sb.ranked:
        ra, rb = pooled(sa), pooled(sb)
        d = _compare_rank_stats({r: s for r, s in ra.items() if r is not None},
                                {r: s for r, s in rb.items() if r is not None}, names)
    elif len(sa.processes) == 1 and len(sb.processes) == 1:
        d = _compare_stats(next(iter(pooled(sa).values())), next(iter(pooled(sb).values())),
                           names)
    else:
        multi, single = (sa, sb) if len(sa.processes) > 1 else (sb, sa)
        example = next(iter(multi.processes.values()))[0].path
        raise DiffInputError(
            f"{single.spec} is one process's run ({single.kind}) and {multi.spec} a rank "
            f"directory of {len(multi.processes)} ranks: compare two rank directories, or "
            f"{single.spec} with one rank's file (e.g. {example})")
    d.sources = ({**sa.describe(), "text": sa.text()}, {**sb.describe(), "text": sb.text()})
    d.notes = sa.notes + sb.notes + unit_notes + d.notes
    return d


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _pct(p: float | None) -> str:
    return "" if p is None else f"{p:+.1f}%"


def _signed_ns(ns: float | None) -> str:
    from hooktrace.text import format_ns

    return "" if ns is None else ("+" if ns >= 0 else "-") + format_ns(abs(ns))


def _json_number(x: Any) -> Any:
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")
