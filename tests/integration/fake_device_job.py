"""Child process of tests/integration/test_fake_device.py: one scenario of hooktrace's
real device path (csrc/gpu_time.cpp's DeviceBackend) on the fake PrivateUse1 device of
test_fake_device.cpp, whose events complete a set lag after they are recorded.

    python fake_device_job.py SCENARIO LAG_MS [never_idle]   (FAKEDEV_BUILD: the built module's folder)

``never_idle``: the device never idles (issue #50): every event completes LAG_MS after its
record, even right after a wait.

Prints one JSON object: what the scenario measured. The registration of a PrivateUse1
guard is process-wide, hence a process per scenario.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from typing import Any

os.environ["HOOKTRACE_GPU_TIMER"] = "privateuse1"
sys.path.insert(0, os.environ["FAKEDEV_BUILD"])

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import fakedev  # noqa: E402  (registers the PrivateUse1 guard)
import hooktrace  # noqa: E402
import hooktrace._C as _C  # noqa: E402
from hooktrace._events import GPU_MARK, GPU_TIME  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")


class Sleepy(nn.Module):
    """Host work of a known length (the fake device's events complete at their record
    time plus the lag: device intervals follow host intervals)."""

    def __init__(self, ms: float, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.ms, self.inner, self.fc = ms, inner, nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        x = self.fc(x)
        return self.inner(x) if self.inner is not None else x


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Sleepy(0.4, Sleepy(0.2)), nn.ReLU(), nn.Linear(16, 1))


def marks_times(data: Any) -> dict[str, Any]:
    ev = data.events
    marks = ev[ev["kind"] == GPU_MARK]
    times = ev[ev["kind"] == GPU_TIME]
    return {"marks": int(len(marks)), "times": int(len(times)),
            "time_devices": sorted({int(d) for d in times["rf_tid"]})}


def rows(data: Any) -> dict[str, Any]:
    g = data.gpu_spans()
    names = [data.modules[int(m)][0] for m in g.module]
    return {"intervals": int(len(g)), "min_duration_ns": int(g.duration_ns.min()) if len(g) else None,
            "by_module": {n: [int(d) for d, m in zip(g.duration_ns, names) if m == n]
                          for n in sorted(set(names))}}


FIRST: dict[str, int] = {}


def train(model: nn.Module, steps: int, between: Any = None, **opts: Any) -> tuple[Any, int]:
    """``steps`` training steps under gpu=True; the syncs the fake device saw from the
    end of the first step mark to the last one (what a step costs the host). FIRST:
    the syncs of the first forward and backward (the pools are made there)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    syncs = 0
    with hooktrace.trace(model, gpu=True, **opts) as tr:
        for i in range(steps):
            c0 = fakedev.counters()["syncs"]
            model(x).sum().backward()
            if i == 0:
                FIRST["syncs"] = fakedev.counters()["syncs"] - c0
            opt.step()  # the step mark
            opt.zero_grad()
            if i:
                syncs += fakedev.counters()["syncs"] - c0
            if between is not None:
                between(i)
    return tr.result, syncs


def basic(lag_ms: int) -> dict[str, Any]:
    data, syncs = train(net(), 4)
    return {**marks_times(data), **rows(data), "syncs_between_marks": syncs,
            "syncs_in_first_forward_backward": FIRST["syncs"], "info": data.info["gpu"]}


def devices(lag_ms: int) -> dict[str, Any]:
    """The trace starts on device 0 and the script moves to device 1 (torchrun's
    set_device(local_rank)), then back to 0."""
    model = net()
    x = torch.randn(4, 16)
    out: dict[str, Any] = {}
    with hooktrace.trace(model, gpu=True) as tr:
        fakedev.set_device(1)
        model(x)
        tr.step()
        out["devices_after_device_1"] = list(_C.gpu_stats(tr._session)["devices"])
        fakedev.set_device(0)
        model(x)
    fakedev.set_device(0)
    return {**out, **marks_times(tr.result), "info": tr.result.info["gpu"]}


def schedule(lag_ms: int) -> dict[str, Any]:
    windows: list[Any] = []
    sched = torch.profiler.schedule(wait=1, warmup=0, active=2, repeat=2)
    train(net(), 7, schedule=sched, on_window=windows.append)
    return {"windows": [{**marks_times(w), "intervals": int(len(w.gpu_spans())),
                         "steps": [w.info["window"]["first_step"], w.info["window"]["last_step"]]}
                        for w in windows]}


def aggregate(lag_ms: int, every: int = 1) -> dict[str, Any]:
    from hooktrace.record.aggregate import load_aggregates

    folder = tempfile.mkdtemp()
    train(net(), 6, aggregate=folder, aggregate_interval=0, gpu_every=every)
    table = load_aggregates(folder)
    step = [int(s) for s in table.column("step").to_pylist()]
    gpu = table.column("gpu_ms").to_pylist()
    return {"rows": len(gpu), "steps_with_gpu_ms": sorted({s for s, g in zip(step, gpu)
                                                            if g is not None and g == g})}


def aggregate_every(lag_ms: int) -> dict[str, Any]:
    return aggregate(lag_ms, every=2)


