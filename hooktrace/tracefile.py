"""The versioned ``.htrace`` binary trace file: writer and validating reader.

Two versions are read: 2, which ``save()`` writes (one run, laid out below), and 3,
the stream format that ``hooktrace.trace(model, out=...)`` appends to while the
model runs (``STREAM_FORMAT_VERSION``, laid out further below).

Layout of version 2 (little-endian; ``FORMAT_VERSION``)::

    off size
    0   8   magic b"HTRACE\\x00\\x00"
    8   4   u32 format version (FORMAT_VERSION)
    12  4   u32 header size = 80
    16  8   u64 meta_len      (UTF-8 JSON metadata block)
    24  8   u64 strings_len   (string table block)
    32  8   u64 n_events
    40  8   u64 clock ticks0
    48  8   i64 clock unix_ns0
    56  8   f64 clock ns_per_tick
    64  4   u32 crc32 of meta+strings blocks (zlib.crc32)
    68  4   u32 crc32 of the events block
    72  4   u32 pid
    76  4   u32 crc32 of header bytes 0-75 (version 2; version 1 had a reserved 0
                here and left the clock and pid unchecked)
    80      meta JSON (meta_len bytes)
            string table: u32 count, then count x (u32 byte length + UTF-8 bytes)
            zero padding so the events start at a multiple of 32 from file start
            events: n_events x 32 bytes (EVENT_DTYPE, see csrc/event.h)

The module table and backward node names are string-table indices stored in the
metadata: ``meta["modules"] = [[name_idx, type_idx], ...]`` (slot i = module i)
and ``meta["node_names"] = [idx, ...]`` (the id of NODE_BEGIN events indexes
this list; a NODE_END's id is the autograd graph task id). The keys the reader
interprets (``pid``, ``hostname``, ``dropped_events``, ``overwritten_events``,
``capacity``, ``start_unix_ns``/``stop_unix_ns``, ``thread_names``, ...) are
type- and range-checked; any other key is free-form run information.

Layout of version 3, the stream (little-endian; csrc/stream_writer.h draws the same)::

    off size
    0   8   magic b"HTRACE\x00\x00"
    8   4   u32 format version = 3
    12  4   u32 header size = 16
    16      blocks, each a 24-byte header then its payload:
            0   4  u32 block type (BLOCK_* below)
            4   4  u32 reserved, 0
            8   8  u64 payload length
            16  4  u32 crc32 of the payload
            20  4  u32 crc32 of block header bytes 0-19

    META (1)        JSON object, the first block: the run's metadata (the keys
                    of version 2's, below) with ``modules`` as
                    ``[[qualified name, class name], ...]``
    CLOCK (2)       u64 ticks0, i64 unix_ns0, f64 ns_per_tick: the conversion
                    measured so far; the last one applies to every event
    NODE_NAMES (3)  u32 first, then a string table (u32 count, count x (u32
                    byte length + UTF-8)): node names [first, first + count)
    EVENTS (4)      u32 thread (its index in the session), u32 tid, u64 first
                    (the index of the block's first event among the thread's),
                    then 32-byte events of that one thread, in recorded order
    STATS (5)       u64 dropped_events, u64 overwritten_events so far
    FOOTER (6)      JSON object, the last block: dropped/overwritten counts,
                    ``stop_unix_ns``, ``thread_names``, ``events`` (how many
                    EVENTS carried in all); nothing follows it

A stream is readable at every moment: a block that is truncated or fails its
checksum ends the readable part (a killed process leaves a partly written last
block); the events before it load and ``info["cut"]`` says, in one line, where
and why the recording was cut. The complete blocks are validated like a version
2 file; their events are returned thread by thread, as a recording in memory
holds them.

The reader refuses, with one ``TraceFileError`` line naming the file, the
offset (or metadata key) and what it expected, anything that cannot be a
recording: bad checksums, clock conversions outside ``NS_PER_TICK_RANGE``,
unknown event kinds or flags, ids outside the tables, timestamps going back on
a thread or lying far outside the recorded interval (``INTERVAL_SLACK_NS``).

Example:
    >>> import numpy as np, tempfile, os
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> ev = np.zeros(2, EVENT_DTYPE); ev["kind"] = [1, 2]; ev["t"] = [10, 20]
    >>> path = os.path.join(tempfile.mkdtemp(), "run.htrace")
    >>> write_trace(path, ev, [("", "Net")], [], Clock(0, 0, 1.0), {"pid": 1})
    >>> contents = read_trace(path)
    >>> contents.modules, int(contents.events["t"][1])
    ([('', 'Net')], 20)
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

import numpy as np

from hooktrace._output import open_output
from hooktrace.errors import HooktraceError
from hooktrace._events import (
    EVENT_DTYPE,
    ENTER,
    EXIT,
    FLAG_ERROR,
    MEM_CPU,
    MEM_CUDA,
    NODE_BEGIN,
    STEP,
    VALID_KINDS,
    Clock,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "HEADER_SIZE",
    "TraceFileError",
    "TraceFileContents",
    "write_trace",
    "read_trace",
    "STREAM_FORMAT_VERSION",
    "STREAM_HEADER_SIZE",
    "BLOCK_META",
    "BLOCK_CLOCK",
    "BLOCK_NODE_NAMES",
    "BLOCK_EVENTS",
    "BLOCK_STATS",
    "BLOCK_FOOTER",
    "READABLE_KINDS",
    "stream_header",
    "stream_block",
    "encode_json",
]

MAGIC = b"HTRACE\x00\x00"
FORMAT_VERSION = 2
_HEADER = struct.Struct("<8sIIQQQQqdIIII")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 80
_HEADER_CRC_AT = 76  # the last header field: crc32 of the 76 bytes before it
# A recorder's clock conversion: rdtsc ticks are ~0.2-1 ns, steady-clock ticks 1 ns.
# Far outside this range every duration would be rescaled into nonsense.
NS_PER_TICK_RANGE = (1e-3, 1e3)
_MAX_PID = 2**31 - 1  # pid_t is a positive int32
_MAX_UNIX_NS = 2**62  # year 2116; keeps every sum below int64 overflow
# Thread ids are gettid() values, below Linux's PID_MAX_LIMIT (2**22): larger ones
# are not a recording's.
_MAX_TID = 2**22
# Events may lie this far outside [start_unix_ns, stop_unix_ns] (the wall clock
# can be stepped during a run); further out a timestamp cannot be right.
INTERVAL_SLACK_NS = 60 * 10**9
_MAX_META_DEPTH = 32  # JSON nesting of the metadata (the writer's own is 3)
_MAX_NUMBER_CHARS = 40  # a JSON number literal longer than this is no counter
_EVENT_ALIGN = EVENT_DTYPE.itemsize  # events start at a multiple of 32
_U32 = struct.Struct("<I")
# Keys of the metadata block that the file format itself owns.
_RESERVED_META = ("modules", "node_names")
_CHUNK = 1 << 24  # bytes per crc32 / write step over the events block
_VERSION_END = 12  # the version is readable once this many bytes are there

STREAM_FORMAT_VERSION = 3
_STREAM_HEADER = struct.Struct("<8sII")
STREAM_HEADER_SIZE = _STREAM_HEADER.size
_BLOCK = struct.Struct("<IIQII")
_BLOCK_SIZE = _BLOCK.size
assert (STREAM_HEADER_SIZE, _BLOCK_SIZE) == (16, 24)
_BLOCK_CRC_AT = 20  # the last block header field: crc32 of the 20 bytes before it
BLOCK_META, BLOCK_CLOCK, BLOCK_NODE_NAMES, BLOCK_EVENTS, BLOCK_STATS, BLOCK_FOOTER = range(1, 7)
_BLOCK_NAMES = {BLOCK_META: "META", BLOCK_CLOCK: "CLOCK", BLOCK_NODE_NAMES: "NODE_NAMES",
                BLOCK_EVENTS: "EVENTS", BLOCK_STATS: "STATS", BLOCK_FOOTER: "FOOTER"}
_EVENTS_SUB = struct.Struct("<IIQ")  # thread index, tid, first event index
_CLOCK_BLOCK = struct.Struct("<Qqd")
_STATS_BLOCK = struct.Struct("<QQ")
READABLE_KINDS = VALID_KINDS  # (STEP included: _events.py)


class TraceFileError(HooktraceError):
    """A ``.htrace`` file is truncated, corrupt, or of an unsupported version.

    The message is one line: ``<file>: offset <n>: <what was expected vs found>``.
    """

    def __init__(self, path: str | os.PathLike[str], offset: int, message: str) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        super().__init__(f"{self.path}: offset {offset}: {message}")


@dataclass(frozen=True)
class TraceFileContents:
    """Everything a ``.htrace`` file holds, validated."""

    events: np.ndarray
    modules: list[tuple[str, str]]
    node_names: list[str]
    clock: Clock
    info: dict[str, Any]
    pid: int


def _events_offset(meta_len: int, strings_len: int) -> int:
    end = HEADER_SIZE + meta_len + strings_len
    return -(-end // _EVENT_ALIGN) * _EVENT_ALIGN


def _field_offset(name: str) -> int:
    """Byte offset of an event field (for error messages)."""
    assert EVENT_DTYPE.fields is not None
    return int(EVENT_DTYPE.fields[name][1])


def _crc_of(array: np.ndarray, crc: int = 0) -> int:
    flat = array.view(np.uint8).reshape(-1) if array.size else np.zeros(0, np.uint8)
    for start in range(0, flat.size, _CHUNK):
        crc = zlib.crc32(flat[start : start + _CHUNK].data, crc)
    return crc


class _StringTable:
    def __init__(self) -> None:
        self.strings: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"string table entries must be str, got {type(s).__name__}: {s!r}")
        idx = self._index.get(s)
        if idx is None:
            idx = self._index[s] = len(self.strings)
            self.strings.append(s)
        return idx

    def encode(self) -> bytes:
        parts = [_U32.pack(len(self.strings))]
        for s in self.strings:
            b = s.encode("utf-8")
            parts.append(_U32.pack(len(b)))
            parts.append(b)
        return b"".join(parts)


def write_trace(
    path: str | os.PathLike[str],
    events: np.ndarray,
    modules: Sequence[tuple[str, str]],
    node_names: Sequence[str],
    clock: Clock,
    info: Mapping[str, Any],
) -> None:
    """Write one run to ``path`` in the ``.htrace`` format.

    ``info`` is free-form JSON-serializable metadata; ``info["pid"]`` (a
    positive int) also goes into the header. The events array is streamed to
    the file as-is. A pid or clock conversion the reader would refuse is
    refused here (ValueError) rather than written.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> p = os.path.join(tempfile.mkdtemp(), "empty.htrace")
        >>> write_trace(p, np.zeros(0, EVENT_DTYPE), [], [], Clock(0, 0, 1.0), {"pid": 1})
        >>> os.path.getsize(p)
        128
    """
    if events.dtype != EVENT_DTYPE or events.ndim != 1:
        raise TypeError(f"events must be a 1-D array of EVENT_DTYPE, got {events.dtype} "
                        f"with shape {events.shape}")
    events = np.ascontiguousarray(events)
    clash = [k for k in _RESERVED_META if k in info]
    if clash:
        raise ValueError(f"info must not contain the reserved metadata keys {clash}")

    table = _StringTable()
    meta: dict[str, Any] = dict(info)
    meta["modules"] = [[table.add(name), table.add(type_name)] for name, type_name in modules]
    meta["node_names"] = [table.add(name) for name in node_names]
    meta_bytes = json.dumps(
        meta, ensure_ascii=False, separators=(",", ":"), default=_json_default
    ).encode("utf-8")
    strings_bytes = table.encode()
    events_off = _events_offset(len(meta_bytes), len(strings_bytes))
    padding = events_off - HEADER_SIZE - len(meta_bytes) - len(strings_bytes)

    pid = info.get("pid")
    if not (isinstance(pid, (int, np.integer)) and not isinstance(pid, bool)
            and 1 <= pid <= _MAX_PID):
        raise ValueError(f'info["pid"] must be an int in [1, {_MAX_PID}], got {pid!r:.60}')
    pid = int(pid)
    problem = _clock_problem(clock.ticks0, clock.unix_ns0, clock.ns_per_tick)
    if problem:
        raise ValueError(f"clock {clock}: {problem}")
    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        HEADER_SIZE,
        len(meta_bytes),
        len(strings_bytes),
        len(events),
        clock.ticks0,
        clock.unix_ns0,
        clock.ns_per_tick,
        zlib.crc32(strings_bytes, zlib.crc32(meta_bytes)),
        _crc_of(events),
        pid,
        0,
    )
    header = header[:_HEADER_CRC_AT] + _U32.pack(zlib.crc32(header[:_HEADER_CRC_AT]))
    # Through a temporary file renamed when complete: a failure or Ctrl-C never
    # leaves a truncated .htrace where a good one was (hooktrace._output).
    with open_output(path, gzip_by_name=False) as f:
        f.write(header)
        f.write(meta_bytes)
        f.write(strings_bytes)
        f.write(b"\x00" * padding)
        _write_array(f, events)  # type: ignore[arg-type]


def stream_header() -> bytes:
    """The 16 bytes a version 3 stream starts with."""
    return _STREAM_HEADER.pack(MAGIC, STREAM_FORMAT_VERSION, STREAM_HEADER_SIZE)


def stream_block(block_type: int, payload: bytes) -> bytes:
    """One framed version 3 block (the Python-written ones: META and FOOTER).

    Example:
        >>> len(stream_block(BLOCK_FOOTER, b"{}"))
        26
    """
    head = _BLOCK.pack(block_type, 0, len(payload), zlib.crc32(payload), 0)
    return head[:_BLOCK_CRC_AT] + _U32.pack(zlib.crc32(head[:_BLOCK_CRC_AT])) + payload


def encode_json(info: Mapping[str, Any]) -> bytes:
    """Metadata as the compact UTF-8 JSON both versions store (numpy scalars allowed)."""
    return json.dumps(
        info, ensure_ascii=False, separators=(",", ":"), default=_json_default
    ).encode("utf-8")


def _json_default(value: Any) -> Any:
    """numpy scalars and arrays, as the recorder's counters may be, become JSON numbers/lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"trace info value {value!r} of type {type(value).__name__} is not "
                    "JSON serializable")


