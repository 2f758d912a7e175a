"""What every ``.htrace`` version shares: the format's constants, limits and byte
layouts (``HEADER``, ``BLOCK``, ...), its error, the metadata block (JSON) and the
string table. The checks a reader runs on what it reads are
:mod:`hooktrace.format.validate`; the two versions are :mod:`hooktrace.format.v2`
and :mod:`hooktrace.format.stream`.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from hooktrace.errors import HooktraceError
from hooktrace._events import EVENT_DTYPE, VALID_KINDS, Clock


MAGIC = b"HTRACE\x00\x00"
FORMAT_VERSION = 2
HEADER = struct.Struct("<8sIIQQQQqdIIII")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 80
HEADER_CRC_AT = 76  # the last header field: crc32 of the 76 bytes before it
# A recorder's clock conversion: rdtsc ticks are ~0.2-1 ns, steady-clock ticks 1 ns.
# Far outside this range every duration would be rescaled into nonsense.
NS_PER_TICK_RANGE = (1e-3, 1e3)
MAX_PID = 2**31 - 1  # pid_t is a positive int32
MAX_UNIX_NS = 2**62  # year 2116; keeps every sum below int64 overflow
# Thread ids are gettid() values, below Linux's PID_MAX_LIMIT (2**22): larger ones
# are not a recording's.
MAX_TID = 2**22
MAX_STEP = 2**62  # a step number (from 0 up) beyond this is no count of steps
# Events may lie this far outside [start_unix_ns, stop_unix_ns] (the wall clock
# can be stepped during a run); further out a timestamp cannot be right.
INTERVAL_SLACK_NS = 60 * 10**9
_MAX_META_DEPTH = 32  # JSON nesting of the metadata (the writer's own is 3)
_MAX_NUMBER_CHARS = 40  # a JSON number literal longer than this is no counter
_EVENT_ALIGN = EVENT_DTYPE.itemsize  # events start at a multiple of 32
U32 = struct.Struct("<I")
# Keys of the metadata block that the file format itself owns.
RESERVED_META = ("modules", "node_names")
CHUNK = 1 << 24  # bytes per crc32 / write step over the events block
VERSION_END = 12  # the version is readable once this many bytes are there

STREAM_FORMAT_VERSION = 3
STREAM_HEADER = struct.Struct("<8sII")
STREAM_HEADER_SIZE = STREAM_HEADER.size
BLOCK = struct.Struct("<IIQII")
BLOCK_SIZE = BLOCK.size
assert (STREAM_HEADER_SIZE, BLOCK_SIZE) == (16, 24)
BLOCK_CRC_AT = 20  # the last block header field: crc32 of the 20 bytes before it
(BLOCK_META, BLOCK_CLOCK, BLOCK_NODE_NAMES, BLOCK_EVENTS, BLOCK_STATS, BLOCK_FOOTER,
 BLOCK_MODULES) = range(1, 8)
BLOCK_NAMES = {BLOCK_META: "META", BLOCK_CLOCK: "CLOCK", BLOCK_NODE_NAMES: "NODE_NAMES",
                BLOCK_EVENTS: "EVENTS", BLOCK_STATS: "STATS", BLOCK_FOOTER: "FOOTER",
                BLOCK_MODULES: "MODULES"}
EVENTS_SUB = struct.Struct("<IIQ")  # thread index, tid, first event index
CLOCK_BLOCK = struct.Struct("<Qqd")
STATS_BLOCK = struct.Struct("<QQ")
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


def events_offset(meta_len: int, strings_len: int) -> int:
    end = HEADER_SIZE + meta_len + strings_len
    return -(-end // _EVENT_ALIGN) * _EVENT_ALIGN


def field_offset(name: str) -> int:
    """Byte offset of an event field (for error messages)."""
    assert EVENT_DTYPE.fields is not None
    return int(EVENT_DTYPE.fields[name][1])


def chunks(array: np.ndarray) -> Iterator[memoryview]:
    """The array's bytes, CHUNK at a time (what crc32 and the writer step over)."""
    flat = array.view(np.uint8).reshape(-1) if array.size else np.zeros(0, np.uint8)
    for start in range(0, flat.size, CHUNK):
        yield flat[start : start + CHUNK].data


