"""The fused numerics kernel launched from C++ (issue #50; csrc/numerics_launch.h).

Everything but the GPU, on CPU: the variant a tensor takes, the launch's parameters as
packed, the parameter list Triton compiles (PTX for sm_90, no GPU needed), and, through
a fake CUDA driver (test_numerics_launch.cpp: a context, modules, and a cuLaunchKernel
that reads the packed parameters and runs the kernel's arithmetic on the host), the
whole deferred path on CPU tensors: statistics equal to a float64 reference and to the
ATen path, the first non-finite value named right, no call of the Python launcher once
a variant is registered, and every failure falling back to the Python launcher with one
line, counted.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
import hooktrace._C as _C
from hooktrace.analysis.numerics import Numerics, first_nonfinite

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = HERE / "test_numerics_launch.cpp"
HEADER = REPO / "csrc" / "numerics_launch.h"
LAYOUT = "ppilpp"  # x, out, row (32-bit), n (64-bit), Triton's two scratch pointers
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def reference_launcher(calls: list[Any]) -> Any:
    """The Python launcher the core falls back to: the kernel's arithmetic in torch ops
    (float64), folded into out[row]; records each call."""

    def launch(x: torch.Tensor, out: torch.Tensor, row: int) -> None:
        calls.append((tuple(x.shape), x.dtype))
        d = x.reshape(-1).to(torch.float32).double()
        nan, inf = d.isnan(), d.isinf()
        a = torch.where(nan | inf, torch.zeros_like(d), d.abs())
        out[row, 0] = max(float(out[row, 0]), float(a.max()) if a.numel() else 0.0)
        out[row, 1] += float((a * a).sum())
        out[row, 2] += float(nan.sum())
        out[row, 3] += float(inf.sum())
    return launch


# --- no extension needed: keys, packing, the compiled parameter list -----------------

def test_the_variant_a_tensor_takes() -> None:
    """2 * dtype + (0: 16-byte aligned and numel a multiple of 16; 1: any); -1 for a
    dtype the kernel does not read."""
    base = torch.zeros(64, dtype=torch.float32)
    assert _C.numerics_kernel_key(base) == 0
    assert _C.numerics_kernel_key(base[1:17]) == 1  # (4 bytes in: not 16-byte aligned)
    assert _C.numerics_kernel_key(base[:15]) == 1   # (15 elements)
    assert _C.numerics_kernel_key(base.to(torch.bfloat16)) == 2
    assert _C.numerics_kernel_key(base.to(torch.bfloat16)[:3]) == 3
    assert _C.numerics_kernel_key(base.to(torch.float16)) == 4
    assert _C.numerics_kernel_key(base.to(torch.float64)) == -1
    assert _C.numerics_kernel_key(base.to(torch.int32)) == -1


def test_a_launch_is_packed_as_the_kernel_takes_it() -> None:
    """Grid ceil(n / block), 32 threads a warp; x and out as 64-bit pointers, row in the
    first 4 bytes of its slot (a 32-bit parameter), n 64-bit, hidden pointers null."""
    x, out = 0x7F00_1234_5670, 0x7F00_0000_0200
    plan = _C.numerics_launch_plan(LAYOUT, 4, 32, 4096, x, out, 1023, 4097)
    assert plan["grid"] == 2 and plan["threads"] == 128 and plan["shared"] == 32
    p = plan["params"]
    assert len(p) == 6 and all(len(b) == 8 for b in p)
    assert struct.unpack("<Q", p[0])[0] == x and struct.unpack("<Q", p[1])[0] == out
    assert struct.unpack("<I", p[2][:4])[0] == 1023
    assert struct.unpack("<q", p[3])[0] == 4097
    assert p[4] == p[5] == bytes(8)
    assert _C.numerics_launch_plan("ppil", 8, 0, 4096, x, out, 0, 1)["grid"] == 1
    assert _C.numerics_launch_plan("ppil", 8, 0, 4096, x, out, 0, 1)["threads"] == 256
    # what the core does not launch: another parameter list, no elements, a row past 32
    # bits, too much shared memory, too many warps
    for args in (("pilp", 4, 0, 4096, x, out, 0, 10), ("ppilpi", 4, 0, 4096, x, out, 0, 10),
                 ("ppilppppp", 4, 0, 4096, x, out, 0, 10), (LAYOUT, 4, 0, 4096, x, out, 0, 0),
                 (LAYOUT, 4, 0, 4096, x, out, 2**31, 10), (LAYOUT, 4, 64 * 1024, 4096, x, out, 0, 10),
                 (LAYOUT, 64, 0, 4096, x, out, 0, 10)):
        assert _C.numerics_launch_plan(*args) is None, args


def test_a_kernel_the_core_cannot_launch_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="parameters"):
        _C.set_numerics_kernel(0, image=b"FAKE", name="fake_fp32", layout="ppl",
                               num_warps=4, shared=0, block=4096)
    with pytest.raises(ValueError, match="0 to 5"):
        _C.set_numerics_kernel(6, image=b"FAKE", name="fake_fp32", layout=LAYOUT,
                               num_warps=4, shared=0, block=4096)
    assert _C.numerics_native_state()["kernels"] == 0


@pytest.mark.parametrize("key", range(6))
def test_the_compiled_kernel_takes_the_parameters_the_core_packs(key: int) -> None:
    """Each variant as fused_numerics.compile_native compiles it (for sm_90: no GPU
    needed): its PTX's parameter list is the packing's (x, out, row 32-bit, n 64-bit,
    then hidden pointers only), its launch needs nothing the core does not do, and the
    aligned variants load 16 bytes at a time."""
    pytest.importorskip("triton", reason="triton is not installed (make test installs it)")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the interpreter process compiles nothing")
    from triton.backends.compiler import GPUTarget

    from hooktrace.record.fused_numerics import compile_native, make_launcher, param_layout

    kernel = make_launcher(interpret=False).kernel
    spec = compile_native(kernel, key, GPUTarget("cuda", 90, 32))
    assert spec["layout"][:4] == "ppil" and set(spec["layout"][4:]) <= {"p"}
    assert spec["image"][:4] == b"\x7fELF" and spec["name"] == "_numerics_row"
    assert spec["block"] == 4096 and spec["num_warps"] == 4 and spec["shared"] <= 48 * 1024
    assert _C.numerics_launch_plan(spec["layout"], spec["num_warps"], spec["shared"],
                                   spec["block"], 16, 16, 0, 100) is not None
    # (the layout is read from the PTX: a made-up parameter list, parsed)
    assert param_layout(".entry k(\n\t.param .u64 .ptr .global .align 1 k_0,\n"
                        "\t.param .u32 k_1,\n\t.param .u64 k_2,\n\t.param .f32 k_3\n)", "k") == "pil?"


# --- the fake CUDA driver: the whole path on CPU tensors ------------------------------

@pytest.fixture(scope="session")
def fakecuda_module() -> Any:
    """The fake driver, built once per source, header and torch (build/fakecuda/<hash>)."""
    key = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes()
                         + torch.__version__.encode()).hexdigest()[:16]
    folder = REPO / "build" / "fakecuda" / key
    if not list(folder.glob("fakecuda*.so")):
        folder.mkdir(parents=True, exist_ok=True)
        code = ("from torch.utils.cpp_extension import load; "
                f"load('fakecuda', [{str(SOURCE)!r}], build_directory={str(folder)!r}, "
                "extra_cflags=['-O2'], verbose=False)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            pytest.skip(f"the fake driver does not build here: {r.stderr.strip()[-300:]}")
    sys.path.insert(0, str(folder))
    try:
        import fakecuda
    finally:
        sys.path.remove(str(folder))
    return fakecuda


def register_fake_kernels() -> None:
    for key in range(6):
        _C.set_numerics_kernel(key, image=b"FAKE cubin", name=f"fake_{('fp32', 'bf16', 'fp16')[key // 2]}",
                               layout=LAYOUT, num_warps=4, shared=32, block=4096)


@pytest.fixture
def native(fakecuda_module: Any) -> Iterator[tuple[Any, list[Any]]]:
    """The deferred path on CPU with the fused launcher registered (a Python reference:
    what the core falls back to) and every variant registered with the fake driver."""
    fakecuda_module.reset()
    calls: list[Any] = []
    _C.reset_numerics_native()
    _C.set_numerics_driver_for_tests(fakecuda_module.driver())
    _C.set_numerics_deferred(True)
    _C.set_numerics_fused(reference_launcher(calls), True)
    register_fake_kernels()
    try:
        yield fakecuda_module, calls
    finally:
        _C.set_numerics_deferred(False)
        _C.set_numerics_fused(None)
        _C.set_numerics_driver_for_tests(0)
        _C.reset_numerics_native()


class _Const(nn.Module):
    def __init__(self, t: torch.Tensor) -> None:
        super().__init__()
        self.t = t

    def forward(self, x: Any) -> torch.Tensor:
        return self.t


def _root_stats(data: Any) -> tuple[float, float, int, bool]:
    n = Numerics.from_trace(data)
    fwd = [i for i in range(len(n)) if not n.backward[i]]
    i = fwd[0]
    return float(n.absmax[i]), float(n.rms[i]), int(n.nonfinite[i]), bool(n.failed[i])


def _cases() -> dict[str, torch.Tensor]:
    nan, inf = float("nan"), float("inf")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(48, 64, generator=g)
    out = {}
    for dt in DTYPES:
        name = str(dt).removeprefix("torch.")
        big = 3e38 if dt != torch.float16 else 6e4
        out[f"{name}-random"] = (base * 3).to(dt)
        out[f"{name}-nan-inf"] = torch.tensor([1.0, nan, -inf, 2.0, nan, inf, -4.0], dtype=dt)
        out[f"{name}-inf"] = torch.tensor([1.0, -inf, 3.0, inf], dtype=dt)
        out[f"{name}-near-max"] = torch.full((3000,), big, dtype=dt)
        out[f"{name}-transposed"] = base.to(dt).t()
        out[f"{name}-sliced"] = base.to(dt)[::2, 3:40]
        out[f"{name}-unaligned"] = base.to(dt).reshape(-1)[3:1000]
        out[f"{name}-scalar"] = torch.tensor(-2.5, dtype=dt)
        out[f"{name}-empty"] = torch.zeros(0, 4, dtype=dt)
    many = torch.randn(3 * 4096 + 5, generator=g) * 1e3  # several blocks: folded
    many[5000] = nan
    out["float32-blocks-nan"] = many
    return out


@pytest.mark.parametrize("case", list(_cases()))
def test_native_statistics_equal_the_reference(native: tuple[Any, list[Any]], case: str) -> None:
    """One native launch per tensor (none of the Python launcher): abs-max, RMS and the
    non-finite count equal a float64 reference; the variant, grid and parameters the
    fake driver checked."""
    fake, calls = native
    t = _cases()[case]
    m = _Const(t)
    with hooktrace.trace(m, numerics=True) as tr:
        m(None)
    absmax, rms, nonfinite, failed = _root_stats(tr.result)
    assert not failed and calls == []
    c = fake.counters()
    assert c["rejected"] == 0, c["last_error"]
    info = tr.result.info["numerics"]
    assert info["deferred_path"] == "triton" and "native_note" not in info
    if t.numel() == 0:
        assert c["launches"] == 0 and (absmax, rms, nonfinite) == (0.0, 0.0, 0)
        return
    assert c["launches"] == 1 == info["native_launches"] and info["native_fallbacks"] == 0
    assert c["grid"] == math.ceil(t.numel() / 4096) and c["threads"] == 128
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
        assert absmax == pytest.approx(want_absmax, rel=1e-7)
        assert rms == pytest.approx(want_rms, rel=1e-6)
    else:
        assert _nan_equal(absmax, want_absmax) and _nan_equal(rms, want_rms), (absmax, rms)


def _nan_equal(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


class Overflow(nn.Module):
    """Multiplies by a factor that overflows float32 at step `at`."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.step = at, 0
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * (1e39 if self.step == self.at else 1.0)


