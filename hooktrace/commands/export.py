"""``hooktrace export RUN -o OUT``: a ``.htrace`` file as a Chrome JSON or Perfetto trace,
or as Parquet tables.

The format follows OUT's suffix, in ``hooktrace.exporters.formats.OUTPUT_FORMATS`` (one
table: a new exporter adds its suffixes there): ``.json`` / ``.json.gz`` write Chrome
JSON, ``.pftrace`` / ``.perfetto-trace`` (optionally ``.gz``) Perfetto's protobuf,
``.parquet`` the run's ``spans`` table (``--table`` another; docs/schema.md); any
other suffix is refused, naming the accepted ones. ``-o DIR/`` (a trailing slash, or an
existing empty directory) writes every table: ``DIR/<table>.parquet``. A directory of
rank files (or schedule windows) with a Parquet output is one hive-partitioned dataset:
``X.parquet/rank=N/`` (the spans), or ``DIR/<table>/rank=N/`` (every table), with
``window=K/`` below ``rank=N/`` for windows (:mod:`hooktrace.data.parquet`). ``-`` (standard output), a FIFO or a
device without a known suffix get Chrome JSON. ``--steps``,
``--start``/``--end`` and ``--max-depth`` cut the run down first (see
``hooktrace.analysis._filters``).
"""

from __future__ import annotations

import argparse
import os
import sys

from hooktrace._args import finite_float
from hooktrace.analysis.inputs import Input, Kind, resolve
from hooktrace.commands import OPEN_HINT

NAME = "export"
HELP = "convert a .htrace file to Chrome trace JSON, a Perfetto .pftrace or Parquet tables"

# Browser viewers load a trace into one JS heap: the Perfetto UI and
# chrome://tracing fail somewhere between 256 and 800 MB of JSON.
JSON_WARN_BYTES = 500_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file, or a directory of ranks' files (one "
                               "process per rank, as merge-ranks)")
    p.add_argument("-o", "--output", required=True,
                   help="OUT.pftrace or OUT.perfetto-trace (Perfetto protobuf, smallest), "
                        "OUT.json, OUT.json.gz to compress, - for standard output (JSON), "
                        "OUT.parquet (the spans table; docs/schema.md) or DIR/ (every table "
                        "as Parquet)")
    p.add_argument("--nodes", action="store_true",
                   help="also write every autograd node under its module's backward span")
    p.add_argument("--steps", metavar="A:B",
                   help="only training steps A to B (inclusive; A alone for one step)")
    p.add_argument("--start", type=finite_float, metavar="SECONDS",
                   help="only from this many seconds after the run's first event")
    p.add_argument("--end", type=finite_float, metavar="SECONDS",
                   help="only until this many seconds after the run's first event")
    p.add_argument("--max-depth", type=int, metavar="N",
                   help="only module calls at depth 0..N (the root is 0); backward spans "
                        "by their forward call's depth")
    p.add_argument("--table", default="spans", metavar="TABLE",
                   help="with OUT.parquet: which table (spans, steps, modules, memory, "
                        "numerics, runs; default spans)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="with a directory of ranks and a Parquet output: ranks converted "
                        "at once (each holds one rank's events; default 1)")


