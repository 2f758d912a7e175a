"""Export throughput: events/s to .htrace and to Chrome JSON, against a naive exporter.

The naive baseline is what a Python tracer typically does: build one dict per
Chrome event and ``json.dump`` the list. All variants run in this process on the
same synthetic run (module calls nested 3 deep, 250 modules, one thread).

    python benchmarks/export.py              # 2 M events
    python benchmarks/export.py --events 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

import hooktrace
from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, Clock
from hooktrace.reading import TraceData


def synthetic_run(n_events: int, families: int = 8) -> TraceData:
    """Calls of a root with children with grandchildren, 100 ns apart; root calls
    spread over ``families`` module families (1: every call under module slot 0)."""
    per_root = 2 * (1 + 10 + 10 * 2)  # events per root call: 1 root, 10 children, 2 grandchildren each
    roots = max(1, n_events // per_root)
    kinds: list[int] = []
    ids: list[int] = []
    for c in range(10):
        kinds += [ENTER]
        ids += [1 + c]
        for g in range(2):
            kinds += [ENTER, EXIT]
            ids += [11 + 2 * c + g] * 2
        kinds += [EXIT]
        ids += [1 + c]
    one_kind = np.array([ENTER] + kinds + [EXIT], np.uint8)
    one_id = np.array([0] + ids + [0], np.uint32)
    ev = np.zeros(roots * len(one_kind), EVENT_DTYPE)
    ev["kind"] = np.tile(one_kind, roots)
    # 250 module slots: spread root calls over 8 module families
    ev["id"] = np.tile(one_id, roots) + (
        np.repeat(np.arange(roots) % families, len(one_kind)) * 31).astype(np.uint32)
    ev["t"] = np.arange(len(ev), dtype=np.uint64) * 100
    ev["tid"] = 1234
    modules = [("", "Net")] + [(f"layer.{i}", "Linear") for i in range(1, 8 * 31 + 1)]
    info = {"pid": os.getpid(), "hostname": "bench", "dropped_events": 0, "overwritten_events": 0}
    return TraceData(ev, modules, [], Clock(0, 1_700_000_000_000_000_000, 1.0), info)


def with_flops(run: TraceData) -> TraceData:
    """``run`` as if recorded with ``flops=True``: one input signature, every module
    with forward FLOPs, the first root call counted (as hooktrace.analysis.flops records)."""
    spans = run.spans()
    roots = int(np.count_nonzero((spans.module == 0) & (spans.depth == 0)))
    forward = {name: 1_000_003 * (i + 1) for i, (name, _) in enumerate(run.modules)}
    info = dict(run.info, flops={"signatures": [{"forward": forward, "backward": {}}],
                                 "calls": [0] * roots, "counted": [0]})
    return TraceData(run.events, run.modules, run.node_names, run.clock, info)


def naive_chrome(run: TraceData, path: str) -> None:
    s = run.spans()
    events = []
    for i in range(len(s)):
        name, typ = run.modules[int(s.module[i])]
        events.append({
            "ph": "X", "cat": "forward", "name": name or typ, "pid": run.pid, "tid": int(s.tid[i]),
            "ts": (int(s.start_ns[i]) - int(s.start_ns.min())) / 1000,
            "dur": int(s.end_ns[i] - s.start_ns[i]) / 1000,
            "args": {"module": name, "type": typ, "call": int(s.call[i])},
        })
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)


def fresh_spans(run: TraceData) -> None:
    run._spans = None  # drop the cache
    run.spans()


def timed(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    run = synthetic_run(args.events)
    n = len(run.events)
    with tempfile.TemporaryDirectory() as d:
        htrace = os.path.join(d, "run.htrace")
        variants: dict[str, Callable[[], None]] = {
            "save .htrace": lambda: run.save(htrace),
            "load .htrace (validated)": lambda: hooktrace.load(htrace) and None,
            "spans (pair enter/exit)": lambda: fresh_spans(run),
            "Chrome JSON (hooktrace, spans cached)": lambda: run.export_chrome(os.path.join(d, "t.json")),
            "Chrome JSON (hooktrace, from events)": lambda: (
                fresh_spans(run), run.export_chrome(os.path.join(d, "t.json"))) and None,
            "Chrome JSON.gz (hooktrace, from events)": lambda: (
                fresh_spans(run), run.export_chrome(os.path.join(d, "t.json.gz"))) and None,
        }
        # The naive exporter is ~1000x slower: time it on a tenth of the run (rate per event).
        small = synthetic_run(max(1, n // 10))
        run.save(htrace)
        run.spans()
        print(f"{n} events ({n // 2} spans), best of {args.rounds} rounds")
        print(f"{'step':42} {'seconds':>9} {'M events/s':>11} {'vs naive':>9}")
        rates = {name: n / timed(fn, args.rounds) for name, fn in variants.items()}
        naive = "Chrome JSON (naive dicts + json.dump)"
        rates[naive] = len(small.events) / timed(lambda: naive_chrome(small, os.path.join(d, "n.json")), 1)
        for name, rate in rates.items():
            print(f"{name:42} {n / rate:9.3f} {rate / 1e6:11.2f} {rate / rates[naive]:8.1f}x")
        size = os.path.getsize(htrace)
        print(f"\n.htrace size: {size} bytes = {size / n:.1f} bytes/event (header and tables included)")


if __name__ == "__main__":
    main()
