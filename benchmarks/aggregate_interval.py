"""What ``aggregate_interval=0`` (a row per module and mode for every step) costs per
step, against the default window (``aggregate_interval=1.0``: a row per second) and the
untraced loop (issue #38: ~0.7 ms per step on a 26-module MLP was reported).

Rounds are interleaved in one process; each variant's per-step time is the median over
rounds of (round time / steps); the extra is against the untraced loop of the same run.

    python benchmarks/aggregate_interval.py            # 9 rounds of 400 steps
    python benchmarks/aggregate_interval.py --quick    # 2 rounds of 150 steps
    python benchmarks/aggregate_interval.py --profile  # cProfile of interval=0's steps
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import hooktrace


def model() -> nn.Module:
    """26 modules: the root and 25 layers."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(12):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    layers.append(nn.Linear(32, 1))
    return nn.Sequential(*layers)


def steps(m: nn.Module, n: int) -> float:
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    for _ in range(n):
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rounds, n = (2, 150) if args.quick else (args.rounds, 400)
    m = model()
    print(f"{len(list(m.modules()))} modules, {rounds} rounds of {n} steps, "
          f"torch {torch.__version__}")
    steps(m, 50)  # warm-up
    tmp = Path(tempfile.mkdtemp())

    def untraced() -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def agg(interval: float) -> Callable[[int], contextlib.AbstractContextManager[object]]:
        def make(i: int) -> contextlib.AbstractContextManager[object]:
            return hooktrace.trace(m, aggregate=tmp / f"agg{interval}-{i}", detail="every=0",
                                   aggregate_interval=interval)
        return make

    variants: dict[str, Callable[[int], contextlib.AbstractContextManager[object]]] = {
        "untraced": lambda i: untraced(),
        "trace() in memory": lambda i: hooktrace.trace(m),
        "aggregate_interval=1.0": agg(1.0),
        "aggregate_interval=0": agg(0.0),
    }
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        with agg(0.0)(99):
            prof.enable()
            steps(m, n)
            prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        return
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for name, make in variants.items():
            with make(r):
                times[name].append(steps(m, n) / n)
    base = statistics.median(times["untraced"])
    print(f"{'variant':<26}{'ms/step':>10}{'extra ms/step':>15}{'extra':>9}")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"{name:<26}{med * 1e3:>10.3f}{(med - base) * 1e3:>15.3f}"
              f"{(med / base - 1) * 100:>8.1f}%")




if __name__ == "__main__":
    main()
