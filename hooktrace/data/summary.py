"""``hooktrace summary`` of a Parquet export of one run (issue #29): the per-module table
from the ``spans`` and ``steps`` tables, which DuckDB reads.

The rows are :class:`hooktrace.analysis.summary.Summary`'s, with the same keys, values and order
as the summary of the ``.htrace`` the export came from: per module and mode the forward,
backward and recompute calls, their total and self times, the median and p99 of the
call durations (the spans table is the trace's per-call table,
:class:`hooktrace.analysis.calls.Calls`, grouped by the summary's own reduction), the
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
from hooktrace.analysis.calls import COMPILE, Calls
from hooktrace.analysis.summary import Summary, add_per_step_columns, module_rows
from hooktrace.reading import Steps, compile_steps

__all__ = ["EXPORT_NOTE", "runs_in_export", "summary_of_export"]

EXPORT_NOTE = ("from a Parquet export: no <unattributed> autograd rows, fused modules, FLOPs, "
               "memory, numerics or device time (query those tables)")

# the spans table's columns that make the per-call table (hooktrace.analysis.calls)
_SPANS_SQL = ("SELECT module, slot, type, phase, mode, timing, call, step, thread, start_ns, "
              "end_ns, dur_ns, self_ns, depth, span, parent, error, unfinished FROM spans")


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
    n = con.sql("SELECT count(*) FROM runs").fetchall()[0]
    if not n[0]:
        n = con.sql('SELECT count(DISTINCT (rank, "window")) FROM spans').fetchall()[0]
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
    con = connect(src)
    try:
        with sql_errors(name):
            n_runs = _runs(con)
            if n_runs > 1:
                raise QueryError(f"{name}: a Parquet export of {n_runs} runs (ranks or windows): "
                                 "the per-module table is one run's; hooktrace summary DIR gives "
                                 "the ranks' tables")
            calls = Calls.from_arrow(con.sql(_SPANS_SQL).to_arrow_table())
            steps = _fetch(con, "SELECT step, start_ns, end_ns, dur_ns FROM steps "
                                "WHERE complete ORDER BY step")
            runs = _fetch(con, "SELECT dropped_events, overwritten_events, cut FROM runs")
    finally:
        con.close()
    for column, values in (("dur_ns", calls.dur), ("self_ns", calls.self_ns)):
        if float(values.astype(np.float64).sum()) >= 2.0 ** 63:  # (no silent int64 wrap)
            raise QueryError(f"{name}: column {column} sums past int64 "
                             f"({float(values.max()):.3g} ns in one row); hooktrace writes "
                             "no such times")
    rows = module_rows(calls)  # (the summary's own reduction, issue #37)
    # lost data is said as the summary says it (a spans-only X.parquet has no runs table)
    counts: dict[str, int] = {
        "dropped_events": sum(r["dropped_events"] for r in runs),
        "overwritten_events": sum(r["overwritten_events"] for r in runs)}
    notes = [r["cut"] for r in runs if r["cut"]]
    if not runs:
        notes.append("the export has no runs table: events the recorder dropped are not known")
    # steps that overlap a compile are left out, as the summary does (reading.compile_steps)
    table = {k: np.array([r[k] for r in steps], np.int64)
             for k in ("step", "start_ns", "end_ns", "dur_ns")}
    complete = Steps(table["step"], table["start_ns"], table["end_ns"],
                     np.ones(len(steps), bool))
    c = calls.timing == COMPILE
    kept = ~compile_steps(complete, np.c_[calls.start[c], calls.end[c]])
    counts["steps"] = int(np.count_nonzero(kept))
    counts["compile_steps"] = len(steps) - counts["steps"]
    if kept.any():
        d = table["dur_ns"][kept]
        counts["step_p50_ns"] = int(np.percentile(d, 50))
        counts["step_p99_ns"] = int(np.percentile(d, 99))
    add_per_step_columns(rows, calls, complete.number[kept])
    return Summary(rows, counts, notes + [EXPORT_NOTE])


def _fetch(con: Any, sql: str) -> list[dict[str, Any]]:
    rel = con.sql(sql)
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
