"""The .htrace format: round trip, exact layout, and refusal of damaged files."""

from __future__ import annotations

import json
import re
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import build_events, build_trace, random_stream

import hooktrace.reading as reading
from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, MEM_CPU, NODE_BEGIN, NODE_END, Clock
from hooktrace.analysis.summary import Summary
from hooktrace.format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    TraceFileError,
    read_trace,
    write_trace,
)

CLOCK = Clock(ticks0=123_456, unix_ns0=1_700_000_000_987_654_321, ns_per_tick=0.37)


def sample_trace() -> reading.TraceData:
    ev = random_stream(11)
    n = int(ev["id"].max()) + 1
    modules = [("", "Net")] + [(f"enc.layer.{i}", "Linear") for i in range(1, n)]
    return build_trace(  # random_stream's node ids are < 3
        ev, modules, node_names=["AddmmBackward0", "ReluBackward0", 'we"ird\\näme'],
        clock=CLOCK, dropped_events=3, overwritten_events=5, mode="flight",
        thread_names={"1000": "MainThread"},
    )


def save(tmp_path: Path, trace: reading.TraceData, name: str = "run.htrace") -> Path:
    path = tmp_path / name
    trace.save(path)
    return path


def header_fields(data: bytes) -> tuple:
    return struct.unpack_from("<8sIIQQQQqdIIII", data, 0)


def test_round_trip_preserves_everything(tmp_path):
    # GIVEN a trace with modules, node names, clock and free-form info
    trace = sample_trace()
    # WHEN it is saved and loaded
    loaded = reading.load(save(tmp_path, trace))
    # THEN every part comes back unchanged
    assert np.array_equal(loaded.events, trace.events)
    assert loaded.events.dtype == EVENT_DTYPE
    assert loaded.modules == trace.modules
    assert loaded.node_names == trace.node_names
    assert loaded.clock == trace.clock
    assert loaded.info == trace.info
    assert (loaded.pid, loaded.hostname) == (4242, "testhost")
    assert (loaded.dropped_events, loaded.overwritten_events) == (3, 5)


def test_round_trip_with_mmap(tmp_path):
    trace = sample_trace()
    loaded = reading.load(save(tmp_path, trace), mmap=True)
    assert np.array_equal(loaded.events, trace.events)
    assert np.array_equal(loaded.spans().start_ns, trace.spans().start_ns)


