"""``hooktrace diff A B``: per module and phase, how run B's times compare with run A's."""

from __future__ import annotations

import argparse
import sys

from hooktrace.commands import CliError

NAME = "diff"
HELP = "compare two .htrace files per module (a CI gate with --fail-above)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the baseline .htrace file")
    p.add_argument("b", metavar="B", help="the .htrace file compared with it")
    p.add_argument("--top", type=int, default=None, help="only the N rows of largest change")
    p.add_argument("--json", action="store_true", help="JSON instead of a table (times in ns)")
    p.add_argument("--fail-above", type=float, default=None, metavar="PCT",
                   help="exit 1 when the step or any module got slower by more than PCT "
                        "percent (per step when both runs have steps, else p50 per call)")
    p.add_argument("--min-share", type=float, default=1.0, metavar="PCT",
                   help="with --fail-above: ignore modules below PCT percent of A's step "
                        "time (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from hooktrace.diff import compare
    from hooktrace.reading import load

    if args.top is not None and args.top < 1:
        raise CliError(f"--top must be at least 1, got {args.top}")
    if args.fail_above is not None and not args.fail_above >= 0:
        raise CliError(f"--fail-above must be a percentage >= 0, got {args.fail_above}")
    if not args.min_share >= 0:
        raise CliError(f"--min-share must be a percentage >= 0, got {args.min_share}")
    d = compare(load(args.a), load(args.b), names=(args.a, args.b))
    failed = (d.failures(args.fail_above, min_share=args.min_share)
              if args.fail_above is not None else None)
    if args.json:
        print(d.to_json(top=args.top, failed=failed))
    else:
        print(d.to_text(top=args.top))
    if failed:
        # stdout carries the table; the verdict goes to stderr, so `| head` keeps it
        print(f"hooktrace: diff: slower by more than {args.fail_above:g}%: "
              + "; ".join(failed), file=sys.stderr)
        return 1
    return 0
