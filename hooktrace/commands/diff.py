"""``hooktrace diff A B``: per module and phase, how run B's times compare with run A's."""

from __future__ import annotations

import argparse
import os
import sys

from hooktrace._args import finite_float
from hooktrace.commands import CliError, at_least

NAME = "diff"
HELP = ("compare two runs (files, rank directories or schedule windows) per module "
        "(a CI gate with --fail-above)")

EPILOG = """\
A and B are each one of:
  RUN.htrace      one trace file
  DIR             a directory (searched recursively) holding either
                    - one run's rank files (each with its rank in its metadata):
                      compared rank by rank with another rank directory; each row
                      shows the rank where the module slowed most, plus the median
                      change over the ranks; ranks in one run only are listed
                    - schedule windows of one process (hooktrace.window_handler(DIR)),
                      pooled: every call and every complete step of every window
                    (rank files that are windows: each rank's windows pooled)
  DIR:N, FILE:N   window N only (in step order: 0 the first, -1 the last), of the
                  process or of every rank, e.g. `hooktrace diff traces:0 traces:-1`
A file (or one process's windows) against a rank directory of several ranks is
refused: name one rank's file instead. A directory mixing runs (files with and
without ranks, different world sizes, two processes for one rank, ranks that did
not record at the same time, overlapping windows), an empty directory or an
unreadable file is an error naming the path and the file.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Per module and phase: p50 time per call and per step in A and B,\n"
                     "their change, and calls per step, sorted by the change of the median call's\n"
                     "self time x calls (one stalled call does not move it).")
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("a", metavar="A", help="the baseline: a .htrace file, a rank directory or "
                                          "a directory of windows (PATH:N for window N)")
    p.add_argument("b", metavar="B", help="the run compared with it (the same kinds)")
    p.add_argument("--top", type=int, default=None, help="only the N rows of largest change")
    p.add_argument("--json", action="store_true", help="JSON instead of a table (times in ns)")
    p.add_argument("--fail-above", type=finite_float, default=None, metavar="PCT",
                   help="exit 1 when the step or any module got slower by more than PCT "
                        "percent (a module: its median call x calls per step, or per run); "
                        "rank directories: on any rank, named in the verdict; when both runs "
                        "recorded device time (trace(gpu=True)), the modules' GPU rows")
    p.add_argument("--min-share", type=finite_float, default=1.0, metavar="PCT",
                   help="with --fail-above: ignore modules below PCT percent of A's step "
                        "time (default: %(default)s)")
    p.add_argument("--fail-on-noise", action="store_true",
                   help="with --fail-above: gate the rows marked noise too (a change no "
                        "larger than A's run-to-run spread; left out by default)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes reading files (default: one per CPU from 4 files on)")


def run(args: argparse.Namespace) -> int:
    from hooktrace.data.paths import compare_paths  # (.htrace files, or a Parquet export)

    at_least("--top", args.top)
    if args.fail_above is not None and not args.fail_above >= 0:
        raise CliError(f"--fail-above must be a percentage >= 0, got {args.fail_above}")
    if not 0 <= args.min_share <= 100:
        raise CliError(f"--min-share must be a percentage from 0 to 100, got {args.min_share}")
    at_least("--workers", args.workers)
    from hooktrace.analysis.inputs import Kind, resolve
    from hooktrace.data.aggregates import aggregate_diff

    aggregate = {p: resolve(p).kind is Kind.AGGREGATE for p in (args.a, args.b)}  # (#37)
    if aggregate[args.a] and aggregate[args.b]:  # aggregate= folders (#31)
        text, failed_rows = aggregate_diff(args.a, args.b, args.top, args.fail_above,
                                           args.min_share)
        print(text)
        for line in failed_rows:
            print(f"  {line}", file=sys.stderr)
        return 1 if failed_rows else 0
    for path, other in ((args.a, args.b), (args.b, args.a)):  # one side aggregates only
        if aggregate[path]:
            raise CliError(f"{path} is an aggregate= folder and {other} is not: diff two "
                           f"aggregate= folders, or a step it kept whole "
                           f"({os.path.join(path, 'steps', 'step-N_<run>.htrace')}) against "
                           f"{other}")
    d = compare_paths(args.a, args.b, workers=args.workers)
    failed = (d.failures(args.fail_above, min_share=args.min_share,
                          include_noise=args.fail_on_noise)
              if args.fail_above is not None else None)
    noisy = (d.noise_left_out(args.fail_above, min_share=args.min_share)
             if args.fail_above is not None and not args.fail_on_noise else [])
    if args.json:
        print(d.to_json(top=args.top, failed=failed))
    else:
        print(d.to_text(top=args.top))
    if noisy:  # (said, so that a row over the bar that did not fail is not a surprise)
        print(f"hooktrace: diff: {len(noisy)} above {args.fail_above:g}% but within the "
              "runs' own noise (a module: A's run-to-run spread; the step: the runs' "
              "step-to-step spread), not gated (--fail-on-noise gates them): "
              + "; ".join(noisy[:5]) + (f"; and {len(noisy) - 5} more" if len(noisy) > 5
                                        else ""), file=sys.stderr)
    if failed:
        # stdout carries the table; the verdict goes to stderr, so `| head` keeps it
        print(f"hooktrace: diff: {len(failed)} slower by more than {args.fail_above:g}%:",
              file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0
