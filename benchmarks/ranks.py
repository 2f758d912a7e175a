"""Many ranks at scale (issues #11, #29): straggler summary over synthetic rank files.

    python benchmarks/ranks.py --ranks 256 --events 1000000 --dir /tmp/ranks [--workers 2]
        [--engines pool,parquet,diff-pool,diff-parquet]

Writes RANKS files of EVENTS events each (forward spans: a root and 63 child modules
called in turn, 50 steps, one rank made slow in one module at one step), then times
``hooktrace.analysis.stragglers.analyze`` over the directory in a fresh process per engine and
reports its wall time, the parent's peak RSS and the largest worker's peak RSS:

* ``pool``: the worker processes of issue #11 (numpy per rank, ``map_ranks``), end to
  end from the ``.htrace`` files;
* ``parquet``: the ranks exported once (``hooktrace export DIR -o OUT/``: its time and
  size printed apart) and the straggler summary run by DuckDB over that Parquet dataset,
  end to end from the dataset.

``diff-pool`` times ``hooktrace diff DIR DIR`` (every file read once, by the worker
pool), ``diff-parquet`` the diff of the Parquet export with itself (DuckDB; issue #29).
Each kind's reports must be equal (checked). (The DuckDB copies of the ``.htrace``
reductions, ``duckdb`` and ``diff-duckdb``, were slower than the pool at several times
its memory and were dropped: issue #37, RESULTS.md.) The files are kept (``--keep``) or
removed. Generation is not timed.
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
ENGINES = ("pool", "parquet", "diff-pool", "diff-parquet")
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


def measure(directory: str, workers: int | None, engine: str) -> None:
    from hooktrace.analysis.stragglers import analyze

    if engine.startswith("diff-"):
        measure_diff(directory, workers, engine)
        return
    stop, peak = threading.Event(), [0]
    poller = threading.Thread(target=_descendants_peak_kib, args=(stop, peak), daemon=True)
    poller.start()
    t = time.perf_counter()
    report = analyze([directory], workers=workers)  # (parquet: the export, on DuckDB)
    wall = time.perf_counter() - t
    stop.set()
    poller.join()
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = peak[0] / 1024
    import hashlib

    doc = json.loads(report.to_json())
    for r in doc["ranks"]:  # the parquet engine's paths are the .htrace paths too
        r.pop("path", None)
    digest = hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    print(json.dumps({"engine": engine, "wall_s": round(wall, 2), "parent_peak_mib": round(me),
                      "worker_peak_mib": round(kids), "ranks": len(report.ranks),
                      "stragglers": [(s["rank"], s["module"], s["step"])
                                     for s in report.stragglers[:3]], "report": digest}))


def measure_diff(directory: str, workers: int | None, engine: str) -> None:
    """``hooktrace diff DIR DIR`` (every rank file read once): ``diff-pool`` from the
    ``.htrace`` files (numpy in worker processes), ``diff-parquet`` from their Parquet
    export (DuckDB)."""
    import hashlib

    from hooktrace.analysis.diff import compare_paths

    stop, peak = threading.Event(), [0]
    poller = threading.Thread(target=_descendants_peak_kib, args=(stop, peak), daemon=True)
    poller.start()
    t = time.perf_counter()
    d = compare_paths(directory, directory, workers=workers)  # (an export: DuckDB reads it)
    wall = time.perf_counter() - t
    stop.set()
    poller.join()
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    doc = json.loads(d.to_json())
    for k in ("a", "b"):  # (the input's name: the directory or its export)
        doc.pop(k)
        doc["sources"][k].pop("path")
    digest = hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    print(json.dumps({"engine": engine, "wall_s": round(wall, 2), "parent_peak_mib": round(me),
                      "worker_peak_mib": round(peak[0] / 1024), "ranks": len(d.ranks),
                      "stragglers": [], "report": digest}))


def export_parquet(directory: str, out: str, threads: int) -> None:
    from hooktrace.data.parquet import write_dataset

    t = time.perf_counter()
    r = write_dataset([directory], out, tables=("spans", "steps", "modules", "runs"),
                      threads=threads)
    wall = time.perf_counter() - t
    size = sum(f.stat().st_size for f in Path(out).rglob("*.parquet"))
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"export_s": round(wall, 2), "parquet_gib": round(size / 2**30, 3),
                      "rows": r.rows["spans"], "peak_mib": round(me)}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--dir", default="/tmp/hooktrace-ranks-bench")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--engines", default="pool,parquet",
                   help="comma-separated: pool, parquet (the straggler summary; default "
                        "both), diff-pool, diff-parquet (hooktrace diff DIR DIR; of the "
                        "export)")
    p.add_argument("--measure-only", default=None, help=argparse.SUPPRESS)
    p.add_argument("--export-only", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    unknown = [e for e in args.engines.split(",") if e not in ENGINES]
    if unknown:
        p.error(f"--engines: unknown {', '.join(unknown)} (choose from {', '.join(ENGINES)})")
    if args.measure_only:
        measure(args.dir, args.workers, args.measure_only)
        return
    if args.export_only:
        export_parquet(args.dir, args.export_only, args.workers or os.cpu_count() or 1)
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
    extra = ["--workers", str(args.workers)] if args.workers else []
    pq_dir = Path(str(d) + ".parquet")
    results = []
    for engine in args.engines.split(","):
        source = d
        if engine in ("parquet", "diff-parquet"):
            if not pq_dir.exists():
                r = subprocess.run([sys.executable, __file__, "--export-only", str(pq_dir),
                                    "--dir", str(d), *extra], capture_output=True, text=True)
                print("export:", r.stdout.strip() or r.stderr[-2000:])
            source = pq_dir
        r = subprocess.run([sys.executable, __file__, "--measure-only", engine, "--dir",
                            str(source), *extra], capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr[-2000:])
        if r.returncode == 0:
            results.append(json.loads(r.stdout.strip().splitlines()[-1]))
    for kind in ("straggler", "diff"):  # each against the first engine of its kind
        mine = [x for x in results if x["engine"].startswith("diff-") == (kind == "diff")]
        if not mine:
            continue
        base = mine[0]["wall_s"]
        print(f"\n{kind}: {'engine':<11} {'wall s':>7} {'vs ' + mine[0]['engine']:>14} "
              f"{'parent MiB':>10} {'worker MiB':>10}  report")
        for x in mine:
            print(f"{kind}: {x['engine']:<11} {x['wall_s']:>7.2f} {x['wall_s'] / base:>13.2f}x "
                  f"{x['parent_peak_mib']:>10} {x['worker_peak_mib']:>10}  {x['report']}")
        if len({x["report"] for x in mine}) > 1:
            print(f"REPORTS DIFFER between {kind} engines")
    if not args.keep:
        shutil.rmtree(d)
        shutil.rmtree(pq_dir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
