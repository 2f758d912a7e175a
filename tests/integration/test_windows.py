"""Schedule windows in trace() itself (issue #9 part 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.reading import CAT_FORWARD, TraceData


def model_and_opt() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return m, torch.optim.SGD(m.parameters(), lr=0.01)


def train_step(m: nn.Module, opt: torch.optim.Optimizer) -> None:
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def roots(window: TraceData) -> int:
    s = window.spans()
    return int(((s.depth == 0) & (s.cat == CAT_FORWARD)).sum())


def test_each_window_holds_exactly_its_active_steps_and_arrives_as_it_ends() -> None:
    m, opt = model_and_opt()
    seen: list[tuple[int, TraceData]] = []
    sched = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
    with hooktrace.trace(m, schedule=sched,
                         on_window=lambda w: seen.append((tr.current_step, w))) as tr:
        for _ in range(10):
            train_step(m, opt)
    # two windows, each handed over right after its last step ended
    assert [(at, w.info["window"]) for at, w in seen] == [
        (4, {"first_step": 2, "last_step": 3, "complete": True}),
        (8, {"first_step": 6, "last_step": 7, "complete": True})]
    for _, w in seen:
        assert roots(w) == 2  # forward of the root: once per active step
        assert w.steps().number.tolist() == [w.info["window"]["first_step"],
                                             w.info["window"]["last_step"]]
        assert (w.spans().cat == 1).sum() > 0  # backward spans of the window's steps
        assert w.dropped_events == 0
    # wait / warmup steps and the steps after the last window recorded nothing
    assert len(tr.events) == 0 and tr.info["window"]["complete"] is False


def test_a_window_open_at_exit_is_handed_over_and_kept() -> None:
    m, opt = model_and_opt()
    sched = torch.profiler.schedule(wait=0, warmup=0, active=3)
    with hooktrace.trace(m, schedule=sched) as tr:
        for _ in range(2):  # the block ends inside the window
            train_step(m, opt)
    assert len(tr.windows) == 1 and tr.windows[0].info["window"]["complete"] is False
    assert roots(tr) == 2 and roots(tr.windows[0]) == 2


def test_memory_holds_one_window_at_most() -> None:
    # 501 modules: 1002 forward events per step; 12 windows of 2 steps = 24,048 events,
    # twice what a capacity of 3 chunks holds: only recycling keeps every one
    m = nn.Sequential(*[nn.Identity() for _ in range(500)])
    x = torch.randn(2)
    chunks: list[int] = []
    sched = torch.profiler.schedule(wait=1, warmup=0, active=2, repeat=12)
    with hooktrace.trace(m, schedule=sched, steps=None, capacity=3 * 4096,
                         on_window=lambda w: chunks.append(tr._session.stats()["chunks"])
                         ) as tr:
        for _ in range(36):
            m(x)
            tr.step()
    assert len(chunks) == 12 and max(chunks) <= 3  # the pool is reused window after window
    assert tr.dropped_events == 0


def test_window_handler_writes_one_file_per_window(tmp_path: Path) -> None:
    m, opt = model_and_opt()
    sched = torch.profiler.schedule(wait=1, warmup=0, active=1, repeat=3)
    with hooktrace.trace(m, schedule=sched, on_window=hooktrace.window_handler(tmp_path)):
        for _ in range(6):
            train_step(m, opt)
    files = sorted(tmp_path.glob("*.htrace"), key=lambda p: int(p.name.split(".")[-2]))
    assert [int(p.name.split(".")[-2]) for p in files] == [1, 3, 5]
    assert all(roots(hooktrace.load(p)) == 1 for p in files)


def test_bad_schedule_arguments_are_refused_before_touching_the_model(tmp_path: Path) -> None:
    m, _ = model_and_opt()
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1)
    for kwargs, err in (({"schedule": 3}, TypeError), ({"on_window": print}, TypeError),
                        ({"schedule": sched, "out": str(tmp_path / "x.htrace")}, ValueError),
                        ({"schedule": sched, "policy": "ring"}, ValueError)):
        with pytest.raises(err):
            hooktrace.trace(m, **kwargs)
    assert "forward" not in m.__dict__
    (tmp_path / "f").write_text("x")
    with pytest.raises(hooktrace.errors.OutputPathError):
        hooktrace.window_handler(tmp_path / "f")
