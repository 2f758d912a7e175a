"""``hooktrace export RUN -o OUT``: a ``.htrace`` file as a Chrome / Perfetto trace."""

from __future__ import annotations

import argparse
import os

from hooktrace.commands import OPEN_HINT

NAME = "export"
HELP = "convert a .htrace file to Chrome trace JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file, or a directory of ranks' files (one "
                               "process per rank, as merge-ranks)")
    p.add_argument("-o", "--output", required=True,
                   help="OUT.json, OUT.json.gz to compress, or - for standard output")
    p.add_argument("--nodes", action="store_true",
                   help="also write every autograd node under its module's backward span")


def run(args: argparse.Namespace) -> None:
    from hooktrace._output import check_output_path, open_output
    from hooktrace.exporters.chrome import write_chrome
    from hooktrace.reading import load

    if os.path.isdir(args.run):  # many ranks (issue #11)
        from hooktrace.commands import merge_ranks

        merge_ranks.run(argparse.Namespace(inputs=[args.run], output=args.output, profiler=[],
                                           workers=None))
        return
    check_output_path(args.output, [args.run])
    trace = load(args.run)
    with open_output(args.output, inputs=[args.run]) as f:
        write_chrome(trace, f, nodes=args.nodes)
    if args.output != "-":
        print(f"wrote {args.output}: {len(trace.spans())} spans; {OPEN_HINT}")
