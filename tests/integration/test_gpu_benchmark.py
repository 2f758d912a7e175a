"""benchmarks/gpu.py (issues #28, #50) works: its CPU smoke mode (hooktrace's host-clock
timer, tiny models) prints every table, issue #50's measurements included (their code
paths but the GPU's), and without CUDA the real run is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HOOKTRACE_GPU_TIMER", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env=env)


def test_dry_run_on_cpu_prints_every_table() -> None:
    r = _run("--device", "cpu", "--dry-run", "--models", "gpt2-small")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for variant in ("untraced", "hooktrace time-only", "gpu=True", "gpu_every=10",
                    "numerics=True", "profiler CPU+CUDA", "profiler CUDA only"):
        assert f"\n{variant} " in out, variant
    assert "GPU self time per module" in out and "transformer.h.0" in out
    assert "clock alignment (device to host), measured: " in out and "timer host" in out
    assert "#28's targets:" in out and "gpt2-small: gpu=True adds" in out
    # issue #50's measurements: their code paths, on CPU
    assert "== gpt2-small: the device path (issue #50) ==" in out
    assert "never-idle stream, 4 steps: align_waits " in out
    assert "rows with device time for every call" in out
    assert "numerics launch" in out
    if "(triton:" not in out:  # (make test installs triton)
        assert "bf16 variant compiled for sm_90, parameters 'ppil" in out
    assert "memory sample, the CPU counters (lock-free: no CUDA here): " in out
    for variant in ("numerics=True, Triton's launcher", "memory=True"):
        assert f"\n{variant} " in out, variant


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_in_one_line() -> None:
    r = _run()
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "needs a CUDA device" in r.stderr


def test_the_kernel_busy_time_benchmark_runs_its_parts_on_cpu(tmp_path: Path) -> None:
    """benchmarks/gpu_kernels.py (issues #49, #52) on CPU with the fake CUPTI: every
    variant, the graph cases, and the JSON object the GPU run records."""
    import json

    lib = REPO / "build" / "fake_cupti" / "libfakecupti.so"
    src = REPO / "tests" / "integration" / "fake_cupti.cpp"
    if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
        lib.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["c++", "-std=c++17", "-O1", "-shared", "-fPIC", str(src), "-o", str(lib)],
                       check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOOKTRACE_CUPTI_LIB": str(lib)}
    env.pop("HOOKTRACE_GPU_TIMER", None)
    out = tmp_path / "k.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_kernels.py"), "--device",
                        "cpu", "--dry-run", "--models", "gpt2-small", "--rounds", "1", "--steps",
                        "1", "--json", str(out)], capture_output=True, text=True, timeout=600,
                       cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["added_per_step"]["gpt2-small"]) == {
        "time-only", "gpu-events", "gpu-kernels", "gpu_every=10", "numerics", "memory",
        "profiler-cuda"}
    assert set(result["graphs"]) == {"inference", "training"}
