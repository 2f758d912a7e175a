"""The version 3 stream format (hooktrace/format/stream.py): blocks, cuts, and what is refused."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import build_events
from hooktrace._events import ENTER, EVENT_DTYPE, EXIT
from hooktrace.reading import load
from hooktrace.format import (
    BLOCK_CLOCK,
    BLOCK_EVENTS,
    BLOCK_FOOTER,
    BLOCK_META,
    BLOCK_MODULES,
    BLOCK_NODE_NAMES,
    BLOCK_STATS,
    TraceFileError,
    read_trace,
    stream_block,
    stream_header,
    write_trace,
)
from hooktrace._events import Clock

START = 1_700_000_000_000_000_000
META: dict[str, Any] = {"pid": 4242, "hostname": "h", "start_unix_ns": START,
                        "modules": [["", "Net"], ["fc", "Linear"]]}
CLOCK = struct.pack("<Qqd", 0, START, 1.0)


def events_block(thread: int, tid: int, first: int, ev: np.ndarray) -> bytes:
    return stream_block(BLOCK_EVENTS, struct.pack("<IIQ", thread, tid, first) + ev.tobytes())


def names_block(first: int, names: list[str]) -> bytes:
    table = struct.pack("<I", len(names)) + b"".join(
        struct.pack("<I", len(n.encode())) + n.encode() for n in names)
    return stream_block(BLOCK_NODE_NAMES, struct.pack("<I", first) + table)


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def thread_events(tid: int, t0: int) -> np.ndarray:
    """Two nested calls on one thread: Net(fc())."""
    return build_events([(tid, ENTER, 0, t0), (tid, ENTER, 1, t0 + 10), (tid, EXIT, 1, t0 + 20),
                         (tid, EXIT, 0, t0 + 30)])


def two_threads() -> tuple[list[bytes], np.ndarray]:
    """Blocks of a stream in which two threads' events interleave, and the events as
    memory holds them (thread by thread)."""
    a, b = thread_events(101, 100), thread_events(202, 105)
    blocks = [
        stream_header(),
        stream_block(BLOCK_META, js(META)),
        stream_block(BLOCK_CLOCK, CLOCK),
        names_block(0, ["MulBackward0"]),
        events_block(0, 101, 0, a[:2]),
        events_block(1, 202, 0, b[:3]),
        events_block(0, 101, 2, a[2:]),
        stream_block(BLOCK_STATS, struct.pack("<QQ", 7, 0)),
        events_block(1, 202, 3, b[3:]),
        stream_block(BLOCK_FOOTER, js({"dropped_events": 7, "overwritten_events": 0,
                                       "stop_unix_ns": START + 10**6, "events": 8})),
    ]
    return blocks, np.concatenate([a, b])


def write(tmp_path: Path, blocks: list[bytes], name: str = "s.htrace") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(blocks))
    return path


def expect_error(path: Path, offset: int, *fragments: str) -> TraceFileError:
    with pytest.raises(TraceFileError) as info:
        read_trace(path)
    err = info.value
    assert err.offset == offset, str(err)
    for fragment in fragments:
        assert fragment in str(err)
    assert "\n" not in str(err)
    return err


def test_a_complete_stream_loads_thread_by_thread(tmp_path: Path) -> None:
    blocks, expected = two_threads()
    run = load(write(tmp_path, blocks))
    assert np.array_equal(run.events, expected)
    assert run.modules == [("", "Net"), ("fc", "Linear")] and run.node_names == ["MulBackward0"]
    assert run.dropped_events == 7 and run.info["stop_unix_ns"] == START + 10**6
    assert "cut" not in run.info
    assert len(run.spans()) == 4 and run.spans().unfinished == 0
    # saved as version 2, it reads back the same
    run.save(tmp_path / "v2.htrace")
    again = load(tmp_path / "v2.htrace")
    assert np.array_equal(again.events, expected) and again.dropped_events == 7


def test_every_cut_loads_the_complete_blocks_before_it(tmp_path: Path) -> None:
    blocks, _ = two_threads()
    data = b"".join(blocks)
    ends = np.cumsum([len(b) for b in blocks])
    meta_end = int(ends[1])
    events_before = [0, 0, 0, 0, 2, 5, 7, 7, 8, 8]  # after each block, in file order
    for size in range(meta_end, len(data)):
        path = write(tmp_path, [data[:size]])
        run = read_trace(path)
        complete = int(np.searchsorted(ends, size, side="right")) - 1  # last whole block
        n = events_before[complete]
        assert len(run.events) == n, size
        at_boundary = size == ends[complete]
        why = ("no footer: the process did not finish" if at_boundary
               else "a partly written block")
        assert run.info["cut"].startswith(
            f"{path}: recording cut at byte {int(ends[complete])} ({why}"), run.info["cut"]
        assert run.info["cut"].endswith(f"); {n:,} events before it loaded")
        # dropped events so far come from the last STATS block before the cut
        assert run.info["dropped_events"] == (7 if complete >= 7 else 0)
    for size in range(0, meta_end):
        with pytest.raises(TraceFileError):
            read_trace(write(tmp_path, [data[:size]]))


@pytest.mark.parametrize("where", ["header", "payload"])
def test_a_damaged_block_ends_the_readable_part(tmp_path: Path, where: str) -> None:
    blocks, expected = two_threads()
    damaged = bytearray(blocks[6])  # the third EVENTS block
    damaged[5 if where == "header" else 40] ^= 0x10
    blocks[6] = bytes(damaged)
    path = write(tmp_path, blocks)
    run = read_trace(path)
    at = sum(len(b) for b in blocks[:6])
    what = ("a block header that fails its checksum" if where == "header"
            else "a block (EVENTS) whose payload fails its checksum")
    assert run.info["cut"] == f"{path}: recording cut at byte {at} ({what}); 5 events before it loaded"
    assert np.array_equal(run.events, np.concatenate([expected[:2], expected[4:7]]))


def test_kind_5_step_marks_are_read(tmp_path: Path) -> None:
    # kStep (kind 5, seq = step number, id = 0), recorded by tr.step()
    ev = build_events([(101, ENTER, 0, 100), (101, 5, 0, 105), (101, EXIT, 0, 110)])
    ev["seq"][1] = 3
    blocks = [stream_header(), stream_block(BLOCK_META, js(META)),
              stream_block(BLOCK_CLOCK, CLOCK), events_block(0, 101, 0, ev)]
    assert np.array_equal(read_trace(write(tmp_path, blocks)).events["kind"], [1, 5, 2])
    v2 = tmp_path / "v2.htrace"
    write_trace(v2, ev, [("", "Net")], [], Clock(0, START, 1.0), {"pid": 1})
    assert read_trace(v2).events["kind"].tolist() == [1, 5, 2]


def bad(blocks: list[bytes], index: int, replacement: bytes) -> list[bytes]:
    return blocks[:index] + [replacement] + blocks[index + 1:]


def offset_of(blocks: list[bytes], index: int) -> int:
    return sum(len(b) for b in blocks[:index])


@pytest.mark.parametrize(
    ("index", "replacement", "delta", "fragments"),
    [
        (1, stream_block(BLOCK_CLOCK, CLOCK), 0, ["expected the META block first, found CLOCK"]),
        (2, stream_block(9, b""), 0, ["unknown block type 9"]),
        (2, stream_block(BLOCK_CLOCK, CLOCK[:16]), 8, ["CLOCK block: expected 24"]),
        (2, stream_block(BLOCK_CLOCK, struct.pack("<Qqd", 0, START, 0.0)), 24 + 16,
         ["ns_per_tick"]),
        (2, events_block(0, 101, 0, thread_events(101, 100)), 0,
         ["expected a CLOCK block before the first EVENTS"]),
        (3, names_block(1, ["X"]), 24, ["expected names from index 0 on, found 1"]),
        (5, events_block(0, 202, 0, thread_events(202, 105)[:3]), 24 + 4,
         ["thread 0 was tid 101 before, found tid 202"]),
        (6, events_block(0, 101, 3, thread_events(101, 100)[2:]), 24 + 8,
         ["expected thread 0's event 2 next, found 3"]),
        (6, events_block(0, 101, 2, thread_events(202, 100)[2:]), 24 + 16 + 20,
         ["expected every event on tid 101, event 0 is on 202"]),
        (6, stream_block(BLOCK_EVENTS, b"\0" * 20), 8, ["EVENTS block: expected 16 + a multiple"]),
        (7, stream_block(BLOCK_STATS, b"\0" * 8), 8, ["STATS block: expected 16"]),
        (9, stream_block(BLOCK_FOOTER, js({"events": 9})), '"events"', ['"events"', "expected the 8"]),
        (9, stream_block(BLOCK_FOOTER, js({"events": 8, "dropped_events": -1})), '"dropped_events"',

         ['"dropped_events"', "expected an int"]),
        (9, stream_block(BLOCK_FOOTER, js({"events": 8, "stop_unix_ns": START - 1})),
         '"stop_unix_ns"',
         ['"stop_unix_ns"', "at or after start_unix_ns"]),
        (1, stream_block(BLOCK_META, js({**META, "pid": 0})), '"pid"', ['"pid"', "expected an int"]),
        (1, stream_block(BLOCK_META, js({**META, "modules": [["", 3]]})), '"modules"',
         ['"modules"', "[0]: expected [name, class name]"]),
        (1, stream_block(BLOCK_META, b"[1]"), 24, ["expected a JSON object"]),
    ],
)
def test_intact_blocks_that_no_recorder_writes_are_refused(
    tmp_path: Path, index: int, replacement: bytes, delta: int | str, fragments: list[str]
) -> None:
    # delta: the error's offset in the block, or the metadata key it names (JSON blocks)
    blocks, _ = two_threads()
    changed = bad(blocks, index, replacement)
    if isinstance(delta, str):
        delta = 24 + replacement[24:].index(delta.encode())
    expect_error(write(tmp_path, changed), offset_of(changed, index) + delta, *fragments)


def test_event_values_are_validated_as_in_version_2(tmp_path: Path) -> None:
    blocks, _ = two_threads()
    ev = thread_events(202, 105)[:3]
    ev["id"][1] = 7  # no module 7
    changed = bad(blocks, 5, events_block(1, 202, 0, ev))
    expect_error(write(tmp_path, changed), offset_of(changed, 5) + 24 + 16 + 32 + 16,
                 "module id 7 out of range")
    ev = thread_events(101, 100)[2:]
    ev["t"][0] = 50  # before the thread's earlier events
    changed = bad(blocks, 6, events_block(0, 101, 2, ev))
    expect_error(write(tmp_path, changed), offset_of(changed, 6) + 24 + 16, "time goes back")


def test_nothing_may_follow_the_footer_or_precede_the_meta(tmp_path: Path) -> None:
    blocks, _ = two_threads()
    path = write(tmp_path, blocks + [b"xx"])
    expect_error(path, path.stat().st_size - 2, "2 trailing bytes")
    head = bytearray(stream_header())
    struct.pack_into("<I", head, 12, 80)
    expect_error(write(tmp_path, [bytes(head)] + blocks[1:]), 12, "expected header size 16")
    # a second META is a different recording glued on
    expect_error(write(tmp_path, blocks[:3] + [blocks[1]] + blocks[3:]), offset_of(blocks, 3),
                 "a second one")


def test_reserved_field_must_be_zero(tmp_path: Path) -> None:
    blocks, _ = two_threads()
    head = bytearray(blocks[7][:24])
    struct.pack_into("<I", head, 4, 1)
    struct.pack_into("<I", head, 20, zlib.crc32(bytes(head[:20])))
    changed = bad(blocks, 7, bytes(head) + blocks[7][24:])
    expect_error(write(tmp_path, changed), offset_of(changed, 7) + 4, "reserved 0")


def test_an_empty_stream_loads(tmp_path: Path) -> None:
    # killed right after the metadata: no clock, no events
    run = load(write(tmp_path, [stream_header(), stream_block(BLOCK_META, js(META))]))
    assert len(run.events) == 0 and run.clock.unix_ns0 == START
    assert "0 events before it loaded" in run.info["cut"]
    assert run.events.dtype == EVENT_DTYPE


# -- MODULES (7): the module table of a process scope grows while it records ---------

PROCESS_META: dict[str, Any] = {**META, "modules": []}


def modules_block(first: int, modules: list[tuple[str, str]], count: int | None = None) -> bytes:
    strings = [s for pair in modules for s in pair]
    table = struct.pack("<I", len(strings) if count is None else count) + b"".join(
        struct.pack("<I", len(s.encode())) + s.encode() for s in strings)
    return stream_block(BLOCK_MODULES, struct.pack("<I", first) + table)


def process_stream() -> list[bytes]:
    """A process scope's stream: Net and its fc first, then a head first called later."""
    a = thread_events(101, 100)
    head = build_events([(101, ENTER, 2, 140), (101, EXIT, 2, 150)])
    return [
        stream_header(),
        stream_block(BLOCK_META, js(PROCESS_META)),
        stream_block(BLOCK_CLOCK, CLOCK),
        modules_block(0, [("", "Net"), ("fc", "Linear")]),
        events_block(0, 101, 0, a),
        modules_block(2, [("Head", "Linear")]),
        events_block(0, 101, 4, head),
        stream_block(BLOCK_FOOTER, js({"stop_unix_ns": START + 10**6, "events": 6})),
    ]


