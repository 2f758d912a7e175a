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
