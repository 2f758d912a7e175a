"""Streaming to disk (issue #9): overhead, drain rate, and memory over a long run.

Three measurements, one process:

1. per-module-call overhead on 1000 x nn.Identity: untraced, in memory and streaming
   to a file, interleaved round by round in the same run (overhead.py's helpers);
2. the drain rate: events the writer thread moves to disk per second of its busy time
   (collect + CRC + write), and per second of wall time over the long run;
3. RSS over a long streaming run (VmRSS from /proc/self/status, sampled every ~0.5 s),
   against the same process before tracing: events recorded until --events or
   --seconds, whichever comes first.

    python benchmarks/streaming.py                       # 200 M events or 180 s
    python benchmarks/streaming.py --quick               # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import hooktrace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import bench, hooktrace_mode, identity_chain, no_tracing  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def streaming(folder: str) -> Any:
    count = [0]

    @contextlib.contextmanager
    def install(model: nn.Module) -> Iterator[Any]:
        count[0] += 1
        path = os.path.join(folder, f"overhead{count[0]}.htrace")
        with hooktrace.trace(model, out=path) as tr:
            yield tr
        os.unlink(path)

    return install


def overhead_section(folder: str, rounds: int, inner: int) -> None:
    model, run, calls = identity_chain()
    variants = {
        "none": no_tracing,
        "hooktrace in memory (default)": hooktrace_mode("wrap"),
        "hooktrace streaming (out=)": streaming(folder),
    }
    with torch.no_grad():
        bench("1000 x Identity (forward)", variants, "hooktrace in memory (default)", model,
              run, calls, rounds, inner, grad=False)


def long_run(folder: str, max_events: int, max_seconds: float) -> None:
    model, run, calls = identity_chain()
    per_forward = 2 * calls
    with torch.no_grad():
        for _ in range(20):
            run()  # warm up untraced, so the baseline includes what the model itself holds
        base = rss_mib()
        path = os.path.join(folder, "long.htrace")
        samples: list[tuple[float, int, float]] = []
        forwards = 0
        t0 = time.perf_counter()
        next_sample = t0
        with hooktrace.trace(model, out=path):
            while forwards * per_forward < max_events:
                for _ in range(50):
                    run()
                forwards += 50
                now = time.perf_counter()
                if now >= next_sample:
                    samples.append((now - t0, forwards * per_forward, rss_mib() - base))
                    next_sample = now + 0.5
                    if now - t0 > max_seconds:
                        break
        wall = time.perf_counter() - t0
    size = os.path.getsize(path)
    # The footer holds the writer's figures: read it alone (tr.info would load the
    # whole file, GBs here).
    info = _footer(path)
    recorded = forwards * per_forward
    print(f"\nlong run: {recorded / 1e6:.1f} M events in {wall:.1f} s "
          f"({recorded / wall / 1e6:.2f} M events/s recorded), file {size / 2**30:.2f} GiB")
    print(f"written {info['events'] / 1e6:.1f} M events, dropped {info['dropped_events']:,}; "
          f"chunks allocated at most {info['stream']['chunks']} "
          f"({info['stream']['chunks'] * 128 / 1024:.1f} MiB)")
    busy, cpu = info["stream"]["busy_ns"] / 1e9, info["stream"]["cpu_ns"] / 1e9
    print(f"writer busy {busy:.1f} s (CPU {cpu:.1f} s) of {wall:.1f} s: drain rate "
          f"{info['events'] / cpu / 1e6:.1f} M events/s of writer CPU time "
          f"({info['stream']['bytes'] / cpu / 1e9:.2f} GB/s), "
          f"{info['events'] / busy / 1e6:.1f} M events/s of busy (wall) time, "
          f"{info['events'] / wall / 1e6:.2f} M events/s of the run's wall time")
    print("RSS above the untraced process (MiB) over the run:")
    step = max(1, len(samples) // 12)
    for t, n, mib in samples[::step] + [samples[-1]]:
        print(f"  t={t:6.1f} s  {n / 1e6:8.1f} M events  {mib:7.1f} MiB")
    print(f"  max {max(s[2] for s in samples):.1f} MiB")
    os.unlink(path)


def _footer(path: str) -> dict[str, Any]:
    """The FOOTER block's JSON: the last block, found by walking block headers."""
    import json
    import struct

    with open(path, "rb") as f:
        pos, size = 16, os.path.getsize(path)
        while pos < size:
            f.seek(pos)
            btype, _, length, _, _ = struct.unpack("<IIQII", f.read(24))
            if btype == 6:
                return dict(json.loads(f.read(length)))
            pos += 24 + length
    raise RuntimeError(f"{path}: no footer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds and a short long run")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--events", type=float, default=200e6, help="long run: events to record")
    ap.add_argument("--seconds", type=float, default=180, help="long run: at most this long")
    ap.add_argument("--dir", default=None, help="folder for the files (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        overhead_section(folder, 2 if args.quick else args.rounds, 5 if args.quick else 30)
        long_run(folder, int(2e6 if args.quick else args.events),
                 5 if args.quick else args.seconds)


if __name__ == "__main__":
    main()
