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

A Parquet file is data, never SQL (issue #35). Every file a view reads is checked
against the schema first (:mod:`hooktrace.data.validate`: metadata, folder names,
column names and types, values); the views name the schema's columns, quoted, never
the file's; hooktrace runs its own SQL one statement per call; and, once the views
exist, the connection is locked down (``enable_external_access=false``: no file but
the inputs can be read or written, no extension installed or ATTACH; the configuration
locked) for everything but the SQL of ``query`` itself, which keeps DuckDB's full
powers unless ``read_only``.

Example::

    from hooktrace.data.engine import query
    print(query("traces/", "SELECT rank, sum(dur_ns) FROM spans GROUP BY rank"))
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hooktrace._input import files_under
from hooktrace.analysis.inputs import Input, Kind, resolve
from hooktrace.analysis.rankset import find_rank_files
from hooktrace.analysis.phases import SQL_EVAL, SQL_HOST_PHASES, sql_key_phase, sql_rank_phase
from hooktrace.data import require
from hooktrace.data.schema import (
    AGGREGATES,
    ALL_TABLES,
    LATER_AGGREGATE_COLUMNS,
    PARTITION_COLUMNS,
    TABLES,
    file_schema,
    pa,
)
from hooktrace.data.schema import schema as table_schema
from hooktrace.data.tables import Where, batches
from hooktrace.data.validate import check_rows, check_table, table_of
from hooktrace.errors import HooktraceError, InputPathError
from hooktrace.text import display_path, printable

__all__ = ["Source", "check_source", "connect", "find_source", "named_tables", "query",
           "sql_errors", "tables_of", "view_sql"]

duckdb: Any = require("duckdb")


class QueryError(HooktraceError):
    """A query DuckDB refused, or an input that holds no tables."""


@dataclass
class Source:
    """What a path holds: per table, the Parquet glob DuckDB reads (``parquet``) and
    whether it is hive-partitioned, or the ``.htrace`` files to convert (``htrace``);
    ``files``: per table (and ``aggregates``), every Parquet file, the views read these."""

    path: str
    parquet: dict[str, tuple[str, bool]] = field(default_factory=dict)
    htrace: list[str] = field(default_factory=list)
    aggregates: str | None = None  # the glob of an aggregate= folder's parts
    files: dict[str, list[str]] = field(default_factory=dict)


def _parquet_files(directory: str, *, recursive: bool = True) -> list[str]:
    """The regular ``*.parquet`` files under ``directory``, sorted (a FIFO or a folder
    named ``x.parquet`` is no table file: opening a FIFO would hang; a directory symlink
    is not followed: hooktrace._input.files_under)."""
    return files_under(directory, (".parquet",), recursive=recursive)


def _any_parquet(directory: str) -> str | None:
    found = _parquet_files(directory)
    return found[0] if found else None


def find_source(path: str | os.PathLike[str] | Input) -> Source:
    """What ``path`` holds (see the module docstring): a view of what
    :func:`hooktrace.analysis.inputs.resolve` says it is (give its answer when you have
    it: a path is classified once); :class:`QueryError` for nothing."""
    inp = path if isinstance(path, Input) else resolve(path)
    name = inp.path
    src = Source(name)
    if inp.kind in (Kind.MISSING, Kind.EMPTY):
        raise QueryError(inp.problem)
    if inp.kind in (Kind.TRACE, Kind.TRACES):
        if os.path.exists(name) and not (os.path.isfile(name) or os.path.isdir(name)):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(os.stat(name).st_mode) else \
                "not a regular file"
            raise InputPathError(f"{display_path(name)}: is {kind}; give a Parquet or .htrace "
                                 "file, or a directory of them")
        src.htrace = find_rank_files([inp])[0]
        return src
    if os.path.isfile(name):  # X.parquet: a table, or one part of an aggregate= folder
        if inp.kind is Kind.AGGREGATE:
            src.aggregates = name
            src.files[AGGREGATES] = [name]
        else:
            t = table_of(name)
            src.parquet[t] = (name, False)
            src.files[t] = [name]
        return src
    if inp.kind is Kind.AGGREGATE:
        parts = _parquet_files(os.path.join(name, AGGREGATES), recursive=False)
        if parts:  # a trace(aggregate=DIR) folder (its kept steps, DIR/steps/*.htrace:
            # query those)
            src.aggregates = os.path.join(name, AGGREGATES, "*.parquet")
            src.files[AGGREGATES] = parts
            return src
        from hooktrace._naming import is_aggregate_dir

        if is_aggregate_dir(name):  # no part yet: killed before the first, or still running
            from hooktrace.data.aggregates import no_parts_problem

            raise QueryError(no_parts_problem(name, name))
    for t in TABLES:
        as_file = os.path.join(name, f"{t}.parquet")
        as_dir = os.path.join(name, t)
        if os.path.isfile(as_file):
            src.parquet[t] = (as_file, False)
            src.files[t] = [as_file]
        elif os.path.isdir(as_dir) and _any_parquet(as_dir):
            src.parquet[t] = (os.path.join(as_dir, "**", "*.parquet"), True)
            src.files[t] = _parquet_files(as_dir)
    if not src.parquet:
        first = _any_parquet(name)
        if first is not None and not files_under(name, (".htrace",)):
            t = table_of(first)
            if t == AGGREGATES:  # DIR/aggregates itself, or a folder of its parts
                src.aggregates = os.path.join(name, "**", "*.parquet")
                src.files[t] = _parquet_files(name)
                return src
            src.parquet[t] = (os.path.join(name, "**", "*.parquet"), True)
            src.files[t] = _parquet_files(name)
    if src.parquet:
        return src
    raise QueryError(f"{name}: a directory with no .htrace file in it")


def _sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(name: str) -> str:
    """``name`` as a DuckDB identifier: double-quoted, a ``"`` in it doubled."""
    return '"' + name.replace('"', '""') + '"'


def _duckdb_type(t: Any) -> str:
    if pa.types.is_dictionary(t) or pa.types.is_string(t):
        return "VARCHAR"
    return {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE",
            pa.float32(): "FLOAT", pa.bool_(): "BOOLEAN"}[t]


def view_sql(files: Sequence[str], hive: bool, table: str, have: Collection[str] = ()) -> str:
    """The SELECT of a view of ``table`` over Parquet ``files`` (checked against the
    schema: :mod:`hooktrace.data.validate`): the schema's columns, each cast to the
    schema's type, ``rank`` and ``window`` first (BIGINT, null unless in ``have``: a
    column or a partition of the files)."""
    read = (f"read_parquet([{', '.join(_sql_string(os.path.abspath(f)) for f in files)}], "
            f"hive_partitioning={'true' if hive else 'false'}, union_by_name=true)")
    cols = []
    # aggregate parts an older hooktrace wrote lack the later columns (null where no
    # part has one; union_by_name fills the parts without it)
    later = set()
    if table == AGGREGATES:
        names = {n for f in files for n in _column_names(f)}
        later = {n for n in LATER_AGGREGATE_COLUMNS if n not in names}
    for f in table_schema(table):
        absent = (f.name in PARTITION_COLUMNS and f.name not in have) or f.name in later
        source = "NULL" if absent else _ident(f.name)
        cols.append(f"CAST({source} AS {_duckdb_type(f.type)}) AS {_ident(f.name)}")
    return f"SELECT {', '.join(cols)} FROM {read}"


def _column_names(path: str) -> list[str]:
    import pyarrow.parquet as pq

    return list(pq.read_schema(path).names)


def _execute(con: Any, sql: str) -> None:
    """One statement of hooktrace's own SQL: ``con.execute`` runs every statement of a
    string, so a string of several is refused rather than run (issue #35)."""
    statements = duckdb.extract_statements(sql)
    if len(statements) != 1:
        raise QueryError(f"internal: {len(statements)} statements where one was built")
    con.execute(statements[0])


def _lock(con: Any, files: Sequence[str]) -> None:
    """No file but ``files`` read or written, no extension loaded, no ATTACH, and the
    configuration locked (a statement cannot turn any of it back on)."""
    allowed = ", ".join(_sql_string(os.path.abspath(f)) for f in files)
    _execute(con, f"SET allowed_paths = [{allowed}]")
    _execute(con, "SET enable_external_access = false")
    _execute(con, "SET lock_configuration = true")


def check_source(src: Source, tables: Collection[str], threads: int) -> dict[str, set[str]]:
    """Every Parquet file of ``src`` checked against the schema (its values too, for
    the ``tables`` named); per table, the partition columns its files have."""
    have = {}
    for t, files in src.files.items():
        hive = src.parquet[t][1] if t in src.parquet else False
        base = src.parquet[t][0].partition("**")[0] if hive else None
        have[t] = check_table(t, files, base, threads=threads)
        if t in tables:
            check_rows(t, files, threads=threads)
    return have


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


def connect(path: str | os.PathLike[str] | Input | Source, *, sql: str | None = None,
            threads: int = 1, problems: list[str] | None = None, lock: bool = True) -> Any:
    """A DuckDB connection with ``path``'s tables as views (see the module docstring);
    with ``sql``, only the tables it names are built from ``.htrace`` files (and have
    their Parquet values checked). ``lock``: lock the connection down once the views
    exist (hooktrace's own SQL; ``query`` without ``read_only`` passes False). ``path``
    may be its :func:`find_source` already."""
    src = path if isinstance(path, Source) else find_source(path)
    words = set(re.findall(r"[A-Za-z_]+", sql.lower())) if sql is not None else set(ALL_TABLES)
    have = check_source(src, [t for t in ALL_TABLES if t in words], threads)
    con = duckdb.connect()
    _execute(con, "SET enable_progress_bar = false")  # (the CLI prints the result only)
    read = [f for files in src.files.values() for f in files]
    for t in ALL_TABLES:
        if t in src.files:
            hive = src.parquet[t][1] if t in src.parquet else False
            _execute(con, f"CREATE VIEW {_ident(t)} AS "
                          f"{view_sql(src.files[t], hive, t, have[t])}")
        elif not src.htrace or t == AGGREGATES:  # a table the export left out: empty
            _empty_view(con, t)
    if src.htrace:
        # the tables the query names (all without one)
        arrow = htrace_tables(src.htrace, [t for t in TABLES if t in words] or ["runs"],
                              threads=threads, problems=problems)
        if problems and len(problems) >= len(src.htrace):
            raise QueryError("no trace could be read: " + "; ".join(problems))
        for t in TABLES:
            if t in arrow:
                con.register(f"_arrow_{t}", arrow[t])
                _execute(con, f"CREATE VIEW {_ident(t)} AS SELECT * FROM {_ident('_arrow_' + t)}")
            else:
                _empty_view(con, t)
    if lock:
        _lock(con, read)
    return con


def _empty_view(con: Any, table: str) -> None:
    empty = file_schema(table, partitioned=False).empty_table()
    con.register(f"_empty_{table}", empty)
    _execute(con, f"CREATE VIEW {_ident(table)} AS SELECT * FROM {_ident('_empty_' + table)}")


@contextmanager
def sql_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """DuckDB's errors in hooktrace's own SQL over ``path`` (an overflow of a sum of
    values a file holds) as one :class:`QueryError` line naming it."""
    try:
        yield
    except duckdb.Error as e:
        raise QueryError(f"{display_path(os.fspath(path))}: the tables cannot be reduced: "
                         f"{printable(str(e).splitlines()[0])}") from None


# What `query --read-only` runs: one statement that reads (issue #35).
_READ_ONLY_TYPES = ("SELECT", "EXPLAIN")


def tables_of(src: Source) -> list[str]:
    """The tables a source holds, by what its files are (``hooktrace.table`` metadata,
    the folder they are in): every table for ``.htrace`` files, ``aggregates`` alone for
    an ``aggregate=`` folder or part."""
    if src.htrace:
        return list(TABLES)
    return [t for t in ALL_TABLES if t in src.files]


# a table named after FROM or JOIN (one or a comma-separated list: `FROM a, b AS x`)
_FROM = re.compile(r'\b(?:from|join)\s+((?:"?\w+"?(?:\s+(?:as\s+)?\w+)?\s*,\s*)*"?\w+"?)',
                   re.IGNORECASE)


def named_tables(sql: str) -> list[str]:
    """hooktrace's tables that ``sql`` reads (after FROM or JOIN, any case), in order.

    Example:
        >>> named_tables('SELECT 1 FROM spans s, "Steps" AS t, x JOIN runs USING (rank)')
        ['spans', 'steps', 'runs']
    """
    out: list[str] = []
    for m in _FROM.finditer(sql):
        for item in m.group(1).split(","):
            word = item.split()[0].strip('"').lower()
            if word in ALL_TABLES and word not in out:
                out.append(word)
    return out


def _read_only_sql(sql: str) -> str:
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"the query failed: {str(e).splitlines()[0]}") from None
    kinds = [s.type.name for s in statements]
    if len(statements) != 1 or kinds[0] not in _READ_ONLY_TYPES:
        raise QueryError(f"read-only: one SELECT statement is run, not "
                         f"{', '.join(kinds) or 'an empty query'}")
    return str(statements[0].query)