def run(args: argparse.Namespace) -> None:
    import numpy as np

    from hooktrace.analysis._filters import Filters, cut, parse_steps
    from hooktrace._output import check_output_path, open_output
    from hooktrace._progress import WriteTo, progress_write
    from hooktrace.exporters.formats import output_format
    from hooktrace.result import load

    # many ranks or windows (any folder: the ranks' reader says what one lacks)
    inp = resolve(args.run)  # (asked once, issue #48)
    many = inp.kind is Kind.TRACES or os.path.isdir(args.run)
    if _is_dir_output(args.output) or args.output.endswith(".parquet"):
        _export_parquet(args, inp if many else None)
        return
    check_output_path(args.output, [args.run])  # (a directory, an input: said first)
    fmt = output_format(args.output)
    if many:  # many ranks (issue #11)
        from hooktrace.commands import write_ranks_merged

        write_ranks_merged([args.run], args.output, profilers=[], workers=None)
        return
    filters = Filters(start=args.start, end=args.end, max_depth=args.max_depth,
                      steps=None if args.steps is None else parse_steps(args.steps))
    trace = load(args.run)
    c = cut(trace, filters)  # also rejects a trace without steps before any output exists
    attributed = trace.spans().nodes.span >= 0
    slices = int(np.count_nonzero(c.spans)) + int(np.count_nonzero(
        c.nodes if args.nodes else c.nodes & ~attributed))
    size = slices * fmt.bytes_per_slice
    if fmt.browser_json and size > JSON_WARN_BYTES:
        print(f"hooktrace: warning: {args.output} will hold about {size / 1e6:.0f} MB of JSON "
              f"({slices} slices); browser viewers (Perfetto UI, chrome://tracing) fail near "
              "256-800 MB: write a .pftrace instead, or cut the run with --steps, "
              "--start/--end or --max-depth", file=sys.stderr)
    with open_output(args.output, inputs=[args.run]) as f:
        with progress_write(f.write, total_bytes=size, events=len(trace.events),
                            desc=f"export {os.path.basename(args.output)}") as write:
            fmt.write(trace, WriteTo(write), args.nodes, filters)
    if args.output != "-":
        kept = int(np.count_nonzero(c.spans))
        what = f"{kept} spans" + (f" of {len(c.spans)}" if filters.active else "")
        print(f"wrote {args.output}: {what}; {OPEN_HINT}")


def _is_dir_output(path: str) -> bool:
    """``-o DIR/`` (every table as Parquet): a trailing slash, or an empty directory. A
    directory with files in it and no slash is refused as before ("is a directory")."""
    return path.endswith(("/", os.sep)) or (os.path.isdir(path) and not os.listdir(path))


def _export_parquet(args: argparse.Namespace, many: Input | None) -> None:
    """``-o X.parquet`` / ``-o DIR/``: the run's tables (docs/schema.md); ``many``: the
    input when it is many ranks or windows."""
    from hooktrace.commands import CliError, at_least
    from hooktrace.data import require

    require("pyarrow")  # the one line naming the extra, before anything is read
    from hooktrace.data.schema import TABLES

    out = args.output
    if args.table not in TABLES:
        raise CliError(f"--table {args.table}: no such table; the tables are "
                       f"{', '.join(TABLES)}")
    if any(v is not None for v in (args.steps, args.start, args.end, args.max_depth)):
        raise CliError("--steps, --start/--end and --max-depth cut Chrome and Perfetto "
                       "exports only; a Parquet export holds the whole run: select in SQL "
                       "(hooktrace query RUN \"SELECT ... WHERE step BETWEEN ...\")")
    at_least("--threads", args.threads)
    folder = os.path.dirname(os.path.abspath(out.rstrip("/" + os.sep)))
    if not os.path.isdir(folder):
        raise CliError(f"{out}: the folder {folder} does not exist")
    whole = _is_dir_output(out)
    if (whole or many) and os.path.exists(out):
        if not os.path.isdir(out):
            raise CliError(f"{out}: exists and is not a directory; a dataset of many ranks is "
                           "a directory (rank=N/ inside)")
        if os.listdir(out):
            raise CliError(f"{out}: the directory is not empty; write the tables to a new "
                           "or empty directory")
    if many:
        from hooktrace.data.parquet import write_dataset

        tables = TABLES if whole else (args.table,)
        r = write_dataset([many], out, tables=tables, single=not whole,
                          threads=args.threads)
        for line in r.problems:
            print(f"hooktrace: warning: {line}", file=sys.stderr)
        what = ", ".join(f"{r.rows[t]} {t}" for t in tables)
        print(f"wrote {out}: a dataset of {r.files} files, ranks {_ranks(r.ranks)}: {what} "
              f"rows (rank=N/ partitions)")
        return
    from hooktrace._output import check_output_path
    from hooktrace.data.parquet import write_run, write_table
    from hooktrace.data.tables import Where
    from hooktrace.reading import load

    if not whole:
        check_output_path(out, [args.run])
    # read, not mapped: a run that truncates the same path (a new trace(out=) there)
    # would end a mapped export with SIGBUS (issue #35); read, it is the file as it was
    trace = load(args.run)
    if whole:
        rows = write_run(trace, out, Where.of(trace, args.run))
        print(f"wrote {out}: " + ", ".join(f"{t}.parquet ({n} rows)" for t, n in rows.items()))
    else:
        n = write_table(trace, args.table, out, Where.of(trace, args.run))
        print(f"wrote {out}: {n} {args.table} rows")


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ", ".join(map(str, ranks))