def _train(net: nn.Module, steps: int) -> Any:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with hooktrace.trace(net, numerics=True) as tr:
        for i in range(steps):
            net[1].step = i
            net(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return tr.result


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 8), Overflow(at=2), nn.ReLU(), nn.Linear(8, 1))


def test_native_path_names_the_first_nonfinite_and_matches_the_aten_path(
        native: tuple[Any, list[Any]]) -> None:
    """A model whose module "1" overflows to inf in forward at step 2: the native path
    names the same first non-finite value (module, phase, step) as the ATen deferred
    path, with the same per-call statistics (abs-max and non-finite counts equal, RMS to
    float rounding), every tensor launched natively."""
    fake, calls = native
    data = _train(_model(), 4)
    launched = fake.counters()["launches"]
    # the same run on the ATen deferred path
    _C.set_numerics_fused(None)
    aten = _train(_model(), 4)
    first, first_aten = first_nonfinite(data), first_nonfinite(aten)
    assert first is not None and first_aten is not None
    assert (first["module"], first["phase"], first["step"]) == ("1", "forward", 2)
    assert (first["module"], first["phase"], first["step"]) == \
        (first_aten["module"], first_aten["phase"], first_aten["step"])
    n, a = Numerics.from_trace(data), Numerics.from_trace(aten)
    assert n.module.tolist() == a.module.tolist() and n.backward.tolist() == a.backward.tolist()
    assert n.nonfinite.tolist() == a.nonfinite.tolist()
    for x, y in zip(n.absmax.tolist() + n.rms.tolist(), a.absmax.tolist() + a.rms.tolist()):
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-6)
    assert calls == [] and launched > 0 and fake.counters()["rejected"] == 0
    assert data.info["numerics"]["native_launches"] == launched


