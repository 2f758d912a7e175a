"""Readers given what another program (or user) left (issue #46, items 7 to 9): folders
that loop through directory symlinks, a FIFO named like a ``--max-disk`` segment, a
missing middle segment, a sparse file whose header claims terabytes, metadata values of
another type in a CRC-correct file, a flight-recorder dump's terminal escapes, negative
profiler durations; and a full disk at exit, which names the disk and leaves the
script's exit status its own.

Each hostile input ends in hooktrace's own one line (or a note), never a traceback, a
hang or a terminal escape; what could hang runs in a subprocess with a timeout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.cli import main
from hooktrace.format import read_trace, rolling_segments, write_trace
from hooktrace.format.meta import TraceFileError
# (a real small filesystem, which needs root: the fixture small_disk)
from test_max_disk import small_disk as small_disk_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [e.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS", "RANK"):
        e.pop(name, None)
    return e


def cli(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """hooktrace in a subprocess (a reader that hangs is a failure, not a hung suite)."""
    return subprocess.run([sys.executable, "-m", "hooktrace", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env())


def cli_here(*args: str | Path) -> tuple[int, str, str]:
    """hooktrace in this process: (exit status, stdout, stderr); an exception escaping
    main() (a traceback) fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def small_run(path: Path, steps: int = 3, **options: Any) -> Path:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hooktrace.trace(model, **options) as tr:
        for _ in range(steps):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    if "out" not in options:
        tr.result.save(path)
    return path


# -- item 7: folders and segments ------------------------------------------------


def test_a_folder_with_symlinks_to_itself_and_out_is_read_once(tmp_path: Path) -> None:
    # GIVEN a rank folder holding a trace, two symlinks to itself, one to its parent and
    # one out to another folder of traces (glob(..., recursive=True) followed them:
    # 2**40 paths, every verb that reads a folder hung)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    small_run(ranks / "run_rank0.htrace")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    small_run(elsewhere / "other.htrace")
    for name, target in (("a", "."), ("b", "."), ("up", ".."), ("out", str(elsewhere))):
        os.symlink(target, ranks / name)
    # WHEN summary, diff, query and export read the folder
    for verb in (["summary", ranks], ["diff", ranks, ranks],
                 ["export", ranks, "-o", tmp_path / "m.json"]):
        r = cli(*verb)
        # THEN each reads the one trace in the folder, and nothing through a link
        assert r.returncode == 0, (verb, r.stderr)
        assert "other.htrace" not in r.stdout + r.stderr
    count = "SELECT count(*) AS n FROM spans"
    assert cli("query", ranks, count).stdout == cli("query", ranks / "run_rank0.htrace",
                                                    count).stdout


