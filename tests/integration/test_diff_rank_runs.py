"""hooktrace diff on real recorded rank directories and schedule windows: two "ranks"
recorded at the same time in this process (RANK / WORLD_SIZE set as torchrun sets them,
so the recorder writes their rank metadata and window_handler their file names), one
module of rank 1 slowed with a sleep in run B."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.cli import main
from hooktrace.analysis.diff import compare_paths
from hooktrace.record.distributed import default_output_name

SLEEP_S = 0.02
STEPS = 6


class Sleepy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.delay = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.fc(x)


def record(out: Path, monkeypatch: pytest.MonkeyPatch, *, slow_rank: int | None,
           windows: bool) -> Path:
    """Two ranks traced side by side for STEPS steps; files in ``out`` as each rank
    would write them: DIR/rank<R>/trace.htrace, or window_handler(DIR)'s windows of
    steps 1-2 and 4-5."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(16, 16), nn.ReLU(), Sleepy(), nn.Linear(16, 4))
              for _ in range(2)]
    if slow_rank is not None:
        models[slow_rank][2].delay = SLEEP_S
    monkeypatch.setenv("WORLD_SIZE", "2")
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=2) if windows else None
    handler = hooktrace.window_handler(out) if windows else None
    traces = [hooktrace.trace(m, schedule=sched, on_window=handler) for m in models]

    def as_rank(r: int) -> None:  # the recorder reads RANK when it writes metadata
        monkeypatch.setenv("RANK", str(r))

    for r, tr in enumerate(traces):
        as_rank(r)
        tr.__enter__()
    x = torch.randn(8, 16)
    for _ in range(STEPS):
        for r, (m, tr) in enumerate(zip(models, traces)):
            as_rank(r)
            m(x).sum().backward()
            tr.step()
    for r, tr in enumerate(traces):
        as_rank(r)
        tr.__exit__(None, None, None)
        if not windows:
            path = Path(default_output_name(f"{out}/", r))
            path.parent.mkdir(parents=True, exist_ok=True)
            tr.save(path)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return out


def test_a_slowed_module_on_one_rank_is_named_with_its_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    a = record(tmp_path / "a", monkeypatch, slow_rank=None, windows=False)
    b = record(tmp_path / "b", monkeypatch, slow_rank=1, windows=False)
    assert sorted(p.relative_to(a).as_posix() for p in a.rglob("*.htrace")) == [
        "rank0/trace.htrace", "rank1/trace.htrace"]
    same = compare_paths(str(a), str(a), workers=1)
    assert same.ranks == [0, 1] and not same.failures(0.0)
    assert all(r["per_step_change_ns"] == 0 for r in same.rows)
    d = compare_paths(str(a), str(b), workers=1)
    top = d.rows[0]
    assert (top["module"], top["phase"], top["rank"]) == ("2", "forward", 1)
    assert top["self_per_step_change_ns"] > 0.75 * SLEEP_S * 1e9  # the sleep, in its self time
    # The gate names the module with its rank. The step got slower on both ranks (rank 0's
    # step holds rank 1's calls here, as a real rank waits for the others), by about as
    # much, so which rank it names is noise. 1000%: a few-µs module on a loaded machine can
    # double from run to run; the sleep is ~1000x. --min-share 0: a preempted step in A
    # (ms on a loaded machine) can shrink the module's share of it below the default 1%.
    failed = d.failures(1000.0, min_share=0.0)
    modules = [f for f in failed if not f.startswith("<step> step on rank ")]
    assert modules[0].startswith("2 forward on rank 1: +"), failed
    assert main(["diff", str(a), str(b), "--fail-above", "1000", "--min-share", "0",
                 "--workers", "1"]) == 1
    assert "2 forward on rank 1: +" in capsys.readouterr().err
    assert main(["diff", str(a), str(a), "--fail-above", "0", "--json", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["failed"] == []


def test_rank_windows_pooled_and_picked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    a = record(tmp_path / "a", monkeypatch, slow_rank=None, windows=True)
    b = record(tmp_path / "b", monkeypatch, slow_rank=1, windows=True)
    names = sorted(p.name.split("_rank")[1] for p in a.glob("*.htrace"))
    assert names == ["0.2.htrace", "0.5.htrace", "1.2.htrace", "1.5.htrace"]
    d = compare_paths(str(a), str(b), workers=1)
    assert d.ranks == [0, 1] and d.sources is not None
    assert d.sources[0]["files"] == 4 and "2 windows each pooled" in d.sources[0]["text"]
    assert (d.rows[0]["module"], d.rows[0]["rank"]) == ("2", 1)
    assert d.rows[0]["calls_b"] == 1  # per step, over the 4 pooled steps
    last = compare_paths(f"{a}:-1", f"{b}:-1", workers=1)
    assert (last.rows[0]["module"], last.rows[0]["rank"]) == ("2", 1)
    # rank 0 against itself, window by window: nothing moved beyond noise in A vs A
    assert main(["diff", f"{a}:0", f"{a}:0", "--fail-above", "0", "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["diff", f"{a}:0", f"{b}:1", "--fail-above", "1000", "--min-share", "0",
                 "--workers", "1"]) == 1
    assert "2 forward on rank 1: +" in capsys.readouterr().err