def test_layout_matches_the_documented_format(tmp_path):
    trace = sample_trace()
    data = save(tmp_path, trace).read_bytes()
    (magic, version, header_size, meta_len, strings_len, n_events, ticks0, unix_ns0,
     ns_per_tick, crc_meta, crc_events, pid, crc_header) = header_fields(data)
    assert (magic, version, header_size) == (MAGIC, FORMAT_VERSION, 80)
    assert crc_header == zlib.crc32(data[:76])
    assert (ticks0, unix_ns0, ns_per_tick, pid) == (123_456, 1_700_000_000_987_654_321, 0.37, 4242)
    meta = json.loads(data[80 : 80 + meta_len])
    strings_off = 80 + meta_len
    (count,) = struct.unpack_from("<I", data, strings_off)
    pos, strings = strings_off + 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<I", data, pos)
        strings.append(data[pos + 4 : pos + 4 + length].decode())
        pos += 4 + length
    assert pos == strings_off + strings_len
    assert [(strings[a], strings[b]) for a, b in meta["modules"]] == trace.modules
    assert [strings[i] for i in meta["node_names"]] == trace.node_names
    events_off = -(-pos // 32) * 32
    assert set(data[pos:events_off]) <= {0}
    assert len(data) == events_off + 32 * n_events == events_off + trace.events.nbytes
    assert data[events_off:] == trace.events.tobytes()
    assert crc_meta == zlib.crc32(data[80:pos])
    assert crc_events == zlib.crc32(data[events_off:])


def test_numpy_values_in_info_are_stored_as_json(tmp_path):
    trace = build_trace(build_events([]), [], dropped_events=np.uint64(3),
                        thread_tids=np.array([1, 2]))
    loaded = reading.load(save(tmp_path, trace))
    assert loaded.dropped_events == 3 and loaded.info["thread_tids"] == [1, 2]


def test_empty_run_round_trips(tmp_path):
    trace = build_trace(build_events([]), [])
    loaded = reading.load(save(tmp_path, trace))
    assert len(loaded.events) == 0 and loaded.modules == [] and len(loaded.spans()) == 0


def test_reserved_info_keys_are_refused(tmp_path):
    trace = build_trace(build_events([]), [])
    trace.info["modules"] = []
    with pytest.raises(ValueError, match="reserved"):
        trace.save(tmp_path / "x.htrace")


# --- damaged files ---------------------------------------------------------------------------


def expect_error(path: Path, offset: int, *fragments: str) -> TraceFileError:
    with pytest.raises(TraceFileError) as info:
        read_trace(path)
    err = info.value
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: offset {offset}: "), msg
    assert err.offset == offset
    for fragment in fragments:
        assert fragment in msg, msg
    assert isinstance(err, ValueError)
    return err


def rewrite(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_empty_file(tmp_path):
    expect_error(rewrite(tmp_path / "e.htrace", b""), 0, "empty file")


def test_wrong_magic(tmp_path):
    data = save(tmp_path, sample_trace()).read_bytes()
    expect_error(rewrite(tmp_path / "m.htrace", b"PK\x03\x04" + data[4:]), 0, "magic")
    expect_error(rewrite(tmp_path / "s.htrace", b"{}"), 0, "magic")


def test_chrome_json_and_gzip_are_named(tmp_path):
    err = expect_error(rewrite(tmp_path / "t.json", b'{"traceEvents": []}'), 0)
    assert "file is JSON (a Chrome trace?), not a .htrace file" in str(err)
    err = expect_error(rewrite(tmp_path / "t.json.gz", b"\x1f\x8b\x08\x00" + bytes(90)), 0)
    assert "file is gzip-compressed (a .json.gz Chrome trace?), not a .htrace file" in str(err)


@pytest.mark.parametrize("version, age", [(1, "an older"), (7, "a newer")])
def test_wrong_version(tmp_path, version, age):
    # version 1 files (no header checksum) and future ones are refused by version,
    # before any other check could misreport them as corrupt
    path = save(tmp_path, sample_trace())
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, version)
    err = expect_error(rewrite(path, bytes(data)), 8)
    assert str(err) == (f"{path}: offset 8: unsupported format version {version} "
                        f"(this hooktrace reads versions {FORMAT_VERSION} and 3; the file was "
                        f"written by {age} hooktrace)")
    assert FORMAT_VERSION == 2


def test_wrong_header_size(tmp_path):
    path = save(tmp_path, sample_trace())
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 12, 96)
    expect_error(rewrite(path, bytes(data)), 12, "header size 80", "96")


def set_header(data: bytes, fmt: str, offset: int, value: object) -> bytes:
    """The header with one field replaced and its checksum recomputed."""
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    struct.pack_into("<I", out, 76, zlib.crc32(bytes(out[:76])))
    return bytes(out)


def test_header_fields_are_under_the_header_checksum(tmp_path):
    path = save(tmp_path, sample_trace())
    data = bytearray(path.read_bytes())
    struct.pack_into("<d", data, 56, 0.5)  # clock rescaled, checksum left alone
    expect_error(rewrite(path, bytes(data)), 76, "header checksum mismatch")


@pytest.mark.parametrize("fmt, offset, value, fragment", [
    ("<d", 56, float("nan"), "ns_per_tick"),
    ("<d", 56, 0.0, "ns_per_tick"),
    ("<d", 56, -1.0, "ns_per_tick"),
    ("<d", 56, 1e9, "ns_per_tick"),
    ("<d", 56, float("inf"), "ns_per_tick"),
    ("<q", 48, -5, "unix_ns0"),
    ("<I", 72, 0, "pid"),
    ("<I", 72, 2**31, "pid"),
])
def test_header_values_are_range_checked(tmp_path, fmt, offset, value, fragment):
    path = save(tmp_path, sample_trace())
    expect_error(rewrite(path, set_header(path.read_bytes(), fmt, offset, value)), offset,
                 fragment)


def test_header_pid_must_match_metadata(tmp_path):
    path = save(tmp_path, sample_trace())
    data = set_header(path.read_bytes(), "<I", 72, 77)
    err = expect_error(rewrite(path, data), HEADER_SIZE + data[80:].index(b'"pid"'),
                       '"pid"', "header's pid 77", "4242")
    assert err.path == str(path)


@pytest.mark.parametrize("where", ["in_magic", "in_header", "in_meta", "in_strings", "in_events",
                                   "last_byte"])