def _write_array(f: BinaryIO, events: np.ndarray) -> None:
    flat = events.view(np.uint8).reshape(-1) if events.size else np.zeros(0, np.uint8)
    for start in range(0, flat.size, _CHUNK):
        f.write(flat[start : start + _CHUNK].data)


def read_trace(path: str | os.PathLike[str], *, mmap: bool = False) -> TraceFileContents:
    """Read and validate a ``.htrace`` file.

    Raises ``TraceFileError`` (one line naming the file, the byte offset or
    metadata key, and what was expected) for anything that is not an intact
    recording: an empty, truncated or corrupt file, another format version, a
    JSON/gzip file given by mistake, header, metadata or event values that no
    recorder writes.

    ``mmap=False`` (the default) reads the events into memory: the result stays
    valid whatever happens to the file afterwards. ``mmap=True`` maps them
    read-only instead, for files larger than memory; the trade-off is that the
    process then depends on the file: if it is truncated while mapped (rewritten
    by a recorder, a full disk, another ``save`` to the same path), touching
    the lost pages kills the process with SIGBUS, which Python cannot catch.
    Only map files that nothing will modify.

    Example:
        >>> read_trace("/nonexistent.htrace")
        Traceback (most recent call last):
        ...
        FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent.htrace'
    """
    name = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(HEADER_SIZE)
        _check_magic(name, head, size)
        (version,) = _U32.unpack_from(head, 8)
        if version == STREAM_FORMAT_VERSION:
            return _read_stream(name, f, size, head)
        if version != FORMAT_VERSION:
            age = "an older" if version < FORMAT_VERSION else "a newer"
            raise TraceFileError(
                name, 8,
                f"unsupported format version {version} (this hooktrace reads versions "
                f"{FORMAT_VERSION} and {STREAM_FORMAT_VERSION}; the file was written by {age} "
                "hooktrace)",
            )
        if len(head) < HEADER_SIZE:
            raise TraceFileError(
                name, len(head),
                f"truncated header: expected {HEADER_SIZE} bytes, file has {size}",
            )
        (
            _magic, version, header_size, meta_len, strings_len, n_events,
            ticks0, unix_ns0, ns_per_tick, crc_meta, crc_events, pid, crc_header,
        ) = _HEADER.unpack(head)
        if header_size != HEADER_SIZE:
            raise TraceFileError(
                name, 12, f"expected header size {HEADER_SIZE}, found {header_size}"
            )
        crc = zlib.crc32(head[:_HEADER_CRC_AT])
        if crc != crc_header:
            raise TraceFileError(
                name, _HEADER_CRC_AT,
                f"header checksum mismatch: header says {crc_header:#010x}, bytes "
                f"0-{_HEADER_CRC_AT - 1} hash to {crc:#010x} (file is corrupt)",
            )
        _check_header_values(name, ticks0, unix_ns0, ns_per_tick, pid)
        strings_off = HEADER_SIZE + meta_len
        events_off = _events_offset(meta_len, strings_len)
        end = events_off + n_events * EVENT_DTYPE.itemsize
        if size < end:
            if size < strings_off:
                where, what = HEADER_SIZE, f"metadata block of {meta_len} bytes"
            elif size < strings_off + strings_len:
                where, what = strings_off, f"string table of {strings_len} bytes"
            elif size < events_off:
                where, what = strings_off + strings_len, "padding before the events block"
            else:
                where, what = events_off, f"{n_events} events ({n_events * 32} bytes)"
            raise TraceFileError(
                name, where,
                f"truncated: expected {what}, file ends at {size} (expected {end} bytes)",
            )
        if size > end:
            raise TraceFileError(
                name, end, f"expected end of file, found {size - end} trailing bytes"
            )

        blocks = f.read(events_off - HEADER_SIZE)
        meta_bytes = blocks[:meta_len]
        strings_bytes = blocks[meta_len : meta_len + strings_len]
        crc = zlib.crc32(strings_bytes, zlib.crc32(meta_bytes))
        if crc != crc_meta:
            raise TraceFileError(
                name, HEADER_SIZE,
                f"metadata/string table checksum mismatch: header says {crc_meta:#010x}, "
                f"blocks hash to {crc:#010x} (file is corrupt)",
            )
        pad = blocks[meta_len + strings_len :]
        if pad.strip(b"\x00"):
            raise TraceFileError(
                name, strings_off + strings_len, "expected zero padding before the events block"
            )
        meta = _parse_meta(name, meta_bytes)
        strings = _parse_strings(name, strings_off, strings_bytes)

        events: np.ndarray
        if mmap and n_events:
            events = np.memmap(f, dtype=EVENT_DTYPE, mode="r", offset=events_off,
                               shape=(n_events,))
        else:
            f.seek(events_off)
            events = np.fromfile(f, dtype=EVENT_DTYPE, count=n_events)
            if len(events) != n_events:  # the file shrank under us
                raise TraceFileError(
                    name, events_off, f"truncated: expected {n_events} events, read {len(events)}"
                )
    crc = _crc_of(events)
    if crc != crc_events:
        raise TraceFileError(
            name, events_off,
            f"events checksum mismatch: header says {crc_events:#010x}, "
            f"events hash to {crc:#010x} (file is corrupt)",
        )
    modules = _resolve_modules(name, meta_bytes, meta.pop("modules", None), strings)
    node_names = _resolve_node_names(name, meta_bytes, meta.pop("node_names", None), strings)
    _check_info(name, meta_bytes, meta, pid)
    clock = Clock(ticks0, unix_ns0, ns_per_tick)
    interval = _recorded_interval(name, meta_bytes, meta, clock)
    _validate_events(name, lambda i: events_off + i * EVENT_DTYPE.itemsize, events,
                     len(modules), len(node_names), clock, interval)
    meta.setdefault("pid", pid)
    return TraceFileContents(
        events=events,
        modules=modules,
        node_names=node_names,
        clock=clock,
        info=meta,
        pid=pid,
    )