def test_modules_blocks_grow_the_table_of_a_process_scope(tmp_path: Path) -> None:
    blocks = process_stream()
    run = load(write(tmp_path, blocks))
    assert run.modules == [("", "Net"), ("fc", "Linear"), ("Head", "Linear")]
    assert len(run.spans()) == 3 and run.spans().unfinished == 0
    # saved as version 2, the whole table is in its metadata
    run.save(tmp_path / "v2.htrace")
    assert load(tmp_path / "v2.htrace").modules == run.modules
    # cut anywhere after the first EVENTS block: the modules written so far, their events
    data = b"".join(blocks)
    ends = np.cumsum([len(b) for b in blocks])
    for size in range(int(ends[4]), int(ends[6]) + 1):
        cut = read_trace(write(tmp_path, [data[:size]], "cut.htrace"))
        assert len(cut.events) == (6 if size >= ends[6] else 4)
        assert len(cut.modules) == (3 if size >= ends[5] else 2), size
        assert "recording cut at byte" in cut.info["cut"]


def test_a_modules_block_restates_names_that_changed(tmp_path: Path) -> None:
    # the main model became known: the first one's names gain its class as a prefix
    blocks = process_stream()
    blocks.insert(6, modules_block(0, [("Net", "Net"), ("Net.fc", "Linear"), ("", "Linear")]))
    run = read_trace(write(tmp_path, blocks))
    assert run.modules == [("Net", "Net"), ("Net.fc", "Linear"), ("", "Linear")]


