"""``hooktrace summary RUN``: the per-module time table (or op attribution with --profiler)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from hooktrace._args import finite_float
from hooktrace.analysis.inputs import Input, Kind, resolve
from hooktrace.commands import CliError, at_least

if TYPE_CHECKING:
    from hooktrace.analysis.attribution import Attribution
    from hooktrace.analysis.shapes import ShapeTable
    from hooktrace.analysis.summary import StepTable

NAME = "summary"
MAX_MIN_EXCESS_NS = 10**18  # (31 years) larger does not fit the int64 times it is compared with
HELP = "per-module time table of a .htrace file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="+", help="the .htrace file, a Parquet export of one run "
                                          "(X.parquet, DIR/) or an aggregate= folder; a "
                                          "directory or several files: the ranks' straggler "
                                          "tables")
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
    p.add_argument("--by-shape", action="store_true",
                   help="one row per module and input shape signature (recorded with "
                        "trace(model, shapes=True) or hooktrace run --shapes)")
    p.add_argument("--peak-tflops", type=finite_float, default=None, metavar="TFLOPS",
                   help="the device's peak TFLOP/s, for MFU (default: known GPUs' peaks)")
    p.add_argument("--steps", action="store_true",
                   help="one row per training step (duration, forward and backward time)")
    _quantity_flags(p)
    ranks = p.add_argument_group("many ranks (a directory or several files)")
    ranks.add_argument("--threshold", type=finite_float, default=None,
                       help="straggler: over (1 + T) x the other ranks' median (default: 0.5)")
    ranks.add_argument("--min-excess-ms", type=finite_float, default=None,
                       help="straggler: and more than this over it (default: 1 ms)")
    ranks.add_argument("--workers", type=int, default=None,
                       help="processes reading ranks (default: one per CPU from 4 ranks on)")


def _quantity_flags(p: argparse.ArgumentParser) -> None:
    """Each recorded quantity's flag (``--flops``, ``--memory``, ``--numerics``: its column
    provider's ``text_flag`` and ``flag_help``, hooktrace.analysis.columns), added when
    ``p`` first parses or prints its help: the providers' modules import numpy, which
    ``hooktrace --version`` (every verb's parser built) does not."""

    def adding(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            from hooktrace.analysis.columns import PROVIDERS

            for provider in PROVIDERS:
                flag = f"--{provider.text_flag.replace('_', '-')}"
                if provider.text_flag and flag not in p._option_string_actions:
                    p.add_argument(flag, action="store_true", help=provider.flag_help)
            return method(*args, **kwargs)

        return call

    p.parse_known_args = adding(p.parse_known_args)  # type: ignore[method-assign]
    p.format_help = adding(p.format_help)  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> None:
    from hooktrace.analysis.columns import PROVIDERS
    from hooktrace.result import load
    from hooktrace.analysis.summary import Summary
    from hooktrace.text import terminal_width

    inputs = [resolve(p) for p in args.run]  # what each path is (issue #37)
    if len(inputs) == 1 and inputs[0].kind is Kind.AGGREGATE:  # aggregate=DIR, its parts
        _aggregate(args)
        return
    export = len(inputs) == 1 and _one_run_export(inputs[0])  # hooktrace export's Parquet
    if not export and (len(inputs) > 1 or os.path.isdir(args.run[0])
                       or inputs[0].kind is Kind.TRACES):
        _run_ranks(args)
        return
    if args.threshold is not None or args.min_excess_ms is not None or args.workers is not None:
        raise CliError("--threshold, --min-excess-ms and --workers apply to many ranks: give a "
                       "directory or several .htrace files")
    args.run = args.run[0]
    # the recorded quantities' flags given (--flops, --memory, --numerics: their providers')
    shown = {p.text_flag: bool(getattr(args, p.text_flag, False)) for p in PROVIDERS
             if p.text_flag}
    asked = [p for p in PROVIDERS if shown.get(p.text_flag)]
    at_least("--top", args.top)
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise CliError(f"--peak-tflops must be a positive number, got {args.peak_tflops}")
    at_least("--top-ops", args.top_ops, 0)
    table: Summary | Attribution | StepTable | ShapeTable
    if sum(bool(x) for x in (args.steps, args.profiler is not None, args.by_shape)) > 1:
        raise CliError("--steps, --profiler and --by-shape are separate tables: give one of them")
    if export:  # the per-module table of a one-run export (hooktrace.data.summary)
        from hooktrace.data.summary import summary_of_export

        left_out = [flag for flag, on in (
            ("--steps", args.steps), ("--by-shape", args.by_shape),
            ("--profiler", args.profiler is not None),
            *((f"--{k.replace('_', '-')}", on) for k, on in shown.items())) if on]
        if left_out:
            raise CliError(f"{args.run}: {', '.join(left_out)} read the .htrace file; a "
                           "Parquet export holds those values as tables: hooktrace query")
        table = summary_of_export(args.run)
    elif args.by_shape:
        from hooktrace.analysis.shapes import ShapeTable as Shapes

        table = Shapes.from_trace(load(args.run))
        if not table.recorded:
            raise CliError(f"{args.run}: no shapes recorded; trace with "
                           "hooktrace.trace(model, shapes=True) or hooktrace run --shapes")
    elif args.steps:
        from hooktrace.analysis.summary import StepTable as Steps

        table = Steps.from_trace(load(args.run))
    elif args.profiler is not None:
        from hooktrace.exporters.merged import attribute

        table = attribute(args.run, args.profiler, top_ops=args.top_ops)
    else:
        run_ = load(args.run)
        for provider in asked:
            if not provider.recorded(run_):
                raise CliError(f"{args.run}: no {provider.name} recorded; "
                               f"{_record_with(run_.info, provider.text_flag)}")
        table = run_.summary(peak_tflops=args.peak_tflops)
    # Both tables offer the same forms; --top applies to every one of them.
    if args.csv:
        sys.stdout.write(table.to_csv(top=args.top))
    elif args.json and asked and isinstance(table, Summary):
        # a quantity's flag with --json: what its provider adds (--numerics: the per-step
        # history, hooktrace.analysis.numerics.history)
        import json

        doc = json.loads(table.to_json(top=args.top))
        for provider in asked:
            doc.update(provider.json_extra(run_))
        print(json.dumps(doc, ensure_ascii=False))
    elif args.json:
        print(table.to_json(top=args.top))
    elif isinstance(table, Summary):
        print(table.to_text(top=args.top, wide=args.wide, width=terminal_width(), **shown))
    else:
        print(table.to_text(top=args.top, wide=args.wide))


def _record_with(info: dict[str, Any], option: str) -> str:
    """How to record ``option`` (flops, memory, numerics) the way this run was recorded:
    ``hooktrace run --OPTION`` for a run of the process (hooktrace run, HOOKTRACE=1,
    global_trace; issue #47: it suggested trace(model, flops=True) there), else the API's
    keyword."""
    if info.get("scope") == "process":
        return (f"record with hooktrace run --{option} (with HOOKTRACE=1: "
                f"HOOKTRACE_OPTIONS=--{option})")
    return f"trace with hooktrace.trace(model, {option}=True) (or hooktrace run --{option})"


# What an aggregate= folder cannot give: its rows are per module and mode per window,
# with no calls, shapes or per-step tables inside (a kept step, DIR/steps/, can).
_NOT_FOR_AGGREGATES = (("by_shape", "--by-shape"), ("profiler", "--profiler"),
                       ("steps", "--steps"))


def _aggregate(args: argparse.Namespace) -> None:
    """``summary DIR`` of an ``aggregate=`` folder (or its parts): the table, or its
    rows as CSV or JSON (times in ms, as the aggregates hold them)."""
    import json

    from hooktrace.data.aggregates import (
        AGGREGATE_SUMMARY_COLUMNS,
        aggregate_summary,
        aggregate_summary_data,
    )
    from hooktrace.text import csv_text

    asked = [flag for name, flag in _NOT_FOR_AGGREGATES if getattr(args, name, None)]
    if asked:
        raise CliError(f"{args.run[0]}: {asked[0]} needs a trace; an aggregate= folder holds "
                       "rows per module and mode per window (summary one of its kept steps, "
                       "DIR/steps/, or hooktrace query the folder)")
    if args.json:
        doc = _finite(aggregate_summary_data(args.run[0], args.top))
        print(json.dumps(doc, ensure_ascii=False, allow_nan=False))
    elif args.csv:
        rows = aggregate_summary_data(args.run[0], args.top)["rows"]
        print(csv_text([{k: r[k] for k in AGGREGATE_SUMMARY_COLUMNS} for r in rows],
                       AGGREGATE_SUMMARY_COLUMNS), end="")
    else:
        print(aggregate_summary(args.run[0], args.top, wide=args.wide))


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity made None (JSON has neither)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _one_run_export(inp: Input) -> bool:
    """Whether ``inp`` is a Parquet export of one run (a file ``X.parquet``, or a folder
    of one run's tables); a folder of several runs' tables gets the ranks' tables."""
    if inp.kind is not Kind.EXPORT:
        return False
    from hooktrace.data.summary import runs_in_export

    return os.path.isfile(inp.path) or runs_in_export(inp.path) <= 1


def _run_ranks(args: argparse.Namespace) -> None:
    """The straggler tables over the ranks' files (hooktrace.analysis.stragglers)."""
    import warnings

    from hooktrace.analysis.stragglers import DEFAULT_MIN_EXCESS_NS, DEFAULT_THRESHOLD
    from hooktrace.data.paths import analyze  # (.htrace files, or a Parquet export)

    at_least("--top", args.top)
    if args.steps or args.csv:
        raise CliError("--steps and --csv are for one run; the ranks' tables are text or --json")
    at_least("--workers", args.workers)
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    min_excess = (DEFAULT_MIN_EXCESS_NS if args.min_excess_ms is None
                  else int(args.min_excess_ms * 1e6))
    if threshold < 0 or min_excess < 0:
        raise CliError("--threshold and --min-excess-ms must be at least 0")
    if min_excess > MAX_MIN_EXCESS_NS:
        raise CliError(f"--min-excess-ms must be at most {MAX_MIN_EXCESS_NS // 10**6} ms, got "
                       f"{args.min_excess_ms:g}")
    profilers = [args.profiler] if args.profiler is not None else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # problems are part of the report
        report = analyze(args.run, profilers=profilers, threshold=threshold,
                         min_excess_ns=min_excess, workers=args.workers)
    if args.json:
        print(report.to_json(top=args.top))
    else:
        print(report.to_text(top=args.top, wide=args.wide))
