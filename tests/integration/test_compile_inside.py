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

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.analysis.kernels import Kernels

REPO = Path(__file__).resolve().parents[2]
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


CACHED_SCRIPT = """
import json, sys, warnings, torch, torch.nn as nn, hooktrace
from torch._dynamo.utils import counters
from hooktrace.analysis.kernels import Kernels
warnings.simplefilter("ignore")
torch.manual_seed(0)
from collections import OrderedDict
layers = [nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)]
net = (nn.Sequential(OrderedDict(zip(["first", "g", "last"], layers)))
       if sys.argv[-1] == "renamed" else nn.Sequential(*layers))
rows, unplaced = [], 0
if sys.argv[1] == "traced":
    with hooktrace.trace(net) as tr:
        if sys.argv[2] == "shift":  # other sites first: ids differ from the first run's
            from hooktrace.record import kernels
            for i in range(5):
                kernels.site(f"cpp_fused_{i}", "elsewhere", "forward")
        cnet = torch.compile(net)
        for _ in range(2):
            net.zero_grad(); cnet(torch.randn(4, 32)).sum().backward()
    rows = sorted(r["module"] for r in tr.result.summary().rows if r["timing"] == "kernels")
    k = Kernels.from_trace(tr.result)
    unplaced = k.unplaced + k.unnamed
else:
    cnet = torch.compile(net)
    for _ in range(2):
        net.zero_grad(); cnet(torch.randn(4, 32)).sum().backward()
print(json.dumps({"hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"],
                  "rows": rows, "unplaced": unplaced}))
"""


def test_marked_code_is_cached_under_its_own_key(tmp_path: Path) -> None:
    """Two processes compiling the same model under the trace: the second loads the
    marked code from Inductor's cache (no recompile) and its kernels still have rows;
    the same ops under other module names, and an untraced compile, never get that
    code (a miss, then an entry of their own)."""
    script = tmp_path / "cached.py"
    script.write_text(CACHED_SCRIPT)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)

    def run(*args: str) -> dict[str, Any]:
        r = subprocess.run([sys.executable, str(script), *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = run("traced", "plain")
    assert first["miss"] > 0 and first["hit"] == 0, first
    assert first["rows"] == ["0", "1", "2"] and first["unplaced"] == 0, first
    second = run("traced", "shift")  # other sites registered first in this process
    assert second["hit"] >= first["miss"], second  # every marked graph from the cache
    assert second["rows"] == ["0", "1", "2"] and second["unplaced"] == 0, second
    # the same ops under other module names: not the first model's code (its sites
    # name the first model's modules), an entry of its own
    renamed = run("traced", "renamed")
    assert renamed["hit"] == 0 and renamed["miss"] > 0, renamed
    assert renamed["rows"] == ["first", "g", "last"] and renamed["unplaced"] == 0, renamed
    plain = run("plain")
    assert plain["hit"] == 0 and plain["miss"] > 0, plain  # never the marked code
    assert run("plain")["hit"] > 0  # and unmarked code is cached as before


def _train_steps(compiled: bool, steps: int = 4) -> hooktrace.TraceResult:
    torch._dynamo.reset()
    net, _, _ = _model("sequential")
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(net) as tr:
            fn = torch.compile(net) if compiled else net
            for _ in range(steps):
                opt.zero_grad()
                fn(torch.randn(4, 32)).sum().backward()
                opt.step()
    return tr.result


def test_compile_steps_are_told_apart_and_compile_time_shown_apart() -> None:
    from hooktrace.reporters.html import render_report
    from hooktrace.reading import CAT_BACKWARD
    from hooktrace.analysis.summary import COMPILE_ROW, StepTable

    result = _train_steps(compiled=True)
    compiles = result.info["compiles"]
    assert compiles and all(c[1] > c[0] for c in compiles)
    compile_ns = sum(c[1] - c[0] for c in compiles)
    # the first step compiled; the step table says so and leaves it out of p50/p99
    table = StepTable.from_trace(result)
    assert [r["compile"] for r in table.rows] == [True, False, False, False]
    assert "(1 compile steps left out)" in table.to_text()
    first = table.rows[0]["duration_ns"]
    s = result.summary()
    assert s.counts["steps"] == 3 and s.counts["compile_steps"] == 1
    assert s.counts["step_p99_ns"] < first  # the compile step is not in the statistics
    rows = {r["module"]: r for r in s.rows}
    # the compile time is a row of its own, and out of the root's self time
    r = rows[COMPILE_ROW]
    assert r["total_ns"] + r["bwd_total_ns"] == compile_ns
    assert r["calls"] + r["bwd_calls"] == len(compiles)
    # Dynamo's compile in the first forward call; a compile in the backward pass (where
    # AOTAutograd compiles a backward lazily) under backward
    assert r["calls"] >= 1, r
    spans = result.spans()
    first_bwd = int(spans.start_ns[spans.cat == CAT_BACKWARD].min())  # (steps: 1 compile)
    assert r["bwd_total_ns"] == sum(c[1] - c[0] for c in compiles if c[0] >= first_bwd)
    # (before: the root's self time was the compile's, seconds against microseconds)
    assert rows[""]["self_ns"] < 0.5 * compile_ns, (rows[""], compiles)
    assert COMPILE_ROW in s.to_text() and "compile steps left out" in s.to_text()
    # the report's step chart hatches the compile step
    assert '"shape": ["/", "", "", ""]' in render_report(result).replace("\\/", "/")


def test_an_eager_run_has_no_compile_step() -> None:
    from hooktrace.analysis.summary import COMPILE_ROW, StepTable

    result = _train_steps(compiled=False)
    assert "compiles" not in result.info
    s = result.summary()
    assert s.counts["steps"] == 4 and s.counts["compile_steps"] == 0
    assert all(r["module"] != COMPILE_ROW for r in s.rows)
    assert not any(r["compile"] for r in StepTable.from_trace(result).rows)
    assert "compile" not in s.footer()
