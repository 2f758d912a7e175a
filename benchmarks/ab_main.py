"""Per-module-call cost of both scopes against another build of hooktrace (issue #16).

Compares this checkout with a baseline checkout (e.g. the previous ``main`` in a git
worktree, its native core built in place) in one run: each round starts one child
process per checkout, alternating, and each child measures no tracing,
``hooktrace.trace(model)`` and ``hooktrace.global_trace()`` (what ``hooktrace run``
installs) on the same models as overhead.py, forward only, one intra-op thread. A
child's untraced baseline is measured in the same process. The table gives the
added time per call from the min over rounds of each variant, and the median of
the rounds' own differences.

    git worktree add ../hooktrace-base main~1
    (cd ../hooktrace-base && python setup.py build_ext --inplace)
    python benchmarks/ab_main.py --baseline ../hooktrace-base --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def child(inner_scale: float) -> None:
    """Runs in a child: one round of each variant on each model; prints JSON."""
    import contextlib
    from collections.abc import Iterator

    import torch
    from torch import nn

    import hooktrace
    from overhead import MODELS, measure, no_tracing

    @contextlib.contextmanager
    def model_scope(model: nn.Module) -> Iterator[None]:
        with hooktrace.trace(model, backward=False):
            yield

    @contextlib.contextmanager
    def process_scope(model: nn.Module) -> Iterator[None]:
        with hooktrace.global_trace(backward=False):
            yield

    variants = {"none": no_tracing, "trace(model)": model_scope,
                "global_trace() / run": process_scope}
    torch.set_num_threads(1)
    out: dict[str, Any] = {"hooktrace": hooktrace.__file__, "models": {}}
    with torch.no_grad():
        for name, make in MODELS.items():
            model, run, calls = make()
            inner = max(1, int((30 if "Identity" in name else 50) * inner_scale))
            best = {}
            for _ in range(2):  # two interleaved passes inside the child
                for vname, install in variants.items():
                    with install(model):
                        run()  # warm-up inside the variant (names modules in the process scope)
                        t = measure(run, inner)
                    best[vname] = min(best.get(vname, float("inf")), t)
            out["models"][name] = {"calls": calls, "best_s": best}
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="checkout of the build to compare with")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="2 rounds, short loops (smoke run)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.scale)
        return
    trees = {"baseline": Path(args.baseline).resolve(), "this checkout": HERE.parent}
    rounds = 2 if args.quick else args.rounds
    scale = 0.2 if args.quick else 1.0
    best: dict[str, dict[str, dict[str, float]]] = {t: {} for t in trees}
    added: dict[str, dict[str, dict[str, list[float]]]] = {t: {} for t in trees}
    calls: dict[str, int] = {}
    for r in range(rounds):
        order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
        for label, tree in order:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(HERE)]))
            for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS"):
                env.pop(name, None)
            proc = subprocess.run([sys.executable, str(HERE / "ab_main.py"), "--child",
                                   "--baseline", str(tree), "--scale", str(scale)],
                                  env=env, cwd=tree, capture_output=True, text=True, check=True)
            doc = json.loads(proc.stdout.strip().splitlines()[-1])
            if not doc["hooktrace"].startswith(str(tree)):
                raise SystemExit(f"{label}: imported {doc['hooktrace']}, not from {tree}")
            for model, m in doc["models"].items():
                calls[model] = m["calls"]
                per = best[label].setdefault(model, {})
                per_added = added[label].setdefault(model, {})
                for vname, t in m["best_s"].items():
                    per[vname] = min(per.get(vname, float("inf")), t)
                    # against this child's own untraced run, same process
                    per_added.setdefault(vname, []).append(
                        (t - m["best_s"]["none"]) / m["calls"] * 1e9)
    print(f"A/B, {rounds} rounds, one child process per checkout per round, 1 intra-op thread")
    for label, tree in trees.items():
        print(f"  {label}: {tree}")
    print("added/call: (min over rounds of the variant - min of none) / calls; "
          "median: of each round's own difference")
    for model in calls:
        print(f"\n{model}: {calls[model]} module calls per run")
        print(f"{'checkout':16} {'variant':24} {'min per run':>12} {'added/call':>11} "
              f"{'median':>9}")
        for label in trees:
            per = best[label][model]
            for vname in ("none", "trace(model)", "global_trace() / run"):
                from_min = (per[vname] - per["none"]) / calls[model] * 1e9
                median = statistics.median(added[label][model][vname])
                print(f"{label:16} {vname:24} {per[vname] * 1e6:10.1f}us {from_min:9.1f}ns "
                      f"{median:7.1f}ns")


if __name__ == "__main__":
    main()
