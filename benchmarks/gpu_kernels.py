"""Kernel busy time from CUPTI (``gpu=True`` on CUDA, issue #49) on a GPU: what the
GPU acceptance issue (#52) asks of it, in one run.

1. cost: added seconds per training step over untraced, variants interleaved round by
   round (best of the rounds): time-only, ``gpu_mode="events"``, ``"kernels"``,
   ``gpu_every=10``, ``numerics=True``, ``memory=True``, torch.profiler (CUDA only);
2. agreement with torch.profiler: the sum of all kernel time over N steps, and per
   (module, phase) for the ten largest, hooktrace's ``kernel_self_ns`` against the
   kernel time the profiler attributes to the module (hooktrace/analysis/attribution.py).
   CUPTI has one subscriber, so the two record the same N steps of the same model one
   after the other, not at once;
3. CUDA graphs: a training step and an inference step captured with
   ``torch.cuda.graph`` under the trace, replayed 3 times: the fraction of the replays'
   kernel time named by module (and ``torch.compile(mode="reduce-overhead")`` with
   ``--compiled``);
4. no hidden sync: a traced step queued behind 300 ms of GPU work returns at once.

Prints a line per figure and, with ``--json FILE``, appends one object (the keys of
``benchmarks/results/gpu.json``).

    python benchmarks/gpu_kernels.py --json out.json        # on a CUDA machine
    python benchmarks/gpu_kernels.py --device cpu --dry-run  # smoke (needs HOOKTRACE_CUPTI_LIB)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hooktrace  # noqa: E402
from gpu import Model, build  # noqa: E402
from gpu import cost as gpu_cost  # noqa: E402

VARIANTS: dict[str, dict[str, Any] | None] = {
    "untraced": None,
    "time-only": {},
    "gpu-events": {"gpu": True, "gpu_mode": "events"},
    "gpu-kernels": {"gpu": True, "gpu_mode": "kernels"},
    "gpu_every=10": {"gpu": True, "gpu_mode": "kernels", "gpu_every": 10},
    "numerics": {"numerics": True},
    "memory": {"memory": True},
    "profiler-cuda": None,
}


@contextlib.contextmanager
def variant(name: str, m: Model, cuda: bool) -> Iterator[Any]:
    opts = VARIANTS[name]
    if name == "profiler-cuda":
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
        with profile(activities=acts) as prof:
            yield prof
    elif opts is None:
        yield None
    else:
        if not cuda:
            opts = {k: v for k, v in opts.items() if k != "memory"}
        with hooktrace.trace(m.model, capacity=1 << 24, **opts) as tr:
            yield tr


def cost(m: Model, rounds: int, steps: int, cuda: bool, names: list[str]
         ) -> dict[str, float]:
    """Added time per step of each of ``names`` over "untraced" (first), interleaved
    (gpu.py's loop)."""
    best = gpu_cost(m, rounds, steps, {n: lambda m, n=n: variant(n, m, cuda) for n in names})
    base = best["untraced"]
    return {k: v / base - 1 for k, v in best.items() if k != "untraced"}


def ours_per_module(m: Model, steps: int) -> tuple[dict[tuple[str, str], int], dict[str, Any]]:
    """hooktrace's kernel self time per (module, phase) over ``steps`` steps. Before any
    torch.profiler in this process: Kineto keeps CUPTI's one subscriber once it ran."""
    m.step()
    m.sync()
    with hooktrace.trace(m.model, capacity=1 << 24, gpu=True, gpu_mode="kernels") as tr:
        for _ in range(steps):
            m.step()
        m.sync()
    run = tr.result
    from hooktrace.analysis.kernel_time import kernel_records, span_kernels
    from hooktrace.reading import CAT_BACKWARD

    sk, spans, k = span_kernels(run), run.spans(), kernel_records(run)
    ours: dict[tuple[str, str], int] = defaultdict(int)
    for mod, cat, own in zip(spans.module.tolist(), spans.cat.tolist(), sk.self_busy.tolist(),
                             strict=True):
        name = run.modules[mod][0]
        ours[(name, "backward" if cat == CAT_BACKWARD else "forward")] += int(own)
    return ours, {"ours_all_records_ns": int((k.end_ns - k.start_ns).sum()), "records": len(k),
                  "unmatched": k.unmatched, "lost": run.info["kernels"]["lost"],
                  "unplaced_ns": int((k.end_ns - k.start_ns)[k.span < 0].sum())}


def agreement(m: Model, steps: int, ours: dict[tuple[str, str], int],
              extra: dict[str, Any]) -> dict[str, Any]:
    """hooktrace's kernel time (measured before) against the profiler's, `steps` steps."""
    from torch.profiler import ProfilerActivity, profile

    from hooktrace.analysis.attribution import attribute_events
    from hooktrace.format._profiler_events import collect

    m.step()
    m.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with hooktrace.trace(m.model, capacity=1 << 24) as ref:
            for _ in range(steps):
                m.step()
            m.sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "profiler.json")
        prof.export_chrome_trace(path)
        events = collect(path, pid=os.getpid())
        table = attribute_events(ref.result, events)
        kernel_total = int(sum(events.gpu_dur))  # every GPU activity, attributed or not
    theirs: dict[tuple[str, str], int] = defaultdict(int)
    for r in table.rows:
        if r["phase"] in ("forward", "backward"):
            theirs[(r["module"], r["phase"])] += int(r["gpu_self_ns"])
    profiler_sum = sum(theirs.values())
    ours_sum = sum(ours.values())
    top = sorted(theirs, key=lambda key: -theirs[key])[:10]
    worst = max((abs(ours.get(key, 0) - theirs[key]) / theirs[key] for key in top
                 if theirs[key]), default=None)
    return {"kernel_sum_vs_profiler": abs(ours_sum - profiler_sum) / profiler_sum
            if profiler_sum else None,
            "top10_kernel_vs_profiler": worst,
            "ours_attributed_ns": ours_sum, "profiler_attributed_ns": profiler_sum,
            "profiler_kernel_total_ns": kernel_total, **extra,
            "top10": [[f"{a}:{b}", ours.get((a, b), 0), theirs[(a, b)]] for a, b in top]}


