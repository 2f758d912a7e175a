"""DuckDB, the embedded engine (issue #29): a run's tables as SQL views.

:func:`connect` opens an in-memory DuckDB database whose views ``spans``, ``steps``,
``modules``, ``memory``, ``numerics``, ``runs`` and ``gpu`` (:mod:`hooktrace.data.schema`) read

* a Parquet dataset or file written by ``hooktrace export`` (``DIR/<table>/rank=N/...``,
  ``DIR/<table>.parquet``, ``X.parquet/rank=N/...`` or one ``X.parquet`` file): DuckDB
  reads it from disk, out of core, on every core;
* an aggregate folder (``trace(aggregate=DIR)``): the view ``aggregates`` over
  ``DIR/aggregates/*.parquet`` (the other views are empty; query ``DIR/steps`` for the
  steps kept whole);
* ``.htrace`` files (one run, or a directory of ranks or windows): each run is converted
  to Arrow record batches (one thread per ``threads``) and registered; only the tables the
  query names are built. (For runs larger than memory, export to Parquet first.)

Every view has ``rank`` and ``window`` as its first columns (BIGINT, null where the run
has none), whatever the source.

Example::

    from hooktrace.data.engine import query
    print(query("traces/", "SELECT rank, sum(dur_ns) FROM spans GROUP BY rank"))
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hooktrace.data import require
from hooktrace.data.schema import AGGREGATES, TABLES, file_schema, pa
from hooktrace.data.tables import Where, batches, span_columns
from hooktrace.errors import HooktraceError

__all__ = ["Source", "connect", "find_source", "query", "view_sql"]

duckdb: Any = require("duckdb")


class QueryError(HooktraceError):
    """A query DuckDB refused, or an input that holds no tables."""


@dataclass
class Source:
    """What a path holds: per table, the Parquet glob DuckDB reads (``parquet``) and
    whether it is hive-partitioned, or the ``.htrace`` files to convert (``htrace``)."""

    path: str
    parquet: dict[str, tuple[str, bool]] = field(default_factory=dict)
    htrace: list[str] = field(default_factory=list)
    aggregates: str | None = None  # the glob of an aggregate= folder's parts


def _aggregate_glob(directory: str) -> str | None:
    """``DIR/aggregates/*.parquet`` when ``directory`` is a ``trace(aggregate=DIR)``
    folder (hooktrace.record.aggregate), else None."""
    folder = os.path.join(directory, AGGREGATES)
    if os.path.isdir(folder) and glob.glob(os.path.join(glob.escape(folder), "*.parquet")):
        return os.path.join(folder, "*.parquet")
    return None


def _table_of(parquet_file: str) -> str:
    pq = require("pyarrow.parquet")
    meta = pq.read_schema(parquet_file).metadata or {}
    name = meta.get(b"hooktrace.table", b"spans").decode()
    return name if name in TABLES else "spans"


def _any_parquet(directory: str) -> str | None:
    found = glob.glob(os.path.join(glob.escape(directory), "**", "*.parquet"), recursive=True)
    return min(found) if found else None


def find_source(path: str | os.PathLike[str]) -> Source:
    """What ``path`` holds (see the module docstring); :class:`QueryError` for nothing."""
    from hooktrace._naming import rank_files_of
    from hooktrace.rankset import find_rank_files

    name = os.fspath(path)
    src = Source(name)
    if os.path.isfile(name) and name.endswith(".parquet"):
        src.parquet[_table_of(name)] = (name, False)
        return src
    if os.path.isdir(name):
        src.aggregates = _aggregate_glob(name)
        if src.aggregates is not None:  # (its kept steps, DIR/steps/*.htrace: query those)
            return src
        for t in TABLES:
            as_file = os.path.join(name, f"{t}.parquet")
            as_dir = os.path.join(name, t)
            if os.path.isfile(as_file):
                src.parquet[t] = (as_file, False)
            elif os.path.isdir(as_dir) and _any_parquet(as_dir):
                src.parquet[t] = (os.path.join(as_dir, "**", "*.parquet"), True)
        if not src.parquet:
            first = _any_parquet(name)
            if first is not None and not glob.glob(os.path.join(glob.escape(name), "**",
                                                                "*.htrace"), recursive=True):
                src.parquet[_table_of(first)] = (os.path.join(name, "**", "*.parquet"), True)
        if src.parquet:
            return src
    if os.path.isfile(name) or os.path.isdir(name) or rank_files_of(name):
        files, problems = find_rank_files([name])
        if files:
            src.htrace = files
            return src
        raise QueryError("; ".join(problems) or f"{name}: no .htrace or .parquet file in it")
    raise QueryError(f"{name}: no such file or directory")


def _sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def view_sql(glob_: str, hive: bool, columns: Sequence[str]) -> str:
    """The SELECT of a view over Parquet: ``rank`` and ``window`` first (BIGINT, null when
    the files have neither column nor partition), then the table's columns."""
    read = f"read_parquet({_sql_string(glob_)}, hive_partitioning={'true' if hive else 'false'}"
    read += ")"
    cols = set(columns)
    part = [f'CAST("{c}" AS BIGINT) AS "{c}"' if c in cols else f'CAST(NULL AS BIGINT) AS "{c}"'
            for c in ("rank", "window")]
    rest = [f'"{c}"' for c in columns if c not in ("rank", "window")]
    return f"SELECT {', '.join(part + rest)} FROM {read}"


def _parquet_columns(con: Any, glob_: str, hive: bool) -> list[str]:
    # (the files of a table share its schema: DuckDB takes the first file's; reading
    # every file's, union_by_name, costs a footer read per file and table)
    rel = con.sql(f"SELECT * FROM read_parquet({_sql_string(glob_)}, hive_partitioning="
                  f"{'true' if hive else 'false'}) LIMIT 0")
    return list(rel.columns)


def _named_tables(sql: str | None) -> list[str]:
    """The tables a query names (all when unknown)."""
    if sql is None:
        return list(TABLES)
    words = set(re.findall(r"[A-Za-z_]+", sql.lower()))
    return [t for t in TABLES if t in words] or ["runs"]


def htrace_tables(files: Sequence[str], tables: Sequence[str], *, threads: int = 1,
                  problems: list[str] | None = None) -> dict[str, Any]:
    """``tables`` of the runs in ``files`` as one Arrow table each (rank and window
    columns filled: the metadata's rank, else the file's index; windows numbered in
    step order per rank)."""
    from hooktrace.data.parquet import process_key, process_ranks, rank_where
    from hooktrace.reading import load

    Result = tuple[int | None, str, int | None, dict[str, list[Any]]]

    def convert(i: int, path: str) -> Result | str:
        try:
            run = load(path)
        except (HooktraceError, OSError) as e:
            text = str(e)
            return text if text.startswith(path) else f"{path}: {text}"
        rank, first = rank_where(run.info, i, path)
        where = Where(rank=None, window=None, path=path)  # (both set below)
        return rank, process_key(run.info), first, {t: list(batches(run, t, where))
                                                    for t in tables}

    with ThreadPoolExecutor(max(threads, 1)) as pool:
        results = list(pool.map(lambda a: convert(*a), enumerate(files)))
    done: list[Result] = []
    for r in results:
        if isinstance(r, str):
            if problems is None:
                raise QueryError(r)
            problems.append(r)
        else:
            done.append(r)
    ranks = process_ranks([(r[0], r[1]) for r in done])
    firsts: dict[int, list[int]] = {}
    for rank, r in zip(ranks, done):
        if r[2] is not None:
            firsts.setdefault(rank, []).append(r[2])
    out: dict[str, list[Any]] = {t: [] for t in tables}
    for rank, (_, _, first, per_table) in zip(ranks, done):
        # the window's index in its rank's step order
        k = None if first is None else sorted(firsts[rank]).index(first)
        for t, bs in per_table.items():
            out[t] += [_with_partition(b, rank, k) for b in bs]
    return {t: pa.Table.from_batches(bs, schema=file_schema(t, partitioned=False))
            for t, bs in out.items()}


def _with_partition(batch: Any, rank: int, window: int | None) -> Any:
    n = batch.num_rows
    batch = batch.set_column(0, "rank", pa.array(np.full(n, rank, np.int64)))
    return batch.set_column(1, "window", pa.nulls(n, pa.int64()) if window is None
                            else pa.array(np.full(n, window, np.int64)))


def connect(path: str | os.PathLike[str], *, sql: str | None = None, threads: int = 1,
            problems: list[str] | None = None) -> Any:
    """A DuckDB connection with ``path``'s tables as views (see the module docstring);
    with ``sql``, only the tables it names are built from ``.htrace`` files."""
    src = find_source(path)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # (the CLI prints the result only)
    if src.aggregates is not None:
        g = src.aggregates
        con.execute(f'CREATE VIEW "{AGGREGATES}" AS '
                    f'{view_sql(g, False, _parquet_columns(con, g, False))}')
    else:
        _empty_view(con, AGGREGATES)
    if src.aggregates is not None:
        for t in TABLES:
            _empty_view(con, t)
        return con
    if src.parquet:
        for t, (g, hive) in src.parquet.items():
            con.execute(f'CREATE VIEW "{t}" AS {view_sql(g, hive, _parquet_columns(con, g, hive))}')
        for t in TABLES:  # a table the export left out: an empty view of the right columns
            if t not in src.parquet:
                _empty_view(con, t)
        return con
    arrow = htrace_tables(src.htrace, _named_tables(sql), threads=threads, problems=problems)
    if problems and len(problems) >= len(src.htrace):
        raise QueryError("no trace could be read: " + "; ".join(problems))
    for t in TABLES:
        if t in arrow:
            con.register(f"_arrow_{t}", arrow[t])
            con.execute(f'CREATE VIEW "{t}" AS SELECT * FROM "_arrow_{t}"')
        else:
            _empty_view(con, t)
    return con


def _empty_view(con: Any, table: str) -> None:
    empty = file_schema(table, partitioned=False).empty_table()
    con.register(f"_empty_{table}", empty)
    con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_empty_{table}"')


def query(path: str | os.PathLike[str], sql: str, *, threads: int = 1,
          problems: list[str] | None = None) -> Any:
    """The result of ``sql`` over ``path``'s tables, as a ``pyarrow.Table``. With
    ``problems``, an unreadable ``.htrace`` file among several is a line there and the
    others are queried; without, it raises :class:`QueryError`."""
    con = connect(path, sql=sql, threads=threads, problems=problems)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as e:
        raise QueryError(f"the query failed: {str(e).splitlines()[0]}") from None


# -- the straggler tables' inputs (hooktrace.stragglers, engine "duckdb") -------------

# Per (file, module, mode, phase, step): what hooktrace.stragglers.rank_stats reduces a
# rank to. Measured forward and backward spans in a step; recompute and kernel-derived
# rows are not a rank's own time per step there. Device time (the gpu table, when
# recorded): every interval in a step, recompute counted as forward ("gpu fwd"/"gpu bwd",
# the pool path's phases 2 and 3), and per file the steps it timed. Plain SQL that DuckDB
# and Spark both read (hooktrace.data.spark runs the same): `window` in backticks (a
# keyword in DuckDB).
STRAGGLER_SQL = {
    # (grouped by integer keys: the module's slot, booleans for the phase and mode;
    # grouping by the names costs ~1.5x as much, measured on 55 M rows)
    "agg": """
        SELECT rank, `window`, slot, mode = 'eval' AS eval, phase = 'backward' AS backward,
               false AS on_device, step, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(count(*) AS BIGINT) AS calls, max(end_ns) AS last_end_ns
        FROM spans
        WHERE timing = 'measured' AND phase <> 'recompute' AND step IS NOT NULL
        GROUP BY rank, `window`, slot, mode = 'eval', phase = 'backward', step
        UNION ALL
        SELECT rank, `window`, slot, mode = 'eval' AS eval, phase = 'backward' AS backward,
               true AS on_device, step, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(count(*) AS BIGINT) AS calls, max(end_ns) AS last_end_ns
        FROM gpu
        WHERE step IS NOT NULL
        GROUP BY rank, `window`, slot, mode = 'eval', phase = 'backward', step
        ORDER BY rank, `window`, slot, eval, on_device, backward, step""",
    "timed": """SELECT rank, `window`, CAST(count(DISTINCT step) AS BIGINT) AS timed_steps
                FROM gpu WHERE step IS NOT NULL GROUP BY rank, `window`
                ORDER BY rank, `window`""",
    "steps": """SELECT rank, `window`, step, start_ns, end_ns, outside_ns FROM steps
                ORDER BY rank, `window`, start_ns, step""",
    "modules": """SELECT rank, `window`, slot, CAST(module AS STRING) AS module,
                         CAST(type AS STRING) AS type
                  FROM modules ORDER BY rank, `window`, slot""",
    "runs": """SELECT rank, `window`, path, hostname, pid, world_size, backend, clock_offset_ns,
                      clock_offset_uncertainty_ns, clock_aligned, start_ns, stop_ns, events,
                      cut, info
               FROM runs ORDER BY rank, `window`, path""",
}

# Per rank and module: the totals of hooktrace summary per (module, mode, phase), on
# each rank: the query the tests run on both engines.
MODULE_TOTALS_SQL = """
    SELECT rank, CAST(module AS STRING) AS module, CAST(mode AS STRING) AS mode,
           CAST(phase AS STRING) AS phase, CAST(count(*) AS BIGINT) AS calls,
           CAST(sum(dur_ns) AS BIGINT) AS total_ns, CAST(sum(self_ns) AS BIGINT) AS self_ns
    FROM spans
    GROUP BY rank, module, mode, phase
    ORDER BY rank, module, mode, phase"""


def straggler_tables(con: Any) -> dict[str, Any]:
    """:data:`STRAGGLER_SQL`'s results over a connection's views (Arrow tables)."""
    return {k: con.sql(sql).to_arrow_table() for k, sql in STRAGGLER_SQL.items()}


def file_straggler_tables(path: str, index: int) -> dict[str, Any]:
    """:func:`straggler_tables` of one ``.htrace`` file (its own DuckDB connection: one
    per thread); ``window`` is the window's first step. Raises what loading raises."""
    from hooktrace.data.parquet import rank_where
    from hooktrace.reading import load

    run = load(path)
    rank, first = rank_where(run.info, index, path)
    # (a file without a rank: its index, a key of its own; RankFile keeps the metadata's)
    where = Where(rank=index if rank is None else rank, window=first, path=path)
    con = duckdb.connect(config={"threads": 1})  # (one rank per thread: threads enough)
    try:
        con.register("spans", span_columns(run, where))
        for t in ("steps", "modules", "runs", "gpu"):
            con.register(t, pa.Table.from_batches(list(batches(run, t, where)),
                                                  schema=file_schema(t, partitioned=False)))
        del run
        return straggler_tables(con)
    finally:
        con.close()


# -- the diff's per-run numbers (hooktrace.diff, engine "duckdb") ----------------------

# One run's (one file's) numbers per (module, phase) as hooktrace.diff reduces it: the
# phases "forward", "backward" (training calls) and "eval" (forward calls with grad off
# or in eval mode), kernel-derived rows included; the device time's "gpu forward"
# (recompute included), "gpu backward" and "gpu eval". A span's column: its complete
# step's index among the complete steps (-1 outside them; 0 for every span when the run
# has none); a device interval's: among the complete steps that hold device time.
# Percentiles: quantile_cont, numpy's "linear" (tests compare the two engines exactly).
_DIFF_COLUMNS = """
    cols AS (SELECT step, CAST(row_number() OVER (ORDER BY start_ns, step) - 1 AS BIGINT)
                    AS col FROM steps WHERE complete),
    n AS (SELECT count(*) AS n_steps FROM cols)"""
_DIFF_HOST = """
    s AS (SELECT slot, CAST(module AS STRING) AS module, CAST(type AS STRING) AS type,
                 dur_ns, self_ns, timing = 'kernels' AS derived,
                 timing = 'measured' AND parent IS NULL AS root,
                 CASE WHEN (SELECT n_steps FROM n) = 0 THEN 0 ELSE coalesce(cols.col, -1) END
                    AS col,
                 CASE WHEN phase = 'forward' AND mode = 'train' THEN 0
                      WHEN phase = 'backward' AND mode = 'train' THEN 1
                      WHEN phase = 'forward' AND mode = 'eval' THEN 2 END AS key_phase
          FROM spans LEFT JOIN cols USING (step))"""
_DIFF_GPU = """
    timed AS (SELECT step, CAST(row_number() OVER (ORDER BY col) - 1 AS BIGINT) AS col
              FROM cols WHERE step IN (SELECT step FROM gpu WHERE step IS NOT NULL)),
    s AS (SELECT slot, CAST(module AS STRING) AS module, CAST(type AS STRING) AS type,
                 dur_ns, self_ns, timing = 'kernels' AS derived, false AS root,
                 CASE WHEN (SELECT n_steps FROM n) = 0 THEN 0 ELSE coalesce(timed.col, -1) END
                    AS col,
                 CASE WHEN phase <> 'backward' AND mode = 'train' THEN 3
                      WHEN phase = 'backward' AND mode = 'train' THEN 4
                      WHEN phase <> 'backward' AND mode = 'eval' THEN 5 END AS key_phase
          FROM gpu LEFT JOIN timed USING (step))"""
_DIFF_SELECTS = {
    "keys": """
        SELECT key_phase, slot, any_value(module) AS module, any_value(type) AS type,
               CAST(count(*) AS BIGINT) AS calls, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(sum(self_ns) AS BIGINT) AS self_ns,
               quantile_cont(dur_ns, [0.25, 0.5, 0.75]) AS q,
               quantile_cont(self_ns, 0.5) AS p50_self,
               CAST(count_if(derived) AS BIGINT) AS derived
        FROM s WHERE key_phase IS NOT NULL GROUP BY key_phase, slot
        ORDER BY key_phase, slot""",
    "cells": """
        SELECT key_phase, slot, col, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(sum(self_ns) AS BIGINT) AS self_ns, CAST(count(*) AS BIGINT) AS calls
        FROM s WHERE key_phase IS NOT NULL AND col >= 0 GROUP BY key_phase, slot, col
        ORDER BY key_phase, slot, col""",
    "roots": """
        SELECT CAST(coalesce(sum(dur_ns) FILTER (WHERE col >= 0), 0) AS BIGINT) AS in_steps,
               CAST(coalesce(sum(dur_ns), 0) AS BIGINT) AS run
        FROM s WHERE key_phase IS NOT NULL AND root""",
    "calls": """
        SELECT key_phase, slot, dur_ns, self_ns FROM s WHERE key_phase IS NOT NULL
        ORDER BY key_phase, slot""",
}
DIFF_STEPS_SQL = """SELECT dur_ns FROM steps WHERE complete ORDER BY start_ns, step"""


def diff_tables(con: Any, *, gpu: bool, calls: bool) -> dict[str, Any]:
    """The numbers of :mod:`hooktrace.diff` for the run whose tables ``con`` holds (one
    file): ``host_*`` and (with ``gpu``) ``gpu_*`` Arrow tables per :data:`_DIFF_SELECTS`
    key (``calls``: every call, only when asked), and ``steps``."""
    out = {"steps": con.sql(DIFF_STEPS_SQL).to_arrow_table()}
    for side, with_ in (("host", _DIFF_HOST), ("gpu", _DIFF_GPU)):
        if side == "gpu" and not gpu:
            continue
        for k, select in _DIFF_SELECTS.items():
            if k == "calls" and not calls:
                continue
            sql = f"WITH {_DIFF_COLUMNS}, {with_} {select}"
            out[f"{side}_{k}"] = con.sql(sql).to_arrow_table()
    if gpu:  # the device time's columns: the complete steps that hold some
        out["gpu_timed"] = con.sql(f"WITH {_DIFF_COLUMNS}, {_DIFF_GPU} "
                                   "SELECT count(*) AS n FROM timed").to_arrow_table()
    return out


def run_connection(run: Any, tables: Sequence[str]) -> Any:
    """A one-thread DuckDB connection with ``tables`` of one loaded run registered."""
    from hooktrace.data.tables import to_arrow

    con = duckdb.connect(config={"threads": 1})
    for t in tables:
        con.register(t, to_arrow(run, t))
    return con


def dataset_diff_tables(path: str | os.PathLike[str], keep_calls: Any
                        ) -> list[tuple[dict[str, Any], bool, dict[str, Any]]]:
    """:func:`diff_tables` of every file (``runs`` row) of a Parquet dataset that
    ``hooktrace export DIR -o OUT/`` wrote: per file its runs row (``info`` parsed),
    whether it recorded device time, and the results. ``keep_calls(info)``: whether to
    fetch that file's every call. DuckDB reads each file's partition (the ``rank`` and
    ``window`` filters prune the others) on every core."""
    import json

    con = connect(path)
    try:
        runs = con.sql('SELECT rank, "window", path, hostname, pid, world_size, start_ns, '
                       'stop_ns, cut, info FROM runs ORDER BY rank, "window", path'
                       ).to_arrow_table().to_pylist()
        timed = set(con.sql('SELECT DISTINCT rank, "window" FROM gpu').fetchall())
        con.execute("CREATE SCHEMA f")
        con.execute("SET schema = 'f'")  # (the views below, one file's rows, come first)
        out = []
        for row in runs:
            rank, window = row["rank"], row["window"]
            cond = " AND ".join(f'"{c}" IS NOT DISTINCT FROM '
                                f'{"NULL" if v is None else int(v)}'
                                for c, v in (("rank", rank), ("window", window)))
            for t in ("spans", "steps", "gpu"):
                con.execute(f'CREATE OR REPLACE VIEW f."{t}" AS '
                            f'SELECT * FROM main."{t}" WHERE {cond}')
            row["info"] = info = json.loads(row["info"])
            gpu = isinstance(info.get("gpu"), dict) or (rank, window) in timed
            out.append((row, gpu, diff_tables(con, gpu=gpu, calls=bool(keep_calls(info)))))
        return out
    finally:
        con.close()
