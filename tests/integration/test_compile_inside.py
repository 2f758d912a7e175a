"""torch.compile(model) called inside ``hooktrace.trace(model)`` (issue #26).

A ``torch.nn`` class as the root (``nn.Sequential``) is compiled by torch through a
frame that calls the module (``external_utils.wrap_inline``), so the module's own call
runs inside the compiled code and never reached the recorder: no span at all, every
kernel "outside any recorded module call". The wrapper's call is now recorded as the
root's (record/scopes.adopt_wrapper). Both roots, the same rows: the root measured,
kernel rows per submodule, forward and backward, every kernel placed; with
fullgraph, dynamic shapes, a recompile from a new input shape, and reduce-overhead
(which on CPU falls back to Inductor's default code).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.kernels import Kernels

STEPS = 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.act = nn.GELU()
        self.b = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


def _model(root: str) -> tuple[nn.Module, str, str]:
    """The model and the names of its two Linear layers."""
    torch.manual_seed(0)
    if root == "sequential":
        return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)), "0", "2"
    return Net(), "a", "b"


def _run(root: str, how: str) -> tuple[hooktrace.TraceResult, str, str, list[int]]:
    torch._dynamo.reset()
    net, first, last = _model(root)
    options: dict[str, Any] = {"fullgraph": {"fullgraph": True},
                               "dynamic": {"dynamic": True},
                               "recompile": {},
                               "reduce-overhead": {"mode": "reduce-overhead"}}[how]
    batches = [4, 8] if how == "recompile" else [4] * STEPS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(net) as tr:
            cnet = torch.compile(net, **options)
            for n in batches:
                net.zero_grad()
                cnet(torch.randn(n, 32)).sum().backward()
    return tr.result, first, last, batches


@pytest.mark.parametrize("how", ["fullgraph", "dynamic", "recompile", "reduce-overhead"])
@pytest.mark.parametrize("root", ["sequential", "custom"])
def test_a_model_compiled_inside_the_trace_has_its_rows(root: str, how: str) -> None:
    result, first, last, batches = _run(root, how)
    rows = {r["module"]: r for r in result.summary().rows if r["mode"] == "train"}
    # the root: one measured call per step (the compiled region)
    assert rows[""]["timing"] == "measured" and rows[""]["calls"] == len(batches), rows
    # both Linear layers: kernel rows, a call per region call, time forward
    for name in (first, last):
        r = rows[name]
        assert r["timing"] == "kernels" and r["calls"] == len(batches), (name, r)
        assert r["total_ns"] > 0
    # backward kernels attributed inside the model too (the last Linear's mm)
    assert rows[last]["bwd_calls"] == len(batches) and rows[last]["bwd_total_ns"] > 0
    # every kernel ran inside a recorded call, none left over
    k = Kernels.from_trace(result)
    assert len(k) > 0 and (k.unplaced, k.unpaired) == (0, 0)
    assert "outside any recorded module call" not in result.summary().to_text()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 128)
        self.act = nn.GELU()
        self.proj = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.act(self.fc(self.ln(x))))


def test_a_module_fused_away_shows_fused_not_calls_0_and_0_ns() -> None:
    # GELU's backward fuses with its neighbours' into a kernel counted in the block
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), Block(), nn.Linear(64, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(net) as tr:
            cnet = torch.compile(net)
            for _ in range(STEPS):
                net.zero_grad()
                cnet(torch.randn(4, 32)).sum().backward()
    s = tr.result.summary()
    zero = [r["module"] for r in s.rows if r["timing"] == "kernels"
            and (r["calls"] == 0 or r["bwd_calls"] == 0)]
    assert zero, [(r["module"], r["calls"], r["bwd_calls"]) for r in s.rows]
    text = s.to_text(wide=True)
    for line in text.splitlines()[1:]:
        if line.split()[0] in zero:
            assert "fused" in line and " 0 ns" not in line, line
    assert "\nfused: no kernel of its own" in text
