"""``hooktrace export RUN -o OUT``: a ``.htrace`` file as a Chrome JSON or Perfetto trace.

The format follows OUT's suffix, in :data:`OUTPUT_FORMATS` (one table: a new
exporter adds its suffixes there): ``.json`` / ``.json.gz`` write Chrome JSON,
``.pftrace`` / ``.perfetto-trace`` (optionally ``.gz``) Perfetto's protobuf; any other
suffix is refused, naming the accepted ones. ``-`` (standard output), a FIFO or a
device without a known suffix get Chrome JSON. ``--steps``,
``--start``/``--end`` and ``--max-depth`` cut the run down first (see
``hooktrace._filters``).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hooktrace._args import finite_float
from hooktrace.commands import OPEN_HINT, CliError

if TYPE_CHECKING:
    from hooktrace._filters import Filters
    from hooktrace.reading import TraceData

NAME = "export"
HELP = "convert a .htrace file to Chrome trace JSON or a Perfetto .pftrace"

# Measured on real and synthetic exports (benchmarks/RESULTS.md): bytes per
# written slice, for the progress bar's total and the size warning.
JSON_BYTES_PER_SLICE = 160
PFTRACE_BYTES_PER_SLICE = 50
# Browser viewers load a trace into one JS heap: the Perfetto UI and
# chrome://tracing fail somewhere between 256 and 800 MB of JSON.
JSON_WARN_BYTES = 500_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file, or a directory of ranks' files (one "
                               "process per rank, as merge-ranks)")
    p.add_argument("-o", "--output", required=True,
                   help="OUT.pftrace or OUT.perfetto-trace (Perfetto protobuf, smallest), "
                        "OUT.json, OUT.json.gz to compress, or - for standard output (JSON)")
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


def _write_chrome(trace: TraceData, out: Any, nodes: bool, filters: Filters) -> None:
    from hooktrace.exporters.chrome import write_chrome

    write_chrome(trace, out, nodes=nodes, filters=filters)


def _write_perfetto(trace: TraceData, out: Any, nodes: bool, filters: Filters) -> None:
    from hooktrace.exporters.perfetto import write_perfetto

    write_perfetto(trace, out, nodes=nodes, filters=filters)


@dataclass(frozen=True)
class OutputFormat:
    """One output format of ``export``: how it is named, its size per slice (for the
    progress bar and the size warning) and its writer ``(trace, out, nodes, filters)``."""

    name: str
    bytes_per_slice: int
    write: Callable[[TraceData, Any, bool, Filters], None]
    browser_json: bool = False  # loaded whole by browser viewers: warn when huge


CHROME = OutputFormat("Chrome JSON", JSON_BYTES_PER_SLICE, _write_chrome, browser_json=True)
PERFETTO = OutputFormat("Perfetto protobuf", PFTRACE_BYTES_PER_SLICE, _write_perfetto)
# Output suffix -> format (a ".gz" suffix is gzip-compressed by open_output). A new
# exporter joins by adding its suffixes here.
OUTPUT_FORMATS: dict[str, OutputFormat] = {
    ".json": CHROME, ".json.gz": CHROME,
    ".pftrace": PERFETTO, ".pftrace.gz": PERFETTO,
    ".perfetto-trace": PERFETTO, ".perfetto-trace.gz": PERFETTO,
}


def output_format(path: str) -> OutputFormat:
    """The format ``path`` asks for by its suffix; :class:`CliError` naming the accepted
    suffixes for any other. ``-`` and an existing FIFO or device with no known suffix
    are written Chrome JSON (they have no name to go by)."""
    for suffix in sorted(OUTPUT_FORMATS, key=len, reverse=True):
        if path.endswith(suffix) and len(path) > len(suffix):
            return OUTPUT_FORMATS[suffix]
    if path == "-" or _is_stream(path):
        return CHROME
    ext = os.path.splitext(os.path.basename(path))[1]
    what = f"unknown output suffix '{ext}'" if ext else "no output suffix"
    raise CliError(f"{path}: {what}; give a name ending in "
                   f"{', '.join(OUTPUT_FORMATS)} (or - for standard output)")


def _is_stream(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def run(args: argparse.Namespace) -> None:
    import numpy as np

    from hooktrace._filters import Filters, cut, parse_steps
    from hooktrace._output import check_output_path, open_output
    from hooktrace._progress import WriteTo, progress_write
    from hooktrace.result import load

    from hooktrace._naming import rank_files_of

    fmt = output_format(args.output)
    if os.path.isdir(args.run) or rank_files_of(args.run):  # many ranks (issue #11)
        from hooktrace.commands import merge_ranks

        merge_ranks.run(argparse.Namespace(inputs=[args.run], output=args.output, profiler=[],
                                           workers=None))
        return
    filters = Filters(start=args.start, end=args.end, max_depth=args.max_depth,
                      steps=None if args.steps is None else parse_steps(args.steps))
    check_output_path(args.output, [args.run])
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
