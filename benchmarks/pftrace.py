"""Perfetto protobuf (.pftrace) against Chrome JSON: bytes per event and export rate.

Both exporters run in this process on the same synthetic run as
benchmarks/export.py (module calls nested 3 deep, 250 modules, one thread),
from raw events (spans recomputed each round, as ``hooktrace export`` does),
and again with spans cached (the formatting alone).

    python benchmarks/pftrace.py                     # 2 M events
    python benchmarks/pftrace.py --events 10000000   # the issue's 10 M
    python benchmarks/pftrace.py --flops             # FLOP args on every span, and without

``--flops``: every root call under one root module (one module family), exported
as recorded without FLOPs and as recorded with ``flops=True`` (the args ``flops``,
``tflops`` / ``flops_counted`` on every span; span_flops' cost included).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from export import fresh_spans, synthetic_run, timed, with_flops  # noqa: E402

from hooktrace.exporters.chrome import export_chrome  # noqa: E402
from hooktrace.exporters.perfetto import export_perfetto  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flops", action="store_true",
                    help="one module family, exported without and with FLOP args")
    args = ap.parse_args()
    if args.flops:
        plain = synthetic_run(args.events, families=1)
        runs = {"": plain, " +FLOPs": with_flops(plain)}
    else:
        runs = {"": synthetic_run(args.events)}
    n = len(runs[""].events)
    with tempfile.TemporaryDirectory() as d:
        print(f"{n} events ({n // 2} spans), best of {args.rounds} rounds")
        print(f"{'format':19} {'bytes':>13} {'bytes/event':>12} {'size vs JSON':>13} "
              f"{'M events/s (from events)':>25} {'M events/s (spans cached)':>26}")
        sizes: dict[str, int] = {}
        for suffix, run in runs.items():
            run.spans()
            paths = {"Chrome JSON": os.path.join(d, "t.json"),
                     ".pftrace": os.path.join(d, "t.pftrace")}
            writers: dict[str, Callable[[], object]] = {
                "Chrome JSON": lambda: export_chrome(run, paths["Chrome JSON"]),
                ".pftrace": lambda: export_perfetto(run, paths[".pftrace"]),
            }
            for name, write in writers.items():
                cached = timed(write, args.rounds)
                raw = timed(lambda: (fresh_spans(run), write()), args.rounds)
                sizes[name + suffix] = os.path.getsize(paths[name])
                print(f"{name + suffix:19} {sizes[name + suffix]:13d} "
                      f"{sizes[name + suffix] / n:12.1f} "
                      f"{sizes[name + suffix] / sizes['Chrome JSON']:13.3f} "
                      f"{n / raw / 1e6:25.2f} {n / cached / 1e6:26.2f}")


if __name__ == "__main__":
    main()
