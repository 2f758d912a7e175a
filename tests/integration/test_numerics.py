"""Numeric health per module call and the first non-finite value, named (issue #19).

Checks: each call's output and input-gradient statistics equal a pure-Python
reference (torch.amax(abs), torch.linalg.vector_norm, isfinite counts); an overflow
to inf in one submodule at a known step and a custom autograd Function returning NaN
gradients at a known step are both named exactly (module, phase, step), the latter
also when the module shares its input with its parent; activation checkpointing,
in-place ops, dataclass and tuple outputs, integer outputs (skipped, counted);
sampling every N steps; dump_on="nonfinite"; `hooktrace run --numerics` read through
`summary --json`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace._events import NUMERICS
from hooktrace.analysis.numerics import Numerics, first_nonfinite, history

REPO = Path(__file__).resolve().parents[2]


# The fused deferred path (hooktrace/record/fused_numerics.py, a Triton kernel) runs on
# CPU tensors in the Triton interpreter, which works only when TRITON_INTERPRET=1 is
# set before triton is imported (torch.compile imports it, in earlier tests): so
# test_the_fused_path_in_an_interpreter_process runs this file's "fused" tests again in
# a process of their own, with HOOKTRACE_TEST_FUSED=1, where they are collected.
FUSED = os.environ.get("HOOKTRACE_TEST_FUSED") == "1"


class _Counting:
    """The fused launcher, counting its calls and the kernel launches it makes; the
    aten ops it runs itself (the interpreter copies tensors) are inside a
    record_function, so the profiler shows them as not top-level."""

    def __init__(self) -> None:
        from hooktrace.record.fused_numerics import make_launcher

        self.launcher = make_launcher(interpret=True)
        self.calls: list[tuple[tuple[int, ...], torch.dtype]] = []
        self.launches = 0
        self.launcher.kernel.add_pre_run_hook(self._launched)

    def _launched(self, *args: Any, **kwargs: Any) -> None:
        self.launches += 1

    def __call__(self, x: torch.Tensor, out: torch.Tensor, row: int) -> None:
        self.calls.append((tuple(x.shape), x.dtype))
        with torch.profiler.record_function("hooktrace_fused_launch"):
            self.launcher(x, out, row)


@pytest.fixture(params=["immediate", "deferred", *(["fused"] if FUSED else [])])
def path(request: pytest.FixtureRequest) -> Any:
    """Each way statistics are read: at once (CPU tensors), and deferred (what tensors
    off the CPU take: queued where they live, read once per step; forced on CPU here),
    by ATen ops or, in the interpreter process (FUSED), by the fused Triton kernel."""
    import hooktrace._C as _C

    _C.set_numerics_deferred(request.param != "immediate")
    launcher = _Counting() if request.param == "fused" else None
    if launcher is not None:
        _C.set_numerics_fused(launcher, True)
    try:
        yield request.param
    finally:
        _C.set_numerics_deferred(False)
        _C.set_numerics_fused(None)
    if launcher is not None:  # the test took the fused path
        assert launcher.calls and launcher.launches == len(launcher.calls)


@dataclasses.dataclass
class Out:
    hidden: torch.Tensor
    ids: torch.Tensor


class Pair(nn.Module):
    """Several outputs: a tuple of two tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y, y * 2


class Head(nn.Module):
    """A dataclass output holding a float and an integer tensor."""

    def forward(self, x: torch.Tensor) -> Out:
        return Out(x.tanh(), x.argmax(-1))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.pair = Pair()
        self.head = Head()

    def forward(self, x: torch.Tensor) -> Out:
        a, b = self.pair(self.act(self.inp(x)))
        return self.head(a + b)


def _batches(n: int) -> list[torch.Tensor]:
    return [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) * (i + 1)
            for i in range(n)]