def query(path: str | os.PathLike[str], sql: str, *, threads: int = 1,
          problems: list[str] | None = None, read_only: bool = False) -> Any:
    """The result of ``sql`` over ``path``'s tables, as a ``pyarrow.Table``. With
    ``problems``, an unreadable ``.htrace`` file among several is a line there and the
    others are queried; without, it raises :class:`QueryError`.

    ``sql`` has DuckDB's full powers (``COPY ... TO`` a file, ``read_text``, ``ATTACH``,
    ``INSTALL``): it is the caller's. ``read_only``: for SQL from someone else, one
    SELECT statement on a connection locked down before it runs (no file but the
    inputs read, none written, no extension, no configuration change)."""
    if read_only:
        sql = _read_only_sql(sql)
    src = find_source(path)
    have = tables_of(src)
    lacking = [t for t in named_tables(sql) if t not in have]
    if lacking:
        raise QueryError(f"{display_path(os.fspath(path))}: no {lacking[0]} table there; it "
                         f"holds {', '.join(have) or 'no table'}")
    con = connect(src, sql=sql, threads=threads, problems=problems, lock=read_only)
    try:
        return con.sql(sql).to_arrow_table()
    except duckdb.Error as e:
        raise QueryError(f"the query failed: {str(e).splitlines()[0]}") from None