class _Cut(Exception):
    """Where a stream's readable part ends, and why."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(why)
        self.offset = offset
        self.why = why


def _read_stream(name: str, f: BinaryIO, size: int, head: bytes) -> TraceFileContents:
    """A version 3 stream: blocks up to the footer, or up to the first damaged one."""
    if len(head) < STREAM_HEADER_SIZE:
        raise TraceFileError(name, len(head), f"truncated header: expected {STREAM_HEADER_SIZE} "
                                              f"bytes, file has {size}")
    _magic, _version, header_size = _STREAM_HEADER.unpack_from(head)
    if header_size != STREAM_HEADER_SIZE:
        raise TraceFileError(name, 12, f"expected header size {STREAM_HEADER_SIZE}, found "
                                       f"{header_size}")
    # Events are read straight into one array, in file order; every block
    # header is 40 bytes or more, so this bounds their number. Pages never
    # written are never touched, so the slack costs address space only.
    buf = np.empty(max(0, (size - STREAM_HEADER_SIZE) // EVENT_DTYPE.itemsize), EVENT_DTYPE)
    n = 0
    runs: list[tuple[int, int, int, int]] = []  # (thread, start in buf, count, file offset)
    threads: dict[int, list[int]] = {}  # thread index -> [tid, events so far]
    meta: dict[str, Any] | None = None
    meta_at = footer_at = clock_at = 0
    meta_bytes = footer_bytes = b""
    footer: dict[str, Any] | None = None
    clock: Clock | None = None
    node_names: list[str] = []
    stats = (0, 0)
    cut: _Cut | None = None
    pos = STREAM_HEADER_SIZE
    f.seek(pos)
    while True:
        try:
            btype, length, payload, events = _next_block(name, f, pos, size, buf[n:])
        except _Cut as c:
            cut = c
            break
        at = pos + _BLOCK_SIZE  # the payload's offset
        what = _BLOCK_NAMES[btype]
        if meta is None and btype != BLOCK_META:
            raise TraceFileError(name, pos, f"expected the META block first, found {what}")
        if btype == BLOCK_META:
            if meta is not None:
                raise TraceFileError(name, pos, "expected one META block, found a second one")
            meta, meta_bytes, meta_at = _parse_meta(name, payload, at), payload, at
        elif btype == BLOCK_CLOCK:
            if length != _CLOCK_BLOCK.size:
                raise TraceFileError(name, pos + 8, f"CLOCK block: expected {_CLOCK_BLOCK.size} "
                                                    f"payload bytes, found {length}")
            ticks0, unix_ns0, ns_per_tick = _CLOCK_BLOCK.unpack(payload)
            problem = _clock_problem(ticks0, unix_ns0, ns_per_tick)
            if problem:
                field = 16 if "ns_per_tick" in problem else 8 if "unix_ns0" in problem else 0
                raise TraceFileError(name, at + field, f"clock conversion: {problem}")
            clock, clock_at = Clock(ticks0, unix_ns0, ns_per_tick), at
        elif btype == BLOCK_NODE_NAMES:
            if length < 4:
                raise TraceFileError(name, pos + 8, f"NODE_NAMES block: expected at least 4 "
                                                    f"payload bytes, found {length}")
            (first,) = _U32.unpack_from(payload)
            if first != len(node_names):
                raise TraceFileError(name, at, f"NODE_NAMES block: expected names from index "
                                               f"{len(node_names)} on, found {first}")
            node_names += _parse_strings(name, at + 4, payload[4:])
        elif btype == BLOCK_EVENTS:
            assert events is not None
            thread, tid, first = _EVENTS_SUB.unpack(payload)
            if clock is None:
                raise TraceFileError(name, pos, "expected a CLOCK block before the first EVENTS")
            known = threads.setdefault(thread, [tid, 0])
            if known[0] != tid:
                raise TraceFileError(name, at + 4, f"EVENTS block: thread {thread} was tid "
                                                   f"{known[0]} before, found tid {tid}")
            if first != known[1]:
                raise TraceFileError(name, at + 8, f"EVENTS block: expected thread {thread}'s "
                                                   f"event {known[1]} next, found {first}")
            other = np.flatnonzero(events["tid"] != tid)
            if other.size:
                i = int(other[0])
                raise TraceFileError(
                    name, at + _EVENTS_SUB.size + i * EVENT_DTYPE.itemsize + _field_offset("tid"),
                    f"EVENTS block: expected every event on tid {tid}, event {i} is on "
                    f"{int(events['tid'][i])}")
            runs.append((thread, n, len(events), at + _EVENTS_SUB.size))
            known[1] += len(events)
            n += len(events)
        elif btype == BLOCK_STATS:
            if length != _STATS_BLOCK.size:
                raise TraceFileError(name, pos + 8, f"STATS block: expected {_STATS_BLOCK.size} "
                                                    f"payload bytes, found {length}")
            stats = _STATS_BLOCK.unpack(payload)
            if max(stats) > 2**63 - 1:
                raise TraceFileError(name, at, f"STATS block: expected counts below 2**63, "
                                               f"found {stats}")
        else:  # BLOCK_FOOTER
            footer, footer_bytes, footer_at = _parse_meta(name, payload, at), payload, at
            end = at + length
            if size > end:
                raise TraceFileError(name, end, f"expected end of file after the FOOTER block, "
                                                f"found {size - end} trailing bytes")
            break
        pos = at + length
    if meta is None:
        assert cut is not None
        raise TraceFileError(name, cut.offset, f"truncated: expected a complete META block, "
                                               f"found {cut.why}")

    modules = _stream_modules(name, meta_bytes, meta_at, meta.pop("modules", None))
    if "node_names" in meta:
        _meta_error(name, meta_bytes, "node_names", "expected node names in NODE_NAMES blocks, "
                                                   "not in META", meta_at)
    pid = meta.get("pid")
    if not (isinstance(pid, int) and _is_int(pid) and 1 <= pid <= _MAX_PID):
        _meta_error(name, meta_bytes, "pid", f"expected an int in [1, {_MAX_PID}], found "
                                             f"{pid!r:.60}", meta_at)
    _check_info(name, meta_bytes, meta, pid, meta_at)
    info = dict(meta)
    if footer is not None:
        written = footer.pop("events", None)
        if written != n:
            _meta_error(name, footer_bytes, "events", f"expected the {n} events the EVENTS "
                                                      f"blocks hold, found {written!r:.40}",
                        footer_at)
        _check_info(name, footer_bytes, footer, pid, footer_at)
        info.update(footer)
    else:
        assert cut is not None
        info["dropped_events"], info["overwritten_events"] = stats
        info["cut"] = (f"{name}: recording cut at byte {cut.offset} ({cut.why}); {n:,} events "
                       "before it loaded")
    if clock is None:  # no events either
        clock = Clock(0, int(info.get("start_unix_ns", 0)), 1.0)
    interval = None
    if footer is not None:
        interval = _recorded_interval(name, footer_bytes, info, clock, footer_at, clock_at + 8)

    # Thread by thread, as a recording in memory is (Session::copy_events).
    order = sorted(range(len(runs)), key=lambda r: runs[r][0])
    if order == list(range(len(runs))):
        events = buf[:n]
    else:
        events = np.concatenate([buf[runs[r][1] : runs[r][1] + runs[r][2]] for r in order])
    starts = np.cumsum([0] + [runs[r][2] for r in order])
    offsets = [runs[r][3] for r in order]

    def offset_of(i: int) -> int:
        k = int(np.searchsorted(starts, i, side="right")) - 1
        return offsets[k] + (i - int(starts[k])) * EVENT_DTYPE.itemsize

    _validate_events(name, offset_of, events, len(modules), len(node_names), clock, interval)
    return TraceFileContents(events=events, modules=modules, node_names=node_names, clock=clock,
                             info=info, pid=pid)


def _next_block(name: str, f: BinaryIO, pos: int, size: int, room: np.ndarray,
                ) -> tuple[int, int, bytes, np.ndarray | None]:
    """The intact block at ``pos``: (type, payload length, payload, events).

    An EVENTS block's events are read into ``room`` (returned as a view of it) and
    its payload holds the 16-byte sub-header only. Raises _Cut where the readable
    part ends: a block that is truncated or fails a checksum."""
    if pos == size:
        raise _Cut(pos, "no footer: the process did not finish")
    head = f.read(_BLOCK_SIZE)
    if len(head) < _BLOCK_SIZE:
        raise _Cut(pos, f"a partly written block header, {len(head)} of {_BLOCK_SIZE} bytes: "
                        "the process did not finish")
    btype, reserved, length, crc_payload, crc_head = _BLOCK.unpack(head)
    if zlib.crc32(head[:_BLOCK_CRC_AT]) != crc_head:
        raise _Cut(pos, "a block header that fails its checksum")
    if length > size - pos - _BLOCK_SIZE:
        raise _Cut(pos, f"a partly written block, {size - pos - _BLOCK_SIZE} of {length} payload "
                        "bytes: the process did not finish")
    # From here the header is intact: what it says is refused, not cut, when wrong.
    if reserved != 0:
        raise TraceFileError(name, pos + 4, f"expected a reserved 0 in the block header, "
                                            f"found {reserved}")
    if btype not in _BLOCK_NAMES:
        raise TraceFileError(name, pos, f"unknown block type {btype} (expected 1-6; the file "
                                        "was written by a newer hooktrace?)")
    events: np.ndarray | None = None
    if btype == BLOCK_EVENTS:
        sub = _EVENTS_SUB.size
        if length < sub or (length - sub) % EVENT_DTYPE.itemsize:
            raise TraceFileError(name, pos + 8, f"EVENTS block: expected {sub} + a multiple of "
                                                f"{EVENT_DTYPE.itemsize} payload bytes, found "
                                                f"{length}")
        payload = f.read(sub)
        events = room[: (length - sub) // EVENT_DTYPE.itemsize]
        got = f.readinto(memoryview(events.view(np.uint8)))  # type: ignore[attr-defined,arg-type]
        if len(payload) + (got or 0) != length:  # the file shrank under us
            raise _Cut(pos, "a partly written block: the file shrank while read")
        crc = _crc_of(events, zlib.crc32(payload))
    else:
        payload = f.read(length)
        if len(payload) != length:
            raise _Cut(pos, "a partly written block: the file shrank while read")
        crc = zlib.crc32(payload)
    if crc != crc_payload:
        raise _Cut(pos, f"a block ({_BLOCK_NAMES[btype]}) whose payload fails its checksum")
    return btype, length, payload, events


def _stream_modules(name: str, meta_bytes: bytes, base: int, raw: Any) -> list[tuple[str, str]]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        _meta_error(name, meta_bytes, "modules",
                    f"expected a list of [name, class name], found {raw!r:.60}", base)
    for i, entry in enumerate(raw):
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(x, str) for x in entry)):
            _meta_error(name, meta_bytes, "modules",
                        f"[{i}]: expected [name, class name], found {entry!r:.60}", base)
    return [(entry[0], entry[1]) for entry in raw]


def _check_magic(name: str, head: bytes, size: int) -> None:
    """Refuse what is not a .htrace, saying what it looks like when that is clear."""
    if size == 0:
        raise TraceFileError(
            name, 0, f"empty file (expected an {HEADER_SIZE}-byte hooktrace header)"
        )
    if head[: len(MAGIC)] != MAGIC[: len(head)]:
        expected = f"expected magic {MAGIC!r}, found {head[: len(MAGIC)]!r}"
        if head[:2] == b"\x1f\x8b":
            what = "gzip-compressed (a .json.gz Chrome trace?)"
        elif head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"["):
            what = "JSON (a Chrome trace?)"
        else:
            what = "not a hooktrace file"
            raise TraceFileError(name, 0, f"{expected} ({what})")
        raise TraceFileError(name, 0, f"file is {what}, not a .htrace file ({expected})")
    if len(head) < _VERSION_END:
        raise TraceFileError(
            name, len(head),
            f"truncated header: expected {HEADER_SIZE} bytes, file has {size}",
        )


def _clock_problem(ticks0: int, unix_ns0: int, ns_per_tick: float) -> str | None:
    """What is wrong with a clock conversion, or None (shared by writer and reader)."""
    lo, hi = NS_PER_TICK_RANGE
    if not (isinstance(ns_per_tick, numbers.Real) and not isinstance(ns_per_tick, bool)
            and math.isfinite(ns_per_tick) and lo <= ns_per_tick <= hi):
        return f"expected ns_per_tick, a finite float in [{lo:g}, {hi:g}], found {ns_per_tick!r}"
    if not (_is_int(unix_ns0) and 0 <= unix_ns0 < _MAX_UNIX_NS):
        return f"expected unix_ns0 in [0, 2**62), found {unix_ns0!r}"
    if not (_is_int(ticks0) and 0 <= ticks0 < 2**64):
        return f"expected ticks0 in [0, 2**64), found {ticks0!r}"
    return None


def _check_header_values(name: str, ticks0: int, unix_ns0: int, ns_per_tick: float,
                         pid: int) -> None:
    problem = _clock_problem(ticks0, unix_ns0, ns_per_tick)
    if problem:
        offset = 56 if "ns_per_tick" in problem else 48 if "unix_ns0" in problem else 40
        raise TraceFileError(name, offset, f"clock conversion: {problem}")
    if not 1 <= pid <= _MAX_PID:
        raise TraceFileError(name, 72, f"expected a pid in [1, {_MAX_PID}], found {pid}")


def _is_int(value: Any) -> bool:
    """An integer, numpy's included (a Clock may hold them), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class _BadNumber(Exception):
    """Raised by the JSON number hooks; turned into a TraceFileError with its offset."""

    def __init__(self, literal: str, why: str) -> None:
        super().__init__(literal)
        self.literal = literal
        self.why = why


