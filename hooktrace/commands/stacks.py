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

    info = load(args.dump).info
    block = info.get("dump")
    if not isinstance(block, dict):
        raise CliError(f"{args.dump}: not a flight-recorder dump (no 'dump' metadata); "
                       "dumps are written by trace(dump_on=...) or hooktrace.dump()")
    print(f"dump ({block.get('reason')}) at step {block.get('step')}")
    for line in describe(info):
        print(line)
    for t in block.get("threads", []):
        if isinstance(t, dict) and t.get("open"):
            print(f"\n{t.get('name')} ({t.get('tid')}) module calls, outermost first:")
            for depth, name in enumerate(t["open"]):
                print("  " * (depth + 1) + str(name))
    stacks = block.get("python_stacks")
    if isinstance(stacks, dict):
        for thread, frames in stacks.items():
            print(f"\nPython stack of {thread}:")
            print("".join(str(f) for f in frames).rstrip())