def test_a_module_is_loaded_once_per_context_and_variant(native: tuple[Any, list[Any]]) -> None:
    """Many tensors of two variants: two module loads and two function lookups, one
    context query per launch; none of the Python launcher."""
    fake, calls = native
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    with hooktrace.trace(m, numerics=True):
        for _ in range(5):
            m(torch.randn(4, 16))  # float32, 64 elements: aligned (4 outputs a call)
            m.half()(torch.randn(3, 16).half())  # float16, 48 elements: aligned
            m.float()
    c = fake.counters()
    assert calls == [] and c["rejected"] == 0
    assert c["loads"] == c["functions"] == 2
    assert c["launches"] == c["contexts"] == 5 * 2 * 4


def test_a_failing_module_load_falls_back_once_with_one_line(native: tuple[Any, list[Any]]) -> None:
    """The driver refuses the module (no kernel image for this GPU): that tensor and
    every later one go through the Python launcher, the statistics unchanged; one line
    says why, the fallbacks are counted, and the native launch is not tried again."""
    fake, calls = native
    fake.set_fail_load(True)
    t = torch.tensor([1.0, -3.0, float("inf")])
    m = _Const(t)
    with hooktrace.trace(m, numerics=True) as tr:
        for _ in range(3):
            m(None)
    info = tr.result.info["numerics"]
    assert len(calls) == 3 and fake.counters()["loads"] == 1
    state = _C.numerics_native_state()
    assert state["on"] is False and state["launches"] == 0 and state["fallbacks"] == 1
    assert state["error"] == ("cuModuleLoadData failed (CUresult 209: no kernel image is "
                              "available for execution on the device)")
    assert info["native_note"] == "Triton's launcher took over: " + state["error"]
    assert info["native_fallbacks"] == 1 and info["native_launches"] == 0
    assert "\n" not in info["native_note"]
    assert _root_stats(tr.result)[2] == 1  # (the inf, counted by the Python launcher)


