"""``hooktrace summary`` of a Parquet export of one run (issue #29): the per-module table
from the ``spans`` and ``steps`` tables, computed by DuckDB.

The rows are :class:`hooktrace.analysis.summary.Summary`'s, with the same keys, values and order
as the summary of the ``.htrace`` the export came from: per module and mode the forward,
backward and recompute calls, their total and self times, the median and p99 of the
call durations (DuckDB's ``quantile_cont`` is numpy's linear percentile), the
``timing`` (``measured``, ``kernels``, both), the ``<torch.compile>`` row, a module's
time per step (``step_p50_ns``, ``step_p99_ns``), and the step count and step
percentiles of the footer (steps that overlap a compile left out,
as the summary does). What an export does not carry is left out, and the footer says
so: autograd time outside every module call (``<unattributed>`` rows), modules fused
whole into other modules' kernels, and the FLOP,
memory, numerics and device-time columns (query those tables directly).

Example::

    from hooktrace.data.summary import summary_of_export
    print(summary_of_export("run.parquet").to_text())
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hooktrace.data.engine import QueryError, connect, find_source, sql_errors, tables_of
from hooktrace.analysis.summary import COMPILE_ROW, Summary

__all__ = ["EXPORT_NOTE", "is_export", "runs_in_export", "summary_of_export"]

EXPORT_NOTE = ("from a Parquet export: no <unattributed> autograd rows, fused modules, FLOPs, "
               "memory, numerics or device time (query those tables)")

# Per module, mode and phase (the modules table gives the slot order of ties).
_GROUPS_SQL = """
    SELECT slot, CAST(module AS VARCHAR) AS module, CAST(type AS VARCHAR) AS type,
           CAST(mode AS VARCHAR) AS mode, CAST(phase AS VARCHAR) AS phase,
           bool_or(timing = 'measured' OR timing = 'compile') AS measured,
           bool_or(timing = 'kernels') AS kernels,
           CAST(count(*) AS BIGINT) AS calls, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
           CAST(sum(self_ns) AS BIGINT) AS self_ns,
           quantile_cont(dur_ns, 0.5) AS p50_ns, quantile_cont(dur_ns, 0.99) AS p99_ns
    FROM spans
    GROUP BY ALL
    ORDER BY slot, mode DESC, phase"""

# Complete steps, and whether a compile (a '<torch.compile>' span) overlaps each.
_STEPS_SQL = """
    SELECT s.step, s.dur_ns, EXISTS (SELECT 1 FROM spans c WHERE c.timing = 'compile'
                             AND c.start_ns < s.end_ns AND c.end_ns > s.start_ns) AS compiling
    FROM steps s WHERE s.complete ORDER BY s.step"""

# Per module and step: its measured forward + backward time (train calls).
_PER_STEP_SQL = """
    SELECT slot, CAST(module AS VARCHAR) AS module, step,
           CAST(sum(dur_ns) AS BIGINT) AS total_ns
    FROM spans
    WHERE timing = 'measured' AND phase <> 'recompute' AND mode = 'train'
          AND step IS NOT NULL
    GROUP BY ALL"""


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Parquet export (``hooktrace export -o X.parquet`` or
    ``-o DIR/``), rather than ``.htrace`` files or an ``aggregate=`` folder."""
    name = os.fspath(path)
    if os.path.isfile(name):
        return name.endswith(".parquet")
    if not os.path.isdir(name):
        return False
    try:
        src = find_source(name)
    except QueryError:
        return False
    return bool(src.parquet) and src.aggregates is None


def runs_in_export(path: str | os.PathLike[str]) -> int:
    """How many runs (ranks, windows) a Parquet export holds: its ``runs`` table's rows,
    or its spans' distinct ranks and windows when the export left that table out."""
    con = connect(path)
    try:
        with sql_errors(path):
            return _runs(con)
    finally:
        con.close()


def _runs(con: Any) -> int:
    n = con.execute("SELECT count(*) FROM runs").fetchone()
    if not n or not n[0]:
        n = con.execute('SELECT count(DISTINCT (rank, "window")) FROM spans').fetchone()
    return int(n[0]) if n else 0


