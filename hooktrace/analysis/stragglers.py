"""Straggler tables over many ranks (issue #11): which rank is slow, where, and who waits.

Each rank is reduced to small arrays: per (module, mode, phase, step) the total
time of its spans (forward or backward; a span counts in the step it starts in)
and per step the time the rank spent outside every module span; the parent
combines them, so memory is one rank's events per worker plus
``ranks x (modules x 2 x 2 x steps)`` numbers, and time is linear in the events.

**Inputs** (issue #29). ``.htrace`` files: worker processes reduce each rank with
numpy (:func:`hooktrace.analysis.rankset.map_ranks`). A Parquet dataset that ``hooktrace
export DIR -o OUT/`` wrote: the reduction is SQL (``hooktrace.data.engine.STRAGGLER_SQL``)
run once over it by DuckDB (no pairing left to do: the fast path for big jobs;
:func:`hooktrace.data.paths.analyze` takes either input), or by Spark
(:func:`hooktrace.data.spark.spark_summary`). Both give the same tables (tested). (A DuckDB copy
of the ``.htrace`` reduction was slower than the pool at several times its memory and
was dropped: issue #37, benchmarks/RESULTS.md.)

**Train and eval.** As in the summary (:mod:`hooktrace.analysis.summary`), a module's
eval calls (grad off or the module in eval mode: ``SPAN_EVAL``) are rows and
entries of their own (``"mode": "eval"``, ``name [eval]`` in text), never pooled
with its training calls: a validation pass on one rank is not a straggling
training step.

**Tables.** Per module x mode x phase: the time per step (total over the complete
and incomplete steps of the run, divided by the steps) on every rank; the
median over ranks; the slowest rank, its time and its excess over the median
of the *other* ranks (absolute and as a ratio). The other ranks' median, not
all ranks': with 2 ranks the median of all would be half the straggler itself.

**Stragglers** (issue #38: by where the time went, not by who was slow to leave a
collective). A slow rank makes the others wait in the next collective, and that wait
lands in a module's time or outside every module on the ranks that were on time; so on
the host, ranks are compared per step and *place*: a module's self time in a phase (its
children left out, so the module that was slow is named, not its ancestors), or a
stretch of the step outside every module, cut at the step's top-level spans and named
by the span it ends at (``before <root> fwd``: host work before the forward;
``before step end``). A rank whose time in a place exceeds the median of the other
ranks by more than ``threshold`` times that median and by more than ``min_excess_ns``
is a straggler when it also left the place at least half that excess after the others
(rank 0's clock): a rank that *waited* there leaves with the others, since a collective
lets every rank out together, and is not named. On the device (``gpu fwd``/``gpu bwd``)
the time of each (rank, module, mode, phase, step) is compared, and an entry is left
out when one of its descendants, on the same rank, mode, phase and step, is a
straggler explaining at least ``EXPLAINED`` of its excess.

**Who waits.** With the ranks' torch.profiler traces: the straggler's first collective
after the slow place (``gloo:*`` on gloo's thread, NCCL kernels on the GPU), matched on
every other rank to the collective instance overlapping it most (every rank is inside
it when the last one enters); a rank's wait is how long it was inside that collective
before the straggler entered it. Without profiler traces: per other rank, how much later
the straggler left the place than that rank, at most its excess over that rank there
(on the device: how much more time each other rank spent outside every module span in
that step than the straggler did).

Example::

    from hooktrace.analysis.stragglers import analyze
    report = analyze(["traces/"])
    print(report.to_text())
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hooktrace.analysis._rank_reduce import (
    RankStats,
    collectives,
    rank_stats,
    reduce_rank,
    stats_from_tables,
)
from hooktrace.analysis.inputs import Input
from hooktrace.analysis.phases import MODES, RANK_DEVICE
from hooktrace.analysis.phases import RANK_PHASES as PHASES
from hooktrace.analysis.rankset import RankSet, find_rank_files, map_ranks
from hooktrace.text import align_columns, format_ns, text_lines

__all__ = ["EXPLAINED", "MODES", "PHASES", "RankStats", "RanksSummary", "analyze",
           "check_limits", "rank_stats", "reduce_rank", "summary_from_tables"]

# PHASES (hooktrace.analysis.phases.RANK_PHASES): "gpu fwd" / "gpu bwd": device time
# (trace(gpu=True), hooktrace.analysis.device_time), per step over the steps that were
# timed; rows and stragglers of their own, listed first. MODES: as the summary's rows'.
N_PHASES = len(PHASES)
EXPLAINED = 0.8
DEFAULT_THRESHOLD = 0.5  # a rank 1.5x the others' median ...
DEFAULT_MIN_EXCESS_NS = 1_000_000  # ... and at least 1 ms over it


def _median_of_others(v: np.ndarray) -> np.ndarray:
    """Per element of ``v`` (ranks x keys, NaN = absent): the median of the other ranks'
    values in its column; NaN where fewer than one other value.

    Example:
        >>> import numpy as np
        >>> _median_of_others(np.array([[1.0], [2.0], [9.0]])).ravel().tolist()
        [5.5, 5.0, 1.5]
    """
    n_rank, n_key = v.shape
    order = np.argsort(v, axis=0, kind="stable")  # NaN sort last
    s = np.take_along_axis(v, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n_rank)[:, None].repeat(n_key, 1), axis=0)
    n = np.count_nonzero(~np.isnan(v), axis=0)[None, :].repeat(n_rank, 0)
    m = n - 1  # values left when one is taken out
    lo_i, hi_i = (m - 1) // 2, m // 2
    lo = np.clip(lo_i + (lo_i >= pos), 0, n_rank - 1)
    hi = np.clip(hi_i + (hi_i >= pos), 0, n_rank - 1)
    cols = np.arange(n_key)[None, :].repeat(n_rank, 0)
    out = (s[lo, cols] + s[hi, cols]) / 2
    out[(m < 1) | np.isnan(v)] = np.nan
    return out


@dataclass
class RanksSummary:
    """The tables of :func:`analyze`; ``to_text()``, ``to_json()``."""

    ranks: list[dict[str, Any]]
    rows: list[dict[str, Any]]  # per module x mode x phase, time per step
    per_step: list[dict[str, Any]]  # per module x mode x phase x step
    stragglers: list[dict[str, Any]]
    problems: list[str]
    settings: dict[str, Any]
    # per (rank, place) among the stragglers: persistent, or noise (_verdicts)
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self, top: int | None = None) -> str:
        return json.dumps({"ranks": self.ranks, "rows": self.rows[:top], "per_step":
                           self.per_step, "stragglers": self.stragglers[:top],
                           "verdicts": self.verdicts[:top],
                           "problems": self.problems, "settings": self.settings})

    def to_text(self, top: int | None = None, *, wide: bool = False) -> str:
        lines: list[str] = []
        rk = [r["rank"] for r in self.ranks if r["rank"] is not None]
        offsets = [r for r in self.ranks if r["clock_aligned"]]
        head = f"{len(self.ranks)} ranks"
        if rk:
            head += f" (rank {min(rk)}-{max(rk)})"
        head += f", {self.settings['steps']} steps"
        if offsets:
            worst = max(offsets, key=lambda r: abs(r["clock_offset_ns"]))
            unc = max(r["clock_offset_uncertainty_ns"] for r in offsets)
            head += (f"; clocks aligned to rank 0 (largest offset {format_ns(worst['clock_offset_ns'])}"
                     f" on rank {worst['rank']}, uncertainty up to {format_ns(unc)})")
        else:
            head += "; clocks not aligned (no align_clocks measurement): one host assumed"
        lines.append(head)
        for p in self.problems:
            lines.append(f"warning: {p}")
        lines.append("")
        lines.append("per module and phase, time per step: median over ranks, and the slowest "
                     "rank against the other ranks' median")
        header = ["module", "phase", "median", "slowest rank", "its time", "excess", "x"]
        table = [header]
        for r in self.rows[:top]:
            table.append([_module_cell(r), r["phase"], format_ns(r["median_ns"]),
                          str(r["slowest_rank"]), format_ns(r["slowest_ns"]),
                          _signed(r["excess_ns"]), _ratio(r["ratio"])])
        lines += align_columns(table, 2)
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more rows")
        lines.append("")
        th = self.settings
        lines.append(f"stragglers (a rank over {1 + th['threshold']:.2g}x the other ranks' median "
                     f"and more than {format_ns(th['min_excess_ns'])} over it, by a module's "
                     "self time or the time outside modules; a rank that waited there for "
                     "another is not named):")
        if not self.stragglers:
            lines.append("none")
        else:
            lines += self._verdict_lines(top)
            table = [["rank", "module", "phase", "step", "time", "others' median", "excess", "x",
                      "others waited (median / max)", "from"]]
            for s in self.stragglers[:top]:
                waited = ("" if s["others_wait_ns"] is None else
                          f"{format_ns(s['others_wait_ns'])} / {format_ns(s['others_wait_max_ns'])}")
                table.append([str(s["rank"]), _module_cell(s),
                              s["phase"] if s["module"] is not None else f"before {s['before']}",
                              str(s["step"]),
                              format_ns(s["time_ns"]), format_ns(s["others_median_ns"]),
                              _signed(s["excess_ns"]), _ratio(s["ratio"]), waited,
                              s["wait_source"]])
            lines += align_columns(table, 2)
            if top is not None and len(self.stragglers) > top:
                lines.append(f"... {len(self.stragglers) - top} more")
        if any(r["phase"].startswith("gpu") for r in self.rows):
            lines.append("")
            lines.append("gpu fwd / gpu bwd: device time (trace(gpu=True)) per timed step; "
                         "fwd / bwd: host time")
        if any(r["mode"] == "eval" for r in self.rows):
            lines.append("")
            lines.append("[eval]: the calls made with grad off (no_grad, inference_mode) or the "
                         "module in eval mode, apart from the training calls")
        return text_lines(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _verdict_lines(self, top: int | None) -> list[str]:
        """The verdict per (rank, place), then a line on what it means: which ranks are
        persistent stragglers, and how many places are noise."""
        table = [["rank", "module", "phase", "slow in", "median excess", "verdict"]]
        for d in self.verdicts[:top]:
            table.append([str(d["rank"]), _module_cell(d),
                          d["phase"] if d["module"] is not None else f"before {d['before']}",
                          f"{d['slow_steps']}/{d['steps']} steps",
                          _signed(d["median_excess_ns"]), d["verdict"]])
        lines = align_columns(table, 3)
        if top is not None and len(self.verdicts) > top:
            lines.append(f"... {len(self.verdicts) - top} more")
        persistent = [d for d in self.verdicts if d["verdict"] == "persistent"]
        noise = sum(d["verdict"] == "noise" for d in self.verdicts)
        said = "; ".join(f"rank {d['rank']} {_module_cell(d)}"
                         f"{'' if d['module'] is None else ' ' + d['phase']} slow in "
                         f"{d['slow_steps']}/{d['steps']} steps" for d in persistent[:3])
        lines.append(f"persistent stragglers: {said}" + (f" and {len(persistent) - 3} more"
                                                         if len(persistent) > 3 else "")
                     if persistent else "no persistent straggler (slow in at least "
                     f"{PERSISTENT_SHARE:.0%} of its steps, and {PERSISTENT_MIN_STEPS} or more)")
        if noise:
            lines.append(f"noise: {noise} places slow in under {PERSISTENT_SHARE:.0%} of their "
                         "steps (a preempted step, one late collective)")
        lines.append("each step:")
        return lines


def _module_cell(row: dict[str, Any]) -> str:
    if row["module"] is None:  # a straggler's time outside every module
        return "(outside modules)"
    return (row["module"] or "<root>") + (" [eval]" if row["mode"] == "eval" else "")


def _signed(ns: float | None) -> str:
    if ns is None or ns != ns:
        return ""
    return ("+" if ns >= 0 else "-") + format_ns(abs(ns))


def _ratio(x: float | None) -> str:
    if x is None or x != x:
        return ""
    return f"{x:.1f}x" if x < 100 else f"{x:.0f}x"


def _num(x: float) -> float | None:
    return None if x != x else float(x)


def check_limits(threshold: float, min_excess_ns: int) -> None:
    """ValueError unless the straggler bars are finite and >= 0."""
    if not (0 <= threshold < float("inf") and 0 <= min_excess_ns < 2**63):
        raise ValueError(f"threshold and min_excess_ns must be finite and >= 0, got {threshold}, "
                         f"{min_excess_ns}")


def analyze(inputs: Sequence[str | os.PathLike[str] | Input], *,
            profilers: Sequence[str | os.PathLike[str]] = (),
            threshold: float = DEFAULT_THRESHOLD, min_excess_ns: int = DEFAULT_MIN_EXCESS_NS,
            workers: int | None = None) -> RanksSummary:
    """Straggler tables of the ranks under ``inputs`` (see the module docstring; an input
    may be :func:`~hooktrace.analysis.inputs.resolve`'s answer for its path).

    ``.htrace`` files are reduced by ``workers`` worker processes with numpy
    (:func:`~hooktrace.analysis.rankset.map_ranks`); a Parquet dataset written by
    ``hooktrace export DIR -o OUT/`` is read by :func:`hooktrace.data.paths.analyze`
    (DuckDB: SQL over its tables). Both give the same tables.

    Unreadable rank files are left out with a line in ``problems`` (and a
    RuntimeWarning); raises :class:`~hooktrace.analysis.rankset.RankSetError` when none is
    readable.
    """
    check_limits(threshold, min_excess_ns)
    paths, problems = find_rank_files(inputs)
    prof_of: dict[str, str] = {}
    if profilers:
        # matching needs the ranks' metadata: a cheap first pass over the headers
        from hooktrace.analysis.rankset import match_profilers

        prelim = RankSet.scan(paths, workers=workers, warn=False)
        prof_of = match_profilers(prelim, profilers, problems)
    results = map_ranks(rank_stats, paths, [prof_of.get(p) for p in paths], workers=workers)
    problems += [r for r in results if isinstance(r, str)]
    stats = [r for r in results if not isinstance(r, str)]
    rs = RankSet.from_results(paths, [s.file for s in stats], problems)
    order = {id(f): i for i, f in enumerate(rs.files)}
    stats.sort(key=lambda s: order[id(s.file)])
    return _combine(stats, rs.problems, threshold, min_excess_ns)


def summary_from_tables(parts: Sequence[dict[str, Any]], paths: Sequence[str] = (),
                        problems: Sequence[str] = (), *,
                        profilers: Sequence[str | os.PathLike[str]] = (),
                        threshold: float = DEFAULT_THRESHOLD,
                        min_excess_ns: int = DEFAULT_MIN_EXCESS_NS) -> RanksSummary:
    """The straggler tables from the results of ``hooktrace.data.engine.STRAGGLER_SQL``
    (Arrow tables ``agg``, ``steps``, ``modules``, ``runs``; one dict per part), whichever
    engine ran it (DuckDB, or Spark: :mod:`hooktrace.data.spark`). ``paths``: the rank
    files looked for (default: the ``runs`` rows'); ``problems``: lines so far."""
    from hooktrace.errors import HooktraceError

    problems = list(problems)
    stats = [s for part in parts for s in stats_from_tables(part)]
    if not paths:
        paths = [s.file.path for s in stats]
    if profilers:
        from hooktrace.analysis.rankset import match_profilers

        prelim = RankSet.from_results(paths, [s.file for s in stats], list(problems), warn=False)
        prof_of = match_profilers(prelim, profilers, problems)
        kept = []
        for s in stats:
            prof = prof_of.get(s.file.path)
            if prof is not None:
                try:
                    s.coll_start_ns, s.coll_end_ns = collectives(prof, s.file.offset_ns)
                except (HooktraceError, OSError) as e:  # as a worker's failure: left out
                    text = str(e)
                    problems.append(text if text.startswith(s.file.path)
                                    else f"{s.file.path}: {text}")
                    continue
                s.profiler = prof
            kept.append(s)
        stats = kept
    rs = RankSet.from_results(paths, [s.file for s in stats], problems)
    order = {id(f): i for i, f in enumerate(rs.files)}
    stats.sort(key=lambda s: order[id(s.file)])
    return _combine(stats, rs.problems, threshold, min_excess_ns)


def _combine(stats: list[RankStats], problems: list[str], threshold: float,
             min_excess_ns: int) -> RanksSummary:
    n_rank = len(stats)
    names: dict[str, int] = {}  # qualified module name -> column, across ranks
    type_of: dict[str, str] = {}
    gmods = []  # per rank, per entry: its column's module x mode, (module * 2 + mode)
    for s in stats:
        for n, t in zip(s.modules, s.types):
            type_of.setdefault(n, t)
        g = np.array([names.setdefault(n, len(names)) for n in s.modules], np.int64)
        gmods.append(g[s.module] * 2 + s.mode if len(s.module) else np.zeros(0, np.int64))
    types = [type_of[n] for n in names]
    all_steps = np.unique(np.concatenate([s.step for s in stats] + [np.zeros(0, np.int64)]))
    n_step = max(int(all_steps.max(initial=-1)) + 1, 1)
    keys = [(g * N_PHASES + s.phase) * n_step + s.step for g, s in zip(gmods, stats)]
    uniq = np.unique(np.concatenate(keys + [np.zeros(0, np.int64)]))
    v = np.full((n_rank, len(uniq)), np.nan)
    last_end = np.full((n_rank, len(uniq)), np.iinfo(np.int64).min, np.int64)
    for i, (k, s) in enumerate(zip(keys, stats)):
        col = np.searchsorted(uniq, k)
        v[i, col] = s.total_ns
        last_end[i, col] = s.last_end_ns
    k_group, k_phase, k_step = (uniq // n_step // N_PHASES, uniq // n_step % N_PHASES,
                                uniq % n_step)
    k_mod, k_mode = k_group // 2, k_group % 2
    names_list = list(names)
    rank_ids = [s.file.rank if s.file.rank is not None else i for i, s in enumerate(stats)]

    # per module x mode x phase: time per step (NaN where a rank never ran it)
    mp, mp_inv = np.unique(k_group * N_PHASES + k_phase, return_inverse=True)
    steps_of = np.array([max(len(s.step_number), 1) for s in stats], np.float64)
    # device time: per step over the steps that were timed (gpu_every=N times every N-th)
    timed_of = np.array([max(s.timed_steps, 1) for s in stats], np.float64)
    agg = np.zeros((n_rank, len(mp)))
    seen = np.zeros((n_rank, len(mp)), bool)
    for j in range(len(mp)):  # (columns of one module x phase: its steps)
        block = v[:, mp_inv == j]
        seen[:, j] = ~np.isnan(block).all(axis=1)
        agg[:, j] = np.nansum(block, axis=1) / (timed_of if mp[j] % N_PHASES >= RANK_DEVICE
                                                 else steps_of)
    agg[~seen] = np.nan
    rows = _rows(agg, mp // N_PHASES, mp % N_PHASES, names_list, types, rank_ids)
    per_step = _rows(v, k_group, k_phase, names_list, types, rank_ids, steps=k_step)

    # stragglers on the device: by each module's time (the module explains its ancestors)
    others = _median_of_others(v)
    excess = v - others
    with np.errstate(invalid="ignore"):
        flagged = (excess > min_excess_ns) & (excess > threshold * others) & (k_phase >= RANK_DEVICE)
    entries = []
    for i, c in zip(*np.nonzero(flagged)):
        entries.append({"rank": rank_ids[i], "_i": int(i), "_c": int(c),
                        "module": names_list[int(k_mod[c])], "type": types[int(k_mod[c])],
                        "mode": MODES[int(k_mode[c])], "phase": PHASES[int(k_phase[c])],
                        "step": int(k_step[c]),
                        "time_ns": int(v[i, c]), "others_median_ns": float(others[i, c]),
                        "excess_ns": float(excess[i, c]),
                        "ratio": _num(v[i, c] / others[i, c]) if others[i, c] > 0 else None})
    entries = _explained_left_out(entries)
    for e in entries:
        e.update(_waits(stats, e["_i"], e["step"], int(last_end[e["_i"], e["_c"]])))
        del e["_i"], e["_c"]
    # on the host: by where the time went, waits left out (see _host_stragglers)
    host = uniq[k_phase < RANK_DEVICE]
    self_v = np.full((n_rank, len(host)), np.nan)
    self_end = np.full((n_rank, len(host)), np.iinfo(np.int64).min, np.int64)
    for i, (k, s) in enumerate(zip(keys, stats)):
        mine = (s.phase < RANK_DEVICE) if len(s.phase) else np.zeros(0, bool)
        col = np.searchsorted(host, k[mine])
        self_v[i, col] = s.self_ns[mine]
        self_end[i, col] = s.last_end_ns[mine]
    h_group, h_phase, h_step = (host // n_step // N_PHASES, host // n_step % N_PHASES,
                                host % n_step)
    places = [{"module": names_list[int(g) // 2], "type": types[int(g) // 2],
               "mode": MODES[int(g) % 2], "phase": PHASES[int(ph)], "step": int(st)}
              for g, ph, st in zip(h_group.tolist(), h_phase.tolist(), h_step.tolist())]
    gap_v, gap_end, gap_places = _gap_places(stats)
    entries += _host_stragglers(stats, np.c_[self_v, gap_v], np.c_[self_end, gap_end],
                                places + gap_places, rank_ids, threshold, min_excess_ns)
    entries.sort(key=lambda e: (-e["excess_ns"], e["rank"], e["step"]))
    # per (rank, place): in how many of the steps it had that place it straggled
    present: dict[tuple[int, tuple[Any, ...]], int] = {}
    for i in range(n_rank):
        for g, ph in zip(k_group[~np.isnan(v[i])].tolist(), k_phase[~np.isnan(v[i])].tolist()):
            key = (names_list[g // 2], MODES[g % 2], PHASES[ph], None)
            present[(rank_ids[i], key)] = present.get((rank_ids[i], key), 0) + 1
        for c in np.flatnonzero(~np.isnan(gap_v[i])).tolist():
            key = (None, "train", "outside", gap_places[c]["before"])
            present[(rank_ids[i], key)] = present.get((rank_ids[i], key), 0) + 1
    verdicts = _verdicts(entries, present)
    ranks = [{"rank": s.file.rank, "label": s.file.label, "path": s.file.path,
              "events": s.file.events, "clock_offset_ns": s.file.offset_ns,
              "clock_offset_uncertainty_ns": s.file.uncertainty_ns,
              "clock_aligned": s.file.aligned, "profiler": s.profiler} for s in stats]
    settings = {"threshold": threshold, "min_excess_ns": min_excess_ns,
                "steps": int(len(all_steps)), "explained": EXPLAINED}
    return RanksSummary(ranks, rows, per_step, entries, problems, settings, verdicts)


# A (rank, place) straggling in at least this share of the steps it ran, and in at least
# PERSISTENT_MIN_STEPS of them, is a persistent straggler; one straggling less often is
# noise (a preempted step, one late collective): issue #47, 32 rows under load and no
# word on which of them mattered.
PERSISTENT_SHARE = 0.5
PERSISTENT_MIN_STEPS = 2


def _verdicts(entries: list[dict[str, Any]], present: dict[tuple[int, tuple[Any, ...]], int]
              ) -> list[dict[str, Any]]:
    """Per (rank, place) among the stragglers: in how many steps (``slow_steps``) of the
    steps it ran that place (``steps``), the median excess, and the verdict:
    ``persistent`` (at least :data:`PERSISTENT_SHARE` of its steps, and
    :data:`PERSISTENT_MIN_STEPS` or more), else ``noise``; ``too few steps`` when it ran
    the place in fewer than :data:`PERSISTENT_MIN_STEPS` steps."""
    groups: dict[tuple[int, tuple[Any, ...]], list[dict[str, Any]]] = {}
    for e in entries:
        key = (e["module"], e["mode"], e["phase"], e.get("before"))
        groups.setdefault((e["rank"], key), []).append(e)
    out = []
    for (rank, key), group in groups.items():
        slow = len({e["step"] for e in group})
        steps = max(present.get((rank, key), 0), slow)
        if steps < PERSISTENT_MIN_STEPS:
            verdict = "too few steps"
        elif slow >= PERSISTENT_MIN_STEPS and slow >= PERSISTENT_SHARE * steps:
            verdict = "persistent"
        else:
            verdict = "noise"
        first = group[0]
        out.append({"rank": rank, "module": key[0], "type": first.get("type"), "mode": key[1],
                    "phase": key[2], "before": key[3], "slow_steps": slow, "steps": steps,
                    "median_excess_ns": float(np.median([e["excess_ns"] for e in group])),
                    "verdict": verdict})
    order = {"persistent": 0, "too few steps": 1, "noise": 2}
    out.sort(key=lambda d: (order[d["verdict"]], -d["slow_steps"] / d["steps"],
                            -d["median_excess_ns"], d["rank"]))
    return out


def _rows(v: np.ndarray, group: np.ndarray, phase: np.ndarray, names: list[str],
          types: list[str], rank_ids: list[int], steps: np.ndarray | None = None,
          ) -> list[dict[str, Any]]:
    """Rows of the columns of ``v``; ``group``: each column's module * 2 + mode."""
    out: list[dict[str, Any]] = []
    if not v.size:
        return out
    with np.errstate(invalid="ignore"):
        median = np.nanmedian(v, axis=0)
        others = _median_of_others(v)
    filled = np.where(np.isnan(v), -np.inf, v)
    slow = np.argmax(filled, axis=0)
    cols = np.arange(v.shape[1])
    slow_v = v[slow, cols]
    slow_others = others[slow, cols]
    for c in range(v.shape[1]):
        m = int(group[c]) // 2
        row: dict[str, Any] = {"module": names[m], "type": types[m],
                               "mode": MODES[int(group[c]) % 2], "phase": PHASES[int(phase[c])]}
        if steps is not None:
            row["step"] = int(steps[c])
        row.update(ranks=int(np.count_nonzero(~np.isnan(v[:, c]))), median_ns=_num(median[c]),
                   slowest_rank=rank_ids[int(slow[c])], slowest_ns=_num(slow_v[c]),
                   others_median_ns=_num(slow_others[c]),
                   excess_ns=_num(slow_v[c] - slow_others[c]),
                   ratio=_num(slow_v[c] / slow_others[c]) if slow_others[c] > 0 else None)
        out.append(row)
    # device time first (when recorded), then by the median, largest first
    out.sort(key=lambda r: (not r["phase"].startswith("gpu"), -(r["median_ns"] or 0)))
    return out


def _gaps(s: RankStats) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rank ``s``'s time outside every module span, per step, cut at its top-level spans:
    per gap (step, before, occurrence, gap_ns, end_ns); ``before``: the ``top_key`` of the
    top-level span the gap ends at, -1 for the step's end; ``occurrence``: the ordinal of
    that span among the step's top-level spans of its key."""
    out: list[tuple[int, int, int, int, int]] = []
    by_step: dict[int, list[int]] = {}
    for j, st in enumerate(s.top_step.tolist()):
        by_step.setdefault(st, []).append(j)
    starts, ends, keys = s.top_start_ns.tolist(), s.top_end_ns.tolist(), s.top_key.tolist()
    for st, a, b in zip(s.step_number.tolist(), s.step_start_ns.tolist(),
                        s.step_end_ns.tolist()):
        cursor = a  # the end of the step's spans so far
        seen: dict[int, int] = {}
        for j in by_step.get(st, ()):
            k = keys[j]
            out.append((st, k, seen.get(k, 0), max(0, starts[j] - cursor), starts[j]))
            seen[k] = seen.get(k, 0) + 1
            cursor = max(cursor, ends[j])
        out.append((st, -1, 0, max(0, b - cursor), max(b, cursor)))
    arr = np.array(out, np.int64).reshape(-1, 5)
    return arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4]


def _gap_places(stats: list[RankStats]) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """The time outside modules of every rank, one column per (step, gap), gaps matched
    across ranks by the top-level span they end at: (ns, end ns, place per column)."""
    cols: dict[tuple[int, str, int], int] = {}
    per_rank = []
    for s in stats:
        step, before, occ, gap, end = _gaps(s)
        label = {}
        for k in np.unique(before).tolist():
            if k < 0:
                label[k] = "step end"
            else:
                m = k // RANK_DEVICE // 2
                name = s.modules[m] if m < len(s.modules) else f"<module {m}>"
                label[k] = (f"{name or '<root>'}{' [eval]' if k // RANK_DEVICE % 2 else ''} "
                            f"{PHASES[k % RANK_DEVICE]}")
        at = [cols.setdefault((st, label[b], o), len(cols))
              for st, b, o in zip(step.tolist(), before.tolist(), occ.tolist())]
        per_rank.append((np.asarray(at, np.int64), gap, end))
    v = np.full((len(stats), len(cols)), np.nan)
    e = np.full((len(stats), len(cols)), np.iinfo(np.int64).min, np.int64)
    for i, (c, gap, end) in enumerate(per_rank):
        v[i, c] = gap
        e[i, c] = end
    places = [{"module": None, "type": None, "mode": "train", "phase": "outside",
               "before": before + (f" #{o + 1}" if o else ""), "step": st}
              for (st, before, o) in cols]
    return v, e, places


def _host_stragglers(stats: list[RankStats], v: np.ndarray, end: np.ndarray,
                     places: list[dict[str, Any]], rank_ids: list[int], threshold: float,
                     min_excess_ns: int) -> list[dict[str, Any]]:
    """Stragglers on the host, by where each rank's time went (issue #38): ``v`` holds per
    rank (row) and place (column) the time spent there, ``end`` when the place ended
    (rank 0's clock). A place is a module's self time in one phase and step, or a
    stretch of a step outside every module. A rank whose time in a place exceeds the
    others' median (``threshold``, ``min_excess_ns``) either worked longer there and left
    it late (a straggler: it ends at least half its excess after the others), or waited
    there for a slower rank in a collective and left it with the others (left out): a
    collective lets every rank out together, so the rank that waited is never named."""
    others = _median_of_others(v)
    excess = v - others
    valid = end != np.iinfo(np.int64).min
    base = int(end[valid].min()) if valid.any() else 0
    endf = np.where(valid, (end - base).astype(np.float64), np.nan)
    lag = endf - _median_of_others(endf)
    with np.errstate(invalid="ignore"):
        flagged = ((excess > min_excess_ns) & (excess > threshold * others)
                   & (lag >= excess / 2))
    out = []
    for i, c in zip(*np.nonzero(flagged)):
        i, c = int(i), int(c)
        e = dict(places[c])
        e.update(rank=rank_ids[i], time_ns=int(v[i, c]), others_median_ns=float(others[i, c]),
                 excess_ns=float(excess[i, c]),
                 ratio=_num(v[i, c] / others[i, c]) if others[i, c] > 0 else None)
        e.update(_place_waits(stats, i, c, v, end))
        out.append(e)
    return out


def _place_waits(stats: list[RankStats], i: int, c: int, v: np.ndarray, end: np.ndarray
                 ) -> dict[str, Any]:
    """How long the other ranks waited for rank ``i``'s time in place ``c``: in the next
    collective when the profiler's are known (:func:`_waits`); otherwise, per other rank,
    how much later rank ``i`` left the place, at most its excess over that rank there
    (the others catch up in the next collective)."""
    found = _waits(stats, i, -1, int(end[i, c]), spans=False)
    if found["others_wait_ns"] is not None:
        return found
    return _waited([int(min(max(0, int(end[i, c]) - int(end[j, c])), max(0, v[i, c] - v[j, c])))
                    for j in range(len(stats)) if j != i and not np.isnan(v[j, c])], "spans")


def _explained_left_out(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop entries whose excess a straggling descendant explains (see the module doc)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for e in entries:
        groups.setdefault((e["_i"], e["mode"], e["phase"], e["step"]), []).append(e)
    kept = []
    for group in groups.values():
        for e in group:
            prefix = e["module"] + "." if e["module"] else ""
            if not any(o is not e and o["module"].startswith(prefix) and o["module"]
                       and o["module"] != e["module"]
                       and o["excess_ns"] >= EXPLAINED * e["excess_ns"] for o in group):
                kept.append(e)
    return kept


def _waits(stats: list[RankStats], i: int, step: int, slow_end: int, *, spans: bool = True
           ) -> dict[str, Any]:
    """How long the other ranks waited for rank ``i`` in the next collective (``spans``:
    else, by how much more time they spent outside every module span in ``step``)."""
    others = [j for j in range(len(stats)) if j != i]
    s = stats[i]
    if len(s.coll_start_ns) and all(len(stats[j].coll_start_ns) for j in others):
        k = int(np.searchsorted(s.coll_start_ns, slow_end, "left"))
        if k < len(s.coll_start_ns):
            entered, ended = int(s.coll_start_ns[k]), int(s.coll_end_ns[k])
            # The same collective is the one that overlaps it most on each other rank
            # (all ranks are inside it when the last one enters). Not the nearest end:
            # under load a rank records the end of a ring all-reduce up to 5 ms after
            # another (measured, 2 ranks on the busy 2-core machine).
            waits = []
            for j in others:
                o = stats[j]
                overlap = np.minimum(o.coll_end_ns, ended) - np.maximum(o.coll_start_ns, entered)
                m = int(np.argmax(overlap))
                if overlap[m] > 0:
                    waits.append(max(0, entered - int(o.coll_start_ns[m])))
            if waits:
                return _waited(waits, "profiler")
    row = np.flatnonzero(s.step_number == step)
    if not spans or not len(row):
        return _waited([], "")
    mine = int(s.outside_ns[row[0]])
    waits = []
    for j in others:
        r = np.flatnonzero(stats[j].step_number == step)
        if len(r):
            waits.append(max(0, int(stats[j].outside_ns[r[0]]) - mine))
    return _waited(waits, "spans")


def _waited(waits: list[int], source: str) -> dict[str, Any]:
    """The wait columns of a straggler: the median and the longest of the other ranks'
    ``waits`` (blank when there are none), and where they come from."""
    if not waits:
        return {"others_wait_ns": None, "others_wait_max_ns": None, "wait_source": ""}
    return {"others_wait_ns": float(np.median(waits)), "others_wait_max_ns": max(waits),
            "wait_source": source}
