"""Time of ``hooktrace diff`` and ``hooktrace report`` on a big synthetic run.

The run: ``--steps`` training steps, each one root call with 50 blocks of 10 leaf
modules (561 module calls per step, nested 3 deep), then a step mark; run B has
one leaf 50% slower. Timed end to end from the .htrace files (load, pairing,
statistics, output), best of ``--repeat``.

    python benchmarks/diff_report.py               # 2,000 steps: 1.1 M spans per run
    python benchmarks/diff_report.py --steps 200
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, STEP, Clock
from hooktrace.analysis.diff import compare
from hooktrace.reading import TraceData, load
from hooktrace.reporters.html import render_report

BLOCKS, LEAVES = 50, 10


def synthetic_run(steps: int, slow_leaf: int | None = None) -> TraceData:
    modules = [("", "Net")]
    for b in range(BLOCKS):
        modules.append((f"blocks.{b}", "Block"))
        modules += [(f"blocks.{b}.{j}", "Linear") for j in range(LEAVES)]
    # one step's events: (kind, slot, duration to the next event in ns)
    kind, slot, gap = [ENTER], [0], [100]
    for b in range(BLOCKS):
        bs = 1 + b * (LEAVES + 1)
        kind.append(ENTER)
        slot.append(bs)
        gap.append(50)
        for j in range(LEAVES):
            leaf = bs + 1 + j
            kind += [ENTER, EXIT]
            slot += [leaf, leaf]
            gap += [1500 if leaf == slow_leaf else 1000, 20]
        kind.append(EXIT)
        slot.append(bs)
        gap.append(30)
    kind += [EXIT, STEP]
    slot += [0, 0]
    gap += [200, 10]
    per = len(kind)
    ev = np.zeros(per * steps, EVENT_DTYPE)
    ev["kind"] = np.tile(kind, steps)
    ev["id"] = np.tile(slot, steps)
    gaps = np.tile(gap, steps)  # gap[i]: from event i to event i + 1
    ev["t"] = np.concatenate([[0], np.cumsum(gaps)[:-1]])
    marks = ev["kind"] == STEP
    ev["seq"][marks] = np.arange(steps)
    ev["tid"] = ev["rf_tid"] = 1
    return TraceData(ev, modules, [], Clock(0, 0, 1.0),
                     {"pid": 1, "hostname": "bench", "dropped_events": 0,
                      "overwritten_events": 0})


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "a.htrace"), os.path.join(d, "b.htrace")
        synthetic_run(args.steps).save(a)
        synthetic_run(args.steps, slow_leaf=2 + 17 * (LEAVES + 1)).save(b)
        spans = len(load(a).spans())
        t_diff = best(lambda: compare(load(a), load(b)).to_text(), args.repeat)
        d_ = compare(load(a), load(b))
        t_report = best(lambda: render_report(load(a), source=a), args.repeat)
        size = len(render_report(load(a), source=a).encode())
    print(f"{spans:,} spans per run ({args.steps} steps, {BLOCKS * (LEAVES + 1) + 1} modules)")
    print(f"diff (load both, compare, text): {t_diff:.3f} s; first row: "
          f"{d_.rows[0]['module']} {d_.rows[0]['p50_change_pct']:+.1f}%")
    print(f"report (load, summary, HTML):    {t_report:.3f} s; {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
