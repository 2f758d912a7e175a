"""The cost of shapes per module call (``trace(model, shapes=True)``), issue #19.

One process, variants interleaved round by round, min of N rounds, against no
tracing measured in the same run:

* ``hooktrace (time only)``: the forward bar, ``trace(model)``;
* ``hooktrace shapes=True``: adds the walk of every call's arguments and result,
  a hash of each tensor's dtype and sizes, and a thread-local cache lookup;
* ``shape hooks recipe``: forward hooks that record ``[tuple(t.shape) ...]`` of the
  inputs and outputs per call (the ``VerboseExecution`` pattern, kept in a list).

The table gives the added ns per module call; ``shapes - time-only`` is what shapes
add on top of the forward bar (issue #19's target: at most 100 ns on 1000 x Identity).

    python benchmarks/shapes.py            # full run (~1 min on 2 cores)
    python benchmarks/shapes.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

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
def shape_hooks(model: nn.Module) -> Iterator[None]:
    log: list[Any] = []

    def hook(m: nn.Module, args: Any, out: Any) -> None:
        log.append(([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
                    tuple(out.shape) if isinstance(out, torch.Tensor) else None))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


VARIANTS: dict[str, Callable[[nn.Module], contextlib.AbstractContextManager[Any]]] = {
    "none": no_tracing,
    "hooktrace (time only)": hooktrace_trace(**FORWARD_BAR),
    "hooktrace shapes=True": hooktrace_trace(**FORWARD_BAR, shapes=True),
    "shape hooks recipe": shape_hooks,
}

MODELS = {
    "1000 x Identity (forward)": identity_chain,
    "200 x (Linear+ReLU) (forward)": linear_relu,
    "TinyGPT 2 layers (forward)": tiny_gpt,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread")
    forward_table(VARIANTS, MODELS, rounds, 5 if args.quick else 40)


if __name__ == "__main__":
    main()