def _parse_int(literal: str) -> int:
    if len(literal) > _MAX_NUMBER_CHARS:  # int() of 5000 digits raises ValueError
        raise _BadNumber(literal, f"an integer of at most {_MAX_NUMBER_CHARS} characters")
    return int(literal)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if len(literal) > _MAX_NUMBER_CHARS or not math.isfinite(value):
        raise _BadNumber(literal, "a finite number")
    return value


def _parse_constant(literal: str) -> NoReturn:
    raise _BadNumber(literal, "a finite number (NaN and Infinity are not JSON)")


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _nesting_depth(meta_bytes: bytes) -> tuple[int, int]:
    """Deepest [ / { nesting outside strings, and the byte offset where it is reached."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b'""', meta_bytes), np.uint8)
    step = (skeleton == ord("[")).astype(np.int32) + (skeleton == ord("{"))
    step -= (skeleton == ord("]")).astype(np.int32) + (skeleton == ord("}"))
    if not step.size:
        return 0, 0
    depth = np.cumsum(step)
    at = int(np.argmax(depth))
    return int(depth[at]), at


def _parse_meta(name: str, meta_bytes: bytes, base: int = HEADER_SIZE) -> dict[str, Any]:
    """The JSON object in ``meta_bytes``, which starts at file offset ``base``."""
    try:
        text = meta_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFileError(name, base + e.start, "metadata is not valid UTF-8") from None
    depth, at = _nesting_depth(meta_bytes)
    if depth > _MAX_META_DEPTH:
        # json.loads would recurse once per level (RecursionError near 1000)
        raise TraceFileError(
            name, base,
            f"metadata nests {depth} levels deep (expected at most {_MAX_META_DEPTH})",
        )
    try:
        meta = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant)
    except json.JSONDecodeError as e:
        offset = base + len(text[: e.pos].encode("utf-8"))
        raise TraceFileError(name, offset, f"metadata is not valid JSON: {e.msg}") from None
    except _BadNumber as e:
        at = max(0, meta_bytes.find(e.literal.encode()))
        raise TraceFileError(
            name, base + at,
            f"metadata: expected {e.why}, found the number literal {e.literal!r:.60}",
        ) from None
    except RecursionError:  # not reached after the depth check; kept as a guard
        raise TraceFileError(name, base, "metadata nests too deep") from None
    if not isinstance(meta, dict):
        raise TraceFileError(
            name, base, f"expected a JSON object as metadata, found {type(meta).__name__}"
        )
    bad = _unencodable(meta, "")
    if bad is not None:
        # "\ud800" escapes decode to lone surrogates, which no output can encode
        raise TraceFileError(
            name, base,
            f"metadata {bad}: expected text, found a lone UTF-16 surrogate escape",
        )
    return meta


def _unencodable(value: Any, where: str) -> str | None:
    """The path of the first string in ``value`` that is not encodable as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "(top level)"
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _unencodable(k, f"{where} key {k!r:.40}") or _unencodable(
                v, f"{where}[{k!r:.40}]"
            )
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _unencodable(v, f"{where}[{i}]")
            if found:
                return found
    return None


