"""``hooktrace export RUN -o OUT``: a ``.htrace`` file as a Chrome JSON or Perfetto trace.

The format follows OUT's suffix, in ``hooktrace.exporters.formats.OUTPUT_FORMATS`` (one
table: a new exporter adds its suffixes there): ``.json`` / ``.json.gz`` write Chrome
JSON, ``.pftrace`` / ``.perfetto-trace`` (optionally ``.gz``) Perfetto's protobuf; any
other suffix is refused, naming the accepted ones. ``-`` (standard output), a FIFO or a
device without a known suffix get Chrome JSON. ``--steps``,
``--start``/``--end`` and ``--max-depth`` cut the run down first (see
``hooktrace._filters``).
"""

from __future__ import annotations

import argparse
import os
import sys

from hooktrace._args import finite_float
from hooktrace.commands import OPEN_HINT

NAME = "export"
HELP = "convert a .htrace file to Chrome trace JSON or a Perfetto .pftrace"

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


def run(args: argparse.Namespace) -> None:
    import numpy as np

    from hooktrace._filters import Filters, cut, parse_steps
    from hooktrace._output import check_output_path, open_output
    from hooktrace._progress import WriteTo, progress_write
    from hooktrace.exporters.formats import output_format
    from hooktrace.result import load

    from hooktrace._naming import rank_files_of

    check_output_path(args.output, [args.run])  # (a directory, an input: said first)
    fmt = output_format(args.output)
    if os.path.isdir(args.run) or rank_files_of(args.run):  # many ranks (issue #11)
        from hooktrace.commands import merge_ranks

        merge_ranks.run(argparse.Namespace(inputs=[args.run], output=args.output, profiler=[],
                                           workers=None))
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
