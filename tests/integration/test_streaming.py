"""Issue #9 part 3: streaming to disk with hooktrace.trace(model, out=...)."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hooktrace
from hooktrace._events import NODE_END
from hooktrace.errors import OutputPathError
from hooktrace.format import BLOCK_EVENTS, BLOCK_MODULES
from hooktrace.reading import CAT_BACKWARD
from models import ConvNet
from test_forward import state_snapshot

REPO = Path(__file__).resolve().parents[2]


def mlp(depth: int = 12) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(depth)])


def train(model: nn.Module, steps: int) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(x).sum().backward()


def structure(tr: hooktrace.TraceData) -> dict[str, np.ndarray]:
    """What a run records, without what differs between two identical runs (times,
    graph task ids, the sequence-number counter's offset)."""
    ev = tr.events
    seq = ev["seq"].astype(np.int64)  # -1: a node without a sequence number
    return {
        "kind": ev["kind"], "flags": ev["flags"], "tid": ev["tid"],
        "id": np.where(ev["kind"] == NODE_END, 0, ev["id"]),
        "seq": np.where(seq == -1, -1, seq - seq[0]),
    }


def span_structure(tr: hooktrace.TraceData) -> dict[str, np.ndarray]:
    s = tr.spans()
    return {f: getattr(s, f) for f in ("module", "depth", "call", "cat", "flags", "parent")}


# -- the stream holds what memory would ---------------------------------------------


def test_stream_equals_the_in_memory_trace_event_for_event(tmp_path: Path) -> None:
    # GIVEN the same model and the same forward+backward calls, recorded once in
    # memory and once streamed through chunks far smaller than the run (so chunks are
    # drained, freed and reused many times)
    model = mlp()
    with hooktrace.trace(model) as mem:
        train(model, 250)
    with hooktrace.trace(model, out=tmp_path / "run.htrace", capacity=4 * 4096) as st:
        train(model, 250)
    # THEN the file holds the same events in the same order, field by field (unless the
    # writer fell behind, then every event is still accounted for)
    assert len(mem.events) > 10 * 4096
    assert st.dropped_events + len(st.events) == len(mem.events)
    if st.dropped_events == 0:
        for field, values in structure(mem).items():
            np.testing.assert_array_equal(structure(st)[field], values, err_msg=field)
        for field, values in span_structure(mem).items():
            np.testing.assert_array_equal(span_structure(st)[field], values, err_msg=field)
        def calls(tr: hooktrace.TraceData) -> dict[tuple[str, str], tuple[int, int]]:
            return {(r["module"], r["type"]): (r["calls"], r["bwd_calls"])
                    for r in tr.summary().rows}

        assert calls(st) == calls(mem)
    assert st.modules == mem.modules and st.node_names[: len(mem.node_names)] == mem.node_names
    assert st.info["out"] == str(tmp_path / "run.htrace")
    assert st.info["stream"]["chunks"] <= 4
    assert np.count_nonzero(st.spans().cat == CAT_BACKWARD) > 0
    # and what the trace reads is the file: loading it gives the same
    again = hooktrace.load(tmp_path / "run.htrace")
    assert np.array_equal(again.events, st.events) and "cut" not in again.info


def test_snapshot_while_streaming_is_a_prefix_of_the_file(tmp_path: Path) -> None:
    model = mlp(4)
    with hooktrace.trace(model, out=tmp_path / "run.htrace") as tr:
        train(model, 20)
        snap = tr.snapshot()
        train(model, 20)
    # the snapshot saw every event recorded before it (the writer caught up first)
    assert len(snap.events) == len(tr.events) // 2
    assert np.array_equal(snap.events, tr.events[: len(snap.events)])
    assert "cut" not in snap.info and snap.info["out"] == str(tmp_path / "run.htrace")
    assert snap.spans().unfinished == 0


def test_streaming_records_every_thread(tmp_path: Path) -> None:
    model = mlp(4)
    x = torch.randn(2, 8)

    def work() -> None:
        with torch.no_grad():
            for _ in range(400):
                model(x)

    # (each thread keeps one chunk as its current one: 8 chunks for 4 threads)
    with hooktrace.trace(model, out=tmp_path / "run.htrace", capacity=8 * 4096) as tr:
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        work()
        for t in threads:
            t.join()
    # 4 threads x 400 calls x 13 modules x 2 events, in the file or counted as dropped
    assert len(tr.events) + tr.dropped_events == 4 * 400 * 13 * 2
    tids = tr.events["tid"]
    # thread by thread, as in memory: each thread's events are one run
    assert len(np.unique(tids)) == 4
    assert np.count_nonzero(tids[1:] != tids[:-1]) == 3
    assert tr.spans().unfinished == 0 or tr.dropped_events > 0


# -- memory stays bounded; a writer that falls behind drops and counts ---------------


def test_chunks_in_flight_stay_within_capacity(tmp_path: Path) -> None:
    # GIVEN a capacity of 4 chunks and a run of ~60 chunks' worth of events
    model = nn.Sequential(*[nn.Identity() for _ in range(200)])
    x = torch.zeros(1)
    with hooktrace.trace(model, out=tmp_path / "run.htrace", capacity=4 * 4096,
                         backward=False) as tr:
        peak = 0
        for _ in range(600):
            model(x)
            peak = max(peak, tr._session.stats()["chunks"])
    # THEN never more than 4 chunks were allocated, and every event is either in the
    # file or counted as dropped
    assert peak <= 4 and tr.info["stream"]["chunks"] <= 4
    assert len(tr.events) + tr.dropped_events == 600 * 201 * 2
    assert tr.info["stream"]["bytes"] >= len(tr.events) * 32


def test_writer_falling_behind_drops_and_counts(tmp_path: Path) -> None:
    # GIVEN one chunk of 64 events, far less than one forward records (2002)
    model = nn.Sequential(*[nn.Identity() for _ in range(1000)])
    x = torch.zeros(1)
    with hooktrace.trace(model, out=tmp_path / "run.htrace", capacity=64, backward=False) as tr:
        for _ in range(20):
            model(x)
    # THEN events were dropped (the hot path never waits for the writer), and every
    # event is accounted for, in the file or in the count
    assert tr.dropped_events > 0
    assert len(tr.events) + tr.dropped_events == 20 * 2002
    assert tr.info["stream"]["chunks"] == 1
    # the spans that were kept are well-formed
    assert len(tr.spans()) > 0


# -- a killed process leaves a file whose complete part loads -------------------------

CHILD = """
import sys
import torch
from torch import nn
import hooktrace

torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(10)])
x = torch.randn(4, 8)
with hooktrace.trace(model, out=sys.argv[1]):
    step = 0
    while True:
        model(x).sum().backward()
        step += 1
        if step == 100:
            print("recording", flush=True)
"""


def test_sigkilled_child_leaves_a_loadable_prefix(tmp_path: Path) -> None:
    # GIVEN a child process streaming a training loop that never ends
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    out = tmp_path / "run.htrace"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line == "recording\n", child.stderr.read() if child.stderr else ""
        deadline = time.monotonic() + 120
        while out.stat().st_size < (1 << 20) and time.monotonic() < deadline:
            time.sleep(0.05)
        # WHEN it is killed mid-run (no exit handler, no footer)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream:
                stream.close()
    assert child.returncode == -signal.SIGKILL
    # THEN the file loads up to where it was cut, and says so in one line
    run = hooktrace.load(out)
    note = run.info["cut"]
    assert "\n" not in note
    m = re.fullmatch(rf"{re.escape(str(out))}: recording cut at byte (\d+) \((.+)\); "
                     r"([\d,]+) events before it loaded", note)
    assert m, note
    assert int(m.group(1)) <= out.stat().st_size
    assert int(m.group(3).replace(",", "")) == len(run.events) > 30000
    # the prefix is a sane recording: calls nest, every module is known, the summary
    # and the Chrome export work
    spans = run.spans()
    assert spans.orphan_exits == 0 and spans.unfinished <= 3
    assert len(spans) > 1000
    assert run.modules[0] == ("", "Sequential") and len(run.modules) == 31
    run.summary()
    run.export_chrome(tmp_path / "cut.json")


def test_every_truncation_of_a_stream_loads_a_prefix(tmp_path: Path) -> None:
    # GIVEN a complete stream file
    model = mlp(3)
    with hooktrace.trace(model, out=tmp_path / "run.htrace", capacity=4096) as tr:
        train(model, 40)
    data = (tmp_path / "run.htrace").read_bytes()
    full = tr.events
    # WHEN it is cut anywhere after its metadata
    cut = tmp_path / "cut.htrace"
    meta_end = 16 + 24 + int.from_bytes(data[24:32], "little")
    previous = 0
    for size in sorted({meta_end, meta_end + 1, len(data) - 1, len(data) - 30,
                        *range(meta_end, len(data), 997)}):
        cut.write_bytes(data[:size])
        run = hooktrace.load(cut)
        # THEN it loads the events of the complete blocks before the cut, in order
        n = len(run.events)
        assert n >= previous
        previous = n
        assert np.array_equal(run.events, full[:n])
        assert run.info["cut"].startswith(f"{cut}: recording cut at byte ")
    # and cut inside the metadata, nothing is loadable: one clear error
    cut.write_bytes(data[: meta_end - 1])
    with pytest.raises(hooktrace.HooktraceError, match="expected a complete META block"):
        hooktrace.load(cut)


# -- arguments are checked before the model is touched --------------------------------


def test_ring_with_out_is_refused(tmp_path: Path) -> None:
    model = ConvNet()
    before = state_snapshot(model)
    with pytest.raises(ValueError, match="out= cannot be combined with policy='ring'"):
        hooktrace.trace(model, policy="ring", out=tmp_path / "run.htrace")
    assert state_snapshot(model) == before
    assert not (tmp_path / "run.htrace").exists()


@pytest.mark.parametrize("where", ["dir", "dir/", "missing/run.htrace", "-"])
def test_unusable_out_is_refused_before_the_model_is_touched(tmp_path: Path, where: str) -> None:
    (tmp_path / "dir").mkdir()
    out = "-" if where == "-" else str(tmp_path / where)
    model = ConvNet()
    before = state_snapshot(model)
    with pytest.raises(OutputPathError):
        with hooktrace.trace(model, out=out):
            pytest.fail("entered")
    assert state_snapshot(model) == before


def test_out_must_be_a_path(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="out must be a file path"):
        hooktrace.trace(ConvNet(), out=3)  # type: ignore[arg-type]


def test_failed_entry_leaves_no_stream_file(tmp_path: Path) -> None:
    model = ConvNet()
    with hooktrace.trace(model):
        with pytest.raises(RuntimeError, match="already being traced"):
            with hooktrace.trace(model, out=tmp_path / "run.htrace"):
                pass
    assert not (tmp_path / "run.htrace").exists()


def test_streamed_file_carries_the_rank_metadata(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a launcher's environment (torchrun sets these)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with hooktrace.trace(model, out=tmp_path / "r.htrace") as tr:
        model(torch.randn(1, 2))
    # THEN the stream's footer holds them, as a save()d file's metadata would
    info = hooktrace.load(tmp_path / "r.htrace").info
    assert (info["rank"], info["world_size"], info["local_rank"]) == (1, 2, 1)
    assert tr.info["rank"] == 1


FULL_DISK = """
    import resource, signal, sys, warnings
    import torch, hooktrace
    from torch import nn
    # a disk that is full after 256 KiB: writes past it fail (EFBIG) instead of killing us
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
    model = nn.Sequential(*[nn.Identity() for _ in range(30)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hooktrace.trace(model, out=sys.argv[1]) as tr:
            for _ in range(3000):
                model(torch.zeros(1))
    lost = [str(w.message) for w in caught if "events were lost" in str(w.message)]
    print(len(lost), tr.result.dropped_events, len(tr.result.events),
          tr.result.info.get("stream_error", ""))
"""


def test_a_full_disk_counts_the_lost_events_as_dropped(tmp_path: Path) -> None:
    script = tmp_path / "full.py"
    script.write_text(textwrap.dedent(FULL_DISK))
    out = tmp_path / "run.htrace"
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert r.returncode == 0, r.stderr
    warned, dropped, kept, error = r.stdout.split(maxsplit=3)
    # 3000 x 31 calls = 186,000 events; the file holds what fit, the rest is counted
    assert warned == "1" and int(dropped) > 0 and error.strip()
    assert int(kept) + int(dropped) == 3000 * 31 * 2
    assert out.stat().st_size <= 256 << 10


# -- a process scope (hooktrace run, global_trace) streams too: MODULES blocks --------


class Student(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class Teacher(Student):
    pass


def distill(steps: int, head_after: int, before_head: Any = None) -> None:
    """A teacher called first (under no_grad), then the trained student and a loss; a
    head model made and first called mid-run (``before_head()`` is called just before)."""
    torch.manual_seed(0)
    teacher, student, loss_fn = Teacher(), Student(), nn.MSELoss()
    x = torch.randn(4, 8)
    head: nn.Module | None = None
    for step in range(steps):
        if step == head_after:
            if before_head is not None:
                before_head()
            head = nn.Sequential(nn.Linear(8, 2), nn.Tanh())
        with torch.no_grad():
            target = teacher(x)
        y = student(x)
        loss = loss_fn(y, target) + (head(y).sum() if head is not None else 0)
        loss.backward()


def test_process_scope_stream_equals_the_in_memory_trace(tmp_path: Path) -> None:
    # GIVEN the same run recorded in memory and streamed by a process scope, whose
    # module table grows as modules are first called, and whose first top-level module
    # (the teacher) loses its unprefixed names once the trained student shows up
    with hooktrace.global_trace() as mem:
        distill(60, head_after=30)
    with hooktrace.global_trace(out=tmp_path / "run.htrace", capacity=2 * 4096) as st:
        snaps: list[hooktrace.TraceData] = []
        distill(60, head_after=30, before_head=lambda: snaps.append(st.snapshot()))
    (snap,) = snaps
    # THEN the file names every module as memory does, and holds the same calls
    assert snap.modules == [m for m in mem.modules if not m[0].startswith("Sequential")]
    assert st.modules == mem.modules
    assert ("", "Student") in st.modules and ("Teacher.encoder.0", "Linear") in st.modules
    assert ("Sequential.1", "Tanh") in st.modules
    for key in ("scope", "top_level_modules", "main_module"):
        assert st.info[key] == mem.info[key], key
    assert "cut" not in st.info and st.info["stream"]["chunks"] <= 2
    assert st.dropped_events + len(st.events) == len(mem.events)
    if st.dropped_events == 0:
        def calls(tr: hooktrace.TraceData) -> dict[tuple[str, str], tuple[int, int]]:
            return {(r["module"], r["type"]): (r["calls"], r["bwd_calls"])
                    for r in tr.summary().rows}

        assert calls(st) == calls(mem)
        assert calls(st)[("Sequential", "Sequential")] == (30, 30)
    # the table grew in MODULES blocks: the head's came after events were written
    kinds = stream_blocks(tmp_path / "run.htrace")
    modules_at = [i for i, (btype, _) in enumerate(kinds) if btype == BLOCK_MODULES]
    assert kinds[modules_at[0]][1] == 0
    late = [i for i in modules_at if kinds[i][1] > 0 and
            any(btype == BLOCK_EVENTS for btype, _ in kinds[:i])]
    assert late, kinds


def test_names_that_change_are_restated_in_the_stream(tmp_path: Path) -> None:
    # GIVEN a teacher called alone first (the main model so far: unprefixed names),
    # written to the stream before the trained student is first called
    torch.manual_seed(0)
    teacher, student = Teacher(), Student()
    x = torch.randn(4, 8)
    with hooktrace.global_trace(out=tmp_path / "run.htrace") as tr:
        with torch.no_grad():
            teacher(x)
        before = tr.snapshot()  # (waits for the writer)
        student(x).sum().backward()
    # THEN the student took the unprefixed names: the teacher's were restated
    assert before.modules[0] == ("", "Teacher")
    assert tr.modules[:2] == [("Teacher", "Teacher"), ("Teacher.encoder", "Sequential")]
    assert tr.modules[5:7] == [("", "Student"), ("encoder", "Sequential")]
    assert [first for btype, first in stream_blocks(tmp_path / "run.htrace")
            if btype == BLOCK_MODULES] == [0, 0]
    assert tr.info["main_module"] == "Student"


def stream_blocks(path: Path) -> list[tuple[int, int]]:
    """(block type, its first u32) of each block of a stream file."""
    data = path.read_bytes()
    pos, out = 16, []
    while pos < len(data):
        btype, _, length = struct.unpack_from("<IIQ", data, pos)
        first = struct.unpack_from("<I", data, pos + 24)[0] if length >= 4 else 0
        out.append((btype, first))
        pos += 24 + length
    return out


def test_process_scope_stream_stays_within_capacity(tmp_path: Path) -> None:
    # GIVEN a capacity of 4 chunks and a run of ~60 chunks' worth of events, all from
    # modules named as they are first called
    model = nn.Sequential(*[nn.Identity() for _ in range(200)])
    x = torch.zeros(1)
    with hooktrace.global_trace(out=tmp_path / "run.htrace", capacity=4 * 4096,
                                backward=False) as tr:
        peak = 0
        for _ in range(600):
            model(x)
            peak = max(peak, tr._session.stats()["chunks"])
    # THEN never more than 4 chunks were allocated: the rest went to the file
    assert peak <= 4 and tr.info["stream"]["chunks"] <= 4
    assert len(tr.events) + tr.dropped_events == 600 * 201 * 2
    assert len(tr.events) > 4 * 4096 and len(tr.modules) == 201