def _key_offset(meta_bytes: bytes, key: str, base: int = HEADER_SIZE) -> int:
    """Offset of a top-level metadata key in the file (for messages), or the block's."""
    at = meta_bytes.find(json.dumps(key).encode("utf-8"))
    return base + max(at, 0)


def _meta_error(name: str, meta_bytes: bytes, key: str, message: str,
                base: int = HEADER_SIZE) -> NoReturn:
    raise TraceFileError(name, _key_offset(meta_bytes, key, base), f'metadata "{key}": {message}')


def _int_in(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if _is_int(value) and lo <= value <= hi else f"an int in [{lo}, {hi}]"
    return check


def _of_type(kind: type, label: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, kind) else label
    return check


def _thread_names(value: Any) -> str | None:
    expected = "an object mapping thread ids (decimal strings) to names"
    if not isinstance(value, dict):
        return expected
    for k, v in value.items():
        if not (k.isascii() and k.isdigit() and len(k) <= 10 and isinstance(v, str)):
            return f"{expected}; entry {k!r:.40}: {v!r:.40} is not"
    return None


def _clock_sync(value: Any) -> str | None:
    expected = ("a list of clock measurements {offset_ns, uncertainty_ns >= 0, at_unix_ns, "
                "rounds, rtt_min_ns, cost_ns: ints}")
    if not isinstance(value, list):
        return expected
    for m in value:
        if not (isinstance(m, dict) and all(_is_int(m.get(f)) for f in _CLOCK_SYNC_FIELDS)
                and m["uncertainty_ns"] >= 0 and abs(m["offset_ns"]) < _MAX_UNIX_NS):
            return f"{expected}; entry {m!r:.60} is not"
    return None


_CLOCK_SYNC_FIELDS = ("offset_ns", "uncertainty_ns", "at_unix_ns", "rounds", "rtt_min_ns",
                      "cost_ns")
_MAX_RANK = 2**31 - 1

# Metadata keys the reader and its consumers (summary, Chrome export, merge) use,
# each with what it must be when present; other keys are free-form.
def _memory_info(value: Any) -> str | None:
    """trace(memory=True)'s block: {"devices": ["cpu" | "cuda:N", ...], ...}."""
    devices = value.get("devices") if isinstance(value, dict) else None
    if not isinstance(devices, list) or not all(
            isinstance(d, str) and (d == "cpu" or re.fullmatch(r"cuda:\d{1,3}", d))
            for d in devices):
        return 'an object with "devices": a list of "cpu" or "cuda:N"'
    return None


_INFO_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "pid": _int_in(1, _MAX_PID),
    "hostname": _of_type(str, "a string"),
    "torch_version": _of_type(str, "a string"),
    "hooktrace_version": _of_type(str, "a string"),
    "mode": _of_type(str, "a string"),
    "policy": _of_type(str, "a string"),
    "backward": _of_type(bool, "true or false"),
    "emit_profiler": _of_type(bool, "true or false"),
    "capacity": _int_in(0, 2**63 - 1),
    "dropped_events": _int_in(0, 2**63 - 1),
    "overwritten_events": _int_in(0, 2**63 - 1),
    "start_unix_ns": _int_in(0, _MAX_UNIX_NS - 1),
    "stop_unix_ns": _int_in(0, _MAX_UNIX_NS - 1),
    "thread_names": _thread_names,
    "cut": _of_type(str, "a string"),
    # many ranks (issue #11, hooktrace/distributed.py)
    "rank": _int_in(0, _MAX_RANK - 1),
    "world_size": _int_in(1, _MAX_RANK),
    "local_rank": _int_in(0, _MAX_RANK - 1),
    "local_world_size": _int_in(1, _MAX_RANK),
    "backend": _of_type(str, "a string"),
    "rank_source": _of_type(str, "a string"),
    "clock_offset_ns": _int_in(-_MAX_UNIX_NS, _MAX_UNIX_NS),
    "clock_offset_uncertainty_ns": _int_in(0, _MAX_UNIX_NS),
    "clock_offset_injected_ns": _int_in(-_MAX_UNIX_NS, _MAX_UNIX_NS),
    "clock_sync": _clock_sync,
    "memory": _memory_info,
}