def test_truncated_files(tmp_path, where):
    # GIVEN a valid file and where each block starts
    path = save(tmp_path, sample_trace())
    data = path.read_bytes()
    _, _, _, meta_len, strings_len, n_events, *_ = header_fields(data)
    strings_off = HEADER_SIZE + meta_len
    events_off = -(-(strings_off + strings_len) // 32) * 32
    cut, offset = {
        "in_magic": (5, 5),
        "in_header": (40, 40),
        "in_meta": (HEADER_SIZE + 3, HEADER_SIZE),
        "in_strings": (strings_off + 2, strings_off),
        "in_events": (events_off + 32 * 3 + 7, events_off),
        "last_byte": (len(data) - 1, events_off),
    }[where]
    # WHEN the file is cut there THEN reading names the block that was cut
    expect_error(rewrite(path, data[:cut]), offset, "truncated")


def test_trailing_bytes(tmp_path):
    path = save(tmp_path, sample_trace())
    data = path.read_bytes()
    expect_error(rewrite(path, data + b"\0" * 32), len(data), "trailing")


def test_flipped_bit_in_events_fails_crc(tmp_path):
    path = save(tmp_path, sample_trace())
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    _, _, _, meta_len, strings_len, *_ = header_fields(data)
    events_off = -(-(HEADER_SIZE + meta_len + strings_len) // 32) * 32
    expect_error(rewrite(path, bytes(data)), events_off, "checksum mismatch")


def test_flipped_bit_in_meta_fails_crc(tmp_path):
    path = save(tmp_path, sample_trace())
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 5] ^= 0x01
    expect_error(rewrite(path, bytes(data)), HEADER_SIZE, "checksum mismatch")


def forge(tmp_path: Path, *, meta: bytes | None = None, strings: bytes | None = None,
          events: np.ndarray | None = None, name: str = "forged.htrace") -> Path:
    """A file with correct checksums around deliberately bad content."""
    if meta is None:
        meta = json.dumps({"modules": [[0, 1]], "node_names": [2]}).encode()
    if strings is None:
        parts = [struct.pack("<I", 3)]
        for s in ("", "Net", "AddBackward0"):
            parts += [struct.pack("<I", len(s.encode())), s.encode()]
        strings = b"".join(parts)
    if events is None:
        events = build_events([(1, ENTER, 0, 1), (1, EXIT, 0, 2)])
    events_off = -(-(HEADER_SIZE + len(meta) + len(strings)) // 32) * 32
    header = struct.pack("<8sIIQQQQqdIII", MAGIC, 2, 80, len(meta), len(strings), len(events),
                         0, 0, 1.0, zlib.crc32(meta + strings), zlib.crc32(events.tobytes()),
                         1)
    header += struct.pack("<I", zlib.crc32(header))
    pad = b"\0" * (events_off - HEADER_SIZE - len(meta) - len(strings))
    path = tmp_path / name
    path.write_bytes(header + meta + strings + pad + events.tobytes())
    return path


def test_forged_valid_file_reads(tmp_path):
    contents = read_trace(forge(tmp_path))
    assert contents.modules == [("", "Net")] and contents.node_names == ["AddBackward0"]


def test_bad_json(tmp_path):
    expect_error(forge(tmp_path, meta=b'{"modules": [[0, 1]],'), HEADER_SIZE + 21, "not valid JSON")


def test_meta_not_an_object(tmp_path):
    expect_error(forge(tmp_path, meta=b"[1, 2]"), HEADER_SIZE, "JSON object")


def test_string_index_out_of_range(tmp_path):
    meta = json.dumps({"modules": [[0, 9]], "node_names": []}).encode()
    expect_error(forge(tmp_path, meta=meta), HEADER_SIZE + 1, '"modules"', "[0][1]",
                 "string index 9 out of range", "3 strings")


def test_string_table_overrun(tmp_path):
    strings = struct.pack("<I", 2) + struct.pack("<I", 0) + struct.pack("<I", 50) + b"abc"
    meta = b"{}"
    strings_off = HEADER_SIZE + len(meta)
    expect_error(forge(tmp_path, meta=meta, strings=strings), strings_off + 12, "string 1",
                 "runs past")


def test_bad_event_kind(tmp_path):
    ev = build_events([(1, ENTER, 0, 1), (1, EXIT, 0, 2), (1, 11, 0, 3)])
    path = forge(tmp_path, events=ev)
    data = path.read_bytes()
    events_off = len(data) - ev.nbytes
    expect_error(path, events_off + 2 * 32 + 28, "event 2", "kind", "found 11")


def test_kernel_mark_needs_its_site(tmp_path):
    # a kernel mark (issue #18) names a site of info["kernel_sites"]
    ev = build_events([(1, ENTER, 0, 1), (1, 8, 1, 2), (1, 9, 1, 3), (1, EXIT, 0, 4)])
    meta = {"modules": [[0, 1]], "node_names": [2]}
    ok = forge(tmp_path, events=ev, name="ok.htrace", meta=json.dumps(
        {**meta, "kernel_sites": [["k0", "", "forward"], ["k1", "fc", "forward"]]}).encode())
    assert len(read_trace(ok).events) == 4
    path = forge(tmp_path, events=ev, meta=json.dumps(
        {**meta, "kernel_sites": [["k0", "", "forward"]]}).encode())
    events_off = len(path.read_bytes()) - ev.nbytes
    expect_error(path, events_off + 32 + 16, "event 1", "kernel site 1 out of range", "1 sites")
    bad = forge(tmp_path, events=ev, name="bad.htrace", meta=json.dumps(
        {**meta, "kernel_sites": [["k0", "", "sideways"]]}).encode())
    with pytest.raises(TraceFileError, match='"kernel_sites": expected a list of'):
        read_trace(bad)


def test_module_id_out_of_range(tmp_path):
    ev = build_events([(1, ENTER, 0, 1), (1, EXIT, 5, 2)])
    path = forge(tmp_path, events=ev)
    events_off = len(path.read_bytes()) - ev.nbytes
    expect_error(path, events_off + 32 + 16, "event 1", "module id 5 out of range", "1 modules")


def test_node_id_out_of_range(tmp_path):
    ev = build_events([(1, NODE_BEGIN, 0, 1), (1, NODE_END, 0, 2), (1, NODE_BEGIN, 4, 3)])
    path = forge(tmp_path, events=ev)
    events_off = len(path.read_bytes()) - ev.nbytes
    expect_error(path, events_off + 64 + 16, "event 2", "node name id 4")


def test_node_end_id_is_a_graph_task_not_a_name(tmp_path):
    # NODE_END carries the autograd graph task id (csrc/backward.h), any value
    ev = build_events([(1, NODE_BEGIN, 0, 1), (1, NODE_END, 4000, 2)])
    path = forge(tmp_path, events=ev)
    assert read_trace(path).events["id"].tolist() == [0, 4000]


def test_write_refuses_wrong_dtype(tmp_path):
    with pytest.raises(TypeError, match="EVENT_DTYPE"):
        write_trace(tmp_path / "x.htrace", np.zeros(3, np.int64), [], [], Clock(0, 0, 1.0), {})


def test_error_names_file_as_given(tmp_path):
    rel = os.path.relpath(rewrite(tmp_path / "rel.htrace", b""), os.getcwd())
    with pytest.raises(TraceFileError, match="^" + re.escape(f"{rel}: offset 0: ")):
        read_trace(rel)



# --- values that pass the checksums but cannot be a recording (issue #8) --------------------


def forge_meta(tmp_path: Path, **info: object) -> Path:
    return forge(tmp_path, meta=json.dumps({"modules": [[0, 1]], "node_names": [2], **info})
                 .encode())


@pytest.mark.parametrize("key, value, fragment", [
    ("pid", "abc", "an int in [1, 2147483647]"),
    ("pid", -1, "an int in [1"),
    ("pid", True, "an int in [1"),
    ("pid", 5, "header's pid 1"),
    ("hostname", 5, "a string"),
    ("dropped_events", None, "an int in [0"),
    ("dropped_events", -3, "an int in [0"),
    ("overwritten_events", 1.5, "an int in [0"),
    ("capacity", "8M", "an int in [0"),
    ("start_unix_ns", -1, "an int in [0"),
    ("stop_unix_ns", 2**62, "an int in [0"),
    ("thread_names", [1, 2], "an object mapping thread ids"),
    ("thread_names", {"main": "MainThread"}, "entry 'main'"),
    ("thread_names", {"12": 7}, "entry '12'"),
    ("backward", "yes", "true or false"),
    ("modules", {"a": 1}, "list of [name_idx, type_idx]"),
    ("modules", [[0, 1, 2]], "[0]: expected [name_idx, type_idx]"),
    ("modules", [[0, "1"]], "string index '1'"),
    ("node_names", [-1], "string index -1"),
    ("node_names", 3, "list of string indices"),
])
def test_metadata_values_are_type_checked(tmp_path, key, value, fragment):
    meta = {"modules": [[0, 1]], "node_names": [2], "pid": 1, key: value}
    path = forge(tmp_path, meta=json.dumps(meta).encode())
    offset = HEADER_SIZE + json.dumps(meta).encode().index(f'"{key}"'.encode())
    expect_error(path, offset, f'metadata "{key}"', fragment)


def test_metadata_nesting_is_bounded(tmp_path):
    deep = b'{"x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    expect_error(forge(tmp_path, meta=deep), HEADER_SIZE, "1001 levels deep", "at most 32")
    # brackets inside strings are not nesting
    assert read_trace(forge_meta(tmp_path, note="[" * 100)).info["note"] == "[" * 100


@pytest.mark.parametrize("literal, fragment", [
    (b"1" * 5000, "an integer of at most 40"),
    (b"1e999", "a finite number"),
    (b"NaN", "NaN and Infinity are not JSON"),
    (b"-Infinity", "NaN and Infinity"),
])
def test_metadata_numbers_are_bounded(tmp_path, literal, fragment):
    meta = b'{"modules": [[0, 1]], "node_names": [2], "x": ' + literal + b"}"
    expect_error(forge(tmp_path, meta=meta), HEADER_SIZE + meta.index(literal), fragment)


def test_lone_surrogate_in_metadata_is_refused(tmp_path):
    meta = b'{"modules": [[0, 1]], "node_names": [2], "hostname": "a\\ud800b"}'
    expect_error(forge(tmp_path, meta=meta), HEADER_SIZE, "metadata ['hostname']",
                 "surrogate")


def test_stop_before_start_is_refused(tmp_path):
    path = forge_meta(tmp_path, start_unix_ns=100, stop_unix_ns=50)
    expect_error(path, HEADER_SIZE + path.read_bytes()[80:].index(b'"stop_unix_ns"'),
                 "at or after start_unix_ns 100")


def events_at(tmp_path: Path, ev: np.ndarray, **info: object) -> Path:
    meta = {"modules": [[0, 1]], "node_names": [2], **info}
    return forge(tmp_path, meta=json.dumps(meta).encode(), events=ev)


def event_offset(path: Path, ev: np.ndarray, i: int, field: int) -> int:
    return len(path.read_bytes()) - ev.nbytes + 32 * i + field


def test_time_going_back_on_a_thread_is_refused(tmp_path):
    # GIVEN thread 1 whose EXIT is recorded before its ENTER's time (negative duration),
    # with thread 2's events in between (only per-thread order matters)
    ev = build_events([(1, ENTER, 0, 50), (2, ENTER, 0, 10), (2, EXIT, 0, 20), (1, EXIT, 0, 40)])
    path = events_at(tmp_path, ev)
    expect_error(path, event_offset(path, ev, 3, 0), "event 3", "time goes back on thread 1",
                 "40 ns after 50 ns")


def test_times_outside_the_recorded_interval_are_refused(tmp_path):
    ev = build_events([(1, ENTER, 0, 1_000), (1, EXIT, 0, 10**12)])  # 1000 s later
    path = events_at(tmp_path, ev, start_unix_ns=0, stop_unix_ns=2_000)
    expect_error(path, event_offset(path, ev, 1, 0), "event 1", "recorded interval")
    # within the slack (a wall clock stepped during the run) they are kept
    ev["t"][1] = 2_000 + 30 * 10**9
    assert read_trace(events_at(tmp_path, ev, start_unix_ns=0, stop_unix_ns=2_000,
                                )).events["t"][1] == ev["t"][1]


def test_times_that_overflow_are_refused(tmp_path):
    ev = build_events([(1, ENTER, 0, 1), (1, EXIT, 0, 2**63 + 5)])
    path = events_at(tmp_path, ev)
    expect_error(path, event_offset(path, ev, 1, 0), "event 1", "[0, 2**62)")


@pytest.mark.parametrize("kind, flags", [(EXIT, 2), (ENTER, 1), (NODE_BEGIN, 1)])
def test_unknown_flags_are_refused(tmp_path, kind, flags):
    ev = build_events([(1, ENTER, 0, 1), (1, EXIT, 0, 2), (1, kind, 0, 3, flags)])
    path = events_at(tmp_path, ev)
    expect_error(path, event_offset(path, ev, 2, 29), "event 2", f"found {flags} on kind {kind}")


def test_nonzero_padding_is_refused(tmp_path):
    ev = build_events([(1, ENTER, 0, 1), (1, EXIT, 0, 2)])
    ev["pad"][0] = 3
    path = events_at(tmp_path, ev)
    expect_error(path, event_offset(path, ev, 0, 30), "event 0", "zero padding")


def test_writer_refuses_what_the_reader_would(tmp_path):
    ev = np.zeros(0, EVENT_DTYPE)
    with pytest.raises(ValueError, match="pid"):
        write_trace(tmp_path / "a.htrace", ev, [], [], Clock(0, 0, 1.0), {})
    with pytest.raises(ValueError, match="ns_per_tick"):
        write_trace(tmp_path / "b.htrace", ev, [], [], Clock(0, 0, float("nan")), {"pid": 3})
    assert not (tmp_path / "a.htrace").exists() and not (tmp_path / "b.htrace").exists()


def test_loaded_trace_survives_truncation_of_its_file(tmp_path):
    # GIVEN a run loaded the default way (read into memory)
    trace = sample_trace()
    path = save(tmp_path, trace)
    loaded = reading.load(path)
    # WHEN the file is truncated (a recorder rewriting it, a full disk)
    with open(path, "r+b") as f:
        f.truncate(100)
    # THEN the loaded run is intact (a mapping would raise SIGBUS here) ...
    assert np.array_equal(loaded.events, trace.events)
    assert np.array_equal(loaded.spans().end_ns, trace.spans().end_ns)
    assert Summary.from_trace(loaded).rows == Summary.from_trace(trace).rows
    # ... and loading the truncated file is a clean error
    expect_error(path, HEADER_SIZE, "truncated")


def test_thread_ids_beyond_linux_limit_are_refused(tmp_path):
    ev = build_events([(1, ENTER, 0, 1), (2**32 - 1, EXIT, 0, 2)])
    path = events_at(tmp_path, ev)
    expect_error(path, event_offset(path, ev, 1, 20), "event 1", "thread id of at most 4194304")


def test_time_going_back_inside_one_run_of_a_thread_is_refused(tmp_path):
    ev = build_events([(2, ENTER, 0, 5), (1, ENTER, 0, 50), (1, EXIT, 0, 49), (2, EXIT, 0, 60)])
    path = events_at(tmp_path, ev)
    expect_error(path, event_offset(path, ev, 2, 0), "event 2", "49 ns after 50 ns at event 1")


def test_memory_samples_are_range_checked(tmp_path):
    """A memory sample's bytes and peak are int64 >= 0 (hooktrace.analysis.memory); a wild value
    is named with its event and field, never read as a negative byte count."""
    ev = build_events([(1, ENTER, 0, 1), (1, MEM_CPU, 0, 1), (1, EXIT, 0, 2),
                       (1, MEM_CPU, 0, 2)])
    ev["seq"][3] = 1 << 63
    path = forge(tmp_path, events=ev, name="bytes.htrace")
    events_off = len(path.read_bytes()) - ev.nbytes
    expect_error(path, events_off + 3 * 32 + 8, "event 3", "bytes below 2**62")
    ev["seq"][3] = 500
    ev["rf_tid"][1] = 1 << 31  # the peak's high 32 bits
    path = forge(tmp_path, events=ev, name="peak.htrace")
    expect_error(path, events_off + 32 + 24, "event 1", "peak below 2**62")
    ev["rf_tid"][1] = 0
    ev["id"][1] = 700
    contents = read_trace(forge(tmp_path, events=ev, name="ok.htrace"))
    assert contents.events["kind"].tolist() == [ENTER, MEM_CPU, EXIT, MEM_CPU]


@pytest.mark.parametrize("value", [["gpu"], "cpu", {"devices": "cpu"}, {"devices": ["cuda:x"]}])
def test_memory_metadata_is_checked(tmp_path, value):
    meta = {"modules": [[0, 1]], "node_names": [2], "pid": 1, "memory": value}
    path = forge(tmp_path, meta=json.dumps(meta).encode())
    offset = HEADER_SIZE + json.dumps(meta).encode().index(b'"memory"')
    expect_error(path, offset, 'metadata "memory"', '"devices"')