def make_rolled(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A --max-disk stream that rolled: its newest file and its older segments on disk."""
    out = tmp_path / "rolled" / "run.htrace"
    out.parent.mkdir()
    model = nn.Sequential(*[nn.Identity() for _ in range(100)])
    with hooktrace.trace(model, out=out, max_disk="2M", capacity=16384, backward=False):
        for _ in range(1200):
            model(torch.zeros(1))
    segments = [Path(p) for p in rolling_segments(str(out), {"stem": "run"})]
    assert len(segments) >= 4
    return out, segments


def test_a_missing_middle_segment_is_said_and_a_fifo_segment_never_opened(
        tmp_path: Path) -> None:
    out, segments = make_rolled(tmp_path)
    whole = len(hooktrace.load(out).events)
    # GIVEN a middle segment deleted (its events were silently absent)
    gone = segments[1]
    gone.unlink()
    run = hooktrace.load(out)
    # THEN the trace loads without it, and says which one is missing
    assert len(run.events) < whole
    assert run.info["rolling"]["missing_segments"] == [gone.name]
    notes = " ".join(run.summary().notes)
    assert f"1 segment missing from the middle of the stream, its events and steps not " \
           f"here: {gone.name}" in notes, notes
    # GIVEN another one replaced by a FIFO (every reader of the newest file hung on it)
    fifo = segments[2]
    fifo.unlink()
    os.mkfifo(fifo)
    r = cli("summary", out, timeout=120)
    # THEN it is never opened: missing too, said as what it is
    assert r.returncode == 0, r.stderr
    assert f"2 segments missing from the middle of the stream, their events and steps not " \
           f"here: {gone.name}, {fifo.name} (a FIFO (named pipe), not a segment)" in r.stdout


def test_a_whole_stream_says_nothing_missing(tmp_path: Path) -> None:
    out, _ = make_rolled(tmp_path)
    assert "missing_segments" not in hooktrace.load(out).info["rolling"]


# -- item 8: sizes, metadata, escapes, durations -----------------------------------


def sparse(path: Path, version: int, n_events: int) -> Path:
    """A file of a few KB on disk whose header (v2) or length (v3) claims ``n_events``."""
    import zlib

    from hooktrace.format.meta import (HEADER, HEADER_CRC_AT, MAGIC, STREAM_HEADER, U32,
                                       events_offset)

    with open(path, "wb") as f:
        if version == 2:
            meta = json.dumps({"pid": 7, "modules": [], "node_names": []}).encode()
            strings = U32.pack(0)
            off = events_offset(len(meta), len(strings))
            h = HEADER.pack(MAGIC, 2, 80, len(meta), len(strings), n_events, 0,
                            1_700_000_000_000_000_000, 1.0,
                            zlib.crc32(strings, zlib.crc32(meta)), 0, 7, 0)
            h = h[:HEADER_CRC_AT] + U32.pack(zlib.crc32(h[:HEADER_CRC_AT]))
            f.write(h + meta + strings + b"\0" * (off - 80 - len(meta) - len(strings)))
            f.truncate(off + 32 * n_events)
        else:
            f.write(STREAM_HEADER.pack(MAGIC, 3, 16))
            f.truncate(16 + 32 * n_events)
    st = os.stat(path)
    if st.st_blocks * 512 * 64 >= st.st_size:
        pytest.skip("this filesystem keeps no sparse files")
    return path


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("n_events", [1 << 36, 3 * (1 << 30) // 32])
def test_a_sparse_file_claiming_terabytes_is_refused_before_any_allocation(
        tmp_path: Path, version: int, n_events: int) -> None:
    # GIVEN a few KB on disk claiming 2 TiB (MemoryError) or 3 GiB (3.2 GB of memory
    # and 20 s before the checksum failed) of events
    path = sparse(tmp_path / f"s.v{version}.htrace", version, n_events)
    # WHEN it is read, under a 1 GiB address-space limit (an allocation for the claim
    # would fail, and reading it would take seconds)
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from hooktrace.cli import main
        sys.exit(main(["summary", {str(path)!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env())
    # THEN one line: a sparse file, not a recording
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "bytes on disk: a sparse file (hooktrace writes none), not a recording" in line, \
        line


# (the red team's mutants: one value of another type each, in a CRC-correct file)
MUTANTS = {
    "dump_threads": ({"dump": {"reason": "signal", "threads": 5}}, "dump", '["threads"]'),
    "dump_since": ({"dump": {"threads": [{"name": "MainThread", "open": ["fc"],
                                          "since_ns": "x"}]}}, "dump",
                   '["threads"][0]["since_ns"]'),
    "dump_open_dict": ({"dump": {"threads": [{"open": {"a": 1}}]}}, "dump",
                       '["threads"][0]["open"]'),
    "dump_stacks": ({"dump": {"python_stacks": {"MainThread": None}}}, "dump",
                    '["python_stacks"]["MainThread"]'),
    "rolling_str": ({"rolling": {"max_disk": "x", "rolled_off_events": 5}}, "rolling",
                    '["max_disk"]'),
    "rolling_list": ({"rolling": {"max_disk": 2097152, "rolled_off_events": [1]}}, "rolling",
                     '["rolled_off_events"]'),
    "flops_bool": ({"flops": {"signatures": [{"forward": {}, "backward": {}}],
                              "calls": [0, 0, 0], "counted": [True]}}, "flops",
                   '["counted"][0]'),
    "window_bool": ({"window": {"first_step": 0, "last_step": True, "complete": True}},
                    "window", '["last_step"]'),
    "device_name": ({"device_name": True}, "device_name", ""),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_run(tmp_path_factory.mktemp("src") / "src.htrace", memory=True,
                     numerics=True, shapes=True, flops=True)


def mutant(source: Path, dst: Path, changes: dict[str, Any]) -> Path:
    c = read_trace(source)
    write_trace(dst, c.events, c.modules, c.node_names, c.clock, {**c.info, **changes})
    return dst


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_metadata_value_of_another_type_is_one_line_naming_file_and_key(
        tmp_path: Path, source: Path, name: str) -> None:
    changes, key, where = MUTANTS[name]
    path = mutant(source, tmp_path / f"{name}.htrace", changes)
    # WHEN it is loaded: the one-line error names the file, the key and where inside
    with pytest.raises(TraceFileError, match=rf'{name}\.htrace: offset \d+: metadata "{key}": '
                                             rf'{__import__("re").escape(where)}'):
        hooktrace.load(path)
    # and every verb says that line (a traceback at 6 code sites before)
    for verb in (["summary", path], ["summary", path, "--json"],
                 ["report", path, "-o", tmp_path / "r.html"], ["stacks", path],
                 ["export", path, "-o", tmp_path / "x.json"],
                 ["export", path, "-o", f"{tmp_path}/p/"]):
        code, _, err = cli_here(*verb)
        assert code == 1, (verb, err)
        (line,) = err.strip().splitlines()
        assert f'metadata "{key}"' in line, (verb, line)


def test_stacks_writes_a_dumps_escapes_visibly(tmp_path: Path, source: Path) -> None:
    # GIVEN a dump whose strings hold terminal escapes (a title change, a screen clear,
    # a hyperlink; stacks printed them raw while summary escaped them)
    evil = "\x1b]0;PWNED\x07\x1b[2J"
    path = mutant(source, tmp_path / "dump.htrace", {"dump": {
        "reason": evil, "step": 1,
        "threads": [{"name": "Main\x1b[31m", "tid": 1, "open": ["fc\x1b]8;;http://x/\x07"],
                     "since_ns": 5}],
        "python_stacks": {"Main\x1b[31m (1)": ['  File "x.py", line 1, in <module>\n',
                                              "    print('\x1b[2J')\n"]}}})
    code, out, err = cli_here("stacks", path)
    # THEN every line is printed, its control characters written visibly
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "dump (\\x1b]0;PWNED\\x07\\x1b[2J) at step 1" in out
    assert "Main\\x1b[31m (1) module calls, outermost first:" in out
    assert "    print('\\x1b[2J')" in out.splitlines()


def test_negative_profiler_durations_are_refused_in_one_line(tmp_path: Path) -> None:
    # GIVEN a run with its torch.profiler trace, whose aten::linear slices were given
    # negative durations (they became negative module times)
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent("""
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        for _ in range(3):
            m(torch.randn(4, 8)).sum().backward()
    """))
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", tmp_path / "run.htrace",
                        "--profile", script], capture_output=True, text=True, timeout=300,
                       env=env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "run.profiler.json").read_text())
    flipped = 0
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("name") == "aten::linear":
            e["dur"] = -1000.0 * e["dur"] - 1
            flipped += 1
    assert flipped
    (tmp_path / "neg.json").write_text(json.dumps(doc))
    # WHEN summary --profiler and merge read it: one line naming the event
    for verb in (["summary", tmp_path / "run.htrace", "--profiler", tmp_path / "neg.json"],
                 ["merge", tmp_path / "run.htrace", tmp_path / "neg.json", "-o",
                  tmp_path / "m.json"]):
        code, out, err = cli_here(*verb)
        assert code == 1, (verb, out)
        (line,) = err.strip().splitlines()
        assert "neg.json: traceEvents[" in line and "a negative duration" in line, line


# -- item 9: a full disk at exit ---------------------------------------------------


SCRIPT = """
import torch
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(200):
    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
print("done")
"""


@pytest.mark.parametrize("flags", [["--ring", "-o", "/dev/full"],
                                   ["-o", "{tmp}/run.htrace", "--chrome", "/dev/full"]])
def test_a_disk_that_refuses_the_exit_write_leaves_the_exit_status_the_scripts(
        tmp_path: Path, flags: list[str]) -> None:
    # GIVEN a script that succeeds, WHEN the trace (or the export) written at exit meets
    # a full device (/dev/full: every write is ENOSPC; it made the exit status 1,
    # against docs/script.md: the exit code is the script's)
    (tmp_path / "t.py").write_text(SCRIPT)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run",
                        *[f.format(tmp=tmp_path) for f in flags], "t.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env())
    # THEN exit status 0, and one line naming the file, the reason and the disk
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("hooktrace: error:")]
    assert line.startswith("hooktrace: error: could not write the trace: /dev/full: No space "
                           "left on device (no room on the disk holding it, /dev"), line


def test_a_full_disk_names_itself_and_asks_for_no_more_capacity(
        small_disk_fixture: Path) -> None:  # noqa: F811  (the fixture, imported above)
    small_disk = small_disk_fixture
    # GIVEN a real filesystem with about 60 KB free, WHEN hooktrace run streams to it
    # (the exit line said "N events dropped (buffer full: raise --capacity)"), and when
    # --ring writes its trace at exit (exit status 1)
    st = os.statvfs(small_disk)
    (small_disk / "filler2").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 60_000))
    script = small_disk.parent / "t.py"
    script.write_text(SCRIPT.replace("range(200)", "range(400)"))
    for flags in ([], ["--ring"], ["--schedule", "1,1,3"]):
        for old in small_disk.glob("run*.htrace"):
            old.unlink()
        r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o",
                            small_disk / "run.htrace", *flags, script], capture_output=True,
                           text=True, timeout=300, env=env())
        # THEN the exit status is the script's, the disk is named, no --capacity advice
        assert r.returncode == 0, (flags, r.stderr)
        assert "raise --capacity" not in r.stderr, (flags, r.stderr)
        assert f"No space left on device (no room on the disk holding it, {small_disk}: " \
               in r.stderr, (flags, r.stderr)
        if not flags:
            assert "events lost: the file could not be written" in r.stderr, r.stderr
