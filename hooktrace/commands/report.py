"""``hooktrace report RUN -o report.html``: a self-contained HTML report of one run, or of
an ``aggregate=`` folder (its per-step aggregates and the steps kept whole)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from hooktrace._args import finite_float
from hooktrace.commands import CliError

NAME = "report"
HELP = "write a self-contained HTML report (module icicle chart, steps, table)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file, or an aggregate= folder")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--title", default=None, help="the page's title")
    p.add_argument("--peak-tflops", type=finite_float, default=None, metavar="TFLOPS",
                   help="the device's peak TFLOP/s, for the MFU column of a run recorded "
                        "with flops=True (default: known GPUs' peaks)")
    p.add_argument("--steps", metavar="A:B", default=None,
                   help="only training steps A to B (inclusive; A alone for one step; all: "
                        "the whole run). Default: the whole run, less the steps at its "
                        "start that compiled (torch.compile) when others follow them")


def run(args: argparse.Namespace) -> None:
    from hooktrace._output import check_output_path
    from hooktrace.analysis.inputs import Kind, resolve

    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise CliError(f"--peak-tflops must be a positive number, got {args.peak_tflops}")
    check_output_path(args.output, [args.run])
    inp = resolve(args.run)  # what the path is (issue #37)
    if inp.kind is Kind.AGGREGATE:
        _aggregate_report(args)
    elif os.path.isdir(args.run):
        raise CliError(f"{args.run}: a folder, but not an aggregate= folder (no "
                       "aggregates/part-*.parquet in it); give a .htrace file or the folder "
                       "of trace(aggregate=...) / hooktrace run --aggregate")
    else:
        from hooktrace.reading import load
        from hooktrace.reporters.html import write_report

        trace, notes = _steps_shown(load(args.run), args.steps)
        write_report(trace, args.output, source=args.run, title=args.title,
                     peak_tflops=args.peak_tflops, notes=notes)
    if args.output != "-":
        print(f"wrote {args.output}: open it in a web browser (it needs no network)")


def _aggregate_report(args: argparse.Namespace) -> None:
    """An ``aggregate=`` folder (issue #31): its table and kept steps, or the one-line
    error saying what is wrong with the folder."""
    from hooktrace.data.aggregates import kept_steps, load_aggregates, unwritten_lines
    from hooktrace.reporters.aggregate import write_aggregate_report

    if args.peak_tflops is not None:
        raise CliError("--peak-tflops applies to a trace: an aggregate folder has TFLOP/s, "
                       "not the FLOPs an MFU needs")
    if args.steps is not None:
        raise CliError("--steps applies to a trace: an aggregate folder's steps are in "
                       "windows (report a step it kept whole, DIR/steps/, or hooktrace query "
                       "the folder)")
    import pyarrow as pa

    table = load_aggregates(args.run)  # an unreadable part: its own one-line error
    try:
        write_aggregate_report(table, kept_steps(args.run), args.output, source=args.run,
                               title=args.title, notes=unwritten_lines(args.run, table))
    except (pa.ArrowException, KeyError) as e:  # a part written by something else
        raise CliError(f"{args.run}: the aggregate table is not one trace(aggregate=...) "
                       f"writes: {_first(e)}") from None


def _steps_shown(trace: Any, steps: str | None) -> tuple[Any, list[str]]:
    """The part of ``trace`` the report covers, and the line saying which: ``steps``
    (``A:B``, ``A``, or ``all``), or by default the run less the steps at its start
    that compiled (issue #47: a compile step of 25 s against steps of 58 ms set the
    scale of every chart and the table's totals)."""
    from hooktrace.analysis._filters import cut_steps, leading_compile_steps, parse_steps
    from hooktrace.text import format_ns

    if steps == "all":
        return trace, []
    if steps is not None:
        first, last = parse_steps(steps)
        try:
            lo, hi = trace.step_bounds(first, last)
        except ValueError as e:
            raise CliError(f"--steps {steps}: {e}") from None
        # (the first step starts at the first recorded call: nothing before it to leave out)
        after = None if lo <= int(trace.steps().start_ns.min()) else lo
        return cut_steps(trace, after, hi), [f"steps {first} to {last} only (--steps {steps})"]
    n = leading_compile_steps(trace)
    if not n:
        return trace, []
    have = trace.steps()
    compiled = int(have.duration_ns[:n].sum())
    numbers = f"step {int(have.number[0])}" if n == 1 else \
        f"steps {int(have.number[0])} to {int(have.number[n - 1])}"
    return cut_steps(trace, int(have.end_ns[n - 1]), None), [
        f"{numbers} compiled (torch.compile, {format_ns(compiled)}): left out of this report "
        "(--steps all shows the whole run)"]


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
