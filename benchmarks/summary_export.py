"""``hooktrace summary`` of a one-run Parquet export (hooktrace/data/summary.py, DuckDB)
against ``hooktrace summary`` of the ``.htrace`` it came from (numpy), on the same run,
in the same process: wall time per round.

The run: a 6-deep tree of Linear/ReLU modules trained ``--steps`` steps (forward and
backward spans), recorded once and saved; the export is ``hooktrace export RUN -o DIR/``.
Both summaries are computed whole (rows, steps, per-step module columns), as the CLI
does, and their rows are checked equal before any time is reported.

    python benchmarks/summary_export.py                # ~1 M events, 5 rounds
    python benchmarks/summary_export.py --steps 200 --rounds 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def build_run(steps: int, out: Path) -> int:
    import torch
    from torch import nn

    import hooktrace

    def block(depth: int) -> nn.Module:
        if depth == 0:
            return nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        return nn.Sequential(block(depth - 1), block(depth - 1))

    model = block(6)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2, 8)
    with hooktrace.trace(model, capacity=1 << 24) as tr:
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    tr.result.save(out)
    return len(tr.result.events)


def same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    a = [r for r in a if r["module"] != "<unattributed>" and not r.get("fused")]
    if [(r["module"], r["mode"]) for r in a] != [(r["module"], r["mode"]) for r in b]:
        return False
    for x, y in zip(a, b):
        for k, v in x.items():
            w = y.get(k)
            if isinstance(v, float) and isinstance(w, float):
                if not math.isclose(v, w, rel_tol=1e-9):
                    return False
            elif v != w:
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from hooktrace.cli import main as cli
    from hooktrace.data.summary import summary_of_export
    from hooktrace.result import load

    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run.htrace"
        events = build_run(args.steps, run)
        assert cli(["export", str(run), "-o", f"{d}/tables/"]) == 0
        times: dict[str, list[float]] = {"htrace (numpy)": [], "parquet (duckdb)": []}
        rows: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for what, fn in (("htrace (numpy)", lambda: load(run).summary()),
                             ("parquet (duckdb)", lambda: summary_of_export(f"{d}/tables"))):
                t0 = time.perf_counter()
                s = fn()
                times[what].append(time.perf_counter() - t0)
                rows[what] = s.rows
        assert same_rows(rows["htrace (numpy)"], rows["parquet (duckdb)"]), "rows differ"
        size = sum(p.stat().st_size for p in Path(d, "tables").iterdir())
        print(f"{events:,} events, {args.steps} steps; .htrace {run.stat().st_size / 2**20:.1f} MiB, "
              f"Parquet {size / 2**20:.1f} MiB; {args.rounds} rounds; rows equal")
        base = statistics.median(times["htrace (numpy)"])
        print(f"{'summary of':<20}{'median s':>10}{'min s':>9}{'vs htrace':>11}")
        for what, t in times.items():
            print(f"{what:<20}{statistics.median(t):>10.3f}{min(t):>9.3f}"
                  f"{statistics.median(t) / base:>10.2f}x")


if __name__ == "__main__":
    main()
