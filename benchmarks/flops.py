"""Cost of trace(model, flops=True) after the counted call: the root's signature
check (a Python pre/post hook on the root only). An 8-Linear MLP, batch 16, one
thread, forward + backward per step; best of two runs of 2,000 steps each.

    python benchmarks/flops.py
"""

from __future__ import annotations

import time

import torch
from torch import nn

import hooktrace


def main() -> None:
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])
    x = torch.randn(16, 64)
    per_step: dict[bool, list[float]] = {}
    for flops in (False, True, False, True):
        with hooktrace.trace(model, flops=flops) as tr:
            model(x).sum().backward()  # the counted call when flops=True
            tr.step()
            t = time.perf_counter()
            for _ in range(2000):
                model(x).sum().backward()
            per_step.setdefault(flops, []).append((time.perf_counter() - t) / 2000)
    for flops, times in per_step.items():
        print(f"flops={flops}: {min(times) * 1e6:.1f} us per step (best of {len(times)})")
    t = time.perf_counter()
    with hooktrace.trace(model, flops=True) as tr:
        model(x).sum().backward()
        tr.step()
    print(f"the counted step (FlopCounterMode): {(time.perf_counter() - t) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
