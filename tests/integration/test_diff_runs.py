"""hooktrace diff on real recorded runs: one module slowed with a sleep."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

import hooktrace
from hooktrace.cli import main
from hooktrace.analysis.diff import compare


class Sleepy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.delay = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.fc(x)


def record(path: Path, delay: float) -> hooktrace.TraceData:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), Sleepy(), nn.Linear(16, 4))
    model[2].delay = delay
    with hooktrace.trace(model) as tr:
        for _ in range(4):
            model(torch.randn(8, 16)).sum().backward()
            tr.step()
    tr.save(path)
    return tr


def test_a_sleep_in_one_module_is_named_first_and_fails_the_gate(tmp_path: Path) -> None:
    a = record(tmp_path / "a.htrace", 0.0)
    b = record(tmp_path / "b.htrace", 0.02)
    same = compare(a, a)
    assert all(r["per_step_change_ns"] == 0 for r in same.rows) and not same.failures(1.0)
    d = compare(a, b)
    assert (d.rows[0]["module"], d.rows[0]["phase"]) == ("2", "forward")
    assert d.rows[0]["self_per_step_change_ns"] > 15e6  # the 20 ms sleep, in its self time
    assert main(["diff", str(tmp_path / "a.htrace"), str(tmp_path / "b.htrace"),
                 "--fail-above", "100"]) == 1
    assert main(["diff", str(tmp_path / "a.htrace"), str(tmp_path / "a.htrace"),
                 "--fail-above", "0"]) == 0


def test_a_run_with_steps_against_one_without_is_compared_per_run(tmp_path) -> None:
    import torch
    from torch import nn

    import hooktrace
    from hooktrace.analysis.diff import compare, compare_paths

    # GIVEN the same five training steps recorded with step marks (A) and without (B)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def work() -> None:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()

    with hooktrace.trace(model) as a:
        work()
    with hooktrace.trace(model, steps=None) as b:
        work()
    assert len(a.result.steps()) == 5 and len(b.result.steps()) == 0
    a.result.save(tmp_path / "a.htrace")
    b.result.save(tmp_path / "b.htrace")
    # THEN both are compared over their whole runs (not A per step against B per run),
    # and a note says so; from Python and from files alike
    for d in (compare(a.result, b.result), compare_paths(str(tmp_path / "a.htrace"),
                                                         str(tmp_path / "b.htrace"))):
        rows = {(r["module"], r["phase"]): r for r in d.rows}
        assert rows[("0", "forward")]["calls_a"] == rows[("0", "forward")]["calls_b"] == 5
        assert not d.per_step
        assert any("compared per run" in n for n in d.notes), d.notes
