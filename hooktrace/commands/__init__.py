"""The command line's verbs, one module each (``hooktrace <verb> ...``).

Each module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args)``;
``hooktrace.cli`` only builds the parser from them and dispatches. A failure is
raised as :class:`CliError` or a :class:`~hooktrace.errors.HooktraceError`,
which the CLI prints as one line (exit code 1).
"""

from __future__ import annotations

from types import ModuleType

from hooktrace.errors import HooktraceError
from hooktrace.text import OPEN_HINT

__all__ = ["CliError", "OPEN_HINT", "all_commands"]


class CliError(HooktraceError):
    """A bad command-line argument or request, reported as one line."""


def all_commands() -> list[ModuleType]:
    """The verb modules, in the order ``hooktrace --help`` lists them."""
    from hooktrace.commands import (
        attach,
        demo,
        diff,
        export,
        merge,
        merge_ranks,
        query,
        report,
        run,
        stacks,
        summary,
    )

    return [run, attach, demo, export, summary, diff, report, merge, merge_ranks, query, stacks]