def crc_of(array: np.ndarray, crc: int = 0) -> int:
    for chunk in chunks(array):
        crc = zlib.crc32(chunk, crc)
    return crc


class StringTable:
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
        encoded = [s.encode("utf-8") for s in self.strings]
        return U32.pack(len(encoded)) + b"".join(U32.pack(len(b)) + b for b in encoded)


def encode_json(info: Mapping[str, Any]) -> bytes:
    """Metadata as the compact UTF-8 JSON both versions store (numpy scalars allowed)."""
    return json.dumps(
        info, ensure_ascii=False, separators=(",", ":"), default=json_default
    ).encode("utf-8")


def json_default(value: Any) -> Any:
    """numpy scalars and arrays, as the recorder's counters may be, become JSON numbers/lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"trace info value {value!r} of type {type(value).__name__} is not "
                    "JSON serializable")


def is_int(value: Any) -> bool:
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


def parse_meta(name: str, meta_bytes: bytes, base: int = HEADER_SIZE) -> dict[str, Any]:
    """The JSON object in ``meta_bytes``, which starts at file offset ``base``."""
    try:
        text = meta_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFileError(name, base + e.start, "metadata is not valid UTF-8") from None
    depth, at = _nesting_depth(meta_bytes)
    if depth > _MAX_META_DEPTH:
        # json.loads would recurse once per level (RecursionError near 1000)
        raise TraceFileError(
            name, base, f"metadata nests {depth} levels deep (expected at most {_MAX_META_DEPTH})")
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
            f"metadata: expected {e.why}, found the number literal {e.literal!r:.60}") from None
    except RecursionError:  # not reached after the depth check; kept as a guard
        raise TraceFileError(name, base, "metadata nests too deep") from None
    if not isinstance(meta, dict):
        raise TraceFileError(
            name, base, f"expected a JSON object as metadata, found {type(meta).__name__}")
    bad = _unencodable(meta, "")
    if bad is not None:
        # "\ud800" escapes decode to lone surrogates, which no output can encode
        raise TraceFileError(
            name, base, f"metadata {bad}: expected text, found a lone UTF-16 surrogate escape")
    return meta


def _unencodable(value: Any, where: str) -> str | None:
    """The path of the first string in ``value`` that is not encodable as UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "(top level)"
    elif isinstance(value, dict):  # (the first found: the generators stop there)
        return next(filter(None, (_unencodable(k, f"{where} key {k!r:.40}")
                                  or _unencodable(v, f"{where}[{k!r:.40}]")
                                  for k, v in value.items())), None)
    elif isinstance(value, list):
        return next(filter(None, (_unencodable(v, f"{where}[{i}]")
                                  for i, v in enumerate(value))), None)
    return None


def _key_offset(meta_bytes: bytes, key: str, base: int = HEADER_SIZE) -> int:
    """Offset of a top-level metadata key in the file (for messages), or the block's."""
    at = meta_bytes.find(json.dumps(key).encode("utf-8"))
    return base + max(at, 0)


def meta_error(name: str, meta_bytes: bytes, key: str, message: str,
                base: int = HEADER_SIZE) -> NoReturn:
    raise TraceFileError(name, _key_offset(meta_bytes, key, base), f'metadata "{key}": {message}')


def parse_strings(name: str, base: int, data: bytes) -> list[str]:
    if len(data) < 4:
        raise TraceFileError(
            name, base, f"expected a string table of at least 4 bytes, found {len(data)}")
    (count,) = U32.unpack_from(data, 0)
    pos = 4
    strings: list[str] = []
    for i in range(count):
        if pos + 4 > len(data):
            raise TraceFileError(
                name, base + pos, f"string table ends inside the length of string {i} of {count}")
        (length,) = U32.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise TraceFileError(
                name, base + pos,
                f"string {i} of {length} bytes runs past the string table's end "
                f"(at offset {base + len(data)})")
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
            f"{len(data) - pos} extra bytes")
    return strings


