"""Bounded disk for full streams (issue #31): ``trace(out=..., max_disk=...)`` and
``hooktrace run --max-disk``. The stream rolls into segments at the writer's round
boundaries (csrc/stream_writer.h): OUT holds the newest events, OUT's stem .1, .2 ...
the older ones; the oldest are deleted to stay within the bound and counted as rolled
off. Each file left loads alone, and OUT loads with the segments still there as one run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.format import rolling_segments
from hooktrace.record.core_options import parse_bytes
from hooktrace.record.options import RecordOptions

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def chain(n: int = 100) -> nn.Module:
    return nn.Sequential(*[nn.Identity() for _ in range(n)])


def run_calls(model: nn.Module, calls: int) -> None:
    x = torch.zeros(1)
    for _ in range(calls):
        model(x)


def test_the_stream_stays_within_the_bound_and_keeps_the_newest(tmp_path: Path) -> None:
    out = tmp_path / "run.htrace"
    model = chain()
    # 202 events (6.3 KiB) per call: 2000 calls are ~12.6 MiB against a 4 MiB bound.
    # capacity bounds one writer round (what the newest file may hold beyond its share)
    with hooktrace.trace(model, out=out, max_disk="4M", capacity=16384, backward=False) as tr:
        run_calls(model, 2000)
    counts = tr.stream_counts()
    segments = rolling_segments(str(out), {"stem": "run"})
    files = [Path(p) for p in segments] + [out]
    total = sum(p.stat().st_size for p in files)
    assert len(segments) >= 1
    assert total <= 4 * MIB + 16384 * 32 + 64 * 1024, (total, [p.stat().st_size for p in files])
    assert counts["rolled_off_events"] > 0
    # every file left loads alone: an older segment ends without a footer (the run went
    # on in the next one), the newest has the run's footer and counts
    alone = [hooktrace.load(p) for p in segments]
    assert all(len(a.events) for a in alone)
    # OUT loads as one run: the segments' events, then its own, in order
    run = hooktrace.load(out)
    rolling = run.info["rolling"]
    assert rolling["segments_loaded"] == len(files)
    assert rolling["rolled_off_events"] == counts["rolled_off_events"]
    assert rolling["rolled_off_events"] + len(run.events) == counts["events"]
    assert len(run.events) == sum(len(a.events) for a in alone) + (
        counts["events"] - rolling["rolled_off_events"] - sum(len(a.events) for a in alone))
    assert (run.events["t"][1:] >= run.events["t"][:-1]).all()  # one thread, in order
    # the newest events are kept: the last call's root span is there, whole
    s = run.spans()
    assert (s.module == 0).sum() >= 2000 * 0.2
    # (on a loaded machine the writer may fall behind and the full buffer drop events,
    # the last call's among them: counted, and then neither holds)
    if counts["dropped_events"] == 0:
        assert run.events["id"][-1] == 0 and run.events["kind"][-1] == 2, counts  # its exit
        assert s.unfinished == 0
    else:
        assert run.info["dropped_events"] == counts["dropped_events"] > 0
    assert all("older segment of a rolling stream" in a.info["cut"] for a in alone)
    # and the summary says what was dropped
    assert any("rolled off" in n for n in run.summary().notes)


def test_a_short_run_does_not_roll_and_a_rerun_removes_old_segments(tmp_path: Path) -> None:
    out = tmp_path / "run.htrace"
    model = chain()
    with hooktrace.trace(model, out=out, max_disk="2M", capacity=8192, backward=False):
        run_calls(model, 1000)  # ~6 MiB: rolls
    assert rolling_segments(str(out), {"stem": "run"})
    with hooktrace.trace(model, out=out, max_disk="2M", backward=False) as tr:
        run_calls(model, 3)
    assert rolling_segments(str(out), {"stem": "run"}) == []  # the previous run's went
    run = hooktrace.load(out)
    assert len(run.events) == tr.stream_counts()["events"] == 3 * 202
    assert run.info["rolling"]["rolled_off_events"] == 0


def test_max_disk_values() -> None:
    assert parse_bytes("2G", "max_disk") == 2 << 30
    assert parse_bytes("2.5M", "max_disk") == 5 << 19
    assert parse_bytes(5 * MIB, "max_disk") == 5 * MIB
    with pytest.raises(ValueError, match="max_disk must be a size such as 2G, 500M or 1.5GiB, "
                                         "got '2 parsecs'"):
        RecordOptions(max_disk="2 parsecs")
    with pytest.raises(ValueError, match="max_disk must be at least 2M"):
        RecordOptions(max_disk="1K")
    with pytest.raises(ValueError, match="max_disk bounds a stream's files: it needs out="):
        hooktrace.trace(chain(2), max_disk="2G")


SCRIPT = """
import torch
from torch import nn
m = nn.Sequential(*[nn.Identity() for _ in range(100)])
x = torch.zeros(1)
for _ in range(1500):
    m(x)
