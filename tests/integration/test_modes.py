"""Training and eval calls told apart (issue #17): a module call made with grad off
(``torch.no_grad``, ``torch.inference_mode``) or with the module in eval mode is an
eval call; the summary, ``summary --json``, ``diff`` and the report keep those apart
from the training calls, and step statistics count training steps only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.reading import CAT_FORWARD, SPAN_EVAL

REPO = Path(__file__).resolve().parents[2]


def _modes(tr: hooktrace.Trace) -> list[tuple[str, bool]]:
    s = tr.result.spans()
    fwd = [i for i in range(len(s)) if s.cat[i] == CAT_FORWARD]
    fwd.sort(key=lambda i: int(s.start_ns[i]))
    return [(tr.result.modules[int(s.module[i])][0], bool(s.flags[i] & SPAN_EVAL)) for i in fwd]


def test_grad_mode_and_eval_mode_are_recorded_per_call() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))
    x = torch.randn(2, 4)
    with hooktrace.trace(model) as tr:
        model(x)                      # training
        with torch.no_grad():
            model(x)                  # grad off
        with torch.inference_mode():
            model(x)                  # inference mode
        model.eval()
        model(x)                      # eval mode, grad on
        model[1].train()
        model(x)                      # the root in eval mode, one child back in training
    calls = _modes(tr)
    assert [e for _, e in calls[0:3]] == [False, False, False]
    assert len(calls) == 15 and all(e for _, e in calls[3:12])
    assert calls[12:] == [("", True), ("0", True), ("1", False)]
    assert model.training is False  # (the model is left as the script set it)


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS", "RANK"):
        env.pop(name, None)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


TRAIN_EVAL = """
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        model.train()
        for _ in range(3):
            loss = loss_fn(model(torch.randn(4, 8)), torch.zeros(4, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for _ in range(5):
                loss_fn(model(torch.randn(4, 8)), torch.zeros(4, 1))
    print("done")
"""


def test_summary_json_of_a_train_and_eval_script(tmp_path: Path) -> None:
    # GIVEN a script that trains, then evaluates under no_grad, each epoch
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN_EVAL))
    r = _run(tmp_path, "-m", "hooktrace", "run", "-o", "run.htrace", "train.py")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    r = _run(tmp_path, "-m", "hooktrace", "summary", "--json", "run.htrace")
    assert r.returncode == 0, r.stderr
    rows = {(row["module"], row["mode"]): row for row in json.loads(r.stdout)["rows"]}
    # THEN the training calls and the eval calls are separate rows
    assert rows[("0", "train")]["calls"] == 6 and rows[("0", "eval")]["calls"] == 10
    assert rows[("", "train")]["calls"] == 6 and rows[("", "eval")]["calls"] == 10
    # the training rows' backward ratio is the training calls' own (not diluted by eval)
    assert rows[("0", "train")]["bwd_calls"] == 6 and rows[("0", "train")]["bwd_fwd_ratio"] > 0
    assert rows[("0", "eval")]["bwd_calls"] == 0
    # per-step figures only for training rows
    assert rows[("0", "train")]["step_p50_ns"] is not None
    assert rows[("0", "eval")]["step_p50_ns"] is None
    # the loss module is a secondary top-level module: prefixed; the model's names are its own
    assert ("MSELoss", "train") in rows and ("MSELoss", "eval") in rows
    text = _run(tmp_path, "-m", "hooktrace", "summary", "run.htrace").stdout
    assert "0 [eval]" in text and "[eval]: the calls made with grad off" in text


def test_diff_compares_eval_calls_apart(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN_EVAL))
    for name in ("a", "b"):
        r = _run(tmp_path, "-m", "hooktrace", "run", "-o", f"{name}.htrace", "train.py")
        assert r.returncode == 0, r.stderr
    r = _run(tmp_path, "-m", "hooktrace", "diff", "a.htrace", "b.htrace", "--json")
    assert r.returncode == 0, r.stderr
    phases = {(row["module"], row["phase"]) for row in json.loads(r.stdout)["rows"]}
    assert {("0", "forward"), ("0", "backward"), ("0", "eval")} <= phases


def test_the_report_charts_complete_training_steps_and_shows_the_mode(tmp_path: Path) -> None:
    from hooktrace.reporters.html import render_report

    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN_EVAL))
    r = _run(tmp_path, "-m", "hooktrace", "run", "-o", "run.htrace", "train.py")
    assert r.returncode == 0, r.stderr
    run = hooktrace.load(tmp_path / "run.htrace")
    steps = run.steps()
    assert not steps.complete.all()  # the eval pass after the last optimizer step
    pytest.importorskip("plotly", reason="the HTML report inlines plotly.js from the plotly "
                        "package (optional: hooktrace[report])")
    page = render_report(run)
    complete = [int(n) for n, c in zip(steps.number, steps.complete) if c]
    assert f'"x": {json.dumps(complete)}' in page  # the step chart's steps (steps_figure)
    assert 'data-key="mode"' in page


def test_a_row_without_backward_shows_blank_backward_cells() -> None:
    # GIVEN a training step and a no_grad evaluation (issue #38: the [eval] row read
    # "0 ns" of backward)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.ones(2, 4)).sum().backward()
        with torch.no_grad():
            model(torch.ones(2, 4))
    text = tr.summary().to_text()
    header, *lines = text.splitlines()
    row = next(line for line in lines if line.startswith("0 [eval]"))
    train = next(line for line in lines if line.startswith("0 "))
    # THEN the eval row stops after its forward columns; the training row has backward
    assert "bwd_total" in header and len(row.split()) < len(train.split()), (row, train)
    assert " 0 ns" not in row
