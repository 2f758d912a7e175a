"""``hooktrace query RUN_OR_DIR "SELECT ..."``: SQL over a run's tables (issue #29).

The tables (``spans``, ``steps``, ``modules``, ``memory``, ``numerics``, ``runs``,
``gpu``; docs/schema.md) are views of DuckDB (:mod:`hooktrace.data.engine`) over a ``.htrace``
file, a directory of rank files or windows (converted in memory, only the tables the
query names), or the Parquet that ``hooktrace export`` wrote (read from disk, out of
core); the ``aggregates`` view reads a ``trace(aggregate=DIR)`` folder's
``DIR/aggregates/*.parquet``. The result prints as a table, or ``--csv`` / ``--json`` (one JSON array of
objects), or is written with ``-o OUT.parquet`` (or ``.csv``, ``.json``).

``--engine spark --master URL`` runs the same SQL on Spark over a Parquet export
(:mod:`hooktrace.data.spark`). Needs ``pip install hooktrace[data]`` (``[spark]``).

The SQL has DuckDB's full powers, as the user's own: ``COPY ... TO`` any file,
``read_text``, ``ATTACH``, ``INSTALL``. ``--read-only`` is for SQL from someone else
(a service wrapping ``query``): one SELECT statement, on a connection locked down
before it runs (issue #35). The input files' names and values are never SQL either way.

Example::

    hooktrace query traces/ "SELECT rank, module, sum(dur_ns) AS ns FROM spans
                             WHERE phase = 'backward' GROUP BY ALL ORDER BY ns DESC LIMIT 5"
"""

from __future__ import annotations

import argparse
import os
import sys
from decimal import Decimal
from typing import Any

from hooktrace.commands import CliError, at_least
from hooktrace.text import printable, text_lines

NAME = "query"
HELP = "SQL over a run's tables (spans, steps, modules, ...) with DuckDB or Spark"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN_OR_DIR",
                   help="a .htrace file, a directory of ranks' files, a Parquet export, or "
                        "an aggregate= folder")
    p.add_argument("sql", metavar="SQL", help="the query; tables: spans, steps, modules, "
                                              "memory, numerics, runs, gpu; aggregates (an "
                                              "aggregate= folder) (docs/schema.md)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="print CSV")
    out.add_argument("--json", action="store_true", help="print a JSON array of objects")
    out.add_argument("-o", "--output", metavar="OUT",
                     help="write OUT.parquet, OUT.csv or OUT.json instead of printing")
    p.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                   help="duckdb (default: in this process) or spark (a Parquet export)")
    p.add_argument("--master", default="local[2]", metavar="URL",
                   help="with --engine spark: the Spark master (default local[2])")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help=".htrace inputs converted at once (default: one per CPU)")
    p.add_argument("--read-only", action="store_true",
                   help="for SQL from someone else: one SELECT statement, with no file read "
                        "but the inputs, none written, no extension and no setting changed "
                        "(without it the SQL has DuckDB's full powers: COPY TO, read_text, "
                        "ATTACH)")
    p.add_argument("--max-rows", type=int, default=1000, metavar="N",
                   help="rows printed as a table (default 1000; --csv, --json and -o write "
                        "all)")


def run(args: argparse.Namespace) -> None:
    from hooktrace.data import require

    if args.output is not None and not args.output.endswith((".parquet", ".csv", ".json")):
        raise CliError(f"{args.output}: give a name ending in .parquet, .csv or .json")
    at_least("--threads", args.threads)
    require("pyarrow")
    if args.output is not None:
        _check_output(args.output, args.run)
    if args.engine == "spark":
        if args.read_only:
            raise CliError("--read-only locks DuckDB's connection; it is not for --engine spark")
        table = _spark(args)
    else:
        require("duckdb")
        from hooktrace.data.engine import query

        problems: list[str] = []
        table = query(args.run, args.sql, threads=args.threads or os.cpu_count() or 1,
                      problems=problems, read_only=args.read_only)
        for line in problems:  # (the other files were queried)
            print(f"hooktrace: warning: {printable(line)}", file=sys.stderr)
    if args.output is not None:
        _write(table, args.output)
        print(f"wrote {args.output}: {table.num_rows} rows")
    elif args.csv:
        import pyarrow.csv as pacsv

        pacsv.write_csv(_plain(table), sys.stdout.buffer)
    elif args.json:
        import json

        print(json.dumps(_rows(table), default=_json_value))
    else:
        print(to_text(table, args.max_rows))


def _check_output(output: str, run: str) -> None:
    """``-o`` must not be a file the query reads (``export`` refuses the same): the
    input itself, or a file of the input directory."""
    from hooktrace._output import check_output_path

    inputs = [run]
    if os.path.isdir(run) and os.path.exists(output):
        real = os.path.realpath(output)
        top = os.path.realpath(run)
        if os.path.commonpath([real, top]) == top:
            inputs.append(output)  # (inside the input directory: a table file, maybe)
    check_output_path(output, inputs)


def _spark(args: argparse.Namespace) -> Any:
    from hooktrace.data import require

    require("pyspark")
    from hooktrace.data.spark import check_parquet, query, session

    src = check_parquet(args.run)  # before the JVM starts (~15 s): .htrace needs an export
    spark = session(args.master)
    try:
        return query(spark, src, args.sql)
    except Exception as e:  # Spark's AnalysisException & co.: one line
        if type(e).__module__.startswith("pyspark"):
            raise CliError(f"the query failed on Spark: {str(e).splitlines()[0]}") from None
        raise


def _plain(table: Any) -> Any:
    """Dictionary columns decoded (CSV and Parquet readers elsewhere want plain ones)."""
    import pyarrow as pa

    cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
            for c in table.columns]
    return pa.table(cols, names=table.column_names)


def _write(table: Any, path: str) -> None:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif path.endswith(".csv"):
        import pyarrow.csv as pacsv

        pacsv.write_csv(_plain(table), path)
    else:
        import json

        with open(path, "w") as f:
            json.dump(_rows(table), f, default=_json_value)


def _json_value(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    return str(v)


def _rows(table: Any) -> list[dict[str, Any]]:
    return [{k: (_json_value(v) if isinstance(v, Decimal) else v) for k, v in row.items()}
            for row in table.to_pylist()]


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, Decimal):
        return str(_json_value(v))
    return printable(str(v))  # (measured as printed)


def to_text(table: Any, max_rows: int) -> str:
    """The result as aligned columns (numbers flush right), at most ``max_rows`` rows."""
    rows = table.slice(0, max(max_rows, 0)).to_pylist()
    names = table.column_names
    if not names:
        return "(no columns)"
    cells = [[printable(n) for n in names]] + [[_cell(r[n]) for n in names] for r in rows]
    numeric = [all(isinstance(r[n], (int, float, Decimal)) or r[n] is None for r in rows)
               and any(r[n] is not None for r in rows) for n in names]
    widths = [max(len(row[i]) for row in cells) for i in range(len(names))]
    lines = ["  ".join(c.rjust(w) if numeric[i] else c.ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in cells]
    more = table.num_rows - len(rows)
    lines.append(f"({table.num_rows} rows" + (f"; {more} not shown: --max-rows, --csv, --json "
                                                 "or -o for all)" if more > 0 else ")"))
    return text_lines(lines)
