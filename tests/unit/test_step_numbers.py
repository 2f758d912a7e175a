"""Step marks' numbers are validated by the reader, in both format versions (issue #26
part 3): a CRC-valid file whose steps are negative, repeat or go back is refused in one
line naming the file, the event and the byte offset of its step number."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import build_events
from hooktrace._events import ENTER, EXIT, STEP, Clock
from hooktrace.format import (
    BLOCK_CLOCK,
    BLOCK_EVENTS,
    BLOCK_META,
    TraceFileError,
    read_trace,
    stream_block,
    stream_header,
    write_trace,
)

START = 1_700_000_000_000_000_000


def with_steps(numbers: list[int], tid: int = 101, t0: int = 100) -> np.ndarray:
    """One thread: a call, then a step mark per number (seq = the number, as int64)."""
    rows = [(tid, ENTER, 0, t0), (tid, EXIT, 0, t0 + 5)]
    rows += [(tid, STEP, 0, t0 + 10 * (k + 1)) for k in range(len(numbers))]
    ev = build_events(rows)
    ev["seq"][2:] = np.array(numbers, np.int64).view(np.uint64)
    return ev


def save_v2(path: Path, ev: np.ndarray) -> Path:
    write_trace(path, ev, [("", "Net")], [], Clock(0, START, 1.0), {"pid": 1})
    return path


def save_v3(path: Path, *threads: np.ndarray) -> Path:
    blocks = [stream_header(), stream_block(BLOCK_META, json.dumps(
        {"pid": 1, "hostname": "h", "start_unix_ns": START,
         "modules": [["", "Net"]]}).encode()),
        stream_block(BLOCK_CLOCK, struct.pack("<Qqd", 0, START, 1.0))]
    for k, ev in enumerate(threads):
        blocks.append(stream_block(BLOCK_EVENTS, struct.pack("<IIQ", k, int(ev["tid"][0]), 0)
                                   + ev.tobytes()))
    path.write_bytes(b"".join(blocks))
    return path


SAVE = {"v2": save_v2, "v3": save_v3}


@pytest.mark.parametrize("version", ["v2", "v3"])
@pytest.mark.parametrize("numbers, event, message", [
    ([-1], 2, "expected a step number in [0, 2**62), found -1"),
    ([0, 2**62], 3, "expected a step number in [0, 2**62), found 4611686018427387904"),
    ([7, 7, 7], 3, "step 7 comes after step 7 (event 2): expected step numbers that increase"),
    ([0, 1, 5, 3], 5, "step 3 comes after step 5 (event 4)"),
])
def test_bad_step_numbers_are_refused_naming_the_event(
        tmp_path: Path, version: str, numbers: list[int], event: int, message: str) -> None:
    path = SAVE[version](tmp_path / "bad.htrace", with_steps(numbers))
    with pytest.raises(TraceFileError) as info:
        read_trace(path)
    err = str(info.value)
    assert err.startswith(f"{path}: offset {info.value.offset}: event {event}: {message}"), err
    assert "\n" not in err
    # the offset is that of the bad event's step number in the file
    seq = struct.unpack_from("<q", path.read_bytes(), info.value.offset)[0]
    assert seq == numbers[event - 2]


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_steps_with_gaps_load(tmp_path: Path, version: str) -> None:
    # steps lost to a full buffer (or before a ring's oldest event) leave gaps
    path = SAVE[version](tmp_path / "ok.htrace", with_steps([3, 4, 9]))
    assert read_trace(path).events["seq"][2:].tolist() == [3, 4, 9]


def test_steps_of_two_threads_are_ordered_by_time_not_by_file_position(tmp_path: Path) -> None:
    # v3 keeps each thread's events together: thread 202's steps 1 and 3 come after
    # thread 101's 0, 2 and 4 in the file, but in time they interleave
    a = with_steps([0, 2, 4], tid=101, t0=100)
    b = with_steps([1, 3], tid=202, t0=105)
    events = read_trace(save_v3(tmp_path / "two.htrace", a, b)).events
    assert sorted(events["seq"][events["kind"] == STEP].tolist()) == [0, 1, 2, 3, 4]
    b["t"][3] = 200  # step 3 now after step 4 (t=130): the count goes back
    with pytest.raises(TraceFileError, match="event 8: step 3 comes after step 4 \\(event 4\\)"):
        read_trace(save_v3(tmp_path / "back.htrace", a, b))
