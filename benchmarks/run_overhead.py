"""Per-module-call cost of the global mode (``hooktrace run``, issue #10).

The same harness and models as overhead.py (one process, variants interleaved
round by round, min of N rounds): no tracing, the per-model ``hooktrace.trace``
and ``hooktrace.global_trace()`` (what ``hooktrace run`` and
HOOKTRACE=1 install). Each variant runs one warm-up call inside its block first,
so the global mode's one-off first call per module (naming it) is not timed.

    python benchmarks/run_overhead.py            # ~1 min on 2 cores
    python benchmarks/run_overhead.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

import torch
from torch import nn

import hooktrace
from hooktrace import global_trace
from overhead import MODELS, Installer, bench, hooktrace_trace, linear_relu, no_tracing


@contextlib.contextmanager
def global_mode(model: nn.Module, backward: bool = True) -> Iterator[None]:
    with global_trace(backward=backward):
        yield


VARIANTS: dict[str, Installer] = {
    "none": no_tracing,
    "trace(model)": hooktrace_trace(),
    "global (hooktrace run)": global_mode,
}
TRAIN_VARIANTS: dict[str, Installer] = {
    "none": no_tracing,
    "trace(model), with backward": hooktrace_trace(),
    "global, --no-backward": lambda m: global_mode(m, backward=False),
    "global, with backward": global_mode,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread")
    print("('vs recipe' below is against trace(model)'s added time)")
    for name, make in MODELS.items():
        inner = 5 if args.quick else (30 if "Identity" in name else 50)
        model, run, calls = make()
        bench(name, VARIANTS, "trace(model)", model, run, calls, rounds, inner, grad=False)
    torch.manual_seed(0)
    model, forward, calls = linear_relu()

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        forward().sum().backward()

    bench("200 x (Linear+ReLU) training step (forward + backward)", TRAIN_VARIANTS,
          "trace(model), with backward", model, step, calls, rounds,
          3 if args.quick else 20, grad=True)


if __name__ == "__main__":
    main()