def capture(lag_ms: int) -> dict[str, Any]:
    """A capture the stream reports (C++ check), then one it does not (an event whose
    query and elapsed time fail): neither raises into the step or at the exit."""
    model = net()
    x = torch.randn(4, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    raised = None
    try:
        with hooktrace.trace(model, gpu=True) as tr:
            model(x)
            fakedev.set_capturing(True)
            model(x)  # 3 modules: 6 marks skipped
            fakedev.set_capturing(False)
            fakedev.set_poison(True)
            model(x)  # recorded, unreadable
            fakedev.set_poison(False)
            model(x).sum().backward()
            opt.step()
            model(x).sum().backward()
            opt.step()
    except Exception as e:  # noqa: BLE001
        raised = f"{type(e).__name__}: {e}"
    finally:
        fakedev.set_capturing(False)
        fakedev.set_poison(False)
    return {"raised": raised, **marks_times(tr.result), "info": tr.result.info["gpu"]}


def queries(lag_ms: int) -> dict[str, Any]:
    """One resolution of many completed events on one stream: the queries it makes."""
    model = nn.Sequential(*[nn.Identity() for _ in range(100)])
    x = torch.zeros(1)
    with hooktrace.trace(model, gpu=True) as tr:
        model(x)
        tr.step()  # (the pool is made; first resolution)
        model(x)  # 202 marks
        time.sleep(0.01)
        c0 = fakedev.counters()
        resolved = _C.gpu_resolve(tr._session, False)
        c1 = fakedev.counters()
    return {"resolved": int(resolved), "queries": c1["queries"] - c0["queries"],
            "elapsed": c1["elapsed"] - c0["elapsed"], "syncs": c1["syncs"] - c0["syncs"]}


def no_steps(lag_ms: int) -> dict[str, Any]:
    """Inference with no step marks and a small pool: resolved from the hot path."""
    model = net()
    x = torch.randn(4, 16)
    with torch.no_grad(), hooktrace.trace(model, gpu=True, steps=None) as tr:
        for _ in range(300):  # 14 marks a call: 4,200 marks against a pool of 256
            model(x)
        stats = _C.gpu_stats(tr._session)
    return {**marks_times(tr.result), "info": tr.result.info["gpu"],
            "opportunistic": int(stats["opportunistic"])}


def drift(lag_ms: int) -> dict[str, Any]:
    """A device clock 2 % fast and 60 ms of host time between steps: each mark's device
    time against the host time of its call (lag 0: the same instant)."""
    fakedev.set_drift_ppm(20_000)
    model = net()
    data, _ = train(model, 8, between=lambda i: time.sleep(0.06))
    ev = data.events
    marks = np.flatnonzero(ev["kind"] == GPU_MARK)
    by_id = {int(ev["id"][i]): int(ev["seq"][i].view(np.int64))
             for i in np.flatnonzero(ev["kind"] == GPU_TIME)}
    host = data.clock.to_unix_ns(ev["t"][marks])
    err = [abs(by_id[int(i)] - int(h)) for h, i in zip(host, ev["rf_tid"][marks]) if int(i) in by_id]
    steps = data.steps()
    last_start = int(steps.start_ns[steps.complete][-1])
    last = [abs(by_id[int(i)] - int(h)) for h, i in zip(host, ev["rf_tid"][marks])
            if int(i) in by_id and int(h) >= last_start]
    return {"info": data.info["gpu"], "max_error_ns": max(err), "last_step_max_error_ns": max(last),
            "run_ns": int(host[-1] - host[0])}


def steps4(lag_ms: int) -> dict[str, Any]:
    """Four training steps: the syncs the fake device saw in each step (its mark
    included) and at the trace's end, and every module row's timed calls."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    per_step = []
    with hooktrace.trace(model, gpu=True) as tr:
        for _ in range(4):
            c0 = fakedev.counters()["syncs"]
            model(x).sum().backward()
            opt.step()  # the step mark
            opt.zero_grad()
            per_step.append(fakedev.counters()["syncs"] - c0)
        c_end = fakedev.counters()["syncs"]
    at_end = fakedev.counters()["syncs"] - c_end
    data = tr.result
    # the fake device's truth: an event completes `lag` after its record (the mark's
    # host time, microseconds after it), so each mark's device time should be its host
    # time plus the lag, to within the stated bound
    ev = data.events
    marks = np.flatnonzero(ev["kind"] == GPU_MARK)
    by_id = {int(ev["id"][i]): int(ev["seq"][i].view(np.int64))
             for i in np.flatnonzero(ev["kind"] == GPU_TIME)}
    host = data.clock.to_unix_ns(ev["t"][marks])
    err = [abs(by_id[int(i)] - (int(h) + lag_ms * 1_000_000))
           for h, i in zip(host, ev["rf_tid"][marks]) if int(i) in by_id]
    summary = data.summary()
    table = [{"module": r["module"], "calls": r.get("calls"), "gpu_calls": r.get("gpu_calls"),
              "gpu_total_ns": r.get("gpu_total_ns"), "gpu_bwd_total_ns": r.get("gpu_bwd_total_ns")}
             for r in summary.rows if r.get("calls") and not r["module"].startswith("<")]
    return {**marks_times(data), **rows(data), "syncs_per_step": per_step, "syncs_at_end": at_end,
            "max_error_ns": max(err),
            "rows": table, "info": data.info["gpu"], "text": str(summary)}


SCENARIOS = {f.__name__: f for f in (basic, devices, schedule, aggregate, aggregate_every, capture,
                                     queries, no_steps, drift, steps4)}

if __name__ == "__main__":
    name, lag = sys.argv[1], int(sys.argv[2])
    fakedev.set_lag_ns(lag * 1_000_000)
    fakedev.set_never_idle("never_idle" in sys.argv[3:])
    print(json.dumps(SCENARIOS[name](lag)))