def graphs(cuda: bool, compiled: bool) -> dict[str, Any]:
    """Fraction of a replayed graph's kernel time named by module."""
    from torch import nn

    out: dict[str, Any] = {}
    dev = "cuda" if cuda else "cpu"
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(dev)
    x = torch.randn(64, 256, device=dev)
    cases = ["inference", "training"] + (["reduce-overhead"] if compiled else [])
    for case in cases:
        try:
            out[case] = _graph_case(model, x, case, cuda)
        except Exception as e:  # one case's failure is its result, not the run's end
            out[case] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return out


def _graph_case(model: Any, x: torch.Tensor, case: str, cuda: bool) -> dict[str, Any]:
    from hooktrace.analysis.kernel_time import kernel_records

    if True:
        with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
            if not cuda:
                model(x)
            elif case == "reduce-overhead":
                f = torch.compile(model, mode="reduce-overhead")
                for _ in range(6):
                    f(x)
            else:
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        opt.zero_grad(set_to_none=True)
                        (model(x).sum().backward() if case == "training" else model(x))
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                opt.zero_grad(set_to_none=True)
                with torch.cuda.graph(g):
                    y = model(x)
                    if case == "training":
                        y.sum().backward()
                for _ in range(3):
                    g.replay()
                torch.cuda.synchronize()
        k = kernel_records(tr.result)
        dur = k.end_ns - k.start_ns
        is_graph = k.graph
        if not is_graph.any():
            return {"graph_records": 0, "named": None, "records": len(k)}
        named = float(dur[k.by_node & (k.span >= 0)].sum() / max(1, dur[is_graph].sum()))
        return {"graph_records": int(is_graph.sum()),
                "graph_unnamed": k.graph_unnamed, "named": named,
                "graph_node_events": int(tr.result.info["kernels"]["graph_nodes"])}


def _queued_step_ms(m: Model) -> float:
    m.step()
    m.sync()
    torch.cuda._sleep(int(2e9))  # far more than 300 ms of queued GPU work
    t0 = time.perf_counter()
    m.step()
    waited = (time.perf_counter() - t0) * 1e3
    m.sync()
    return waited


def hidden_sync_ms(m: Model, cuda: bool) -> float | None:
    """How much longer a traced step queued behind GPU work takes than an untraced one
    queued the same way (the model's own syncs are in both)."""
    if not cuda:
        return None
    untraced = _queued_step_ms(m)
    with hooktrace.trace(m.model, gpu=True, gpu_mode="kernels"):
        traced = _queued_step_ms(m)
    print(f"queued step: untraced {untraced:.1f} ms, traced {traced:.1f} ms", flush=True)
    return traced - untraced


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--models", default="gpt2-124m,gpt2-small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--parts", default="cost,agree,graphs,sync")
    p.add_argument("--compiled", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("gpu_kernels.py needs a CUDA device (or --device cpu --dry-run)")
        return 2
    parts = set(a.parts.split(","))
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "date": datetime.date.today().isoformat(), "added_per_step": {}}
    # Everything that needs hooktrace's CUPTI first: once torch.profiler ran, its Kineto
    # keeps CUPTI's one subscriber for the rest of the process.
    names = [v for v in VARIANTS if v != "profiler-cuda"]
    models = {name: build(name, a.device, a.dry_run) for name in a.models.split(",")}
    ours: dict[str, Any] = {}
    for name, m in models.items():
        if "cost" in parts:
            c = cost(m, a.rounds, a.steps, cuda, names)
            result["added_per_step"][name] = c
            print(f"{name}: " + ", ".join(f"{k} {v * 100:+.1f}%" for k, v in c.items()), flush=True)
        if "agree" in parts and name == "gpt2-124m" and cuda:
            ours[name] = ours_per_module(m, 5)
        if "sync" in parts and name == a.models.split(",")[0]:
            result["hidden_sync_ms"] = hidden_sync_ms(m, cuda)
            print(f"hidden_sync_ms: {result['hidden_sync_ms']}", flush=True)
    if "graphs" in parts:
        g = graphs(cuda, a.compiled)
        result["graphs"] = g
        named = [v["named"] for v in g.values() if v.get("named") is not None]
        result["graph_kernels_named"] = min(named) if named else None
        print("graphs:", json.dumps(g), flush=True)
    for name, m in models.items():  # the profiler last
        if "cost" in parts:
            c = cost(m, a.rounds, a.steps, cuda, ["untraced", "profiler-cuda"])
            result["added_per_step"][name].update(c)
            print(f"{name}: profiler-cuda {c['profiler-cuda'] * 100:+.1f}%", flush=True)
        if name in ours:
            ag = agreement(m, 5, *ours[name])
            result.update(ag)
            print("agreement:", json.dumps(ag), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
