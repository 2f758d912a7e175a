"""Many ranks at scale (issue #11): straggler summary over synthetic rank files.

    python benchmarks/ranks.py --ranks 256 --events 1000000 --dir /tmp/ranks [--workers 2]

Writes RANKS files of EVENTS events each (forward spans: a root and 63 child modules
called in turn, 50 steps, one rank made slow in one module at one step), then times
``hooktrace.stragglers.analyze`` over the directory in a fresh process and reports its
wall time, the parent's peak RSS and the largest worker's peak RSS. The files are
kept (``--keep``) or removed. Generation is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

MODULES = [("", "Net")] + [(f"layers.{i}", "Linear") for i in range(63)]
STEPS = 50
T0 = 1_790_000_000 * 10**9


def write_rank(path: Path, rank: int, world: int, n_events: int) -> None:
    from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, STEP, Clock
    from hooktrace.format import write_trace

    per_step = max((n_events - STEPS) // STEPS // 2 - 1, 1)  # child calls per step
    calls = per_step + 1
    n = STEPS * (2 * calls + 1)
    ev = np.zeros(n, EVENT_DTYPE)
    kind = np.empty((STEPS, 2 * calls + 1), np.uint8)
    ids = np.zeros((STEPS, 2 * calls + 1), np.uint32)
    kind[:, 0], kind[:, -2], kind[:, -1] = ENTER, EXIT, STEP
    kind[:, 1:-2:2], kind[:, 2:-2:2] = ENTER, EXIT
    child = 1 + np.arange(per_step) % (len(MODULES) - 1)
    ids[:, 1:-2:2] = child
    ids[:, 2:-2:2] = child
    dt = np.full((STEPS, 2 * calls + 1), 100, np.uint64)  # 100 ns between events
    if rank == world // 2:  # the straggler: module layers.5, step 7, +5 ms
        dt[7, 2 + 2 * 5] += 5_000_000
    ev["kind"] = kind.ravel()
    ev["id"] = ids.ravel()
    ev["t"] = np.cumsum(dt.ravel())
    ev["tid"] = 1000
    seq = np.zeros((STEPS, 2 * calls + 1), np.uint64)
    seq[:, -1] = np.arange(STEPS)
    ev["seq"] = seq.ravel()
    info = {"pid": 10_000 + rank, "hostname": f"node{rank // 8}", "dropped_events": 0,
            "overwritten_events": 0, "rank": rank, "world_size": world,
            "start_unix_ns": T0, "stop_unix_ns": T0 + int(ev["t"][-1]) + 1000,
            "clock_offset_ns": 0, "clock_offset_uncertainty_ns": 0}
    write_trace(path, ev, MODULES, [], Clock(0, T0, 1.0), info)


def _descendants_peak_kib(stop: threading.Event, peak: list[int]) -> None:
    """Polls /proc: the workers are children of the forkserver, not of this process, so
    RUSAGE_CHILDREN never sees them; their VmHWM is read while they live."""
    me = os.getpid()
    while not stop.wait(0.2):
        parent: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    pass
        for pid in parent:
            p, depth = pid, 0
            while p in parent and p != me and depth < 4:
                p, depth = parent[p], depth + 1
            if p == me and pid != me:
                try:
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                peak[0] = max(peak[0], int(line.split()[1]))
                except OSError:
                    pass


def measure(directory: str, workers: int | None) -> None:
    from hooktrace.stragglers import analyze

    stop, peak = threading.Event(), [0]
    poller = threading.Thread(target=_descendants_peak_kib, args=(stop, peak), daemon=True)
    poller.start()
    t = time.perf_counter()
    report = analyze([directory], workers=workers)
    wall = time.perf_counter() - t
    stop.set()
    poller.join()
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = peak[0] / 1024
    print(json.dumps({"wall_s": round(wall, 2), "parent_peak_mib": round(me),
                      "worker_peak_mib": round(kids), "ranks": len(report.ranks),
                      "stragglers": [(s["rank"], s["module"], s["step"])
                                     for s in report.stragglers[:3]]}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--dir", default="/tmp/hooktrace-ranks-bench")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure_only:
        measure(args.dir, args.workers)
        return
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    for r in range(args.ranks):
        path = d / f"run.rank{r}.htrace"
        if not path.exists():
            write_rank(path, r, args.ranks, args.events)
    size = sum(f.stat().st_size for f in d.glob("*.htrace"))
    print(f"{args.ranks} ranks x {args.events} events: {size / 2**30:.2f} GiB written in "
          f"{time.perf_counter() - t:.0f} s")
    cmd = [sys.executable, __file__, "--measure-only", "--dir", str(d)]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout.strip() or r.stderr[-2000:])
    if not args.keep:
        shutil.rmtree(d)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