def _check_info(name: str, meta_bytes: bytes, meta: dict[str, Any], pid: int,
                base: int = HEADER_SIZE) -> None:
    for key, check in _INFO_CHECKS.items():
        if key not in meta:
            continue
        expected = check(meta[key])
        if expected:
            _meta_error(name, meta_bytes, key, f"expected {expected}, found {meta[key]!r:.60}",
                        base)
    if "rank" in meta and "world_size" in meta and meta["rank"] >= meta["world_size"]:
        _meta_error(name, meta_bytes, "rank", f"expected a rank below world_size "
                                              f"{meta['world_size']}, found {meta['rank']}", base)
    if "pid" in meta and meta["pid"] != pid:
        _meta_error(name, meta_bytes, "pid", f"expected the header's pid {pid}, found "
                                             f"{meta['pid']}", base)


def _recorded_interval(name: str, meta_bytes: bytes, meta: dict[str, Any], clock: Clock,
                       base: int = HEADER_SIZE, clock_offset: int = 48,
                       ) -> tuple[int, int] | None:
    """[start, stop] widened by INTERVAL_SLACK_NS when the run recorded both, else None.

    ``meta_bytes`` (at file offset ``base``) holds stop_unix_ns; ``clock_offset`` is
    where the clock's unix_ns0 lies, for messages."""
    if "start_unix_ns" not in meta or "stop_unix_ns" not in meta:
        return None
    start, stop = meta["start_unix_ns"], meta["stop_unix_ns"]
    if stop < start:
        _meta_error(name, meta_bytes, "stop_unix_ns",
                    f"expected a time at or after start_unix_ns {start}, found {stop}", base)
    lo, hi = start - INTERVAL_SLACK_NS, stop + INTERVAL_SLACK_NS
    if not lo <= clock.unix_ns0 <= hi:
        # the conversion is measured at the session's start, inside the run
        raise TraceFileError(
            name, clock_offset, f"clock conversion: expected unix_ns0 within the recorded interval "
                      f"[{start}, {stop}] (+-{INTERVAL_SLACK_NS} ns), found {clock.unix_ns0}",
        )
    return lo, hi


