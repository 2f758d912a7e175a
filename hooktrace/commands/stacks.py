"""``hooktrace stacks DUMP.htrace``: where every thread was when a dump was taken."""

from __future__ import annotations

import argparse

from hooktrace.commands import CliError

NAME = "stacks"
HELP = "print a flight-recorder dump's open module calls and Python stacks"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dump", help="a dump written by trace(dump_on=...) or hooktrace.dump()")


def run(args: argparse.Namespace) -> None:
    from hooktrace.record.flight import describe
    from hooktrace.reading import load
    from hooktrace.text import text_lines

    # (the loader checked the dump block's types: hooktrace.format.validate)
    info = load(args.dump).info
    block = info.get("dump")
    if not isinstance(block, dict):
        raise CliError(f"{args.dump}: not a flight-recorder dump (no 'dump' metadata); "
                       "dumps are written by trace(dump_on=...) or hooktrace.dump()")
    lines = [f"dump ({block.get('reason')}) at step {block.get('step')}", *describe(info)]
    for t in block.get("threads", []):
        if t.get("open"):
            lines += ["", f"{t.get('name')} ({t.get('tid')}) module calls, outermost first:"]
            lines += ["  " * (depth + 1) + name for depth, name in enumerate(t["open"])]
    for thread, frames in (block.get("python_stacks") or {}).items():
        # a frame's text is lines of its own: each printed as one (its control
        # characters, a dump's strings among them, written visibly as summary does)
        lines += ["", f"Python stack of {thread}:", *"".join(frames).rstrip().splitlines()]
    print(text_lines(lines))
