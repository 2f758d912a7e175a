"""``hooktrace summary RUN``: the per-module time table (or op attribution with --profiler)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from hooktrace.commands import CliError

if TYPE_CHECKING:
    from hooktrace.attribution import Attribution
    from hooktrace.summary import StepTable, Summary

NAME = "summary"
HELP = "per-module time table of a .htrace file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file")
    p.add_argument("--top", type=int, default=None,
                   help="only the N rows with most time (all output forms)")
    p.add_argument("--wide", action="store_true",
                   help="every column (the default table fits 120 columns)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV instead of a table (times in ns)")
    fmt.add_argument("--json", action="store_true", help="JSON instead of a table (times in ns)")
    p.add_argument("--profiler", metavar="PROFILER.json[.gz]", default=None,
                   help="attribute this torch.profiler trace's ops (and kernels) to modules")
    p.add_argument("--top-ops", type=int, default=3,
                   help="with --profiler: ops listed per module (default: %(default)s)")
    p.add_argument("--steps", action="store_true",
                   help="one row per training step (duration, forward and backward time)")


def run(args: argparse.Namespace) -> None:
    from hooktrace.reading import load

    if args.top is not None and args.top < 1:
        raise CliError(f"--top must be at least 1, got {args.top}")
    if args.top_ops < 0:
        raise CliError(f"--top-ops must be at least 0, got {args.top_ops}")
    table: Summary | Attribution | StepTable
    if args.steps and args.profiler is not None:
        raise CliError("--steps and --profiler are separate tables: give one of them")
    if args.steps:
        from hooktrace.summary import StepTable as Steps

        table = Steps.from_trace(load(args.run))
    elif args.profiler is not None:
        from hooktrace.merge import attribute

        table = attribute(args.run, args.profiler, top_ops=args.top_ops)
    else:
        table = load(args.run).summary()
    # Both tables offer the same forms; --top applies to every one of them.
    if args.csv:
        sys.stdout.write(table.to_csv(top=args.top))
    elif args.json:
        print(table.to_json(top=args.top))
    else:
        print(table.to_text(top=args.top, wide=args.wide))
