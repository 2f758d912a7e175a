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

__all__ = ["CliError", "OPEN_HINT", "all_commands", "at_least", "write_ranks_merged"]


class CliError(HooktraceError):
    """A bad command-line argument or request, reported as one line."""


def at_least(flag: str, value: int | None, minimum: int = 1) -> None:
    """:class:`CliError` when option ``flag`` was given a ``value`` below ``minimum``."""
    if value is not None and value < minimum:
        raise CliError(f"{flag} must be at least {minimum}, got {value}")


def write_ranks_merged(inputs: list[str], output: str, profilers: list[str],
                       workers: int | None) -> None:
    """Many ranks on one timeline, written to ``output`` (Chrome JSON), with what was
    wrong printed one line each: ``merge-ranks``, and ``export`` given many ranks.
    (Verbs share helpers here; a verb never calls another verb.)"""
    import warnings

    from hooktrace._output import check_output_path
    from hooktrace.exporters.formats import CHROME, output_format
    from hooktrace.exporters.ranks import merge_ranks

    at_least("--workers", workers)
    check_output_path(output, inputs)  # (a directory, an input: said first)
    if output_format(output) is not CHROME:
        raise CliError(f"{output}: only Chrome JSON is written for many ranks yet; write "
                       ".json or .json.gz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the problems are printed below, one line each
        r = merge_ranks(inputs, output, profilers=profilers, workers=workers)
    for line in r.problems:
        print(f"hooktrace: warning: {line}")
    with_prof = sum(1 for e in r.ranks if "profiler" in e)
    prof = f" ({with_prof} with their profiler events)" if with_prof else ""
    print(f"wrote {output}: {len(r.ranks)} ranks{prof}, one process each; {OPEN_HINT}")


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
        top,
    )

    return [run, attach, top, demo, export, summary, diff, report, merge, merge_ranks, query,
            stacks]
