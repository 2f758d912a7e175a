"""``hooktrace merge-ranks DIR_OR_FILES... -o OUT``: every rank on one timeline."""

from __future__ import annotations

import argparse

from hooktrace.commands import write_ranks_merged

NAME = "merge-ranks"
HELP = "merge the .htrace files of many ranks (and their profiler traces) into one trace"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="DIR_OR_FILE",
                   help="rank .htrace files, or directories searched for them")
    p.add_argument("-o", "--output", required=True, help="OUT.json, or OUT.json.gz to compress")
    p.add_argument("--profiler", nargs="+", default=[], metavar="PROFILER",
                   help="the ranks' torch.profiler traces (files or directories), matched to "
                        "ranks by their distributedInfo rank, pid or 'rankN' in the name")
    p.add_argument("--workers", type=int, default=None,
                   help="processes reading ranks (default: one per CPU from 4 ranks on)")


def run(args: argparse.Namespace) -> None:
    write_ranks_merged(args.inputs, args.output, args.profiler, args.workers)
