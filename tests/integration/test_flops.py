"""trace(model, flops=True): per-module FLOPs equal FlopCounterMode's on the same step."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import hooktrace
from hooktrace.demo import GPTConfig, TinyGPT
from models import ConvNet


def reference(model: nn.Module, x: torch.Tensor) -> tuple[dict[str, int], dict[str, int]]:
    """FlopCounterMode's per-module counts of one forward and its backward, keyed by
    qualified name (forward, backward)."""
    root = type(model).__name__
    def named(counts: dict[str, Any]) -> dict[str, int]:
        out = {}
        for k, v in counts.items():
            if k == root:
                out[""] = sum(v.values())
            elif k.startswith(root + "."):
                out[k[len(root) + 1:]] = sum(v.values())
        return out
    with FlopCounterMode(display=False) as counter:
        y = model(x)
        fwd = named(counter.get_flop_counts())
        y.float().pow(2).mean().backward()
        total = named(counter.get_flop_counts())
    bwd = {k: v - fwd.get(k, 0) for k, v in total.items() if v - fwd.get(k, 0)}
    return {k: v for k, v in fwd.items() if v}, bwd


@pytest.mark.parametrize("make", [
    lambda: (TinyGPT(GPTConfig(vocab=64, context=16, width=32, heads=2, layers=2)),
             torch.randint(0, 64, (2, 16))),
    lambda: (ConvNet(), torch.randn(2, 3, 8, 8)),
], ids=["gpt", "resnet"])
def test_flops_equal_flop_counter_mode_per_module(make: Any) -> None:
    # GIVEN a model and a copy of it measured by FlopCounterMode on the same input
    torch.manual_seed(0)
    model, x = make()
    fwd_ref, bwd_ref = reference(copy.deepcopy(model), x)
    # WHEN hooktrace counts FLOPs over three steps (one signature: counted once)
    with hooktrace.trace(model, flops=True) as tr:
        for _ in range(3):
            model(x).float().pow(2).mean().backward()
            tr.step()
    flops = tr.info["flops"]
    assert flops["calls"] == [0, 0, 0] and flops["counted"] == [0]
    # THEN each module's FLOPs per call, forward and backward, are the reference's
    rows = {r["module"]: r for r in tr.summary().rows}
    assert fwd_ref and bwd_ref
    for name, value in fwd_ref.items():
        calls_per_step = rows[name]["calls"] / 3
        assert rows[name]["flops"] * calls_per_step == pytest.approx(value), name
        assert rows[name]["tflops"] is not None and rows[name]["tflops"] > 0
    for name, value in bwd_ref.items():
        per_step = rows[name]["bwd_calls"] / 3
        assert rows[name]["bwd_flops"] * per_step == pytest.approx(value), name
    # modules without FLOPs (activations, dropout) have 0, not a missing value
    assert all(r["flops"] is not None for r in tr.summary().rows if r["calls"])


def test_a_new_input_shape_is_counted_again_and_saved(tmp_path: Any) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with hooktrace.trace(model, flops=True) as tr:
        for batch in (2, 2, 5, 2, 5):
            model(torch.randn(batch, 8)).sum().backward()
            tr.step()
    assert tr.info["flops"]["calls"] == [0, 0, 1, 0, 1]
    assert tr.info["flops"]["counted"] == [0, 2]
    sigs = tr.info["flops"]["signatures"]
    assert sigs[0]["forward"]["0"] == 2 * 2 * 8 * 16 and sigs[1]["forward"]["0"] == 2 * 5 * 8 * 16
    # mean per call over all five calls: (3 x 2 + 2 x 5) rows of 2*8*16 FLOPs each
    row = {r["module"]: r for r in tr.summary().rows}["0"]
    assert row["flops"] == pytest.approx((3 * 2 + 2 * 5) * 2 * 8 * 16 / 5)
    path = tmp_path / "f.htrace"
    tr.save(path)
    loaded = hooktrace.load(path).summary(peak_tflops=1.0)
    r0 = {r["module"]: r for r in loaded.rows}["0"]
    assert r0["flops"] == row["flops"] and r0["mfu"] is not None
    assert "mfu" in loaded.to_csv().splitlines()[0]
    assert "TFLOP/s" in loaded.to_text(flops=True)


def test_flops_must_be_a_bool_and_off_records_nothing() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="flops must be True or False"):
        hooktrace.trace(model, flops="yes")  # type: ignore[arg-type]
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 2))
    assert "flops" not in tr.info and "flops" not in tr.summary().columns


def test_a_root_returning_a_dataclass_still_counts_its_backward() -> None:
    # GIVEN a model whose output is a dataclass (not a pytree) holding the tensor
    from models import Shared

    torch.manual_seed(0)
    model, x = Shared(), torch.randn(2, 4)

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x).hidden

    _, bwd_ref = reference(copy.deepcopy(Hidden()), x)
    # WHEN traced with flops=True
    with hooktrace.trace(model, flops=True) as tr:
        model(x).hidden.float().pow(2).mean().backward()
    # THEN the counter stayed open for the backward pass: FlopCounterMode's counts
    bwd = tr.info["flops"]["signatures"][0]["backward"]
    assert bwd and bwd == {k.removeprefix("model."): v for k, v in bwd_ref.items()
                           if k.startswith("model.")}


def test_eval_rows_have_no_backward_flops() -> None:
    # GIVEN a module called in training (with a backward) and with grad off
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(4, 8)
    with hooktrace.trace(model, flops=True) as tr:
        model(x).sum().backward()
        with torch.no_grad():
            model(x)
    rows = {(r["module"], r["mode"]): r for r in tr.result.summary().rows}
    # THEN the [eval] row's backward FLOP cells are blank: its calls have no backward
    assert rows[("0", "train")]["bwd_flops"] and rows[("0", "eval")]["flops"]
    assert rows[("0", "eval")]["bwd_flops"] is None and rows[("0", "eval")]["bwd_tflops"] is None
    text = tr.result.summary().to_text(wide=True).splitlines()
    header = text[0].split()
    eval_line = next(line for line in text if line.startswith("0 [eval]"))
    assert "bwd_flops" in header and len(eval_line.split()) < len(
        next(line for line in text if line.startswith("0 ")).split())
