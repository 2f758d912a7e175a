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
all. A file given on both sides is read once. ``engine="duckdb"``
(``hooktrace diff --engine duckdb``, issue #29): the same numbers as SQL over each
file's tables (:func:`hooktrace.data.engine.diff_tables`), files read in threads; the
pool stays the default, faster from ``.htrace`` files (benchmarks/RESULTS.md).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hooktrace.analysis._diff_inputs import (
    DiffInputError,
    FileMeta,
    Side,
    file_meta,
    window_of,
    find_files,
    group,
    parse_spec,
)
from hooktrace.analysis.device_time import gpu_recorded, launch_time_only, module_gpu
from hooktrace.analysis.groups import group_percentile
from hooktrace.analysis.kernels import derived_spans, fused_modules, span_self_ns
from hooktrace.analysis.rankset import map_ranks
from hooktrace._events import SPAN_DEFINITION, SPAN_DEFINITIONS, span_definition
from hooktrace.reading import (
    CAT_BACKWARD,
    CAT_FORWARD,
    SPAN_EVAL,
    TraceData,
    as_data,
    compile_intervals,
    load,
)

__all__ = ["ENGINES", "GPU_PHASES", "PHASES", "Diff", "DiffInputError", "compare", "compare_paths", "compare_ranks"]

# "eval": forward calls made with grad off or in eval mode (SPAN_EVAL), compared apart
# from the training calls of the same module.
PHASES = {"forward": CAT_FORWARD, "backward": CAT_BACKWARD, "eval": CAT_FORWARD}
# Device time (trace(gpu=True), hooktrace.analysis.device_time): the same phases on the GPU, rows
# of their own ("gpu forward": forward and recompute, as the summary's gpu_total). When
# both runs have them, the gate (``failures``) checks these rows and the step only.
GPU_PHASES = ("gpu forward", "gpu backward", "gpu eval")
_STEP = "<step>"  # the row name of the step itself
ENGINES = ("pool", "duckdb")  # compare_paths' engine: the default first

_COLUMNS = ("module", "type", "phase", "p50_a_ns", "p50_b_ns", "p50_change_ns", "p50_change_pct",
            "per_step_a_ns", "per_step_b_ns", "per_step_change_ns", "per_step_change_pct",
            "self_per_step_change_ns", "typical_a_ns", "typical_b_ns", "typical_change_ns",
            "typical_change_pct", "typical_self_change_ns", "noise_a_ns", "within_noise",
            "calls_a", "calls_b", "share_a", "timing_a", "timing_b")


Key = tuple[str, str]  # (module, phase)


@dataclass
class _PhaseStats:
    """One run's numbers for a (module, phase): p50 per call, time and calls per step."""

    type: str
    p50_ns: float
    per_step_ns: float
    self_per_step_ns: float
    calls: float
    timing: str = "measured"  # or "kernels" / "measured+kernels", as summary's column
    p50_self_ns: float = 0.0  # the median call's self time
    spread_ns: float = 0.0  # run-to-run noise: IQR of the time per step (see _spread)


@dataclass
class _RunStats:
    per_key: dict[Key, _PhaseStats]
    steps: int  # complete steps (0: the whole run counts as one)
    step_p50_ns: float | None
    total_ns: float  # time per step of the root calls, forward + backward: the run's scale
    span_definition: int = SPAN_DEFINITION  # what a span covers (hooktrace._events)
    gpu: bool = False  # device time recorded
    launch: bool = False  # a CUDA run without device time
    # (module, phase) of compiled regions that ran with no kernel of their own (their ops
    # fused into other modules' kernels): no numbers, but not absent from the run
    fused: set[Key] = field(default_factory=set)


@dataclass
class _Part:
    """One trace's numbers per (module, phase), in the form that pools: the windows of
    one process are pooled by concatenating their calls and their steps.

    ``total`` / ``self_ns`` / ``calls``: one value per column, a column being a
    complete step (``n_steps`` of them), or the whole run when there is none.
    ``calls_ns``: every call's duration, sorted, kept only when the part may be
    pooled (a window); ``p50`` is exact for the part alone.
    """

    types: dict[Key, str]
    p50: dict[Key, float]
    calls_ns: dict[Key, np.ndarray] | None
    total: dict[Key, np.ndarray]
    self_ns: dict[Key, np.ndarray]
    calls: dict[Key, np.ndarray]
    n_steps: int
    step_ns: np.ndarray  # the complete steps' durations
    root_ns: float  # the root calls' time in the columns, summed
    span_definition: int = SPAN_DEFINITION
    # the whole run's (every span, in a step or not): for comparing with a run without steps
    run: dict[Key, tuple[float, float, float]] = field(default_factory=dict)  # total, self, calls
    run_root_ns: float = 0.0
    # per key, when not "measured": "kernels" (kernel-derived inside compiled regions,
    # hooktrace.analysis.kernels) or "measured+kernels"
    timing: dict[Key, str] = field(default_factory=dict)
    # the median call's self time; every call's self time, sorted, as calls_ns
    p50_self: dict[Key, float] = field(default_factory=dict)
    self_calls_ns: dict[Key, np.ndarray] | None = None
    # the interquartile range of the calls' durations (for a run without steps' noise)
    iqr: dict[Key, float] = field(default_factory=dict)
    gpu: bool = False  # device time recorded (the GPU_PHASES keys, hooktrace.analysis.device_time)
    launch: bool = False  # a CUDA run without device time: host times are launch times
    fused: set[Key] = field(default_factory=set)  # as _RunStats.fused


def _whole_run(part: _Part) -> _Part:
    """``part`` with the whole run as its one column (as a part without steps)."""
    if not part.n_steps:
        return part
    return replace(part, total={k: np.array([v[0]]) for k, v in part.run.items()},
                   self_ns={k: np.array([v[1]]) for k, v in part.run.items()},
                   calls={k: np.array([v[2]]) for k, v in part.run.items()},
                   n_steps=0, step_ns=np.zeros(0, np.int64), root_ns=part.run_root_ns)


def _steps_in_one(pa: Sequence[_Part], pb: Sequence[_Part], names: tuple[str, str]
                  ) -> tuple[str, int] | None:
    """When one run has complete steps and the other none: that run's name and steps."""
    a_steps, b_steps = (sum(p.n_steps for p in ps) for ps in (pa, pb))
    if bool(a_steps) == bool(b_steps):
        return None
    return (names[0], a_steps) if a_steps else (names[1], b_steps)


def _unit_note(pa: Sequence[_Part], pb: Sequence[_Part], names: tuple[str, str]) -> list[str]:
    """Both runs per step, or both per run: when one run has steps and the other none,
    both are compared per run (``_whole_run`` on every part), and this note says so."""
    one = _steps_in_one(pa, pb, names)
    if one is None:
        return []
    return [f"{one[0]} has {one[1]} complete steps and the other run none: both are compared "
            "per run (whole runs); compare runs of the same length"]


def _ranks_unit_note(pa: Mapping[int, Sequence[_Part]], pb: Mapping[int, Sequence[_Part]],
                     names: tuple[str, str]) -> list[str]:
    """:func:`_unit_note` of rank directories, rank by rank: when a rank in both runs
    has steps in one and none in the other, every rank is compared per run (so that
    the rows, over ranks, are all in one unit), and this note says so."""
    odd = {r: one for r in sorted(set(pa) & set(pb))
           if (one := _steps_in_one(pa[r], pb[r], names)) is not None}
    if not odd:
        return []
    rank, (stepped, n) = next(iter(odd.items()))
    more = f" (and {len(odd) - 1} more ranks)" if len(odd) > 1 else ""
    return [f"{stepped} has {n} complete steps on rank {rank} and the other run none{more}: "
            "every rank is compared per run (whole runs); compare runs of the same length"]


def _part(trace: TraceData, keep_calls: bool = False) -> _Part:
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
    # the modules inside compiled regions, from their kernels: entries like spans, in the
    # region span's step, never roots; the regions' self time less theirs (as summary)
    d = derived_spans(trace)
    dur = spans.duration_ns
    # the one definition (hooktrace.analysis.kernels.span_self_ns): compile time too is the
    # <torch.compile> row's, not its span's (summary had it; diff did not)
    self_ns = span_self_ns(spans, d, compile_intervals(trace.info))
    module_of, cat_of, flags, parent = spans.module, spans.cat, spans.flags, spans.parent
    derived = np.zeros(len(spans), bool)
    if len(d):
        dur, self_ns = np.r_[dur, d.total_ns], np.r_[self_ns, d.self_ns]
        module_of, cat_of = np.r_[module_of, d.module], np.r_[cat_of, d.cat]
        flags, parent = np.r_[flags, d.flags], np.r_[parent, d.span]
        span_col = np.r_[span_col, span_col[d.span]]
        derived = np.r_[derived, np.ones(len(d), bool)]
    part = _Part({}, {}, {} if keep_calls else None, {}, {}, {}, n_steps,
                 steps.duration_ns[complete].astype(np.int64), 0.0,
                 span_definition(trace.info), self_calls_ns={} if keep_calls else None)
    is_eval = (flags & SPAN_EVAL) != 0
    for phase, cat in PHASES.items():
        sel = np.flatnonzero((cat_of == cat) & (is_eval == (phase == "eval")))
        if not len(sel):
            continue
        module = module_of[sel].astype(np.int64)
        order = np.lexsort((dur[sel], module))
        m_sorted = module[order]
        d_sorted = dur[sel][order]
        starts = np.flatnonzero(np.r_[True, m_sorted[1:] != m_sorted[:-1]])
        counts = np.diff(np.r_[starts, len(m_sorted)])
        ids = m_sorted[starts]
        p50 = group_percentile(d_sorted, starts, counts, 50)
        s_sorted = self_ns[sel][np.lexsort((self_ns[sel], module))]
        p50_self = group_percentile(s_sorted, starts, counts, 50)
        iqr = (group_percentile(d_sorted, starts, counts, 75)
               - group_percentile(d_sorted, starts, counts, 25))
        n_mod = int(module.max()) + 1
        in_step = span_col[sel] >= 0
        cell = module[in_step] * width + span_col[sel][in_step]
        per_step = np.bincount(cell, weights=dur[sel][in_step],
                               minlength=n_mod * width).reshape(n_mod, width)
        self_step = np.bincount(cell, weights=self_ns[sel][in_step],
                                minlength=n_mod * width).reshape(n_mod, width)
        calls = np.bincount(cell, minlength=n_mod * width).reshape(n_mod, width)
        run_total = np.bincount(module, weights=dur[sel], minlength=n_mod)
        run_self = np.bincount(module, weights=self_ns[sel], minlength=n_mod)
        run_calls = np.bincount(module, minlength=n_mod)
        n_derived = np.bincount(module, weights=derived[sel], minlength=n_mod)
        for k, m in enumerate(ids.tolist()):
            name, type_name = (trace.modules[m] if m < len(trace.modules)
                               else (f"<module {m}>", "?"))
            key = (name, phase)
            part.run[key] = (float(run_total[m]), float(run_self[m]), float(run_calls[m]))
            part.types[key] = type_name
            part.p50[key] = float(p50[k])
            part.p50_self[key] = float(p50_self[k])
            part.iqr[key] = float(iqr[k])
            if part.calls_ns is not None and part.self_calls_ns is not None:
                part.calls_ns[key] = d_sorted[starts[k]:starts[k] + counts[k]].copy()
                part.self_calls_ns[key] = s_sorted[starts[k]:starts[k] + counts[k]].copy()
            part.total[key] = per_step[m].copy()
            part.self_ns[key] = self_step[m].copy()
            part.calls[key] = calls[m].astype(np.float64)
            if n_derived[m]:
                part.timing[key] = ("kernels" if n_derived[m] == run_calls[m]
                                    else "measured+kernels")
        roots = parent[sel] < 0
        part.root_ns += float(dur[sel][roots & (span_col[sel] >= 0)].sum())
        part.run_root_ns += float(dur[sel][roots].sum())
    if gpu_recorded(trace):
        _add_gpu_phases(part, trace, complete)
    part.launch = launch_time_only(trace)
    for slot, eval_, phase in fused_modules(trace):
        if not (eval_ and phase == "backward"):
            part.fused.add((trace.modules[slot][0], "eval" if eval_ else phase))
    return part


def _add_gpu_phases(part: _Part, trace: TraceData, complete: np.ndarray) -> None:
    """The run's device time as the GPU_PHASES rows of ``part``: per (module, phase) its
    intervals as calls, in the columns of the complete steps that were timed
    (``gpu_every=N`` times every N-th: the others would count as 0), or the whole run."""
    gpu = trace.gpu_spans()
    part.gpu = True
    if not len(gpu):
        return
    m = module_gpu(trace, len(trace.modules))
    timed = np.intersect1d(complete, m.step[m.step >= 0])
    n_cols = max(len(timed), 1) if part.n_steps else 1
    col = np.full(len(trace.steps()) + 1, -1, np.int64)
    if part.n_steps:
        col[timed] = np.arange(len(timed))
        span_col = col[m.step]
    else:
        span_col = np.zeros(len(gpu), np.int64)
    dur, self_ns = gpu.duration_ns, gpu.self_ns
    is_eval = m.group >= m.n_mod
    module = m.group % m.n_mod
    for phase in GPU_PHASES:
        sel = np.flatnonzero((m.backward == (phase == "gpu backward"))
                             & (is_eval == (phase == "gpu eval")))
        for mod in np.unique(module[sel]).tolist():
            mine = sel[module[sel] == mod]
            d, s_ = np.sort(dur[mine]), np.sort(self_ns[mine])
            name, type_name = (trace.modules[mod] if mod < len(trace.modules)
                               else (f"<module {mod}>", "?"))
            key = (name, phase)
            c = span_col[mine]
            ok = c >= 0
            per_col = np.bincount(c[ok], weights=dur[mine][ok], minlength=n_cols)
            part.types[key] = type_name
            part.p50[key] = float(np.percentile(d, 50))
            part.p50_self[key] = float(np.percentile(s_, 50))
            q75, q25 = np.percentile(d, [75, 25])
            part.iqr[key] = float(q75 - q25)
            if part.calls_ns is not None and part.self_calls_ns is not None:
                part.calls_ns[key], part.self_calls_ns[key] = d, s_
            part.total[key] = per_col
            part.self_ns[key] = np.bincount(c[ok], weights=self_ns[mine][ok],
                                            minlength=n_cols)
            part.calls[key] = np.bincount(c[ok], minlength=n_cols).astype(np.float64)
            part.run[key] = (float(d.sum()), float(s_.sum()), float(len(d)))
            if np.any(gpu.span[mine] < 0):
                part.timing[key] = "kernels"


_KEY_PHASES = (*PHASES, *GPU_PHASES)  # the SQL's key_phase numbers (hooktrace.data.engine)


def _sql_part(trace: TraceData, keep_calls: bool = False) -> _Part:
    """:func:`_part` computed by DuckDB over the run's tables
    (:func:`hooktrace.data.engine.diff_tables`): the same numbers (tested)."""
    from hooktrace.data.engine import diff_tables, run_connection, split_files

    gpu = gpu_recorded(trace)
    con = run_connection(trace, ("spans", "steps", "gpu") if gpu else ("spans", "steps"))
    try:  # (one file: no rank or window, r = w = -1)
        t = diff_tables(con, gpu=gpu, calls=[(-1, -1)] if keep_calls else [])
    finally:
        con.close()
    return _part_from_tables(split_files(t).get((-1, -1), {}), trace.info, gpu, keep_calls)


def _part_from_tables(t: Mapping[str, Any], info: Mapping[str, Any], gpu: bool,
                      keep_calls: bool) -> _Part:
    """A :class:`_Part` from :func:`hooktrace.data.engine.diff_tables`' results of one
    file (``split_files``: a table without rows of the file is absent; ``info``: the
    file's metadata; ``gpu``: device time recorded)."""
    step_ns = (t["steps"].column("dur_ns").to_numpy().astype(np.int64) if "steps" in t
               else np.zeros(0, np.int64))
    n_steps = len(step_ns)
    part = _Part({}, {}, {} if keep_calls else None, {}, {}, {}, n_steps, step_ns, 0.0,
                 span_definition(dict(info)), self_calls_ns={} if keep_calls else None)
    roots = t["host_roots"].to_pylist()[0] if "host_roots" in t else {"in_steps": 0, "run": 0}
    part.root_ns, part.run_root_ns = float(roots["in_steps"]), float(roots["run"])
    for side in ("host", "gpu") if gpu else ("host",):
        width = max(n_steps, 1)
        if side == "gpu":
            part.gpu = True
            if n_steps:
                width = max(int(t["gpu_timed"].column("n")[0].as_py()) if "gpu_timed" in t
                            else 0, 1)
        cells: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        empty = np.zeros(0, np.int64)
        c = ({k: t[f"{side}_cells"].column(k).to_numpy() for k in t[f"{side}_cells"].column_names}
             if f"{side}_cells" in t else dict.fromkeys(("key_phase", "slot", "col", "total_ns",
                                                          "self_ns", "calls"), empty))
        keys = c["key_phase"].astype(np.int64) * (1 << 32) + c["slot"].astype(np.int64)
        bounds = (np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True]) if len(keys)
                  else np.zeros(0, np.int64))
        for a, b in zip(bounds[:-1], bounds[1:]):
            arrays = []
            for name in ("total_ns", "self_ns", "calls"):
                v = np.zeros(width)
                v[c["col"][a:b]] = c[name][a:b]
                arrays.append(v)
            cells[(int(c["key_phase"][a]), int(c["slot"][a]))] = (arrays[0], arrays[1],
                                                                   arrays[2])
        calls_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        if keep_calls and f"{side}_calls" in t:
            k = {n: t[f"{side}_calls"].column(n).to_numpy() for n in
                 ("key_phase", "slot", "dur_ns", "self_ns")}
            kk = k["key_phase"].astype(np.int64) * (1 << 32) + k["slot"].astype(np.int64)
            edges = (np.flatnonzero(np.r_[True, kk[1:] != kk[:-1], True]) if len(kk)
                     else np.zeros(0, np.int64))
            for a, b in zip(edges[:-1], edges[1:]):
                calls_of[(int(k["key_phase"][a]), int(k["slot"][a]))] = (
                    np.sort(k["dur_ns"][a:b]).astype(np.int64),
                    np.sort(k["self_ns"][a:b]).astype(np.int64))
        zero = np.zeros(width)
        for row in t[f"{side}_keys"].to_pylist() if f"{side}_keys" in t else []:
            kp, slot = int(row["key_phase"]), int(row["slot"])
            key = (row["module"], _KEY_PHASES[kp])
            part.types[key] = row["type"]
            q25, p50, q75 = (float(q) for q in row["q"])  # (one sort for the three)
            part.p50[key] = p50
            part.p50_self[key] = float(row["p50_self"])
            part.iqr[key] = q75 - q25
            total, self_, calls = cells.get((kp, slot), (zero, zero, zero))
            part.total[key], part.self_ns[key], part.calls[key] = (total.copy(), self_.copy(),
                                                                   calls.copy())
            part.run[key] = (float(row["total_ns"]), float(row["self_ns"]),
                             float(row["calls"]))
            if keep_calls and part.calls_ns is not None and part.self_calls_ns is not None:
                part.calls_ns[key], part.self_calls_ns[key] = calls_of[(kp, slot)]
            if row["derived"]:
                part.timing[key] = ("kernels" if side == "gpu" or row["derived"] == row["calls"]
                                    else "measured+kernels")
    part.launch = info.get("accelerator") == "cuda" and not gpu  # (launch_time_only)
    return part


