"""``hooktrace export -o X.parquet`` / ``-o DIR/`` write through temporary files, and read
their input instead of mapping it (issue #35): a killed or failed export leaves no table
cut short under its name, and a run that truncates the input meanwhile costs no SIGBUS."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One synthetic rank (benchmarks/ranks.py's), ~4000 events."""
    spec = importlib.util.spec_from_file_location("bench_ranks", REPO / "benchmarks" / "ranks.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path_factory.mktemp("run") / "run.htrace"
    bench.write_rank(path, 0, 1, 4000)
    return path


def _fail_in_second_batch(monkeypatch: pytest.MonkeyPatch, table: str | None = None) -> None:
    """The export fails after its first batch of ``table`` (any table: None), as a full
    disk or a kill would leave it."""
    import hooktrace.data.parquet as parquet

    real = parquet.batches

    def batches(trace: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        for i, b in enumerate(real(trace, name, *args, **kwargs)):
            if i == 1 or (table is not None and name == table):
                raise OSError(28, "No space left on device")
            yield b

    monkeypatch.setattr(parquet, "batches", batches)


def test_a_failed_parquet_export_leaves_the_old_file_and_no_temporary(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a spans.parquet written whole
    out = tmp_path / "spans.parquet"
    assert main(["export", str(run), "-o", str(out)]) == 0
    whole = out.read_bytes()
    # WHEN the next export to the same name fails halfway (several row groups)
    _fail_in_second_batch(monkeypatch)
    from hooktrace.data.parquet import write_table
    from hooktrace.reading import load

    with pytest.raises(OSError):
        write_table(load(run), "spans", out, batch_rows=100)
    # THEN the file there is the previous one, whole, and nothing else is left
    assert out.read_bytes() == whole
    assert os.listdir(tmp_path) == ["spans.parquet"]


def test_a_failed_directory_export_leaves_no_table_cut_short(
        run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN an export of every table whose steps table fails partway
    _fail_in_second_batch(monkeypatch, table="steps")
    out = tmp_path / "tables"
    assert main(["export", str(run), "-o", f"{out}/"]) == 1
    # THEN each table there is whole (readable), the failed one absent, no temporary left
    names = sorted(os.listdir(out))
    assert "steps.parquet" not in names and not [n for n in names if n.startswith(".")]
    for name in names:
        pq.read_table(out / name)


def test_export_reads_its_input_so_a_truncation_meanwhile_is_no_sigbus(
        run: Path, tmp_path: Path) -> None:
    # GIVEN an export whose input is truncated (a new trace(out=) at the same path opens
    # it with O_TRUNC) after it was loaded, before the tables are written
    copy = tmp_path / "run.htrace"
    copy.write_bytes(run.read_bytes())
    out = tmp_path / "spans.parquet"
    code = (
        "import os, sys\n"
        "import hooktrace.data.parquet as p\n"
        "from hooktrace.cli import main\n"
        "real = p.write_table\n"
        "def write_table(*a, **k):\n"
        "    os.truncate(sys.argv[1], 4096)\n"
        "    return real(*a, **k)\n"
        "p.write_table = write_table\n"
        "sys.exit(main(['export', sys.argv[1], '-o', sys.argv[2]]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(copy), str(out)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    # THEN the export finishes from what it read (a mapped input: SIGBUS, rc -7)
    assert r.returncode == 0, (r.returncode, r.stderr[-500:])
    assert pq.read_table(out).num_rows > 0