def test_a_failing_launch_falls_back_and_the_statistics_stay_right(
        native: tuple[Any, list[Any]]) -> None:
    fake, calls = native
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.randn(2, 8)
    with hooktrace.trace(m, numerics=True) as tr:
        m(x)
        fake.set_fail_launch(True)
        m(x)
    state = _C.numerics_native_state()
    assert state["on"] is False and state["error"].startswith("cuLaunchKernel failed (CUresult 1")
    # first call: 3 native launches; second: the first launch fails, then all 3 in Python
    assert state["launches"] == 3 and len(calls) == 3
    n = Numerics.from_trace(tr.result)
    fwd = [(int(s), float(a)) for s, a, b in zip(n.module, n.absmax, n.backward) if not b]
    assert fwd[:3] == fwd[3:] and not n.failed.any()


def test_no_current_context_falls_back_per_tensor(native: tuple[Any, list[Any]]) -> None:
    """A thread the runtime never set up has no current context: that tensor takes the
    Python launcher (counted) and the native launch stays on for the next."""
    fake, calls = native
    m = _Const(torch.ones(8))
    with hooktrace.trace(m, numerics=True):
        fake.set_no_context(True)
        m(None)
        fake.set_no_context(False)
        m(None)
    state = _C.numerics_native_state()
    assert len(calls) == 1 and state["on"] is True and state["error"] is None
    assert state["fallbacks"] == 1 and state["launches"] == 1


