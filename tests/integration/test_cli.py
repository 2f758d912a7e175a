"""The command line, end to end, in subprocesses."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import hooktrace


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m hooktrace ARGS`` in a subprocess (stdout and stderr captured)."""
    return subprocess.run(
        [sys.executable, "-m", "hooktrace", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    r = run_cli("demo", "--out", str(out), "--steps", "2")
    assert r.returncode == 0, r.stderr
    assert "ui.perfetto.dev" in r.stdout and "blocks.0.attn" in r.stdout
    # what it points Perfetto at is the JSON it wrote, not the .htrace
    assert f"open {out / 'demo.json'} at https://ui.perfetto.dev" in r.stdout
    return out


def test_demo_writes_a_loadable_trace_and_chrome_json(demo_dir: Path) -> None:
    run = hooktrace.load(demo_dir / "demo.htrace")
    names = {n for n, _ in run.modules}
    assert {"", "blocks.0", "blocks.0.attn.qkv", "head"} <= names
    doc = json.loads((demo_dir / "demo.json").read_text())
    fwd = [e for e in doc["traceEvents"] if e.get("cat") == "hooktrace.forward"]
    assert sum(1 for e in fwd if e["args"]["module"] == "") == 2  # two training steps
    assert doc["hooktrace"]["dropped_events"] == 0


def test_export_round_trip_gzip(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json.gz"
    r = run_cli("export", str(demo_dir / "demo.htrace"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    with gzip.open(out, "rt") as f:
        doc = json.load(f)
    direct = json.loads((demo_dir / "demo.json").read_text())
    assert doc["traceEvents"] == direct["traceEvents"]


def test_export_with_autograd_nodes(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "n.json"
    r = run_cli("export", str(demo_dir / "demo.htrace"), "-o", str(out), "--nodes")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert {"hooktrace.forward", "hooktrace.backward", "hooktrace.autograd_node",
            "hooktrace.autograd_unattributed"} <= cats
    plain = json.loads((demo_dir / "demo.json").read_text())
    assert "hooktrace.autograd_node" not in {e.get("cat") for e in plain["traceEvents"]}


def test_summary_csv_and_json(demo_dir: Path) -> None:
    r = run_cli("summary", str(demo_dir / "demo.htrace"), "--csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    root = [x for x in rows if x["module"] == ""][0]
    assert root["calls"] == "2" and int(root["total_ns"]) > 0
    totals = [int(x["total_ns"] or 0) + int(x["bwd_total_ns"]) for x in rows]
    assert totals == sorted(totals, reverse=True)
    r = run_cli("summary", str(demo_dir / "demo.htrace"), "--json", )
    assert r.returncode == 0
    assert len(json.loads(r.stdout)["rows"]) == len(rows)
    r = run_cli("summary", str(demo_dir / "demo.htrace"), "--top", "3")
    assert r.returncode == 0 and "more rows" in r.stdout


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "empty"),
        (b"NOTATRACE" * 20, "magic"),
    ],
)
def test_bad_files_give_one_line_and_nonzero_exit(tmp_path: Path, content: bytes, expected: str) -> None:
    bad = tmp_path / "bad.htrace"
    bad.write_bytes(content)
    for cmd in (["summary", str(bad)], ["export", str(bad), "-o", str(tmp_path / "o.json")]):
        r = run_cli(*cmd)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert str(bad) in lines[0] and expected in lines[0].lower()
        assert "Traceback" not in r.stderr


def test_truncated_file_names_offset(demo_dir: Path, tmp_path: Path) -> None:
    data = (demo_dir / "demo.htrace").read_bytes()
    bad = tmp_path / "cut.htrace"
    bad.write_bytes(data[: len(data) - 7])
    r = run_cli("summary", str(bad))
    assert r.returncode == 1
    assert "cut.htrace: offset" in r.stderr and "Traceback" not in r.stderr


def test_missing_file_and_bad_arguments(tmp_path: Path) -> None:
    r = run_cli("summary", str(tmp_path / "nope.htrace"))
    assert r.returncode == 1 and "nope.htrace" in r.stderr and len(r.stderr.splitlines()) == 1
    r = run_cli("export", str(tmp_path / "nope.htrace"))  # missing -o
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    r = run_cli("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run_cli("summary", "x.htrace", "--top", "0")
    assert r.returncode == 1 and "--top" in r.stderr


# -- issue #7: rough edges -----------------------------------------------------


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("hooktrace: error: ")
    for needle in needles:
        assert needle in r.stderr, r.stderr


def test_version_and_bare_command() -> None:
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"hooktrace {hooktrace.__version__} (torch ")
    r = run_cli()
    assert r.returncode == 2
    for command in ("demo", "export", "summary", "merge"):
        assert command in r.stdout


def test_summary_into_a_closed_pipe_is_quiet(demo_dir: Path) -> None:
    # GIVEN a reader that went away (`hooktrace summary RUN | head` after head exits)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "hooktrace", "summary",
                            str(demo_dir / "demo.htrace")], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    # THEN no error message and exit code 0, as for `git log | head`
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_top_applies_to_csv_and_json(demo_dir: Path) -> None:
    r = run_cli("summary", str(demo_dir / "demo.htrace"), "--csv", "--top", "2")
    assert r.returncode == 0 and len(list(csv.DictReader(io.StringIO(r.stdout)))) == 2
    r = run_cli("summary", str(demo_dir / "demo.htrace"), "--json", "--top", "3")
    assert r.returncode == 0 and len(json.loads(r.stdout)["rows"]) == 3


def test_summary_text_fits_120_columns_and_says_its_order(demo_dir: Path) -> None:
    r = run_cli("summary", str(demo_dir / "demo.htrace"))
    assert r.returncode == 0
    assert max(len(line) for line in r.stdout.splitlines()) <= 120
    assert "sorted by forward total + backward total, descending" in r.stdout
    wide = run_cli("summary", str(demo_dir / "demo.htrace"), "--wide")
    assert wide.returncode == 0 and "bwd_p99" in wide.stdout and "bwd_p99" not in r.stdout


def test_export_refuses_to_overwrite_its_input(demo_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run.htrace"
    run.write_bytes((demo_dir / "demo.htrace").read_bytes())
    before = run.read_bytes()
    one_line_error(run_cli("export", str(run), "-o", str(run)), "is also an input")
    assert run.read_bytes() == before
    one_line_error(run_cli("export", str(run), "-o", str(tmp_path)), "is a directory")
    assert not list(tmp_path.glob("*.tmp"))


def test_export_to_stdout_and_to_a_fifo(demo_dir: Path, tmp_path: Path) -> None:
    r = run_cli("export", str(demo_dir / "demo.htrace"), "-o", "-")
    assert r.returncode == 0 and json.loads(r.stdout)["hooktrace"]["dropped_events"] == 0
    # a FIFO is written into, never replaced by a regular file
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = run_cli("export", str(demo_dir / "demo.htrace"), "-o", str(fifo))
    reader.join(timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["traceEvents"]


def test_merge_into_a_directory_is_refused_up_front(demo_dir: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    prof = tmp_path / "p.json"
    prof.write_text('{"traceEvents": []}')
    one_line_error(run_cli("merge", str(demo_dir / "demo.htrace"), str(prof), "-o", str(out_dir)),
                   f"{out_dir}: is a directory")
    assert list(out_dir.iterdir()) == [] and not list(tmp_path.glob(".*.tmp"))


def test_summary_profiler_refuses_a_hooktrace_export(demo_dir: Path) -> None:
    one_line_error(run_cli("summary", str(demo_dir / "demo.htrace"), "--profiler",
                           str(demo_dir / "demo.json")), "written by hooktrace")


def test_export_to_dev_null_leaves_the_device_alone(demo_dir: Path) -> None:
    before = os.stat("/dev/null")
    r = run_cli("export", str(demo_dir / "demo.htrace"), "-o", "/dev/null")
    assert r.returncode == 0, r.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
