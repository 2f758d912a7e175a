"""Every file hooktrace writes, opened by Perfetto's own importer (issue #7).

``perfetto_check`` (tests/perfetto_check) loads each trace into the trace processor of a
released Perfetto UI (headless, under node) and fails on any import error or on any "X"
event that Perfetto drops or re-nests. The traces are real: tiny Hugging Face models and a
ResNet-style net with in-place ops, trained two steps with backward, with and without
torch.profiler.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from perfetto_check import perfetto_check

import hooktrace
from hooktrace.cli import main
from hooktrace.merge import merge_traces
from models import ConvNet, tiny_llama

CPU = [torch.profiler.ProfilerActivity.CPU]


def train(model: torch.nn.Module, x: torch.Tensor, steps: int = 2) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)  # its steps make the "steps" row
    for _ in range(steps):
        out = model(x)
        logits = out.logits if hasattr(out, "logits") else out
        logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Exports, node exports, merges and schedule windows of real training steps."""
    out = tmp_path_factory.mktemp("perfetto")
    files: list[Path] = []
    cases = {"llama": (tiny_llama().train(), torch.randint(0, 64, (2, 8))),
             "convnet": (ConvNet().train(), torch.randn(2, 3, 8, 8))}
    for name, (model, x) in cases.items():
        with hooktrace.trace(model) as tr, torch.profiler.profile(activities=CPU) as prof:
            train(model, x)
        prof.export_chrome_trace(str(out / f"{name}.profiler.json"))
        tr.save(out / f"{name}.htrace")
        tr.export_chrome(out / f"{name}.json")
        assert main(["export", str(out / f"{name}.htrace"), "-o", str(out / f"{name}.nodes.json"),
                     "--nodes"]) == 0
        merge_traces(tr, out / f"{name}.profiler.json", out / f"{name}.merged.json")
        files += [out / f"{name}.json", out / f"{name}.nodes.json", out / f"{name}.merged.json"]
    # profile() with a repeating schedule: one merged file per window
    model, x = cases["llama"]
    sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2)
    with hooktrace.profile(model, out / "windows", schedule=sched, activities=CPU) as p:
        for _ in range(6):
            train(model, x, steps=1)
            p.step()
    assert len(p.outputs) == 2
    files += [Path(o) for o in p.outputs]
    return files


def test_every_written_trace_loads_in_perfetto_without_losing_a_span(traces: list[Path]) -> None:
    reports = perfetto_check(traces)
    # the merged traces carry the profiler's ops and hooktrace's rows together
    cats = set().union(*(r.categories for r in reports))
    assert {"cpu_op", "hooktrace.backward", "hooktrace.autograd_unattributed",
            "hooktrace.step"} <= cats
    assert all(r.slices > 0 and r.x_events for r in reports)


def test_row_names_are_readable(traces: list[Path]) -> None:
    # Perfetto shows a row as "<thread name> <tid>": track tids are the next free
    # small numbers, never 2**30-scale synthetic ones
    from trace_rows import load_json

    for path in traces:
        doc = load_json(path)
        tracks = doc["hooktrace"]["tracks"]
        ours = {t["tid"] for t in tracks}
        assert tracks and len(ours) == len(tracks)
        others = {e["tid"] for e in doc["traceEvents"]
                  if isinstance(e.get("tid"), int) and e["tid"] not in ours}
        assert sorted(ours) == list(range(max(others) + 1, max(others) + 1 + len(ours))), path
