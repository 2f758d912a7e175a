"""A window's aggregate rows (issue #31; the recording that writes them is
:mod:`hooktrace.record.aggregate`, the folder read back is :mod:`hooktrace.data.aggregates`):
:func:`reduce_window`, the per-call table grouped per module and mode, and the names an
``aggregate=DIR`` folder's files and rows share with its readers.
"""

from __future__ import annotations

import statistics
from typing import Any


# DIR/KEPT_INDEX: a JSON line per step kept whole ({"step", "why", "file", "run", "rank"}:
# DIR/steps/file)
KEPT_INDEX = "kept.jsonl"
# DIR/LIVE_DIR/<run>.json: the rows of a run's newest windows, for hooktrace top DIR
# (hooktrace.analysis.live reads them); how far the run got and whether it ended, for
# what kill -9 lost (hooktrace.data.aggregates.run_progress)
LIVE_DIR = "live"


# the module column's own labels; a submodule named as one is quoted (issue #35: one
# named "<root>" merged with the root's rows)
ROOT_ROW, STEP_ROW = "<root>", "<step>"


def row_name(name: str) -> str:
    """The module column's value for a qualified module name."""
    if not name:
        return ROOT_ROW
    return f"'{name}'" if name in (ROOT_ROW, STEP_ROW) else name


def reduce_window(first: int, trace: Any, step_ms: list[float]) -> dict[str, list[Any]]:
    """The aggregate rows of the steps ``first``, ``first + 1``, ... (``len(step_ms)`` of
    them, their wall times) whose events ``trace`` holds, as columns: per module and
    mode, calls and time, and the recorded quantities' columns (their providers',
    hooktrace.analysis.columns: null where not recorded); a "step" row for the steps
    themselves (total, median, max)."""
    import numpy as np

    from hooktrace.analysis.calls import Calls, phase_label
    from hooktrace.analysis.column_provider import WindowGroup
    from hooktrace.analysis.columns import PROVIDERS
    from hooktrace.analysis.groups import Groups
    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, CAT_RECOMPUTE

    # the per-call table every view groups (issue #37): measured and kernel-derived calls
    # and compiles, with the one self time; eval calls (no_grad or module.eval()) are
    # rows of their own, as in the summary
    c = Calls.from_trace(trace)
    names = [row_name(n) for n in c.names]
    # per provider: its columns, and per group their values (None: not in this window)
    parts = [(p.aggregate_columns, p.aggregate(trace, c) if p.recorded(trace) else None)
             for p in PROVIDERS]
    extra = [k for columns, _ in parts for k in columns]
    cols: dict[str, list[Any]] = {k: [] for k in (
        "step", "steps", "module", "mode", "calls", "total_ms", "p50_ms", "max_ms", *extra,
        "total_ns", "self_ns")}
    step, steps = first, len(step_ms)
    for cat in (CAT_FORWARD, CAT_BACKWARD, CAT_RECOMPUTE):
        for is_eval in (False, True):
            sel = np.flatnonzero((c.cat == cat) & (c.eval == is_eval))
            if not sel.size:
                continue
            mode = phase_label(cat, is_eval)
            g = Groups(c.module[sel], c.dur[sel], c.self_ns[sel], len(names))
            group_mods = g.ids.tolist()
            n = len(group_mods)
            cols["step"] += [step] * n
            cols["steps"] += [steps] * n
            cols["module"] += [names[m] for m in group_mods]
            cols["mode"] += [mode] * n
            cols["calls"] += g.counts.tolist()
            cols["total_ns"] += g.total.tolist()
            cols["self_ns"] += g.self_total.tolist()
            cols["total_ms"] += (g.total / 1e6).tolist()
            cols["p50_ms"] += (g.percentile(50) / 1e6).tolist()
            cols["max_ms"] += (g.max / 1e6).tolist()
            group = WindowGroup(mode, cat, is_eval, sel, g, group_mods)
            for columns, values_of in parts:
                values = values_of(group) if values_of is not None else {}
                for key in columns:
                    cols[key] += values.get(key, [None] * n)
    cols["step"].append(step)
    cols["steps"].append(steps)
    cols["module"].append(STEP_ROW)
    cols["mode"].append("step")
    for key, value in (("calls", steps), ("total_ms", float(sum(step_ms))),
                       ("p50_ms", float(statistics.median(step_ms))),
                       ("max_ms", float(max(step_ms))),
                       *((k, None) for k in extra),
                       ("total_ns", int(round(sum(step_ms) * 1e6))), ("self_ns", None)):
        cols[key].append(value)
    return cols


def ranks_only(runs: list[tuple[str, int | None]]) -> bool:
    """Whether the runs are one each of distinct ranks (one launch's ranks)."""
    ranks = [k for _, k in runs]
    return None not in ranks and len(set(ranks)) == len(ranks)


def source_labels(runs: list[tuple[str, int | None]]) -> dict[tuple[str, int | None], str]:
    """``rank R`` per run when the runs are distinct ranks, else ``run N`` (N: 1, 2, ... in
    the runs' order; the names are in the table's ``run`` column)."""
    if ranks_only(runs):
        return {r: f"rank {r[1]}" for r in runs}
    return {r: f"run {i + 1}" + (f" r{r[1]}" if r[1] is not None else "")
            for i, r in enumerate(runs)}