def _parse_strings(name: str, base: int, data: bytes) -> list[str]:
    if len(data) < 4:
        raise TraceFileError(
            name, base, f"expected a string table of at least 4 bytes, found {len(data)}"
        )
    (count,) = _U32.unpack_from(data, 0)
    pos = 4
    strings: list[str] = []
    for i in range(count):
        if pos + 4 > len(data):
            raise TraceFileError(
                name, base + pos,
                f"string table ends inside the length of string {i} of {count}",
            )
        (length,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise TraceFileError(
                name, base + pos,
                f"string {i} of {length} bytes runs past the string table's end "
                f"(at offset {base + len(data)})",
            )
        try:
            strings.append(data[pos : pos + length].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise TraceFileError(name, base + pos + e.start, f"string {i} is not valid UTF-8") \
                from None
        pos += length
    if pos != len(data):
        raise TraceFileError(
            name, base + pos,
            f"expected the string table to end after {count} strings, found "
            f"{len(data) - pos} extra bytes",
        )
    return strings


def _string_at(name: str, meta_bytes: bytes, strings: list[str], idx: Any, key: str,
               what: str) -> str:
    if not _is_int(idx) or not 0 <= idx < len(strings):
        _meta_error(
            name, meta_bytes, key,
            f"{what}: string index {idx!r:.40} out of range "
            f"(the string table has {len(strings)} strings)",
        )
    return strings[idx]


def _resolve_modules(name: str, meta_bytes: bytes, raw: Any,
                     strings: list[str]) -> list[tuple[str, str]]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        _meta_error(name, meta_bytes, "modules",
                    f"expected a list of [name_idx, type_idx], found {raw!r:.60}")
    modules: list[tuple[str, str]] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, list) or len(entry) != 2:
            _meta_error(name, meta_bytes, "modules",
                        f"[{i}]: expected [name_idx, type_idx], found {entry!r:.60}")
        modules.append((
            _string_at(name, meta_bytes, strings, entry[0], "modules", f"[{i}][0]"),
            _string_at(name, meta_bytes, strings, entry[1], "modules", f"[{i}][1]"),
        ))
    return modules


def _resolve_node_names(name: str, meta_bytes: bytes, raw: Any, strings: list[str]) -> list[str]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        _meta_error(name, meta_bytes, "node_names",
                    f"expected a list of string indices, found {raw!r:.60}")
    return [_string_at(name, meta_bytes, strings, idx, "node_names", f"[{i}]")
            for i, idx in enumerate(raw)]


def _validate_events(
    name: str, offset_of: Callable[[int], int], events: np.ndarray, n_modules: int,
    n_nodes: int, clock: Clock, interval: tuple[int, int] | None,
) -> None:
    """Vectorized checks that every event can be interpreted (no per-event Python).

    ``offset_of(i)`` is the file offset of event i (for messages)."""
    if not len(events):
        return

    def fail(bad: np.ndarray, field: str, message: str) -> NoReturn:
        i = int(bad[0])
        raise TraceFileError(
            name, offset_of(i) + _field_offset(field),
            f"event {i}: {message.format(i=i)} ({bad.size} bad events in all)",
        )

    kind = np.ascontiguousarray(events["kind"])
    valid = np.zeros(256, dtype=bool)
    valid[list(READABLE_KINDS)] = True
    bad = np.flatnonzero(~valid[kind])
    if bad.size:
        fail(bad, "kind", f"expected kind in {list(READABLE_KINDS)}, found {int(kind[bad[0]])}")
    ids = events["id"]
    is_forward = (kind == ENTER) | (kind == EXIT)
    bad = np.flatnonzero(is_forward & (ids >= n_modules))
    if bad.size:
        fail(bad, "id", f"module id {int(ids[bad[0]])} out of range "
                        f"(the module table has {n_modules} modules)")
    # NODE_END's id is the graph task id (csrc/backward.h), not a name
    bad = np.flatnonzero((kind == NODE_BEGIN) & (ids >= n_nodes))
    if bad.size:
        fail(bad, "id", f"node name id {int(ids[bad[0]])} out of range "
                        f"(the node name table has {n_nodes} names)")
    bad = np.flatnonzero((kind == STEP) & (ids != 0))
    if bad.size:
        fail(bad, "id", f"expected id 0 on a step mark, found {int(ids[bad[0]])}")
    # memory samples: bytes now (seq) and the peak (id | rf_tid << 32) are int64 >= 0
    mem = np.flatnonzero((kind == MEM_CPU) | (kind == MEM_CUDA))
    if mem.size:
        bad = mem[(events["seq"][mem] >> np.uint64(62)) != 0]
        if bad.size:
            fail(bad, "seq", f"expected a memory sample's bytes below 2**62, found "
                             f"{int(events['seq'][bad[0]])}")
        bad = mem[(events["rf_tid"][mem] >> np.uint32(30)) != 0]
        if bad.size:
            fail(bad, "rf_tid", "expected a memory sample's peak below 2**62, found high "
                                f"bits {int(events['rf_tid'][bad[0]])}")
    # The recorder sets FLAG_ERROR on EXITs only and never writes the padding.
    # (Each check scans the nonzero/too-large values only: a load is I/O bound.)
    flagged = np.flatnonzero(events["flags"])
    flags = events["flags"][flagged]
    bad = flagged[(flags != FLAG_ERROR) | (kind[flagged] != EXIT)]
    if bad.size:
        fail(bad, "flags", f"expected flags 0 (or {FLAG_ERROR} on an EXIT), found "
                           f"{int(events['flags'][bad[0]])} on kind {int(kind[bad[0]])}")
    pad = events["pad"]
    if pad.any():
        fail(np.flatnonzero(pad), "pad", "expected zero padding")
    tid = events["tid"]
    if int(tid.max()) > _MAX_TID:
        bad = np.flatnonzero(tid > _MAX_TID)
        fail(bad, "tid", f"expected a thread id of at most {_MAX_TID}, found {int(tid[bad[0]])}")
    _validate_times(events, clock, interval, fail)


def _validate_times(events: np.ndarray, clock: Clock, interval: tuple[int, int] | None,
                    fail: Callable[[np.ndarray, str, str], NoReturn]) -> None:
    """Timestamps convert without overflow, stay in the run, never go back on a thread."""
    # Same signed tick delta as Clock.to_unix_ns, converted in float first so that
    # a wild tick count is caught before an int64 conversion could wrap it.
    delta = (np.ascontiguousarray(events["t"]) - np.uint64(clock.ticks0)).view(np.int64)
    approx = float(clock.unix_ns0) + delta * clock.ns_per_tick
    lo, hi = interval if interval is not None else (0, _MAX_UNIX_NS)
    # float rounding is far below 1 us; only times that close to a bound need the
    # exact int64 conversion to decide
    outside = ~((approx >= lo + 1e3) & (approx <= hi - 1e3))
    near = np.flatnonzero(outside & (approx >= lo - 1e3) & (approx <= hi + 1e3))
    if near.size:
        exact = clock.to_unix_ns(events["t"][near])
        outside[near] = (exact < lo) | (exact > hi)
    bad = np.flatnonzero(outside)
    if bad.size:
        where = ("the recorded interval (start_unix_ns/stop_unix_ns +- "
                 f"{INTERVAL_SLACK_NS} ns)" if interval is not None else "[0, 2**62)")
        i = int(bad[0])
        found = f"{approx[i]:.0f}" if math.isfinite(approx[i]) else "overflow"
        fail(bad, "t", f"expected a time within {where}: [{lo}, {hi}] Unix ns, "
                       f"found {found}")
    # Per thread, ticks never decrease (then neither do the converted times). A
    # thread's events come in runs (the recorder copies per-thread chunks): check
    # inside each run, then from each run to the thread's next one, in O(n).
    tid = np.ascontiguousarray(events["tid"])
    same = tid[1:] == tid[:-1]
    back = list(np.flatnonzero(same & (delta[1:] < delta[:-1])) + 1)
    starts = np.concatenate([[0], np.flatnonzero(~same) + 1])
    if len(starts) > 1:
        ends = np.append(starts[1:], len(tid)) - 1
        by_thread = np.argsort(tid[starts], kind="stable")  # runs of a thread, in order
        prev, nxt = by_thread[:-1], by_thread[1:]
        joins = (tid[starts[prev]] == tid[starts[nxt]]) & (delta[ends[prev]] > delta[starts[nxt]])
        back += list(starts[nxt[joins]])
    if back:
        later = np.sort(np.array(back, dtype=np.int64))
        i = int(later[0])
        earlier = np.flatnonzero((tid[:i] == tid[i]) & (delta[:i] > delta[i]))[0]
        fail(later, "t", f"time goes back on thread {int(tid[i])}: {approx[i]:.0f} ns after "
                         f"{approx[earlier]:.0f} ns at event {int(earlier)} (expected "
                         "non-decreasing times per thread)")