def _spread(per_step: np.ndarray, call_iqr: float, calls: float) -> float:
    """Run-to-run noise of a (module, phase)'s time per step: the interquartile range
    of its time over the complete steps, from 4 steps on; else (fewer steps, or the
    whole run as one) the calls' interquartile range times the calls per step."""
    if len(per_step) >= 4:
        q75, q25 = np.percentile(per_step, [75, 25])
        return float(q75 - q25)
    return float(call_iqr * calls)


def _pool(parts: Sequence[_Part]) -> _RunStats:
    """One run's numbers from its parts (a file, or the windows of one process): p50
    per call over all their calls, medians over all their complete steps (their sums
    when no part has complete steps: then the run has no steps)."""
    definitions = sorted({p.span_definition for p in parts})
    if len(definitions) > 1:
        raise DiffInputError(
            "hooktrace diff: one run's files were recorded under different span definitions "
            f"({', '.join(_definition(d) for d in definitions)}); re-record them with one "
            "hooktrace version")
    if len(parts) == 1:
        p = parts[0]
        width = max(p.n_steps, 1)
        out = {}
        for key in p.types:
            calls = float(np.percentile(p.calls[key], 50))
            out[key] = _PhaseStats(p.types[key], p.p50[key],
                                   float(np.percentile(p.total[key], 50)),
                                   float(np.percentile(p.self_ns[key], 50)), calls,
                                   p.timing.get(key, "measured"), p.p50_self[key],
                                   _spread(p.total[key] if p.n_steps else np.zeros(0),
                                           p.iqr[key], calls))
        step_p50 = float(np.percentile(p.step_ns, 50)) if p.n_steps else None
        root_total = p.root_ns / width
        return _RunStats(out, p.n_steps, step_p50, step_p50 if step_p50 else root_total,
                         p.span_definition, p.gpu, p.launch, p.fused - set(out))
    stepped = [p for p in parts if p.n_steps]
    n_steps = sum(p.n_steps for p in stepped)
    keys: dict[Key, str] = {}
    for p in parts:
        for key, type_name in p.types.items():
            keys.setdefault(key, type_name)
    out = {}
    for key, type_name in keys.items():
        calls_ns, self_calls_ns = [], []
        for p in parts:
            if key in p.types:
                if p.calls_ns is None or p.self_calls_ns is None:
                    raise ValueError("hooktrace.analysis.diff: a part to pool was made "
                                     "without its calls")
                calls_ns.append(p.calls_ns[key])
                self_calls_ns.append(p.self_calls_ns[key])
        every = np.concatenate(calls_ns)
        p50 = float(np.median(every))
        q75, q25 = np.percentile(every, [75, 25])

        total, self_ns, calls = (_pooled_column(parts, stepped, f, key)
                                 for f in ("total", "self_ns", "calls"))
        per_step = (np.concatenate([p.total.get(key, np.zeros(p.n_steps)) for p in stepped])
                    if stepped else np.zeros(0))
        out[key] = _PhaseStats(type_name, p50, total, self_ns, calls, _pooled_timing(parts, key),
                               float(np.median(np.concatenate(self_calls_ns))),
                               _spread(per_step, float(q75 - q25), calls))
    step_p50 = (float(np.median(np.concatenate([p.step_ns for p in stepped])))
                if n_steps else None)
    root_total = (sum(p.root_ns for p in stepped) / n_steps if n_steps
                  else sum(p.root_ns for p in parts))
    return _RunStats(out, n_steps, step_p50, step_p50 if step_p50 else root_total,
                     definitions[0], all(p.gpu for p in parts), any(p.launch for p in parts),
                     set().union(*(p.fused for p in parts)) - set(out))