# -- the straggler tables' inputs (hooktrace.analysis.stragglers over a Parquet export) ------

# Per (file, module, mode, phase, step): what hooktrace.analysis.stragglers.rank_stats reduces a
# rank to. Measured forward and backward spans in a step; recompute and kernel-derived
# rows are not a rank's own time per step there. Device time (the gpu table, when
# recorded): every interval in a step, recompute counted as forward ("gpu fwd"/"gpu bwd"),
# and per file the steps it timed. A row's phase: hooktrace.analysis.phases.RANK_PHASES.
# Plain SQL that DuckDB and Spark both read (hooktrace.data.spark runs the same): `window`
# in backticks (a keyword in DuckDB).
STRAGGLER_SQL = {
    # (the spans table's rows grouped as hooktrace.analysis._rank_reduce groups the per-call
    # table: measured and kernel-derived calls, not compiles or recomputes;
    # grouped by integer keys: the module's slot, the phase's number, a boolean mode;
    # grouping by the names costs ~1.5x as much, measured on 55 M rows)
    "agg": f"""
        SELECT rank, `window`, slot, {SQL_EVAL} AS eval, {sql_rank_phase(False)} AS phase,
               step, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(count(*) AS BIGINT) AS calls, max(end_ns) AS last_end_ns,
               CAST(sum(self_ns) AS BIGINT) AS self_total_ns
        FROM spans
        WHERE timing <> 'compile' AND {SQL_HOST_PHASES} AND step IS NOT NULL
        GROUP BY rank, `window`, slot, {SQL_EVAL}, {sql_rank_phase(False)}, step
        UNION ALL
        SELECT rank, `window`, slot, {SQL_EVAL} AS eval, {sql_rank_phase(True)} AS phase,
               step, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(count(*) AS BIGINT) AS calls, max(end_ns) AS last_end_ns,
               CAST(sum(self_ns) AS BIGINT) AS self_total_ns
        FROM gpu
        WHERE step IS NOT NULL
        GROUP BY rank, `window`, slot, {SQL_EVAL}, {sql_rank_phase(True)}, step
        ORDER BY rank, `window`, slot, eval, phase, step""",
    # the top-level spans, in start order: the gaps between them are the time outside
    # every module (hooktrace.analysis.stragglers: where a rank that was slow outside modules was)
    "tops": f"""
        SELECT rank, `window`, step, slot, {SQL_EVAL} AS eval, {sql_rank_phase(False)} AS phase,
               start_ns, end_ns
        FROM spans
        WHERE timing = 'measured' AND {SQL_HOST_PHASES} AND step IS NOT NULL
              AND parent IS NULL
        ORDER BY rank, `window`, start_ns, span""",
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


# -- the diff's per-run numbers (hooktrace.analysis.diff over a Parquet export) ----------------

# One run's (one file's) numbers per (module, phase) as hooktrace.analysis.diff reduces it: the
# phases "forward", "backward" (training calls) and "eval" (forward calls with grad off
# or in eval mode), kernel-derived rows included; the device time's "gpu forward"
# (recompute included), "gpu backward" and "gpu eval". A span's column: its complete
# step's index among the complete steps (-1 outside them; 0 for every span when the run
# has none); a device interval's: among the complete steps that hold device time.
# Percentiles: quantile_cont, numpy's "linear" (tests compare the two engines exactly).
# (every reduction per file: r, w = rank and window, -1 for null, so that one query
# reduces a whole dataset)
_DIFF_COLUMNS = """
    cols AS (SELECT coalesce(rank, -1) AS r, coalesce("window", -1) AS w, step,
                    CAST(row_number() OVER (PARTITION BY coalesce(rank, -1),
                                            coalesce("window", -1) ORDER BY start_ns, step)
                         - 1 AS BIGINT) AS col
             FROM steps WHERE complete),
    n AS (SELECT coalesce(rank, -1) AS r, coalesce("window", -1) AS w,
                 count_if(complete) AS n_steps FROM steps GROUP BY ALL)"""
_DIFF_TIMED = """
    timed AS (SELECT r, w, step,
                     CAST(row_number() OVER (PARTITION BY r, w ORDER BY col) - 1 AS BIGINT)
                        AS col
              FROM cols SEMI JOIN (SELECT DISTINCT coalesce(rank, -1) AS r,
                                                   coalesce("window", -1) AS w, step
                                   FROM gpu WHERE step IS NOT NULL) USING (r, w, step))"""
_DIFF_KEYED = {
    "host": f"""
        WITH {_DIFF_COLUMNS}
        SELECT r, w, slot, CAST(module AS STRING) AS module, CAST(type AS STRING) AS type,
               dur_ns, self_ns, timing = 'kernels' AS derived,
               timing = 'measured' AND parent IS NULL AS root,
               CASE WHEN coalesce(n.n_steps, 0) = 0 THEN 0 ELSE coalesce(cols.col, -1) END
                  AS col,
               {sql_key_phase(False)} AS key_phase
        FROM (SELECT *, coalesce(rank, -1) AS r, coalesce("window", -1) AS w FROM spans)
             LEFT JOIN cols USING (r, w, step) LEFT JOIN n USING (r, w)""",
    "gpu": f"""
        WITH {_DIFF_COLUMNS}, {_DIFF_TIMED}
        SELECT r, w, slot, CAST(module AS STRING) AS module, CAST(type AS STRING) AS type,
               dur_ns, self_ns, timing = 'kernels' AS derived, false AS root,
               CASE WHEN coalesce(n.n_steps, 0) = 0 THEN 0 ELSE coalesce(timed.col, -1) END
                  AS col,
               {sql_key_phase(True)} AS key_phase
        FROM (SELECT *, coalesce(rank, -1) AS r, coalesce("window", -1) AS w FROM gpu)
             LEFT JOIN timed USING (r, w, step) LEFT JOIN n USING (r, w)""",
}
_DIFF_SELECTS = {
    "keys": """
        SELECT r, w, key_phase, slot, any_value(module) AS module, any_value(type) AS type,
               CAST(count(*) AS BIGINT) AS calls, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(sum(self_ns) AS BIGINT) AS self_ns,
               quantile_cont(dur_ns, [0.25, 0.5, 0.75]) AS q,
               quantile_cont(self_ns, 0.5) AS p50_self,
               CAST(count_if(derived) AS BIGINT) AS derived
        FROM keyed WHERE key_phase IS NOT NULL GROUP BY r, w, key_phase, slot
        ORDER BY r, w, key_phase, slot""",
    "cells": """
        SELECT r, w, key_phase, slot, col, CAST(sum(dur_ns) AS BIGINT) AS total_ns,
               CAST(sum(self_ns) AS BIGINT) AS self_ns, CAST(count(*) AS BIGINT) AS calls
        FROM keyed WHERE key_phase IS NOT NULL AND col >= 0 GROUP BY r, w, key_phase, slot, col
        ORDER BY r, w, key_phase, slot, col""",
    "roots": """
        SELECT r, w,
               CAST(coalesce(sum(dur_ns) FILTER (WHERE root AND col >= 0), 0) AS BIGINT)
                  AS in_steps,
               CAST(coalesce(sum(dur_ns) FILTER (WHERE root), 0) AS BIGINT) AS run
        FROM keyed WHERE key_phase IS NOT NULL GROUP BY r, w ORDER BY r, w""",
    "calls": """
        SELECT r, w, key_phase, slot, dur_ns, self_ns FROM keyed SEMI JOIN calls_of USING (r, w)
        WHERE key_phase IS NOT NULL
        ORDER BY r, w, key_phase, slot""",
}
DIFF_STEPS_SQL = """SELECT coalesce(rank, -1) AS r, coalesce("window", -1) AS w, dur_ns
                    FROM steps WHERE complete ORDER BY r, w, start_ns, step"""
DIFF_TIMED_SQL = f"""WITH {_DIFF_COLUMNS}, {_DIFF_TIMED}
                     SELECT r, w, count(*) AS n FROM timed GROUP BY r, w ORDER BY r, w"""


def diff_tables(con: Any, *, gpu: bool, calls: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The numbers of :mod:`hooktrace.analysis.diff` for every file (rank, window: ``r``, ``w``
    columns, -1 for null) of the tables ``con`` holds: ``host_*`` and (with ``gpu``)
    ``gpu_*`` Arrow tables per :data:`_DIFF_SELECTS` key, sorted by file (``calls``:
    every call of the files (r, w) listed), ``gpu_timed`` and ``steps``."""
    out = {"steps": con.sql(DIFF_STEPS_SQL).to_arrow_table()}
    con.register("calls_of", pa.table({"r": pa.array([r for r, _ in calls], pa.int64()),
                                       "w": pa.array([w for _, w in calls], pa.int64())}))
    for side in ("host", "gpu") if gpu else ("host",):
        keyed = f"({_DIFF_KEYED[side]}) AS keyed"
        for k, select in _DIFF_SELECTS.items():
            if k != "calls" or calls:
                out[f"{side}_{k}"] = con.sql(select.replace("FROM keyed", f"FROM {keyed}")
                                             ).to_arrow_table()
    if gpu:  # the device time's columns: the complete steps that hold some
        out["gpu_timed"] = con.sql(DIFF_TIMED_SQL).to_arrow_table()
    return out


def split_files(tables: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    """:func:`diff_tables`' results per file (r, w): each table's rows of that file."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for name, t in tables.items():
        if not t.num_rows:
            continue
        r = t.column("r").to_numpy()
        w = t.column("w").to_numpy()
        change = np.flatnonzero((r[1:] != r[:-1]) | (w[1:] != w[:-1])) + 1
        bounds = np.r_[0, change, t.num_rows]
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            out.setdefault((int(r[a]), int(w[a])), {})[name] = t.slice(a, b - a)
    return out


def dataset_diff_tables(path: str | os.PathLike[str] | Source, keep_calls: Any
                        ) -> list[tuple[dict[str, Any], bool, dict[str, Any]]]:
    """:func:`diff_tables` of every file (``runs`` row) of a Parquet dataset that
    ``hooktrace export DIR -o OUT/`` wrote, in one pass over the dataset: per file its
    runs row (``info`` parsed), whether it recorded device time, and its results.
    ``keep_calls(info)``: whether to fetch that file's every call."""
    import json

    con = connect(path)
    try:
        with sql_errors(path.path if isinstance(path, Source) else path):
            runs = con.sql(STRAGGLER_SQL["runs"]).to_arrow_table().to_pylist()
            timed = set(con.sql('SELECT DISTINCT coalesce(rank, -1), coalesce("window", -1) '
                                'FROM gpu').fetchall())
            for row in runs:
                row["info"] = json.loads(row["info"])
                row["_key"] = (-1 if row["rank"] is None else row["rank"],
                               -1 if row["window"] is None else row["window"])
            calls = [row["_key"] for row in runs if keep_calls(row["info"])]
            per_file = split_files(diff_tables(con, gpu=bool(timed), calls=calls))
    finally:
        con.close()
    out = []
    for row in runs:
        gpu = isinstance(row["info"].get("gpu"), dict) or row["_key"] in timed
        out.append((row, gpu, per_file.get(row.pop("_key"), {})))
    return out