def test_the_launcher_compiles_a_variant_once_and_hands_it_to_the_core(fakecuda_module: Any) -> None:
    """fused_numerics.FusedLauncher's side, with the compile replaced by the fake's
    image: the first tensor of a variant compiles it (once) and is launched from C++;
    later ones never reach Python; a variant that fails to compile is launched by Triton
    (here: recorded) with one line for info."""
    pytest.importorskip("triton", reason="triton is not installed (make test installs it)")
    from hooktrace.record import fused_numerics

    compiled: list[int] = []
    triton_launches: list[int] = []

    class Launcher(fused_numerics.FusedLauncher):
        def native_takes(self, x: Any) -> bool:
            return True  # (CPU tensors: the fake driver)

        def native_spec(self, key: int, x: Any) -> dict[str, Any]:
            compiled.append(key)
            if key // 2 == 2:
                raise RuntimeError("PTX .version 9.9 does not support .target sm_00\nmore")
            return {"image": b"FAKE", "name": f"fake_{fused_numerics.NATIVE_DTYPES[key // 2]}",
                    "layout": LAYOUT, "num_warps": 4, "shared": 0, "block": 4096}

    launcher = Launcher(interpret=False, native=True)
    launcher.kernel = _Recorder(triton_launches)
    fakecuda_module.reset()
    _C.reset_numerics_native()
    _C.set_numerics_driver_for_tests(fakecuda_module.driver())
    _C.set_numerics_deferred(True)
    _C.set_numerics_fused(launcher, True)
    failures = list(fused_numerics.native_compile_failures)
    fused_numerics.native_compile_failures.clear()
    try:
        m = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        with hooktrace.trace(m, numerics=True) as tr:
            for _ in range(4):
                m(torch.randn(4, 16))
                m.half()(torch.randn(4, 16).half())
                m.float()
        info = tr.result.info["numerics"]
        note = list(fused_numerics.native_compile_failures)
    finally:
        fused_numerics.native_compile_failures[:] = failures
        _C.set_numerics_deferred(False)
        _C.set_numerics_fused(None)
        _C.set_numerics_driver_for_tests(0)
        _C.reset_numerics_native()
    assert compiled == [0, 4]  # float32 (aligned), then float16: once each
    assert fakecuda_module.counters()["launches"] == 4 * 3  # the float32 outputs
    assert len(triton_launches) == 4 * 3  # the float16 ones (no variant): Triton's
    assert note == ["variant 4 did not compile: RuntimeError: PTX .version 9.9 does not "
                    "support .target sm_00"]
    assert info["native_launches"] == 12 and info["native_fallbacks"] == 1
    assert info["native_note"] == "Triton's launcher took over: " + note[0]


class _Recorder:
    """Stands for the Triton kernel: ``kernel[grid](...)`` records a launch."""

    def __init__(self, launches: list[int]) -> None:
        self.launches = launches

    def __getitem__(self, grid: Any) -> Any:
        def run(x: torch.Tensor, out: torch.Tensor, row: int, n: int, **kw: Any) -> None:
            self.launches.append(row)
            reference_launcher([])(x, out, row)
        return run


# --- on a GPU: the real driver ---------------------------------------------------------

def _cuda_run(path: str) -> Any:
    """_train's model on CUDA (module "1" overflows at step 2) with the deferred numerics
    taken by: "native" (the kernel launched from C++), "triton" (Triton's launcher),
    "aten" (no fused kernel)."""
    pytest.importorskip("triton", reason="triton is not installed")
    from hooktrace.record import fused_numerics

    _C.set_numerics_native(path == "native")
    if path == "aten":
        _C.set_numerics_fused(None)
    else:
        fused_numerics.register()
    try:
        net = _model().cuda()
        torch.manual_seed(0)
        x = torch.randn(4, 8, device="cuda")
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        with hooktrace.trace(net, numerics=True) as tr:
            for i in range(4):
                net[1].step = i
                net(x).sum().backward()
                opt.step()
                opt.zero_grad()
        return tr.result
    finally:
        _C.set_numerics_native(True)
        _C.set_numerics_fused(None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_native_launch_agrees_with_tritons_and_atens() -> None:
    """On a GPU: every deferred tensor launched from C++ (no fallback, no note), the
    first non-finite value named as Triton's launcher and the ATen ops name it, and the
    same per-call statistics."""
    runs = {path: _cuda_run(path) for path in ("native", "triton", "aten")}
    info = runs["native"].info["numerics"]
    assert info["deferred_path"] == "triton" and "native_note" not in info, info
    assert info["native_launches"] > 0 and info["native_fallbacks"] == 0, info
    assert runs["triton"].info["numerics"]["native_launches"] == 0
    firsts = {p: first_nonfinite(r) for p, r in runs.items()}
    assert {(f["module"], f["phase"], f["step"]) for f in firsts.values()} == {("1", "forward", 2)}
    n = Numerics.from_trace(runs["native"])
    for other in ("triton", "aten"):
        o = Numerics.from_trace(runs[other])
        assert n.module.tolist() == o.module.tolist() and n.nonfinite.tolist() == o.nonfinite.tolist()
        for x, y in zip(n.absmax.tolist() + n.rms.tolist(), o.absmax.tolist() + o.rms.tolist()):
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-5), other
