"""Tracing never changes a compiled program (issue #16).

Each case runs the same compiled training steps twice from a fresh Dynamo state:
untraced, then traced. The traced run must compile exactly what the untraced run
compiled (Dynamo's own counters: frames, graphs, graph breaks, recompiles), give
bit-identical outputs and gradients, and still record one forward and one backward
span per compiled region, named for its module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD

REPO = Path(__file__).resolve().parents[2]
STEPS = 3


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def _dynamo_counts() -> dict[str, dict[str, int]]:
    from torch._dynamo.utils import counters

    return {k: dict(counters[k]) for k in ("frames", "stats", "graph_break", "recompiles")}


def _prepare(how: str, net: Net) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the user calls: torch.compile(model), module.compile() per block, fullgraph."""
    if how == "model":
        return torch.compile(net)
    if how == "fullgraph":
        return torch.compile(net, fullgraph=True)
    for b in net.blocks:
        b.compile()
    return net


def _steps(fn: Callable[[torch.Tensor], torch.Tensor], net: Net) -> list[torch.Tensor]:
    results = []
    for i in range(STEPS):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        out = fn(x)
        out.square().sum().backward()
        results.append(out.detach().clone())
        for p in net.parameters():
            results.append(p.grad.clone())  # type: ignore[union-attr]
            p.grad = None
    return results


def _fresh() -> Net:
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    return Net()


_reference: dict[str, tuple[list[torch.Tensor], dict[str, dict[str, int]]]] = {}


def _untraced(how: str) -> tuple[list[torch.Tensor], dict[str, dict[str, int]]]:
    if how not in _reference:
        net = _fresh()
        _reference[how] = (_steps(_prepare(how, net), net), _dynamo_counts())
    return _reference[how]


def _traced(how: str, when: str, scope: str) -> tuple[list[torch.Tensor], dict[str, dict[str, int]],
                                                       hooktrace.TraceData]:
    net = _fresh()
    fn: Any = _prepare(how, net) if when == "before" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compiled regions are recorded as one span each"
        if scope == "trace":
            recorder = hooktrace.trace(fn if isinstance(fn, nn.Module) else net)
        else:
            recorder = hooktrace.global_trace()
        with recorder as tr:
            if fn is None:
                fn = _prepare(how, net)
            results = _steps(fn, net)
    return results, _dynamo_counts(), tr


def _spans(tr: hooktrace.TraceData, cat: int) -> list[str]:
    s = tr.spans()
    idx = sorted((i for i in range(len(s)) if s.cat[i] == cat), key=lambda i: int(s.start_ns[i]))
    return [tr.modules[int(s.module[i])][0] for i in idx]


@pytest.mark.parametrize("scope", ["trace", "global"])
@pytest.mark.parametrize("when", ["before", "inside"])
@pytest.mark.parametrize("how", ["model", "blocks", "fullgraph"])
def test_tracing_does_not_change_the_compiled_program(how: str, when: str, scope: str) -> None:
    expected, expected_counts = _untraced(how)
    assert expected_counts["graph_break"] == {} and expected_counts["stats"]["unique_graphs"] >= 1
    results, counts, tr = _traced(how, when, scope)
    # the same compiles: no graph break, no extra graph, no recompile
    assert counts == expected_counts
    # bit-identical outputs and gradients
    assert len(results) == len(expected)
    for got, want in zip(results, expected):
        assert torch.equal(got, want)
    # each compiled region still gets its spans, named for its module
    fwd, bwd = _spans(tr, CAT_FORWARD), _spans(tr, CAT_BACKWARD)
    if how == "blocks":
        blocks = ["blocks.0", "blocks.1", "blocks.2"]
        assert fwd == (["", "embed", *blocks, "head"]) * STEPS
        assert sorted(bwd) == sorted(["", "embed", *blocks, "head"] * STEPS)
    else:
        assert fwd == [""] * STEPS
        assert bwd == [""] * STEPS
    assert tr.modules[0] == ("", "Net")


@pytest.mark.parametrize("scope", ["trace", "global"])
@pytest.mark.parametrize("how", ["model", "blocks"])
def test_a_warm_compiled_model_is_not_compiled_again_when_traced(how: str, scope: str) -> None:
    # GIVEN a compiled model that already ran (Dynamo's caches are warm), as when a
    # window of a long run is traced
    net = _fresh()
    fn = _prepare(how, net)
    warm = _steps(fn, net)
    counts = _dynamo_counts()
    assert counts["stats"]["unique_graphs"] >= 1
    # WHEN more steps run traced, THEN nothing is compiled again and the same steps
    # give what they give untraced
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorder = (hooktrace.trace(fn if isinstance(fn, nn.Module) else net)
                    if scope == "trace" else hooktrace.global_trace())
        with recorder as tr:
            traced = _steps(fn, net)
    assert _dynamo_counts() == counts
    for got, want in zip(traced, warm):
        assert torch.equal(got, want)
    assert len(_spans(tr, CAT_FORWARD)) >= STEPS


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS"):
        env.pop(name, None)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_run_on_torch_compile_of_a_user_model_class(tmp_path: Path) -> None:
    # `hooktrace run` used to crash here ("torch._dynamo.optimize is called on a non
    # function object"): nanoGPT --compile=True, HF Trainer torch_compile=True.
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, sys, torch
        from torch import nn
        from torch._dynamo.utils import counters

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)
            def forward(self, x):
                return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.Sequential(Block(), Block())
            def forward(self, x):
                return self.blocks(x)

        torch.manual_seed(0)
        model = torch.compile(Net())
        out = []
        for i in range(3):
            y = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)))
            y.square().sum().backward()
            out.append(y.detach().flatten().tolist())
        counts = {k: dict(counters[k]) for k in ("frames", "stats", "graph_break", "recompiles")}
        json.dump({"out": out, "counts": counts}, open(sys.argv[1], "w"))
    """))
    plain = _run(tmp_path, str(script), "plain.json")
    assert plain.returncode == 0, plain.stderr
    traced = _run(tmp_path, "-m", "hooktrace", "run", "-o", "t.htrace", str(script), "traced.json")
    assert traced.returncode == 0, traced.stderr
    want = json.loads((tmp_path / "plain.json").read_text())
    got = json.loads((tmp_path / "traced.json").read_text())
    assert got["counts"] == want["counts"] and want["counts"]["graph_break"] == {}
    assert got["out"] == want["out"]  # bit-identical (floats round-trip exactly in JSON)
    tr = hooktrace.load(tmp_path / "t.htrace")
    assert _spans(tr, CAT_FORWARD) == [""] * 3
    assert _spans(tr, CAT_BACKWARD) == [""] * 3
    assert tr.modules[0] == ("", "Net")
