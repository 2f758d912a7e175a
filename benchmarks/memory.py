"""The cost of memory per module call (``trace(model, memory=True)``), issue #12.

One process, variants interleaved round by round, min of N rounds, against no
tracing measured in the same run:

* ``hooktrace (time only)``: the forward bar, ``trace(model)``;
* ``hooktrace memory=True``: adds a memory sample after every event and counts
  every CPU allocation (hooktrace's counting allocator);
* ``profile_memory recipe``: what people use today for memory per module on
  CPU: ``record_function`` ranges from forward hooks under
  ``torch.profiler.profile(profile_memory=True)``.

The table gives the added ns per module call and ``vs time-only``: the added
cost over the forward bar's (issue #12's target: at most 2x).

    python benchmarks/memory.py            # full run (~1 min on 2 cores)
    python benchmarks/memory.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

import hooktrace
from overhead import (  # benchmarks/overhead.py
    FORWARD_BAR,
    forward_table,
    hooktrace_trace,
    identity_chain,
    linear_relu,
    no_tracing,
    tiny_gpt,
)


@contextlib.contextmanager
def profile_memory_recipe(model: nn.Module) -> Iterator[None]:
    handles = []
    stack: list[Any] = []
    for name, m in model.named_modules():
        def pre(_m: nn.Module, _a: Any, n: str = name) -> None:
            r = record_function(n or "root")
            r.__enter__()
            stack.append(r)

        def post(_m: nn.Module, _a: Any, _o: Any) -> None:
            stack.pop().__exit__(None, None, None)
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            yield
    finally:
        for h in handles:
            h.remove()


VARIANTS: dict[str, Callable[[nn.Module], contextlib.AbstractContextManager[Any]]] = {
    "none": no_tracing,
    "hooktrace (time only)": hooktrace_trace(**FORWARD_BAR),
    "hooktrace memory=True": hooktrace_trace(**FORWARD_BAR, memory=True),
    "profile_memory recipe": profile_memory_recipe,
}


MODELS = {
    "1000 x Identity (forward, no allocation)": identity_chain,
    "200 x (Linear+ReLU) (forward)": linear_relu,
    "TinyGPT 2 layers (forward)": tiny_gpt,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread")
    forward_table(VARIANTS, MODELS, rounds, 5 if args.quick else 40)


if __name__ == "__main__":
    main()
