"""``hooktrace report RUN -o report.html``: a self-contained HTML report of one run."""

from __future__ import annotations

import argparse

from hooktrace._args import finite_float
from hooktrace.commands import CliError

NAME = "report"
HELP = "write a self-contained HTML report (module icicle chart, steps, table)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--title", default=None, help="the page's title")
    p.add_argument("--peak-tflops", type=finite_float, default=None, metavar="TFLOPS",
                   help="the device's peak TFLOP/s, for the MFU column of a run recorded "
                        "with flops=True (default: known GPUs' peaks)")


def run(args: argparse.Namespace) -> None:
    from hooktrace._output import check_output_path
    from hooktrace.reading import load
    from hooktrace.reporters.html import write_report

    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise CliError(f"--peak-tflops must be a positive number, got {args.peak_tflops}")
    check_output_path(args.output, [args.run])
    write_report(load(args.run), args.output, source=args.run, title=args.title,
                 peak_tflops=args.peak_tflops)
    if args.output != "-":
        print(f"wrote {args.output}: open it in a web browser (it needs no network)")
