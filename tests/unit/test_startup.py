"""Start-up (issue #26): the read-only verbs import no torch (``import torch`` is
~2 s; hooktrace._native loads only the libraries the native core links), and
``import hooktrace`` stays lazy until a name that needs torch is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_trace, random_stream

# Runs the CLI's verbs in-process, then says whether torch was imported.
CHECK = """
import json, sys
from hooktrace.cli import main
verbs = json.loads(sys.argv[1])
for argv in verbs:
    try:
        code = main(argv)
    except SystemExit as e:  # --version, --help
        code = e.code
    assert code in (0, None), (argv, code)
print(json.dumps({"torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules}))
"""


def _imports_after(verbs: list[list[str]], tmp_path: Path) -> dict[str, bool]:
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps(verbs)], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.htrace", tmp_path / "b.htrace"
    build_trace(random_stream(1)).save(a)
    build_trace(random_stream(2)).save(b)
    return a, b


def test_version_and_help_import_no_torch(tmp_path: Path) -> None:
    assert _imports_after([["--version"]], tmp_path) == {"torch": False, "numpy": False}
    assert not _imports_after([["--help"]], tmp_path)["torch"]
    assert not _imports_after([["summary", "--help"]], tmp_path)["torch"]


def test_read_only_verbs_import_no_torch(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = (str(p) for p in runs)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for rank, p in enumerate(runs):
        (ranks / f"run_rank{rank}.htrace").write_bytes(p.read_bytes())
    verbs = [["summary", a], ["summary", a, "--steps"], ["summary", a, "--json"],
             ["summary", a, "--wide"], ["diff", a, b], ["export", a, "-o", str(tmp_path / "a.json")],
             ["export", a, "-o", str(tmp_path / "a.pftrace")],
             ["merge-ranks", str(ranks), "-o", str(tmp_path / "ranks.json")],
             ["summary", str(ranks)]]
    pytest.importorskip("plotly", reason="the report needs plotly")
    verbs.append(["report", a, "-o", str(tmp_path / "report.html")])
    assert _imports_after(verbs, tmp_path) == {"torch": False, "numpy": True}


def test_stacks_imports_no_torch(runs: tuple[Path, Path], tmp_path: Path) -> None:
    # a file that is no dump: the one-line error, still without torch
    r = subprocess.run([sys.executable, "-c",
                        "import sys\nfrom hooktrace.cli import main\n"
                        "code = main(['stacks', sys.argv[1]])\n"
                        "print(code, 'torch' in sys.modules)", str(runs[0])],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "False"] and "not a flight-recorder dump" in r.stderr


def test_the_package_face_is_lazy_and_whole(tmp_path: Path) -> None:
    code = """
import sys
import hooktrace
assert 'torch' not in sys.modules and hooktrace.__version__
assert set(hooktrace.__all__) <= set(dir(hooktrace))
trace, load = hooktrace.trace, hooktrace.load  # the names that need torch import it
assert 'torch' in sys.modules
import torch
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
with hooktrace.trace(m) as tr:
    m(torch.randn(2, 4)).sum().backward()
rows = {r["module"] for r in tr.result.summary().rows}
assert {"", "0", "1"} <= rows, rows
try:
    hooktrace.no_such_name
except AttributeError as e:
    assert "no_such_name" in str(e)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_file_read_before_torch_is_imported_then_recording(runs: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    # the native core loaded without torch (hooktrace._native); torch imported after it
    code = """
import sys
import hooktrace
n = len(hooktrace.load(sys.argv[1]).spans())
assert 'torch' not in sys.modules and n > 0
import torch
m = torch.nn.Linear(3, 3)
with hooktrace.trace(m) as tr:
    m(torch.randn(2, 3)).sum().backward()
assert tr.result.summary().rows[0]["calls"] == 1
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code, str(runs[0])], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
