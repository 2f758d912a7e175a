"""Training steps: from Optimizer.step by default, or trace.step(); per-step statistics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.analysis.summary import StepTable


def model_and_opt() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return m, torch.optim.SGD(m.parameters(), lr=0.01)


def train_step(m: nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_steps_come_from_the_optimizer_and_every_span_knows_its_step() -> None:
    m, opt = model_and_opt()
    with hooktrace.trace(m) as tr:
        for _ in range(4):
            train_step(m, opt)
    steps = tr.steps()
    assert steps.number.tolist() == [0, 1, 2, 3] and steps.complete.all()
    # contiguous, in time order
    assert (steps.start_ns[1:] == steps.end_ns[:-1]).all() and (steps.duration_ns > 0).all()
    spans = tr.spans()
    row = tr.span_steps()
    assert (row >= 0).all()
    # each step holds one forward of the root and one backward span of it
    for i in range(4):
        mine = (row == i) & (spans.module == 0)
        assert sorted(spans.cat[mine].tolist()) == [0, 1]
        assert (spans.start_ns[row == i] >= steps.start_ns[i]).all()
        assert (spans.start_ns[row == i] <= steps.end_ns[i]).all()


def test_manual_steps_switch_the_optimizer_off_and_two_optimizers_count_once() -> None:
    m, opt = model_and_opt()
    other = torch.optim.SGD(m.parameters(), lr=0.01)
    with hooktrace.trace(m) as tr:
        for _ in range(3):
            train_step(m, opt)
            other.step()  # a second optimizer in the same iteration: not a second step
    assert tr.steps().number.tolist() == [0, 1, 2]
    with hooktrace.trace(m) as tr:
        train_step(m, opt)  # step 0, from the optimizer
        assert tr.step() == 1  # from here on only manual marks
        train_step(m, opt)
        train_step(m, opt)
        assert tr.step() == 2
    assert tr.steps().number.tolist() == [0, 1, 2]
    with hooktrace.trace(m, steps=None) as tr:
        train_step(m, opt)
    assert len(tr.steps()) == 0
    with pytest.raises(RuntimeError, match="inside the with block"):
        tr.step()
    with pytest.raises(ValueError, match="steps must be"):
        hooktrace.trace(m, steps="epoch")  # type: ignore[arg-type]


def test_the_optimizer_hook_is_removed_after_the_block() -> None:
    m, opt = model_and_opt()
    with hooktrace.trace(m) as tr:
        train_step(m, opt)
    before = len(tr.events)
    train_step(m, opt)  # after the block: nothing more is recorded, nothing raises
    assert len(tr.events) == before
    from torch.optim import optimizer

    assert not optimizer._global_optimizer_post_hooks


def test_per_step_statistics_match_a_reference(tmp_path: Path) -> None:
    m, opt = model_and_opt()
    with hooktrace.trace(m) as tr:
        for _ in range(5):
            train_step(m, opt)
        m(torch.randn(3, 4))  # after the last step: an incomplete step
    summary = tr.summary()
    spans, row = tr.spans(), tr.span_steps()
    steps = tr.steps()
    assert steps.complete.tolist() == [True] * 5 + [False]
    for r in summary.rows:
        if r["module"] == "<unattributed>":
            assert r["step_p50_ns"] is None
            continue
        slot = [n for n, _ in tr.modules].index(r["module"])
        per_step = [int(spans.duration_ns[(row == i) & (spans.module == slot)
                                          & (spans.cat != 2)].sum()) for i in range(5)]
        assert r["step_p50_ns"] == pytest.approx(np.percentile(per_step, 50))
        assert r["step_p99_ns"] == pytest.approx(np.percentile(per_step, 99))
    assert summary.counts["steps"] == 5
    assert "5 complete steps" in str(summary)
    table = StepTable.from_trace(tr)
    assert [r["step"] for r in table.rows] == [0, 1, 2, 3, 4, 5]
    assert table.rows[-1]["complete"] is False and "6 steps" not in table.to_text()
    # CLI: summary --steps, in every form
    path = tmp_path / "run.htrace"
    tr.save(path)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(path), "--steps"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "5 steps: p50" in r.stdout and "5*" in r.stdout
    r = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(path), "--steps",
                        "--json", "--top", "2"], capture_output=True, text=True, timeout=120)
    assert [s["step"] for s in json.loads(r.stdout)["steps"]] == [0, 1]


def test_steps_row_in_the_chrome_export() -> None:
    import io

    from hooktrace.exporters.chrome import write_chrome

    m, opt = model_and_opt()
    with hooktrace.trace(m) as tr:
        for _ in range(3):
            train_step(m, opt)
    buf = io.BytesIO()
    write_chrome(tr, buf)
    doc = json.loads(buf.getvalue())
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "hooktrace.step"]
    assert [(e["name"], e["args"]) for e in steps] == [
        (f"step {i}", {"step": i, "complete": True}) for i in range(3)]
    (row,) = {e["tid"] for e in steps}
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[row] == "steps" and doc["hooktrace"]["steps"] == 3
    assert {"tid": row, "thread": 0, "kind": "steps", "lane": 0} in doc["hooktrace"]["tracks"]
    assert min(e["ts"] for e in doc["traceEvents"] if e["ph"] == "X") >= 0


def test_export_steps_filter_keeps_exactly_those_steps(tmp_path: Path) -> None:
    from hooktrace.cli import main

    m, opt = model_and_opt()
    with hooktrace.trace(m) as tr:
        for _ in range(4):
            train_step(m, opt)
    path = tmp_path / "run.htrace"
    tr.save(path)
    out = tmp_path / "cut.json"
    assert main(["export", str(path), "-o", str(out), "--steps", "1:2"]) == 0
    doc = json.loads(out.read_text())
    roots = [e for e in doc["traceEvents"] if e.get("cat") == "hooktrace.forward"
             and e["args"]["module"] == ""]
    steps = [e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "hooktrace.step"]
    # the root's forward calls of steps 1 and 2, whole; the steps row cut to them
    assert len(roots) == 2 and not any(e["args"].get("clipped") for e in roots)
    assert steps == [1, 2]
    assert main(["export", str(path), "-o", str(out), "--steps", "7:9"]) == 1


def test_the_summary_splits_a_step_into_forward_eval_backward_and_other() -> None:
    """Issue #38: the text summary had no split of a step. Per complete step on average:
    the outermost training forward calls, eval calls, backward spans and the rest,
    checked against the spans themselves; the parts add up to the step."""
    import time

    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, SPAN_EVAL

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hooktrace.trace(model) as tr:
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            time.sleep(0.002)  # "other": outside the model, inside the step
            opt.step()
            with torch.no_grad():
                model(torch.randn(2, 8))  # an eval call, inside the next step
    summary = tr.result.summary()
    split = summary.step_split
    assert split is not None
    # (the reference: the spans of the complete steps, by category)
    trace = tr.result
    spans, steps = trace.spans(), trace.steps()
    row = trace.span_steps()
    complete = np.flatnonzero(steps.complete)
    inside = np.isin(row, complete) & (spans.parent < 0)
    dur = spans.duration_ns
    ev = (spans.flags & SPAN_EVAL) != 0
    n = len(complete)
    assert split["forward"] == int(dur[inside & (spans.cat == CAT_FORWARD) & ~ev].sum()) // n
    assert split["eval"] == int(dur[inside & (spans.cat == CAT_FORWARD) & ev].sum()) // n > 0
    assert split["backward"] == int(dur[inside & (spans.cat == CAT_BACKWARD)].sum()) // n > 0
    assert split["step"] == int(steps.duration_ns[complete].sum()) // n
    assert split["other"] >= 2_000_000  # the sleep, at least
    assert split["forward"] + split["eval"] + split["backward"] + split["other"] == split["step"]
    line = next(x for x in summary.footer().splitlines() if x.startswith("a step on average"))
    assert "forward" in line and "eval" in line and "backward" in line and "other" in line
