"""A one-hour run on <= 50 MB (issue #31): what a full stream (``out=``) and the
aggregate output with the default detail policy (``aggregate=DIR``: a row per module
and mode per second, every 10000th / slow / first non-finite step kept whole) write,
measured over a few seconds of training a small model, then extrapolated to one hour at
the measured rate. Also each variant's step time against the untraced loop (rounds
interleaved in one process).

    python benchmarks/long_run.py            # 3 rounds of 8 s per variant
    python benchmarks/long_run.py --quick    # 1 round of 3 s
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hooktrace


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(12)])


def train_for(m: nn.Module, seconds: float) -> tuple[int, float]:
    """Steps until ``seconds`` passed: (steps, elapsed seconds)."""
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    steps = 0
    while time.perf_counter() - t0 < seconds:
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
        steps += 1
    return steps, time.perf_counter() - t0


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, seconds = (1, 3.0) if args.quick else (3, 8.0)
    m = model()
    modules = len(list(m.modules()))
    train_for(m, 0.5)  # warm-up
    results: dict[str, list[tuple[int, float, dict[str, int]]]] = {}
    kept: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        def untraced(i: int) -> tuple[int, float, dict[str, int]]:
            steps, t = train_for(m, seconds)
            return steps, t, {}

        def stream(i: int) -> tuple[int, float, dict[str, int]]:
            out = Path(tmp) / f"full{i}.htrace"
            with hooktrace.trace(m, out=out):
                steps, t = train_for(m, seconds)
            return steps, t, {"all": size(out)}

        def aggregate(i: int) -> tuple[int, float, dict[str, int]]:
            agg = Path(tmp) / f"agg{i}"
            with hooktrace.trace(m, aggregate=agg) as tr:
                steps, t = train_for(m, seconds)
            kept.append(len(tr.info["aggregate"]["detail"]))
            return steps, t, {"all": size(agg), "rows": size(agg / "aggregates"),
                              "kept": size(agg / "steps")}

        variants: dict[str, Callable[[int], Any]] = {
            "untraced": untraced, "full stream (out=)": stream, "aggregate=": aggregate}
        for i in range(rounds):
            for name, run in variants.items():
                results.setdefault(name, []).append(run(i))
    print(f"12 x (Linear 32, ReLU): {modules} modules, forward + backward + SGD; {rounds} "
          f"round(s) of {seconds:.0f} s per variant, interleaved; steps kept whole by "
          f"aggregate= per round: {kept}")
    base = statistics.median(t / s for s, t, _ in results["untraced"])
    print(f"{'variant':<34}{'ms/step':>9}{'x untraced':>11}{'bytes/step':>12}"
          f"{'MB per hour':>13}")
    for name, runs in results.items():
        per_step = statistics.median(t / s for s, t, _ in runs)
        parts = [("", "all")] if name != "aggregate=" else [
            ("", "all"), ("  of which the Parquet rows", "rows"),
            ("  of which the steps kept whole", "kept")]
        for label, key in parts:
            nbytes = [sizes.get(key, 0) / s for s, _, sizes in runs]
            rate = [sizes.get(key, 0) / t * 3600 / 1e6 for _, t, sizes in runs]
            print(f"{label or name:<34}{per_step * 1e3:>9.3f}{per_step / base:>11.2f}"
                  f"{statistics.median(nbytes):>12.1f}{statistics.median(rate):>13.1f}")


if __name__ == "__main__":
    main()