def _train(net: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    for x in _batches(steps):
        net(x).hidden.square().mean().backward()
        opt.step()
        opt.zero_grad()


def _ref_stats(tensors: list[torch.Tensor]) -> tuple[float, float, int]:
    floats = [t.detach().double() for t in tensors if t.is_floating_point()]
    absmax = max(float(torch.amax(t.abs())) for t in floats)
    sq = sum(float(torch.linalg.vector_norm(t)) ** 2 for t in floats)
    n = sum(t.numel() for t in floats)
    nonfinite = sum(int((~torch.isfinite(t)).sum()) for t in floats)
    return absmax, math.sqrt(sq / n), nonfinite


def _flat(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _flat(o)]
    if dataclasses.is_dataclass(obj):
        return [t for f in dataclasses.fields(obj) for t in _flat(getattr(obj, f.name))]
    return []


def test_stats_equal_a_python_reference_per_call(path: str) -> None:
    # the reference: plain Python hooks on an identical, untraced model
    torch.manual_seed(0)
    ref_net = Net()
    want: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for name, m in ref_net.named_modules():
        if name in ("inp", "pair", "pair.fc", "head"):
            m.register_forward_hook(lambda m, i, o, name=name: want.setdefault(
                (name, "forward"), []).append(_ref_stats(_flat(o))))
        if name in ("pair", "pair.fc", "head"):  # (inp's input needs no grad)
            m.register_full_backward_hook(lambda m, gi, go, name=name: want.setdefault(
                (name, "backward"), []).append(_ref_stats([g for g in gi if g is not None])))
    _train(ref_net, 3)
    torch.manual_seed(0)
    net = Net()
    with hooktrace.trace(net, numerics=True) as tr:
        _train(net, 3)
    result = tr.result
    n = Numerics.from_trace(result)
    deferred = (result.events["kind"] == NUMERICS) & ((result.events["flags"] & 8) != 0)
    assert bool(deferred.any()) is (path != "immediate")
    names = [name for name, _ in result.modules]
    for (name, phase), expected in want.items():
        sel = np.flatnonzero((np.array([names[m] for m in n.module]) == name)
                             & (n.backward == (phase == "backward")))
        got = [(float(n.absmax[k]), float(n.rms[k]), int(n.nonfinite[k])) for k in sel]
        assert len(got) == len(expected) == 3, (name, phase, got, expected)
        for g, w in zip(got, expected):
            assert g[0] == pytest.approx(w[0], rel=1e-5) and g[1] == pytest.approx(w[1], rel=1e-5)
            assert g[2] == w[2] == 0
    # the dataclass output's integer tensor is left out, the ReLU (in place) is measured
    assert ((np.array([names[m] for m in n.module]) == "act") & ~n.backward).sum() == 3
    # nothing non-finite: first_nonfinite is null in the JSON, a line in the footer
    doc = json.loads(result.summary().to_json())
    assert doc["first_nonfinite"] is None
    rows = {(r["module"], r["mode"]): r for r in doc["rows"]}
    assert rows[("pair.fc", "train")]["absmax"] > 0 and rows[("pair.fc", "train")]["rms"] > 0
    assert rows[("pair.fc", "train")]["nonfinite"] == 0
    assert rows[("pair.fc", "train")]["bwd_absmax"] > 0
    assert "numerics: no NaN or Inf seen" in result.summary().to_text()


class Boom(nn.Module):
    """Its output overflows to inf at step `at` (a second, unused output: the weights
    stay finite, so later steps are clean)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.at, self.step = at, 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return y, (y * 1e30) * 1e30 if self.step == self.at else y


class NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, poison: bool) -> torch.Tensor:
        ctx.poison = poison
        return x * 1.0

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (g * float("nan") if ctx.poison else g), None


class Poison(nn.Module):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.step = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NaNGrad.apply(x, self.step == self.at)


class Wrap(nn.Module):
    """Passes its input straight to its child: both see the same input gradient."""

    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.inner = child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Faulty(nn.Module):
    def __init__(self, boom_at: int = -1, nan_at: int = -1) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.boom = Boom(boom_at)
        self.wrap = Wrap(Poison(nan_at))
        self.b = nn.Linear(8, 1)

    def set_step(self, i: int) -> None:
        self.boom.step = self.wrap.inner.step = i

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.boom(self.a(x))
        return self.b(self.wrap(torch.relu(y)))


def _faulty_run(steps: int = 6, **kw: Any) -> hooktrace.TraceResult:
    torch.manual_seed(0)
    net = Faulty(**{k: v for k, v in kw.items() if k in ("boom_at", "nan_at")})
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    opts = {k: v for k, v in kw.items() if k not in ("boom_at", "nan_at")}
    with hooktrace.trace(net, numerics=True, **opts) as tr:
        for i, x in enumerate(_batches(steps)):
            net.set_step(i)
            loss = net(x).square().mean()
            loss.backward()
            if not all(torch.isfinite(p.grad).all() for p in net.parameters()):
                opt.zero_grad()  # (a NaN step is skipped, as AMP's scaler would)
            opt.step()
            opt.zero_grad()
    return tr.result


def test_an_overflow_is_named_with_its_step(capfd: pytest.CaptureFixture[str], path: str
                                             ) -> None:
    result = _faulty_run(boom_at=3)
    first = first_nonfinite(result)
    assert first is not None
    assert (first["module"], first["phase"], first["step"], first["call"]) == ("boom", "forward", 3, 0)
    assert first["absmax"] == "inf" and first["nonfinite"] == 4 * 8
    assert "first non-finite value: boom forward (output), step 3" in capfd.readouterr().err
    doc = json.loads(result.summary().to_json())
    assert doc["first_nonfinite"]["module"] == "boom"
    rows = {(r["module"], r["mode"]): r for r in doc["rows"]}
    assert rows[("boom", "train")]["nonfinite"] == 32 and rows[("a", "train")]["nonfinite"] == 0
    assert "FIRST NON-FINITE: boom forward (output), step 3, call 0" in result.summary().to_text()
    # per-step history: only step 3 has it
    bad_steps = {h["step"] for h in history(result) if h["nonfinite"]}
    assert bad_steps == {3}


def test_a_nan_gradient_is_named_innermost_with_its_step(path: str) -> None:
    result = _faulty_run(nan_at=2)
    first = first_nonfinite(result)
    assert first is not None
    # the gradient of Poison's input is NaN; Wrap shares that input: the innermost
    assert (first["module"], first["phase"], first["step"]) == ("wrap.inner", "backward", 2)
    assert first["type"] == "Poison"


def test_sampling_covers_only_its_steps(path: str) -> None:
    every2 = _faulty_run(boom_at=3, numerics_every=2)
    n = Numerics.from_trace(every2)
    assert set(n.step.tolist()) == {0, 2, 4}
    assert first_nonfinite(every2) is None  # step 3 was not measured
    caught = _faulty_run(boom_at=4, numerics_every=2)
    first = first_nonfinite(caught)
    assert first is not None and first["step"] == 4
    assert first["steps_checked"].startswith("every 2th step")


def test_dump_on_nonfinite_writes_a_dump(tmp_path: Path, path: str) -> None:
    _faulty_run(boom_at=1, dump_on=("nonfinite",), dump_dir=tmp_path)
    dumps = sorted(tmp_path.glob("*.nonfinite-*.htrace"))
    assert len(dumps) == 1
    dump = hooktrace.load(dumps[0])
    assert dump.info["dump"]["reason"] == "nonfinite"
    with pytest.raises(ValueError, match="needs numerics=True"):
        hooktrace.trace(nn.Linear(2, 2), dump_on=("nonfinite",))
    with pytest.raises(ValueError, match="numerics_every"):
        hooktrace.trace(nn.Linear(2, 2), numerics=True, numerics_every=0)


def test_checkpointing_and_off() -> None:
    class Ck(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), Ck(), nn.Linear(8, 1))
    with hooktrace.trace(net, numerics=True) as tr:
        for x in _batches(2):
            net(x).sum().backward()
    n = Numerics.from_trace(tr.result)
    names = [name for name, _ in tr.result.modules]
    inner0 = np.array([names[m] == "1.inner.0" for m in n.module])
    # the recomputed forward calls are marked and left out of the statistics
    assert ((inner0 & ~n.backward & ~n.recompute).sum(), (inner0 & n.recompute).sum()) == (2, 2)
    assert (inner0 & n.backward).sum() == 2  # its input gradient, once per step
    rows = {(r["module"], r["mode"]): r for r in tr.result.summary().rows}
    assert rows[("1.inner.0", "train")]["bwd_absmax"] > 0
    # numerics off: no event
    with hooktrace.trace(net) as tr2:
        net(_batches(1)[0]).sum().backward()
    assert not (tr2.result.events["kind"] == NUMERICS).any()
    assert "absmax" not in tr2.result.summary().columns


def test_run_numerics_names_the_first_nonfinite_in_summary_json(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        torch.manual_seed(0)

        class Scale(nn.Module):
            def __init__(self):
                super().__init__()
                self.step = 0
            def forward(self, x):
                return x * (float("inf") if self.step == 2 else 1.0)

        net = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Tanh(), Scale()), nn.Linear(4, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for i in range(4):
            net[1][1].step = i
            net(torch.randn(2, 4)).sum().backward()
            opt.zero_grad()
            opt.step()
    """))
    out = tmp_path / "run.htrace"
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--numerics", "-o", str(out),
                        str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "first non-finite value: 1.1 forward (output), step 2" in r.stderr
    s = subprocess.run([sys.executable, "-m", "hooktrace", "summary", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert s.returncode == 0, s.stderr
    doc = json.loads(s.stdout)
    first = doc["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == ("1.1", "forward", 2)
    row = next(r for r in doc["rows"] if r["module"] == "1.1")
    assert {"absmax", "rms", "nonfinite", "bwd_absmax"} <= set(row)
    t = subprocess.run([sys.executable, "-m", "hooktrace", "summary", "--numerics", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert t.returncode == 0 and "absmax" in t.stdout and "FIRST NON-FINITE" in t.stdout


class _Child(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


class _InPlaceParent(nn.Module):
    """Returns its child's output tensor itself, once unchanged and once after an
    in-place change: statistics reduced for the child may be reused only in the first
    case (same tensor, same version)."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.child = _Child()
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.child(x)
        if self.in_place:
            y.mul_(-10)
        return y


@pytest.mark.parametrize("in_place", [False, True])
def test_a_returned_tensor_changed_in_place_is_reduced_again(in_place: bool) -> None:
    # GIVEN a parent returning its child's output, changed in place or not
    model = _InPlaceParent(in_place)
    x = torch.tensor([[1.0, -2.0, 0.5]])
    # WHEN traced with numerics (grad off: no gradient hooks)
    with torch.no_grad(), hooktrace.trace(model, numerics=True) as tr:
        out = model(x)
    # THEN each call's abs-max and RMS are those of its output at its return
    n = Numerics.from_trace(tr)
    by_module = {tr.modules[int(m)][0]: (a, r) for m, a, r, b in
                 zip(n.module, n.absmax, n.rms, n.backward) if not b}
    child_out = x * 3
    assert by_module["child"][0] == pytest.approx(float(child_out.abs().max()))
    assert by_module[""][0] == pytest.approx(float(out.abs().max()))
    assert by_module[""][1] == pytest.approx(float(out.pow(2).mean().sqrt()), rel=1e-6)
    assert bool(by_module[""][0] == by_module["child"][0]) is (not in_place)


def test_exports_carry_shapes_numerics_and_the_counter_in_perfetto(tmp_path: Path) -> None:
    """Both exports of a run with shapes and numerics load in Perfetto's own trace
    processor with every span (--strict), the forward spans' args hold the shapes and
    the call's statistics, and the non-finite counter track holds the recorded counts."""
    from perfetto_check import perfetto_check, trace_processor

    from hooktrace.analysis.numerics import COUNTER_NAME, counter_points

    model = Faulty(boom_at=3)
    with hooktrace.trace(model, numerics=True, shapes=True) as tr:
        for i in range(5):
            model.set_step(i)
            model(torch.randn(4, 8)).sum().backward()
            tr.step()
    t, total = counter_points(tr)
    assert total[0] == 0 and total[-1] > 0  # healthy, then the overflow from step 3 on
    files = [tmp_path / "n.json", tmp_path / "n.pftrace"]
    tr.export_chrome(files[0])
    tr.export_perfetto(files[1])
    fwd = [e for e in json.loads(files[0].read_text())["traceEvents"]
           if e.get("cat") == "hooktrace.forward"]
    assert fwd and all("in_shapes" in e["args"] and "absmax" in e["args"] for e in fwd)
    assert any(e["args"]["nonfinite"] > 0 for e in fwd)
    with trace_processor() as tp:
        perfetto_check(files, tp)
        for path in files:
            assert tp.load(path) is None
            rows = tp.query("select c.value from counter c join counter_track t "
                            "on c.track_id = t.id where t.name like '%non-finite%' order by c.ts")
            assert [int(r["value"]) for r in rows] == total.tolist(), path
            args = tp.query("select a.key, count(*) as n from slice s join args a using(arg_set_id)"
                            " where s.category = 'hooktrace.forward' group by a.key")
            keys = {r["key"]: r["n"] for r in args}
            assert any("in_shapes" in k for k in keys) and any("absmax" in k for k in keys), keys
    assert COUNTER_NAME in files[0].read_text()


def test_summary_numerics_json_has_the_per_step_history(tmp_path: Path) -> None:
    model = Faulty(boom_at=2)
    with hooktrace.trace(model, numerics=True) as tr:
        for i in range(4):
            model.set_step(i)
            model(torch.randn(4, 8)).sum().backward()
            tr.step()
    path = tmp_path / "h.htrace"
    tr.save(path)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(path), "--numerics",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    hist = doc["numerics_history"]
    assert sorted({h["step"] for h in hist}) == [0, 1, 2, 3]
    first = doc["first_nonfinite"]
    bad = [h for h in hist if h["nonfinite"] and h["phase"] == first["phase"]]
    assert min(h["step"] for h in bad) == first["step"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_statistics_are_deferred_and_equal_the_reference() -> None:
    """On a GPU the reductions are queued on the current stream and read once per step
    (NUMERICS events flagged deferred, their values at the step mark)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
    xs = [torch.randn(4, 8, device="cuda") for _ in range(3)]
    outs = []
    with hooktrace.trace(net, numerics=True) as tr:
        for x in xs:
            h = net[0](x)  # (recorded too: a second call of net[0] per step)
            outs.append(h.detach().abs().max().item())
            net(x).sum().backward()
            tr.step()
    ev = tr.events
    num = ev[ev["kind"] == NUMERICS]
    assert len(num) and ((num["flags"] & 8) != 0).all()
    n = Numerics.from_trace(tr)
    first = [k for k in range(len(n)) if tr.modules[int(n.module[k])][0] == "0"
             and not n.backward[k] and n.call[k] == 0]
    assert [float(n.absmax[k]) for k in first] == pytest.approx(outs, rel=1e-5)


def test_tensors_without_data_are_counted_as_not_reduced() -> None:
    """A model on the meta device (no data to read): its statistics, queued as for any
    tensor off the CPU, cannot be read at the step's flush; the calls are counted as not
    reduced and the run goes on (the flush used to raise out of step())."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).to("meta")
    with hooktrace.trace(model, numerics=True, shapes=True) as tr:
        for _ in range(2):
            model(torch.randn(2, 4, device="meta"))
            tr.step()
    n = Numerics.from_trace(tr)
    assert len(n) == 6 and n.failed.all()
    summary = tr.summary()
    assert "6 that could not be reduced" in summary.to_text()
    assert all(r["absmax"] is None for r in summary.rows)
    assert first_nonfinite(tr) is None


# -- issue #26 part 3: hostile tensors and outputs, stale statistics, hooks left behind --


def _forward_stats(result: Any) -> dict[str, tuple[float, float, int, bool]]:
    """Per module name (root "<root>"): (absmax, rms, nonfinite, failed) of its forward
    event."""
    n = Numerics.from_trace(result)
    return {result.modules[int(m)][0] or "<root>": (float(a), float(r), int(k), bool(f))
            for m, a, r, k, f, b in zip(n.module, n.absmax, n.rms, n.nonfinite, n.failed,
                                        n.backward) if not b}


class _ChildTimesTwo(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _WritesBehindVersion(nn.Module):
    """Returns its child's output after changing it by a write that does not bump the
    tensor's version counter."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.child, self.how = _ChildTimesTwo(), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.child(x)
        if self.how == "data":
            y.data.mul_(1000)
        else:
            y.detach().numpy()[:] = 12345.0
        return y


@pytest.mark.parametrize("how", ["data", "numpy"])
def test_a_write_behind_the_version_counter_is_seen(how: str, path: str) -> None:
    m = _WritesBehindVersion(how)
    with hooktrace.trace(m, numerics=True) as tr:
        out = m(torch.ones(4))
    stats = _forward_stats(tr.result)
    assert stats["child"][0] == 2.0
    assert stats["<root>"][0] == float(out.abs().max()) == (2000.0 if how == "data" else 12345.0)


class _Const(nn.Module):
    def __init__(self, t: torch.Tensor) -> None:
        super().__init__()
        self.t = t

    def forward(self, x: Any) -> torch.Tensor:
        return self.t


@pytest.mark.parametrize("t", [torch.full((4,), 3e38),
                               torch.full((100_000,), 1e36, dtype=torch.bfloat16),
                               torch.full((8,), 1e-30)], ids=["f32-top", "bf16-top", "f32-tiny"])
def test_rms_of_finite_values_near_the_ends_of_the_range_is_exact(t: torch.Tensor, path: str
                                                                  ) -> None:
    # (immediate: a float32 sum of squares that overflows or underflows is redone in
    # float64; deferred: the sum of squares of the tensor scaled by its abs-max)
    m = _Const(t)
    with hooktrace.trace(m, numerics=True) as tr:
        m(None)
    absmax, rms, nonfinite, _ = _forward_stats(tr.result)["<root>"]
    true_rms = float(t.double().square().mean().sqrt())
    assert nonfinite == 0
    assert math.isfinite(rms) and rms == pytest.approx(true_rms, rel=1e-6)
    assert absmax == pytest.approx(float(t.double().abs().max()), rel=1e-6)


class _OnlySomeOps(torch.Tensor):
    """A __torch_dispatch__ wrapper subclass that supports few ops (no aminmax, no
    norm), as many real ones do."""

    ALLOWED = {"aten.mul.Tensor", "aten.detach.default"}

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype,
                                                   requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        if str(func) not in cls.ALLOWED:
            raise NotImplementedError(f"{func} not supported")
        from torch.utils._pytree import tree_map
        out = func(*tree_map(lambda t: t.elem if isinstance(t, cls) else t, args),
                   **tree_map(lambda t: t.elem if isinstance(t, cls) else t, kwargs or {}))
        return tree_map(lambda t: cls(t) if isinstance(t, torch.Tensor) else t, out)


@pytest.mark.parametrize("kind", ["subclass", "jagged", "strided"])
def test_a_tensor_numerics_cannot_reduce_is_counted_not_raised(kind: str, path: str) -> None:
    if kind == "subclass":
        x: torch.Tensor = _OnlySomeOps(torch.randn(3))
    else:
        x = torch.nested.nested_tensor(
            [torch.randn(2, 3), torch.randn(4, 3)],
            layout=torch.jagged if kind == "jagged" else torch.strided)
    m = _ChildTimesTwo()
    with hooktrace.trace(m, numerics=True) as tr:
        y = m(x)  # (raised SystemError: a result with an exception set)
        z = m(torch.ones(2))  # the next call is measured as usual
    assert type(y) is type(x) and float(z.max()) == 2.0
    n = Numerics.from_trace(tr.result)
    assert n.failed.tolist() == [True, False]
    assert n.absmax.tolist() == [0.0, 2.0]
    assert "1 that could not be reduced" in "\n".join(tr.result.summary().notes)


@dataclasses.dataclass(slots=True)
class _Slotted:
    logits: torch.Tensor
    ids: torch.Tensor


class _SlotsOut(nn.Module):
    def forward(self, x: torch.Tensor) -> _Slotted:
        return _Slotted(x * 2, x.long())


class _Deep(nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        return (((((x * 2,),),),), x * 3)


def test_slotted_dataclasses_are_walked_and_deeper_outputs_said(path: str) -> None:
    slots, deep = _SlotsOut(), _Deep()
    with hooktrace.trace(slots, numerics=True) as tr:
        slots(torch.ones(3))
    n = Numerics.from_trace(tr.result)
    assert n.skipped.tolist() == [False] and n.absmax.tolist() == [2.0]
    assert n.not_walked.tolist() == [False]
    with hooktrace.trace(deep, numerics=True) as tr:
        deep(torch.ones(3))
    n = Numerics.from_trace(tr.result)
    # the tensor 5 levels down is not walked: the statistics are the other one's, and
    # the call is counted as holding something not walked
    assert n.absmax.tolist() == [3.0] and n.not_walked.tolist() == [True]
    notes = "\n".join(tr.result.summary().notes)
    assert "1 whose output nests tuples/lists/dicts/dataclasses deeper than 4 levels" in notes


class _MatMul(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w


class _PassesItsWeight(nn.Module):
    """Gives its parameter to a submodule: a leaf tensor as a traced call's input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.mm = _MatMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mm(x, self.w)


def test_a_parameter_given_to_a_submodule_is_left_without_hooks(path: str) -> None:
    import hooktrace._C as _C

    m = _PassesItsWeight()
    x = torch.randn(2, 8)
    assert _C.numerics_leaf_hooks() == 0
    with hooktrace.trace(m, numerics=True) as tr:
        for _ in range(5):
            m(x)  # forward only: no gradient ever comes for these calls
        # one hook on the parameter for the session, not one per call
        assert _C.numerics_leaf_hooks() == 1
        m.zero_grad()
        m(x).sum().backward()
        grad_absmax = float(m.w.grad.abs().max())
        assert _C.numerics_leaf_hooks() == 1
    assert _C.numerics_leaf_hooks() == 0  # the model is left as it was
    n = Numerics.from_trace(tr.result)
    bwd = [(tr.result.modules[int(k)][0], float(a)) for k, a, b in
           zip(n.module, n.absmax, n.backward) if b]
    # each of the 6 calls of mm waited on w's gradient: the one backward gives it to all
    assert len(bwd) == 6 and all(name == "mm" for name, _ in bwd)
    assert all(a == pytest.approx(grad_absmax, rel=1e-6) for _, a in bwd)
    # after the trace the parameter's gradient runs no hook of the trace
    m.zero_grad()
    m(x).sum().backward()
    assert _C.numerics_leaf_hooks() == 0


def test_the_deferred_path_queues_few_ops_per_tensor() -> None:
    """The deferred (GPU) path, counted with torch.profiler on CPU: the aten ops one
    traced call with numerics on runs beyond the same call without numerics."""
    import hooktrace._C as _C
    from torch.profiler import ProfilerActivity, profile

    m = _ChildTimesTwo()
    x = torch.randn(64, 128)

    def top_level_ops(numerics: bool) -> list[str]:
        with hooktrace.trace(m, numerics=numerics):
            m(x)  # (warm: first-call work out of the count)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                m(x)
        return sorted(e.name for e in prof.events()
                      if e.name.startswith("aten::") and e.cpu_parent is None)

    _C.set_numerics_deferred(True)
    try:
        plain, measured = top_level_ops(False), top_level_ops(True)
    finally:
        _C.set_numerics_deferred(False)
    extra = list(measured)
    for op in plain:
        extra.remove(op)
    # abs-max (ord inf), the divisor (nan_to_num on the 0-d abs-max), the tensor scaled
    # by it (div), its 2-norm and its count of non-zeros: no casts, no stack, no
    # isfinite chain per tensor (it was 12 ops, casts to float64 and a stack included)
    assert sorted(extra) == ["aten::div", "aten::linalg_vector_norm",
                             "aten::linalg_vector_norm", "aten::linalg_vector_norm",
                             "aten::nan_to_num"], extra


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nonfinite_counts_and_zeros_on_both_paths(dtype: torch.dtype, path: str) -> None:
    nan, inf = float("nan"), float("inf")
    cases = {"nan+inf": ([1.0, nan, -inf, 2.0, nan, inf, inf], (nan, nan, 5)),
             "inf": ([1.0, -inf, 3.0], (inf, inf, 1)),
             "zeros": ([0.0, 0.0], (0.0, 0.0, 0))}
    for name, (values, (absmax, rms, nonfinite)) in cases.items():
        m = _Const(torch.tensor(values, dtype=dtype))
        with hooktrace.trace(m, numerics=True) as tr:
            m(None)
        got = _forward_stats(tr.result)["<root>"]
        assert got[2] == nonfinite, name
        for want, have in ((absmax, got[0]), (rms, got[1])):
            assert (math.isnan(want) and math.isnan(have)) or want == have, (name, got)


def test_the_fused_path_in_an_interpreter_process() -> None:
    """This file's "fused" tests (the path fixture's third way and the tests below that
    FUSED defines, all named "fused"), in a process with TRITON_INTERPRET=1 set before
    triton is imported: the fused Triton kernel on CPU tensors."""
    pytest.importorskip("triton", reason="triton is not installed (make test installs it)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HOOKTRACE_TEST_FUSED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        __file__, "-k", "fused and not interpreter_process"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert "passed" in last and "skipped" not in last and "deselected" in last, last
    assert int(last.split(" passed")[0].split()[-1]) >= 52, last


def _nan_equal(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _fused_cases() -> dict[str, torch.Tensor]:
    nan, inf = float("nan"), float("inf")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(48, 64, generator=g)
    out = {}
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        name = str(dt).removeprefix("torch.")
        big = 3e38 if dt != torch.float16 else 6e4
        out[f"{name}-random"] = (base * 3).to(dt)
        out[f"{name}-nan-inf"] = torch.tensor([1.0, nan, -inf, 2.0, nan, inf, -4.0], dtype=dt)
        out[f"{name}-inf"] = torch.tensor([1.0, -inf, 3.0, inf], dtype=dt)
        out[f"{name}-near-max"] = torch.full((3000,), big, dtype=dt)  # rms finite
        out[f"{name}-zeros"] = torch.zeros(5, 7, dtype=dt)
        out[f"{name}-transposed"] = base.to(dt).t()  # dense, not contiguous: no copy
        out[f"{name}-sliced"] = base.to(dt)[::2, 3:40]  # not dense: copied first
        # every other column: a strided 1-D view exists (stride 2); the NaN lies in a
        # column left out, which a kernel given that view would read
        holed = base.to(dt).clone()
        holed[3, 5] = nan
        out[f"{name}-sliced-every-other"] = holed[:, ::2]
        out[f"{name}-scalar"] = torch.tensor(-2.5, dtype=dt)
        out[f"{name}-empty"] = torch.zeros(0, 4, dtype=dt)
    out["float32-tiny"] = torch.full((8,), 1e-30)
    many = (base * 1e3).reshape(-1)[:4096].clone()  # several blocks: the atomics fold them
    many[1500] = nan
    out["float32-blocks-nan"] = many
    return out


if FUSED:
    @pytest.mark.parametrize("case", list(_fused_cases()))
    def test_fused_statistics_equal_the_python_reference(case: str) -> None:
        """One fused launch per tensor: abs-max, RMS (float64) and non-finite count
        equal a float64 reference, float32 / bfloat16 / float16, NaN, ±inf, values near
        the top of the range, zeros, non-contiguous and empty tensors."""
        import hooktrace._C as _C

        t = _fused_cases()[case]
        counting = _Counting()
        _C.set_numerics_deferred(True)
        _C.set_numerics_fused(counting, True)
        try:
            m = _Const(t)
            with hooktrace.trace(m, numerics=True) as tr:
                m(None)
        finally:
            _C.set_numerics_deferred(False)
            _C.set_numerics_fused(None)
        assert tr.result.info["numerics"]["deferred_path"] == "triton"
        absmax, rms, nonfinite, failed = _forward_stats(tr.result)["<root>"]
        assert not failed
        if t.numel() == 0:
            assert counting.calls == [] and (absmax, rms, nonfinite) == (0.0, 0.0, 0)
            return
        assert len(counting.calls) == 1 and counting.launches == 1
        assert counting.calls[0] == (tuple(t.shape), t.dtype)
        d = t.double()
        fin = torch.isfinite(d)
        want_nonfinite = int((~fin).sum())
        if d.isnan().any():
            want_absmax = want_rms = float("nan")
        elif want_nonfinite:
            want_absmax = want_rms = float("inf")
        else:
            want_absmax = float(d.abs().amax())
            want_rms = float(d.square().mean().sqrt())
        assert nonfinite == want_nonfinite
        if math.isfinite(want_rms):
            assert math.isfinite(rms)
            assert absmax == pytest.approx(want_absmax, rel=1e-7)
            assert rms == pytest.approx(want_rms, rel=1e-6)
        else:
            assert _nan_equal(absmax, want_absmax) and _nan_equal(rms, want_rms), (absmax, rms)

    @pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
    def test_fused_path_is_one_pass_and_few_launches_per_tensor(layout: str) -> None:
        """Per tensor: one call of the launcher, one kernel launch (one pass: each block
        read once), and beside it no aten op but the copy of a tensor whose elements
        do not fill one dense range (contiguous): <= 3 launches (the buffer's zeroing is
        one launch per 1024 tensors)."""
        import hooktrace._C as _C
        from torch.profiler import ProfilerActivity, profile

        base = torch.randn(64, 48)
        x = {"contiguous": base, "transposed": base.t(),
             "sliced": base[:, :40]}[layout]
        m = _ChildTimesTwo()

        def top_level_ops(numerics: bool) -> list[str]:
            with hooktrace.trace(m, numerics=numerics):
                m(x)  # (warm: first-call work, the buffer's allocation, out of the count)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    m(x)
            return sorted(e.name for e in prof.events()
                          if e.name.startswith("aten::") and e.cpu_parent is None)

        counting = _Counting()
        _C.set_numerics_deferred(True)
        _C.set_numerics_fused(counting, True)
        try:
            plain = top_level_ops(False)
            assert counting.calls == []
            measured = top_level_ops(True)
        finally:
            _C.set_numerics_deferred(False)
            _C.set_numerics_fused(None)
        extra = list(measured)
        for op in plain:
            extra.remove(op)
        # x * 2 is contiguous whatever x is; the sliced case's own test is below
        assert extra == [], extra
        assert len(counting.calls) == 2 and counting.launches == 2  # (warm call + counted)
        # a non-dense output: one copy (contiguous) before the launch
        sliced = _Const(x)
        counting.calls.clear()
        counting.launches = 0
        _C.set_numerics_deferred(True)
        _C.set_numerics_fused(counting, True)
        try:
            with hooktrace.trace(sliced, numerics=True):
                sliced(None)
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    sliced(None)
        finally:
            _C.set_numerics_deferred(False)
            _C.set_numerics_fused(None)
        ops = sorted(e.name for e in prof.events()
                     if e.name.startswith("aten::") and e.cpu_parent is None)
        assert ops == (["aten::contiguous"] if layout == "sliced" else []), ops
        assert len(counting.calls) == 2 and counting.launches == 2
        assert 1 + len(ops) <= 3

    class _ZeroOut(nn.Module):
        def forward(self, x: Any) -> torch.Tensor:
            return torch._efficientzerotensor(4)  # (what some backward formulas return)

    def test_fused_path_leaves_a_tensor_without_plain_memory_to_aten() -> None:
        """An efficient zero tensor has no data pointer: handed to the kernel, the
        launcher would raise and be dropped for the whole run; it is not handed over."""
        import hooktrace._C as _C

        counting = _Counting()
        _C.set_numerics_deferred(True)
        _C.set_numerics_fused(counting, True)
        try:
            m = _ZeroOut()
            with hooktrace.trace(m, numerics=True) as tr:
                m(None)
            state = _C.numerics_fused_state()
        finally:
            _C.set_numerics_deferred(False)
            _C.set_numerics_fused(None)
        assert counting.calls == [] and state == (True, None)
        assert _forward_stats(tr.result)["<root>"] == (0.0, 0.0, 0, False)

    def test_fused_path_ctrl_c_in_the_launcher_reaches_the_user() -> None:
        """A KeyboardInterrupt raised in the launcher is the user's Ctrl-C, not a failure
        of the kernel: it is raised again in the user's code (not swallowed), the tensor
        is measured by the ATen path, the launcher stays registered."""
        import hooktrace._C as _C

        calls: list[int] = []

        def interrupted(x: torch.Tensor, out: torch.Tensor, row: int) -> None:
            calls.append(row)
            raise KeyboardInterrupt

        m = _Const(torch.tensor([1.0, -3.0]))
        _C.set_numerics_deferred(True)
        _C.set_numerics_fused(interrupted, True)
        try:
            with pytest.raises(KeyboardInterrupt):
                with hooktrace.trace(m, numerics=True) as tr:
                    m(None)  # (returns: the interrupt is raised just after)
                    for _ in range(100_000):
                        pass
            state = _C.numerics_fused_state()
        finally:
            _C.set_numerics_deferred(False)
            _C.set_numerics_fused(None)
        assert len(calls) == 1 and state == (True, None)
        absmax, rms, nonfinite, failed = _forward_stats(tr.result)["<root>"]
        assert (absmax, nonfinite, failed) == (3.0, 0, False)
        assert rms == pytest.approx(math.sqrt(5.0), rel=1e-6)

    def test_a_failing_fused_launcher_falls_back_to_aten_with_a_note() -> None:
        """The first exception of the launcher (Triton cannot compile for this GPU)
        unregisters it: that tensor and the rest take the ATen path, with the same
        statistics, no error in the user's forward, and a note in info["numerics"]."""
        import hooktrace._C as _C

        calls: list[int] = []

        def broken(x: torch.Tensor, out: torch.Tensor, row: int) -> None:
            calls.append(row)
            raise RuntimeError("cannot compile for sm_00\nsecond line")

        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        x = torch.randn(4, 8, requires_grad=True)
        results = []
        for launcher in (None, broken):
            _C.set_numerics_deferred(True)
            _C.set_numerics_fused(launcher, True)
            try:
                with hooktrace.trace(net, numerics=True) as tr:
                    for _ in range(2):
                        net(x).sum().backward()  # (no error here)
                        tr.step()
                state = _C.numerics_fused_state()
            finally:
                _C.set_numerics_deferred(False)
                _C.set_numerics_fused(None)
            n = Numerics.from_trace(tr.result)
            results.append((n.absmax.tolist(), n.rms.tolist(), n.nonfinite.tolist(),
                            n.failed.tolist()))
            info = tr.result.info["numerics"]
        assert len(calls) == 1  # called once, then unregistered
        assert state == (False, "RuntimeError: cannot compile for sm_00")
        assert info["deferred_path"] == "aten"
        assert "RuntimeError: cannot compile for sm_00" in info["deferred_note"]
        assert results[0] == results[1] and len(results[0][0]) == 16
        assert not any(results[1][3])


def test_a_cpu_run_never_imports_triton_and_says_its_deferred_path() -> None:
    """numerics=True on a CPU model: triton is not imported (it is only for a CUDA
    model), and info["numerics"] says the deferred path is ATen's and why."""
    code = textwrap.dedent("""
        import json, sys
        import torch, hooktrace
        m = torch.nn.Linear(4, 4)
        with hooktrace.trace(m, numerics=True) as tr:
            m(torch.randn(2, 4)).sum().backward()
        print(json.dumps(["triton" in sys.modules, tr.result.info["numerics"]]))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    imported, info = json.loads(r.stdout.strip().splitlines()[-1])
    assert imported is False
    assert info["deferred_path"] == "aten" and "no CUDA device" in info["deferred_note"]


@pytest.mark.parametrize("arch", [80, 90])
def test_the_numerics_kernel_compiles_for_gpus(arch: int) -> None:
    """The fused kernel, as the launcher makes it for a GPU, compiled (no GPU needed) for
    sm_80 and sm_90 and each input dtype: the interpreter runs Python and would not see
    what Triton's compiler rejects (it rejected the kernel's typing annotations)."""
    pytest.importorskip("triton", reason="triton is not installed (make test installs it)")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the interpreter process compiles nothing")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hooktrace.record.fused_numerics import make_launcher

    kernel = make_launcher(interpret=False).kernel
    for dtype in ("fp32", "bf16", "fp16"):
        src = ASTSource(kernel, signature={"x_ptr": f"*{dtype}", "out_ptr": "*fp64", "row": "i32",
                                           "n": "i32", "BLOCK": "constexpr"},
                        constexprs={(4,): 4096})
        ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                             options={"enable_fp_fusion": False}).asm["ptx"]
        # one pass: one load per element block, the row folded by atomics
        assert ptx.count("atom.global") >= 3 and "add.f64" in ptx, dtype