def _pooled_timing(parts: Sequence[_Part], key: Key) -> str:
    kinds = {k for p in parts if key in p.types
             for k in p.timing.get(key, "measured").split("+")}
    return "+".join(k for k in ("measured", "kernels") if k in kinds)


def _pooled_column(parts: Sequence[_Part], stepped: Sequence[_Part], field: str, key: Key
                   ) -> float:
    """The median over every complete step of every part, or the sum of the parts'
    whole-run values when none has complete steps."""
    if stepped:
        return float(np.median(np.concatenate([
            getattr(p, field).get(key, np.zeros(p.n_steps)) for p in stepped])))
    return float(sum(getattr(p, field)[key][0] for p in parts if key in p.types))


def _parts(trace: TraceData | Sequence[TraceData]) -> list[_Part]:
    trace = as_data(trace)
    traces = [trace] if isinstance(trace, TraceData) else [as_data(t) for t in trace]
    if not traces:
        raise ValueError("hooktrace.analysis.diff: a run of no trace")
    return [_part(t, keep_calls=len(traces) > 1) for t in traces]


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
            return [f"{_label(r, self.launch)}: +{c:.1f}%"
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
            out = []
            for m, p in items:
                entry: dict[str, Any] = {"module": m, "phase": p}
                if self.ranks is not None:
                    entry["ranks"] = self._only_ranks(which, (m, p))
                out.append(entry)
            return out

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
            kernels = "kernels" in (r.get("timing_a") or "") + (r.get("timing_b") or "")
            line = [(r["module"] or "<root>")
                    + (f" [{_kernels_tag(r, self.launch)}]" if kernels else ""), r["phase"]]
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
                lines.append(f"fused in {which} (its ops ran in other modules' kernels, no time "
                             "of its own): " + ", ".join(f"{m or '<root>'} {p}" for m, p in items))
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


def _label(row: dict[str, Any], launch: bool = False) -> str:
    kernels = "kernels" in (row.get("timing_a") or "") + (row.get("timing_b") or "")
    tag = f" [{_kernels_tag(row, launch)}]" if kernels else ""
    return f"{row['module'] or '<root>'}{tag} {row['phase']}"


def _kernels_tag(row: dict[str, Any], launch: bool) -> str:
    """A kernel-derived row's tag: its kernels' launch time on a CUDA run without device
    time (host rows there), else their time."""
    return "kernel launches" if launch and row["phase"] not in GPU_PHASES else "kernels"


def compare(a: TraceData | Sequence[TraceData], b: TraceData | Sequence[TraceData],
            names: tuple[str, str] = ("A", "B")) -> Diff:
    """Compare run ``b`` against run ``a`` (see the module docstring). A run is one
    trace, or a sequence of traces (the schedule windows of one process), pooled."""
    pa, pb = _parts(a), _parts(b)
    notes = _unit_note(pa, pb, names)
    if notes:
        pa, pb = [_whole_run(p) for p in pa], [_whole_run(p) for p in pb]
    d = _compare_stats(_pool(pa), _pool(pb), names)
    d.notes += notes
    return d


def _definition(d: int) -> str:
    return f"{d}: {SPAN_DEFINITIONS.get(d, 'unknown')}"


def _check_definitions(sa: _RunStats, sb: _RunStats, names: tuple[str, str]) -> None:
    """Module times recorded under different span definitions differ by the hooks'
    time (FSDP2's all-gathers: 80-120 ms per block): refuse rather than report it."""
    if sa.span_definition != sb.span_definition:
        raise DiffInputError(
            f"hooktrace diff: {names[0]} and {names[1]} define a module span differently "
            f"({_definition(sa.span_definition)} vs {_definition(sb.span_definition)}), so "
            "their times are not comparable; re-record the older one with this hooktrace")


def _compare_stats(sa: _RunStats, sb: _RunStats, names: tuple[str, str]) -> Diff:
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
        step.update({"module": _STEP, "type": "", "phase": "step",
                     "per_step_a_ns": sa.step_p50_ns, "per_step_b_ns": sb.step_p50_ns,
                     "per_step_change_ns": ds, "per_step_change_pct": dsp, "share_a": 1.0})
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


def _model_note(sa: _RunStats, sb: _RunStats, names: tuple[str, str]) -> list[str]:
    """One line when A and B look like two different models: the root modules' classes
    differ, or fewer than half of the module names are in both runs."""
    def root(s: _RunStats) -> str | None:
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
    pa, pb = {r: _parts(t) for r, t in a.items()}, {r: _parts(t) for r, t in b.items()}
    notes = _ranks_unit_note(pa, pb, names)
    if notes:
        pa, pb = ({r: [_whole_run(p) for p in ps] for r, ps in parts.items()}
                  for parts in (pa, pb))
    d = _compare_rank_stats({r: _pool(ps) for r, ps in pa.items()},
                            {r: _pool(ps) for r, ps in pb.items()}, names)
    d.notes += notes
    return d


def _compare_rank_stats(sa: Mapping[int, _RunStats], sb: Mapping[int, _RunStats],
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
    only_a = list(dict.fromkeys(k for d in by_rank.values() for k in d.only_a))
    only_b = list(dict.fromkeys(k for d in by_rank.values() for k in d.only_b))
    fused_a = list(dict.fromkeys(k for d in by_rank.values() for k in d.fused_a))
    fused_b = list(dict.fromkeys(k for d in by_rank.values() for k in d.fused_b))
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


# -- paths: files, rank directories, windows -------------------------------------------


def _file_part(path: str) -> tuple[FileMeta, _Part]:
    """Read one file and reduce it (runs in a worker process for many files)."""
    trace = load(path)
    meta = file_meta(path, trace)
    return meta, _part(trace, keep_calls=meta.window is not None)


def _file_sql_part(path: str) -> tuple[FileMeta, _Part]:
    """:func:`_file_part` on DuckDB (:func:`_sql_part`; runs in a thread)."""
    trace = load(path)
    meta = file_meta(path, trace)
    return meta, _sql_part(trace, keep_calls=meta.window is not None)


def _map_threads(paths: Sequence[str], workers: int | None
                 ) -> list[tuple[FileMeta, _Part] | str]:
    """:func:`_file_sql_part` of every path in ``workers`` threads (loading and DuckDB
    release the GIL), a failure as its one-line message, as ``map_ranks`` gives."""
    from concurrent.futures import ThreadPoolExecutor

    from hooktrace.errors import HooktraceError

    def one(path: str) -> tuple[FileMeta, _Part] | str:
        try:
            return _file_sql_part(path)
        except (HooktraceError, OSError, ValueError) as e:
            text = str(e)
            return text if text.startswith(path) else f"{path}: {text}"

    n = workers if workers is not None else min(os.cpu_count() or 1, max(len(paths), 1))
    with ThreadPoolExecutor(max(n, 1)) as pool:
        return list(pool.map(one, paths))


def _is_dataset(path: str) -> bool:
    """Whether ``path`` is a Parquet export of trace files (``hooktrace export DIR -o
    OUT/``: OUT/spans/..., OUT/runs/...)."""
    if not any(os.path.exists(os.path.join(path, n)) for n in ("spans", "spans.parquet")):
        return False
    from hooktrace.errors import HooktraceError

    try:
        from hooktrace.data.engine import find_source

        src = find_source(path)
    except (ImportError, HooktraceError):
        return False
    return "spans" in src.parquet and "runs" in src.parquet


def _dataset_parts(path: str) -> dict[str, tuple[FileMeta, _Part]]:
    """Per file of a Parquet export (its ``runs.path``): its metadata and numbers, as
    :func:`_file_part` reads them from the file itself (SQL over the dataset on DuckDB)."""
    from hooktrace.data.engine import dataset_diff_tables

    out = {}
    for row, gpu, t in dataset_diff_tables(path, lambda info: info.get("window") is not None):
        f, info = row["path"], row["info"]
        rank = info.get("rank")
        meta = FileMeta(f, rank if isinstance(rank, int) else None,
                        info.get("world_size") if isinstance(info.get("world_size"), int)
                        else None, row["hostname"], row["pid"], window_of(f, info),
                        row["start_ns"], row["stop_ns"], cut="cut" in info)
        out[f] = (meta, _part_from_tables(t, info, gpu, meta.window is not None))
    return out


def compare_paths(a: str, b: str, *, workers: int | None = None,
                  engine: str | None = None) -> Diff:
    """Compare the runs at ``a`` and ``b``: each a ``.htrace`` file, a rank directory or
    a directory of schedule windows, optionally ``PATH:N`` for window N (see the
    module docstring). Raises :class:`DiffInputError` (one line, naming the path and
    file) for inputs that are not one run or cannot be compared.

    ``engine``: ``"pool"`` (the default: worker processes reducing each file with
    numpy, :func:`~hooktrace.analysis.rankset.map_ranks`) or ``"duckdb"`` (the same numbers as
    SQL over each file's tables, :func:`hooktrace.data.engine.diff_tables`, in
    ``workers`` threads). Both give the same diff (tested); benchmarks/ranks.py
    ``--engines diff-pool,diff-duckdb`` times them (benchmarks/RESULTS.md, issue #29).
    ``a`` or ``b`` may also be a Parquet export of the files (``hooktrace export DIR -o
    OUT/``): DuckDB reduces it, whatever ``engine``."""
    if engine not in (None, *ENGINES):
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    specs = [parse_spec(a), parse_spec(b)]
    from_dataset: dict[str, tuple[FileMeta, _Part]] = {}
    files = []
    exports: dict[str, dict[str, tuple[FileMeta, _Part]]] = {}  # (each read once)
    for path, _ in specs:
        if _is_dataset(path):  # a Parquet export of the files: DuckDB reads it
            real = os.path.realpath(path)
            if real not in exports:
                exports[real] = _dataset_parts(path)
            found = exports[real]
            from_dataset.update((os.path.realpath(f), r) for f, r in found.items())
            files.append(list(found))
        else:
            files.append(find_files(path))
    unique = list(dict.fromkeys(os.path.realpath(f) for fs in files for f in fs
                                if os.path.realpath(f) not in from_dataset))
    first_name: dict[str, str] = {}
    for fs in files:
        for f in fs:
            first_name.setdefault(os.path.realpath(f), f)
    todo = [first_name[u] for u in unique]
    results: dict[str, tuple[FileMeta, _Part] | str] = dict(zip(
        unique, _map_threads(todo, workers) if engine == "duckdb"
        else map_ranks(_file_part, todo, workers=workers)))
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
    parts = [{rank: [_result_part(results, f.path) for f in fs]
              for rank, fs in side.selected().items()} for side in (sa, sb)]
    if sa.ranked and sb.ranked:
        ranked = [{r: ps for r, ps in side.items() if r is not None} for side in parts]
        unit_notes = _ranks_unit_note(ranked[0], ranked[1], names)
    else:
        unit_notes = _unit_note([p for ps in parts[0].values() for p in ps],
                                [p for ps in parts[1].values() for p in ps], names)

    def pooled(side: Side) -> dict[int | None, _RunStats]:
        return {rank: _pool([_whole_run(_result_part(results, f.path)) if unit_notes
                             else _result_part(results, f.path) for f in fs])
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


def _result_part(results: Mapping[str, tuple[FileMeta, _Part] | str], path: str) -> _Part:
    res = results[os.path.realpath(path)]
    assert not isinstance(res, str)
    return res[1]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _pct(p: float | None) -> str:
    if p is None:
        return ""
    return f"{p:+.1f}%"


def _signed_ns(ns: float | None) -> str:
    from hooktrace.text import format_ns

    if ns is None:
        return ""
    return ("+" if ns >= 0 else "-") + format_ns(abs(ns))


def _json_number(x: Any) -> Any:
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")