"""


def test_run_max_disk_says_what_rolled_off(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", "loop.htrace",
                        "--max-disk", "2M", "--capacity", "8192", "--no-backward", str(script)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    m = re.search(r"([0-9]+) rolled off \(oldest segments deleted: --max-disk\)", r.stderr)
    assert m and int(m.group(1)) > 0, r.stderr
    s = subprocess.run([sys.executable, "-m", "hooktrace", "summary", "loop.htrace"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert s.returncode == 0 and "rolled off" in s.stdout, s.stdout + s.stderr
    bad = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--max-disk", "lots",
                          str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1].endswith(
        "--max-disk must be a size such as 2G, 500M or 1.5GiB, got 'lots'"), bad.stderr


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real 4 MiB filesystem (tmpfs), 1.25 MiB of it free: needs root, as CI has."""
    where = tmp_path / "small"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"a small filesystem needs mount (root): {r.stderr.strip()}")
    try:
        import os
        st = os.statvfs(where)
        (where / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 1280 * 1024))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_rolls_off_old_segments_and_recording_goes_on(small_disk: Path) -> None:
    # GIVEN a 4 MiB bound (512 KiB segments) on a disk with 1.25 MiB free
    out = small_disk / "run.htrace"
    model = chain()
    # WHEN the run writes ~12.6 MiB
    with pytest.warns(RuntimeWarning, match="was full: [0-9]+ older segments were rolled off"):
        with hooktrace.trace(model, out=out, max_disk="4M", capacity=16384,
                             backward=False) as tr:
            run_calls(model, 2000)
    # THEN the oldest segments went to make room and the stream kept writing to the end
    # (before: "write failed: No space left on device" at ~1 MiB, the rest lost)
    counts = tr.stream_counts()
    run = hooktrace.load(out)
    rolling = run.info["rolling"]
    assert "cut" not in run.info  # the footer was written: the run finished in the file
    assert rolling["full_disk_rolled_off_segments"] > 0
    assert rolling["rolled_off_events"] + len(run.events) == counts["events"]
    # what a full disk could not take at all is counted as dropped, never silent
    assert run.info["dropped_events"] == counts["dropped_events"] >= \
        rolling["full_disk_lost_events"]
    assert any("the disk was full" in n for n in run.summary().notes)
    if counts["dropped_events"] == 0:  # (as above: a loaded machine may drop the last)
        assert run.events["id"][-1] == 0 and run.events["kind"][-1] == 2, counts


LOOP_UNTIL_KILLED = """
import torch
from torch import nn
m = nn.Sequential(*[nn.Identity() for _ in range(100)])
x = torch.zeros(1)
for _ in range(10**7):
    m(x)
"""


def test_after_kill_9_the_summary_says_segments_were_rolled_off(tmp_path: Path) -> None:
    # GIVEN a run under --max-disk 2M (256 KiB segments), killed once it rolled off some
    script = tmp_path / "loop.py"
    script.write_text(LOOP_UNTIL_KILLED)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "hooktrace", "run", "-o", "loop.htrace",
                             "--max-disk", "2M", "--no-backward", str(script)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    import time
    deadline = time.monotonic() + 240
    try:
        while True:
            numbers = sorted(int(p.name.split(".")[1]) for p in tmp_path.glob("loop.*.htrace"))
            if numbers and numbers[0] >= 3:  # segments 1 and 2 were rolled off
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, numbers
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    # WHEN the newest file is read (no footer: the counts the writer kept are gone)
    s = subprocess.run([sys.executable, "-m", "hooktrace", "summary", "loop.htrace"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    # THEN the summary says segments were rolled off, as many as the numbering shows
    assert s.returncode == 0, s.stderr
    m = re.search(r"--max-disk: the ([0-9]+) oldest segments were rolled off", s.stdout)
    assert m and int(m.group(1)) >= 2, s.stdout
    assert "not known: the run did not finish" in s.stdout