def summary_of_export(path: str | os.PathLike[str]) -> Summary:
    """The per-module summary of a Parquet export of one run (see the module docstring);
    :class:`QueryError` for an export of several runs, or one without spans."""
    name = os.fspath(path)
    src = find_source(name)
    if "spans" not in src.parquet:
        raise QueryError(f"{name}: holds the {', '.join(tables_of(src))} table"
                         f"{'s' if len(tables_of(src)) > 1 else ''}, not spans: the per-module "
                         "table reads spans (hooktrace export RUN -o DIR/); hooktrace query "
                         "reads any")
    con = connect(name)
    try:
        with sql_errors(name):
            n_runs = _runs(con)
            if n_runs > 1:
                raise QueryError(f"{name}: a Parquet export of {n_runs} runs (ranks or windows): "
                                 "the per-module table is one run's; hooktrace summary DIR gives "
                                 "the ranks' tables")
            groups = _fetch(con, _GROUPS_SQL)
            steps = _fetch(con, _STEPS_SQL)
            per_step = _fetch(con, _PER_STEP_SQL)
            runs = _fetch(con, "SELECT dropped_events, overwritten_events, cut FROM runs")
    finally:
        con.close()
    rows = _rows(groups)
    # lost data is said as the summary says it (a spans-only X.parquet has no runs table)
    counts: dict[str, int] = {
        "dropped_events": sum(r["dropped_events"] for r in runs),
        "overwritten_events": sum(r["overwritten_events"] for r in runs)}
    notes = [r["cut"] for r in runs if r["cut"]]
    if not runs:
        notes.append("the export has no runs table: events the recorder dropped are not known")
    kept = [s for s in steps if not s["compiling"]]
    counts["steps"] = len(kept)
    counts["compile_steps"] = len(steps) - len(kept)
    if kept:
        d = np.array([s["dur_ns"] for s in kept], np.int64)
        counts["step_p50_ns"] = int(np.percentile(d, 50))
        counts["step_p99_ns"] = int(np.percentile(d, 99))
        # a module's time per complete step (0 in a step it did not run), as the summary
        column = {s["step"]: i for i, s in enumerate(kept)}
        totals: dict[str, np.ndarray] = {}
        for r in per_step:
            if r["step"] in column:
                per = totals.setdefault(r["module"], np.zeros(len(kept), np.int64))
                per[column[r["step"]]] += r["total_ns"]
        for row in rows:
            values = totals.get(row["module"]) if row["mode"] == "train" else None
            if values is not None:
                row["step_p50_ns"] = float(np.percentile(values, 50))
                row["step_p99_ns"] = float(np.percentile(values, 99))
    return Summary(rows, counts, notes + [EXPORT_NOTE])


def _fetch(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _rows(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key: dict[tuple[int, str], dict[str, Any]] = {}
    for g in groups:
        key = (g["slot"], g["mode"])
        row = by_key.get(key)
        if row is None:
            row = by_key[key] = {
                "module": g["module"], "type": g["type"], "mode": g["mode"], "timing": "",
                "fused": None, "_measured": False, "_kernels": False,
                **_phase(None, ""), **_phase(None, "bwd_"), "recompute_calls": 0,
                "recompute_total_ns": 0, "step_p50_ns": None, "step_p99_ns": None}
        row["_measured"] |= bool(g["measured"])
        row["_kernels"] |= bool(g["kernels"])
        if g["phase"] == "forward":
            row.update(_phase(g, ""))
        elif g["phase"] == "backward":
            row.update(_phase(g, "bwd_"))
        else:
            row["recompute_calls"] = g["calls"]
            row["recompute_total_ns"] = g["total_ns"]
    # the summary's order: the train rows by module slot, then the eval rows, the compile
    # row (slot -1) last; then by total time, descending (a stable sort)
    ordered = sorted(by_key.items(), key=lambda kv: (kv[0][0] < 0, kv[0][1] == "eval", kv[0][0]))
    rows = []
    for _, row in ordered:
        row["timing"] = "+".join(w for w, on in (("measured", row.pop("_measured")),
                                                 ("kernels", row.pop("_kernels"))) if on)
        del row["bwd_mean_ns"]
        row["bwd_fwd_ratio"] = (row["bwd_total_ns"] / row["total_ns"]
                                if row["bwd_calls"] and row["total_ns"] else None)
        if row["module"] == COMPILE_ROW:  # (compile time: no ratio, as the summary)
            row["type"] = "torch.compile"
            row["bwd_fwd_ratio"] = None
        rows.append(row)
    rows.sort(key=lambda r: -((r["total_ns"] or 0) + r["bwd_total_ns"]))
    columns = Summary([], {}).columns
    return [{key: row.get(key) for key in columns} for row in rows]


def _phase(g: dict[str, Any] | None, prefix: str) -> dict[str, Any]:
    if g is None:
        return {f"{prefix}calls": 0, f"{prefix}total_ns": 0, f"{prefix}self_ns": 0,
                f"{prefix}mean_ns": None, f"{prefix}p50_ns": None, f"{prefix}p99_ns": None}
    return {f"{prefix}calls": g["calls"], f"{prefix}total_ns": g["total_ns"],
            f"{prefix}self_ns": g["self_ns"], f"{prefix}mean_ns": g["total_ns"] / g["calls"],
            f"{prefix}p50_ns": float(g["p50_ns"]), f"{prefix}p99_ns": float(g["p99_ns"])}
