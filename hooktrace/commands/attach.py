"""``hooktrace attach PID -o OUT --steps N`` (or ``--seconds S``; ``--ranks PID`` for a
torchrun job): record a running process for a few steps, then leave it as it was.

Needs ptrace rights over the process and, before Python 3.14, gdb on PATH; the
target must run the same hooktrace. See :mod:`hooktrace.record.attach` (what is checked,
how it injects) and :mod:`hooktrace.record.attach_agent` (what runs in the target).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hooktrace._args import finite_float
from hooktrace.commands import CliError, at_least
from hooktrace.record.attach import AttachRequest, attach, worker_pids
from hooktrace.record.launch import add_options, options_from_args
from hooktrace.text import printable

NAME = "attach"
HELP = "record a running Python process (PID) for a few steps, then detach"

# hooktrace run's flags attach does without: windows and the profiler start with the
# process; --steps is attach's own (how many optimizer steps to record)
LEFT_OUT = ("schedule", "profile", "steps")
# the options holding a path: made absolute here (the target has its own cwd)
PATHS = ("output", "chrome", "pftrace", "aggregate", "dump_dir")
DEFAULT_TIMEOUT_S = 600.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pid", type=int, metavar="PID",
                   help="the process to attach to (with --ranks: torchrun's)")
    p.add_argument("--ranks", action="store_true",
                   help="PID is a torchrun agent: attach to each of its workers, one file "
                        "per rank (OUT_rank<R>.htrace, as torchrun -m hooktrace run)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--steps", dest="stop_steps", type=int, metavar="N", default=None,
                      help="record N optimizer steps after the one the attach lands in "
                           "(default: 3 unless --seconds)")
    stop.add_argument("--seconds", dest="stop_seconds", type=finite_float, metavar="S",
                      default=None, help="record for S seconds")
    p.add_argument("--timeout", type=finite_float, metavar="S", default=DEFAULT_TIMEOUT_S,
                   help="give up waiting after S seconds whatever the steps (a job that never "
                        "steps, or blocked in a call); the recording ends shortly before, so "
                        "that the job can write it (default: "
                        f"{DEFAULT_TIMEOUT_S:.0f})")
    add_options(p, leave_out=LEFT_OUT)


def run(args: argparse.Namespace) -> int:
    steps = args.stop_steps if args.stop_steps is not None or args.stop_seconds else 3
    at_least("--steps", steps)
    if args.stop_seconds is not None and args.stop_seconds <= 0:
        raise CliError(f"--seconds must be positive, got {args.stop_seconds}")
    if args.timeout <= 0:
        raise CliError(f"--timeout must be positive, got {args.timeout}")
    options = {k: v for k, v in vars(args).items() if k not in ("func", "command", "pid")}
    for name in PATHS:
        value = options.get(name)
        if value == "-":  # (the job's own standard output)
            raise CliError(f"--{name.replace('_', '-')} -: the trace would go into the job's "
                           "own output; give a file")
        if isinstance(value, str):
            folder = value.endswith(("/", os.sep)) or os.path.isdir(value)
            options[name] = os.path.abspath(value) + (os.sep if folder else "")
    if options.get("output") is None:
        options["output"] = os.getcwd() + os.sep  # the default name, here
    # checked here first: a bad option never reaches the target (argparse.Namespace:
    # what the target rebuilds from the request)
    options_from_args(argparse.Namespace(**options))
    output = str(options["output"])
    status_dir = Path(output if output.endswith(os.sep) or os.path.isdir(output)
                      else os.path.dirname(output))
    status_dir.mkdir(parents=True, exist_ok=True)
    pids = worker_pids(args.pid) if args.ranks else [args.pid]
    request = AttachRequest(options=options, steps=steps, seconds=args.stop_seconds,
                            timeout=args.timeout)
    outcomes = attach(pids, request, status_dir)
    failed = interrupted = 0
    for o in outcomes:
        # (what the job wrote is text: a hostile job's escapes are shown, never run)
        if o.state == "interrupted":  # Ctrl-C: one line per process, nothing else
            interrupted += 1
            print(f"hooktrace: {printable(str(o.status.get('message')))}", file=sys.stderr)
            continue
        for line in o.status.get("lines", []):
            print(printable(line), file=sys.stderr)
        if o.state == "error":
            failed += 1
            print(f"hooktrace: error: {printable(str(o.status.get('message')))}",
                  file=sys.stderr)
        else:
            # (step 0, the one the attach landed in, is partial: not counted as a step)
            whole = max(0, int(o.status.get("steps", 0)) - 1)
            print(f"hooktrace: process {o.pid}: {whole} steps recorded after the partial one "
                  "the attach landed in; detached", file=sys.stderr)
    return 130 if interrupted else 1 if failed else 0
