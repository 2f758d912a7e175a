"""The ``hooktrace`` command line (also ``python -m hooktrace``).

Example::

    hooktrace demo --out out/demo
    hooktrace summary out/demo/demo.htrace --top 10
    hooktrace export out/demo/demo.htrace -o trace.json.gz
    hooktrace merge run.htrace profiler.json.gz -o merged.json.gz
    hooktrace summary run.htrace --profiler profiler.json.gz --top-ops 3
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from hooktrace.attribution import Attribution
    from hooktrace.summary import Summary

OPEN_HINT = (
    "open it at https://ui.perfetto.dev (Open trace file) or in chrome://tracing (Load)"
)


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"hooktrace: error: {message} (see 'hooktrace --help')\n")


class CliError(Exception):
    """A failure to report as one line on stderr with exit code 1."""


def _cmd_demo(args: argparse.Namespace) -> None:
    from hooktrace.demo import run_demo

    if args.steps < 1:
        raise CliError(f"--steps must be at least 1, got {args.steps}")
    result = run_demo(args.out, steps=args.steps)
    print(f"trained TinyGPT for {args.steps} steps: loss {result.losses[0]:.3f} -> "
          f"{result.losses[-1]:.3f}\n")
    print(result.summary_text)
    print(f"\nwrote {result.htrace} and {result.chrome}")
    print(f"{OPEN_HINT}; or: hooktrace summary {result.htrace}")


def _cmd_export(args: argparse.Namespace) -> None:
    from hooktrace._output import check_output_path, open_output
    from hooktrace.chrome import write_chrome
    from hooktrace.reading import load

    check_output_path(args.output, [args.run])
    run = load(args.run)
    with open_output(args.output, inputs=[args.run]) as f:
        write_chrome(run, f, nodes=args.nodes)
    if args.output != "-":
        print(f"wrote {args.output}: {len(run.spans())} spans; {OPEN_HINT}")


def _cmd_merge(args: argparse.Namespace) -> None:
    from hooktrace.merge import merge_traces

    r = merge_traces(args.run, args.profiler, args.output)
    moved = f", {r.adjacent} on adjacent tracks" if r.adjacent else ""
    clipped = f"; {r.clipped} clipped and {r.outside_window} outside the profiler window" if (
        r.clipped or r.outside_window) else ""
    print(f"wrote {args.output}: {r.profiler_events} profiler events + "
          f"{r.shared + r.adjacent} forward spans ({r.shared} on the profiler's thread rows"
          f"{moved}) and {r.backward} backward spans{clipped}; {OPEN_HINT}")


def _cmd_summary(args: argparse.Namespace) -> None:
    from hooktrace.reading import load

    if args.top is not None and args.top < 1:
        raise CliError(f"--top must be at least 1, got {args.top}")
    if args.top_ops < 0:
        raise CliError(f"--top-ops must be at least 0, got {args.top_ops}")
    table: Summary | Attribution
    if args.profiler is not None:
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


def build_parser() -> argparse.ArgumentParser:
    from hooktrace import __version__

    p = _Parser(prog="hooktrace", description="Low-overhead per-module tracing for PyTorch.")
    p.add_argument("--version", action="version",
                   version=f"hooktrace {__version__} (torch {_torch_version()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser("demo", help="trace a built-in small GPT-style model for a few steps")
    d.add_argument("--out", default="hooktrace-demo", help="output folder (default: %(default)s)")
    d.add_argument("--steps", type=int, default=5, help="training steps (default: %(default)s)")
    d.set_defaults(func=_cmd_demo)

    e = sub.add_parser("export", help="convert a .htrace file to Chrome trace JSON")
    e.add_argument("run", help="the .htrace file")
    e.add_argument("-o", "--output", required=True,
                   help="OUT.json, OUT.json.gz to compress, or - for standard output")
    e.add_argument("--nodes", action="store_true",
                   help="also write every autograd node under its module's backward span")
    e.set_defaults(func=_cmd_export)

    s = sub.add_parser("summary", help="per-module time table of a .htrace file")
    s.add_argument("run", help="the .htrace file")
    s.add_argument("--top", type=int, default=None,
                   help="only the N rows with most time (all output forms)")
    s.add_argument("--wide", action="store_true",
                   help="every column (the default table fits 120 columns)")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV instead of a table (times in ns)")
    fmt.add_argument("--json", action="store_true", help="JSON instead of a table (times in ns)")
    s.add_argument("--profiler", metavar="PROFILER.json[.gz]", default=None,
                   help="attribute this torch.profiler trace's ops (and kernels) to modules")
    s.add_argument("--top-ops", type=int, default=3,
                   help="with --profiler: ops listed per module (default: %(default)s)")
    s.set_defaults(func=_cmd_summary)

    m = sub.add_parser("merge", help="add a run's module spans to a torch.profiler trace")
    m.add_argument("run", help="the .htrace file")
    m.add_argument("profiler", help="the torch.profiler Chrome trace (.json or .json.gz)")
    m.add_argument("-o", "--output", required=True, help="OUT.json, or OUT.json.gz to compress")
    m.set_defaults(func=_cmd_merge)
    return p


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `hooktrace`: say what there is to run
        parser.print_help()
        return 2
    from hooktrace.errors import HooktraceError

    try:
        args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`hooktrace summary RUN | head`): not an error.
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CliError, HooktraceError) as e:
        print(f"hooktrace: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"hooktrace: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