@pytest.mark.parametrize(
    ("replacement", "delta", "fragments"),
    [
        # a gap: module 3 before module 2 is known (written out of order)
        (modules_block(3, [("x", "Linear")]), 24,
         ["MODULES block: expected modules from index 2 on", "found 3"]),
        (modules_block(2, [("x", "Linear")], count=1), 28,
         ["MODULES block: expected (name, class name) pairs", "found 1"]),
        # a restatement that drops modules
        (modules_block(0, [("", "Net")]), 28,
         ["MODULES block: expected the table to keep its 2 modules", "[0, 1) only"]),
        (stream_block(BLOCK_MODULES, b"\0\0\0\0"), 8,
         ["MODULES block: expected at least 8 payload bytes, found 4"]),
        (modules_block(2, [("x", "Linear")], count=4), 24 + 4 + 4 + 4 + 1 + 4 + 6,
         ["string table ends inside the length of string 2 of 4"]),
    ],
)
def test_a_modules_block_no_recorder_writes_is_refused(
    tmp_path: Path, replacement: bytes, delta: int, fragments: list[str]
) -> None:
    blocks = bad(process_stream(), 5, replacement)
    expect_error(write(tmp_path, blocks), offset_of(blocks, 5) + delta, *fragments)


def test_events_before_the_modules_block_naming_their_module_are_refused(
        tmp_path: Path) -> None:
    # the head's events come before the MODULES block that names it
    blocks = process_stream()
    blocks[5], blocks[6] = blocks[6], blocks[5]
    err = expect_error(write(tmp_path, blocks), offset_of(blocks, 5) + 24 + 16 + 16,
                       "EVENTS block: event 0 names module 2, which no MODULES block before "
                       "it names (the table had 2 modules")
    # and a module no MODULES block names at all: out of range, as in version 2
    blocks = process_stream()
    del blocks[5]
    blocks[-1] = stream_block(BLOCK_FOOTER, js({"stop_unix_ns": START + 10**6, "events": 6}))
    expect_error(write(tmp_path, blocks), offset_of(blocks, 5) + 24 + 16 + 16,
                 "module id 2 out of range (the module table has 2 modules)")
    assert "\n" not in str(err)
