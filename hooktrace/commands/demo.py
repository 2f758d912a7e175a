"""``hooktrace demo``: train a built-in small GPT-style model under hooktrace."""

from __future__ import annotations

import argparse

from hooktrace.commands import at_least
from hooktrace.text import open_hint

NAME = "demo"
HELP = "trace a built-in small GPT-style model for a few steps"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="hooktrace-demo", help="output folder (default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="training steps (default: %(default)s)")
    p.add_argument("--flops", action="store_true",
                   help="record FLOPs per module too (trace(model, flops=True))")


def run(args: argparse.Namespace) -> None:
    from hooktrace.demo import run_demo

    at_least("--steps", args.steps)
    result = run_demo(args.out, steps=args.steps, flops=args.flops)
    print(f"trained TinyGPT for {args.steps} steps: loss {result.losses[0]:.3f} -> "
          f"{result.losses[-1]:.3f}\n")
    print(result.summary_text)
    print(f"\nwrote {result.htrace} and {result.chrome}")
    if result.report is not None:
        print(f"wrote {result.report}: open it in a web browser (it needs no network)")
    else:
        print(f"no HTML report: {result.report_error}")
    # (the .htrace is hooktrace's own file: Perfetto opens the JSON)
    print(f"{open_hint(str(result.chrome))}; or: hooktrace summary {result.htrace}")
