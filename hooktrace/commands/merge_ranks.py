"""``hooktrace merge-ranks DIR_OR_FILES... -o OUT``: every rank on one timeline."""

from __future__ import annotations

import argparse

from hooktrace.commands import OPEN_HINT, CliError

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


def add_workers_check(args: argparse.Namespace) -> None:
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers must be at least 1, got {args.workers}")


def run(args: argparse.Namespace) -> None:
    import warnings

    from hooktrace._output import check_output_path
    from hooktrace.exporters.formats import CHROME, output_format
    from hooktrace.exporters.ranks import merge_ranks

    add_workers_check(args)
    check_output_path(args.output, args.inputs)  # (a directory, an input: said first)
    if output_format(args.output) is not CHROME:
        raise CliError(f"{args.output}: only Chrome JSON is written for many ranks yet; write "
                       ".json or .json.gz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the problems are printed below, one line each
        r = merge_ranks(args.inputs, args.output, profilers=args.profiler, workers=args.workers)
    for line in r.problems:
        print(f"hooktrace: warning: {line}")
    with_prof = sum(1 for e in r.ranks if "profiler" in e)
    prof = f" ({with_prof} with their profiler events)" if with_prof else ""
    print(f"wrote {args.output}: {len(r.ranks)} ranks{prof}, one process each; {OPEN_HINT}")
