"""``hooktrace merge RUN PROFILER -o OUT``: module spans onto torch.profiler's timeline."""

from __future__ import annotations

import argparse

from hooktrace.commands import OPEN_HINT, CliError

NAME = "merge"
HELP = "add a run's module spans to a torch.profiler trace"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the .htrace file")
    p.add_argument("profiler", help="the torch.profiler Chrome trace (.json or .json.gz)")
    p.add_argument("-o", "--output", required=True, help="OUT.json, or OUT.json.gz to compress")


def run(args: argparse.Namespace) -> None:
    from hooktrace._output import check_output_path
    from hooktrace.exporters.formats import CHROME, output_format
    from hooktrace.exporters.merged import merge_traces

    check_output_path(args.output, [args.run, args.profiler])  # (a directory: said first)
    if output_format(args.output) is not CHROME:  # (an unknown suffix: said there)
        raise CliError(f"{args.output}: merge writes Chrome JSON only (the profiler's "
                       "events are JSON); write .json or .json.gz")

    r = merge_traces(args.run, args.profiler, args.output)
    moved = f", {r.adjacent} on adjacent tracks" if r.adjacent else ""
    clipped = f"; {r.clipped} clipped and {r.outside_window} outside the profiler window" if (
        r.clipped or r.outside_window) else ""
    print(f"wrote {args.output}: {r.profiler_events} profiler events + "
          f"{r.shared + r.adjacent} forward spans ({r.shared} on the profiler's thread rows"
          f"{moved}) and {r.backward} backward spans{clipped}; {OPEN_HINT}")
