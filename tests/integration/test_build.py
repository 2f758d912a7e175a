"""Build hygiene (issue #7): what `make` would run, read with `make -n` (nothing is built)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_n(*args: str) -> str:
    r = subprocess.run(["make", "-n", "-C", str(REPO), *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_install_stamp_depends_on_the_torch_spec() -> None:
    # another TORCH than the one installed: the venv recipe runs again and installs it
    out = make_n("venv", "TORCH=torch==2.6.0")
    assert 'pip install -q "torch==2.6.0"' in out
    assert "--no-build-isolation -e ." in out
    assert ".hooktrace-installed-torch__2.6.0" in out


def test_make_clean_forgets_the_install_so_the_next_target_rebuilds() -> None:
    out = make_n("clean")
    assert "hooktrace/_C*.so" in out and ".hooktrace-installed*" in out


def test_no_language_standard_is_forced_on_torch() -> None:
    # torch's cpp_extension adds the -std its headers need (C++20 for torch 2.13, whose
    # headers warn under -std=c++17): setup.py must not override it
    assert "-std=" not in (REPO / "setup.py").read_text().split("extra_compile_args")[1]


def test_the_type_stub_names_exactly_what_the_native_core_exports() -> None:
    import re

    from hooktrace import _C

    text = (REPO / "hooktrace" / "_C.pyi").read_text()
    stub = set(re.findall(r"^(?:class|def) (\w+)", text, re.M)) | set(
        re.findall(r"^(\w+):", text, re.M))
    assert stub == {n for n in dir(_C) if not n.startswith("_")}


def test_the_build_says_what_it_builds_and_shows_progress() -> None:
    # GIVEN a venv to (re)build: the native core's build takes minutes on 2 cores
    out = make_n("venv", "TORCH=torch==2.6.0").splitlines()
    build = next(i for i, line in enumerate(out) if "--no-build-isolation -e ." in line)
    # THEN a line first says what it builds and for how long, and pip runs verbose (not
    # -q, which held back every line until the end) through the [n/N] filter
    note = next(i for i, line in enumerate(out) if line.startswith("echo \"building hooktrace"))
    assert note < build and "minutes" in out[note]
    assert "pip install -v --no-build-isolation -e ." in out[build]
    assert "sed -unE" in "\n".join(out[build:build + 3])
    assert 'exit "$status"' in "\n".join(out[build:build + 6])
    assert any(line.startswith('echo "building hooktrace') for line in make_n("build").splitlines())


def test_the_progress_filter_keeps_one_short_line_per_compiled_file(tmp_path: Path) -> None:
    # ninja -v's lines (torch's rule: $cxx -MMD -MF $out.d $cflags -c $in -o $out ...)
    text = (REPO / "Makefile").read_text()
    sed = text.split("NINJA_PROGRESS = ", 1)[1].split("\n", 1)[0]
    # as pip -v streams them: indented by two spaces (issue #38: the filter wanted them at
    # column 0 and printed nothing), among pip's own lines
    lines = ["  running build_ext",
             "  [1/3] c++ -MMD -MF /b/session.o.d -O2 -c /r/csrc/session.cpp -o /b/session.o -DX",
             "  [2/3] c++ -MMD -MF /b/spans.o.d -c /r/csrc/spans.cpp -o /b/spans.o",
             "  [3/3] c++ /b/session.o /b/spans.o -shared -o /r/hooktrace/_C.so", "  noise"]
    r = subprocess.run(["sh", "-c", sed.replace("$$", "$")], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines() == ["  [1/3] session.cpp",
                                                          "  [2/3] spans.cpp"]


def test_demo_installs_what_it_needs_and_test_every_extra(tmp_path: Path) -> None:
    # GIVEN a machine with no venv yet (issue #38: demo installed every test extra)
    venv = f"VENV={tmp_path / 'venv'}"
    demo = [line for line in make_n("demo", venv).splitlines() if "pip install -q" in line]
    test = [line for line in make_n("test", venv).splitlines() if "pip install -q" in line]
    # THEN demo installs torch, the build's deps and plotly (its report), no test extra
    assert any('"torch==' in line and "plotly" in line for line in demo), demo
    for extra in ("transformers", "lightning", "pyspark", "triton", "selenium", "mkdocs"):
        assert not any(extra in line for line in demo), (extra, demo)
        assert any(extra in line for line in test), (extra, test)  # make test: everything
    assert "hooktrace demo --out out/demo" in make_n("demo", venv)


def test_the_core_refuses_to_load_into_another_torch(tmp_path: Path) -> None:
    """issue #47: a build for torch 2.13 loaded silently under torch 2.14.1."""
    import os
    import sys

    import torch

    from hooktrace._native import load_native

    # GIVEN the core, which keeps the torch it was built against
    assert load_native().BUILT_TORCH_VERSION == torch.__version__
    # WHEN it is loaded into another torch (its version, as a process would see it)
    trace = tmp_path / "run.htrace"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    other = ("import torch; torch.__version__ = '2.99.1'; from hooktrace.cli import main; "
             f"raise SystemExit(main(['summary', {str(trace)!r}]))")
    r = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True,
                       env=env, timeout=120)
    # THEN one line names both versions and what to do
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1, r.stderr
    assert err[0] == (f"hooktrace: error: the native core (hooktrace._C) was built against "
                      f"torch {torch.__version__}, and this is torch 2.99.1: rebuild it "
                      "against this torch (pip install --no-build-isolation -e . in the "
                      "checkout, or make build)")
    # and so does recording from Python
    api = ("import torch; torch.__version__ = '2.99.1'; import hooktrace; "
           "hooktrace.trace(torch.nn.Linear(2, 2))")
    r = subprocess.run([sys.executable, "-c", api], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(
        "hooktrace._native.TorchMismatchError: the native core (hooktrace._C) was built "
        f"against torch {torch.__version__}, and this is torch 2.99.1"), r.stderr
    # and the same torch release in another build (+cpu, +cu126) loads
    same = (f"import torch; torch.__version__ = '{torch.__version__.split('+')[0]}+cu126'; "
            "from hooktrace._native import load_native; print(load_native().EVENT_SIZE)")
    r = subprocess.run([sys.executable, "-c", same], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "32", r.stderr
