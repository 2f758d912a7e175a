"""The ``hooktrace`` command line (also ``python -m hooktrace``): parse and dispatch.

Each verb lives in its own module under :mod:`hooktrace.commands`.

Example::

    hooktrace demo --out out/demo
    hooktrace summary out/demo/demo.htrace --top 10
    hooktrace export out/demo/demo.htrace -o trace.json.gz
    hooktrace merge run.htrace profiler.json.gz -o merged.json.gz
    hooktrace summary run.htrace --profiler profiler.json.gz --top-ops 3
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from hooktrace.commands import CliError, all_commands
from hooktrace.errors import HooktraceError
from hooktrace.text import printable

__all__ = ["CliError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"hooktrace: error: {message} (see 'hooktrace --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from hooktrace._version import __version__

    p = _Parser(prog="hooktrace", description="Low-overhead per-module tracing for PyTorch.")
    p.add_argument("--version", action="version",
                   version=f"hooktrace {__version__} (torch {_torch_version()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in all_commands():
        c = sub.add_parser(command.NAME, help=command.HELP)
        command.add_arguments(c)
        c.set_defaults(func=command.run)
    return p


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    # File names that are not UTF-8 (lone surrogates in Python) print as \xNN escapes,
    # as stderr does, rather than failing a strict UTF-8 stdout in mid-output
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    parser = build_parser()
    try:
        # (parsing may load the reading side: `summary`'s flags are its column providers')
        args = parser.parse_args(argv)
        if args.command is None:  # bare `hooktrace`: say what there is to run
            parser.print_help()
            return 2
        # a verb returns an exit status when it has a verdict (`diff --fail-above`)
        status = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`hooktrace summary RUN | head`): not an error.
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CliError, HooktraceError) as e:
        # (one line: a name from a file may hold a newline or an escape sequence)
        print(f"hooktrace: error: {printable(str(e))}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"hooktrace: error: {printable(f'{e.strerror or e}{where}')}", file=sys.stderr)
        return 1
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
