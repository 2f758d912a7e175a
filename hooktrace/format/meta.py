"""What every ``.htrace`` version shares: the format's constants and limits, its
error, the metadata block (JSON) and the string table, and the validation of
headers, metadata and events.

The reader refuses, with one ``TraceFileError`` line naming the file, the
offset (or metadata key) and what it expected, anything that cannot be a
recording: bad checksums, clock conversions outside ``NS_PER_TICK_RANGE``,
unknown event kinds or flags, ids outside the tables, timestamps going back on
a thread or lying far outside the recorded interval (``INTERVAL_SLACK_NS``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from hooktrace.errors import HooktraceError
from hooktrace._events import (
    EVENT_DTYPE,
    ENTER,
    ENTER_FLAGS,
    EXIT,
    FLAG_ERROR,
    KERNEL_BEGIN,
    KERNEL_END,
    MEM_CPU,
    MEM_CUDA,
    NODE_BEGIN,
    NUM_FLAGS,
    NUMERICS,
    NUMERICS_VALUE,
    SHAPE_UNKNOWN,
    SHAPES,
    STEP,
    VALID_KINDS,
    Clock,
)


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
_MAX_STEP = 2**62  # a step number (from 0 up) beyond this is no count of steps
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
(BLOCK_META, BLOCK_CLOCK, BLOCK_NODE_NAMES, BLOCK_EVENTS, BLOCK_STATS, BLOCK_FOOTER,
 BLOCK_MODULES) = range(1, 8)
_BLOCK_NAMES = {BLOCK_META: "META", BLOCK_CLOCK: "CLOCK", BLOCK_NODE_NAMES: "NODE_NAMES",
                BLOCK_EVENTS: "EVENTS", BLOCK_STATS: "STATS", BLOCK_FOOTER: "FOOTER",
                BLOCK_MODULES: "MODULES"}
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


def _string_list(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
    return None if ok else "a list of strings"


def _kernel_sites(value: Any) -> str | None:
    ok = isinstance(value, list) and all(
        isinstance(s, list) and len(s) == 3 and all(isinstance(x, str) for x in s)
        and s[2] in ("forward", "backward") for s in value)
    return None if ok else 'a list of [kernel, module path, "forward" | "backward"]'


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
    # kernel call sites of compiled code (issue #18): [kernel, module path, phase]
    "kernel_sites": _kernel_sites,
    # trace(shapes=True) (issue #19): "dtype[d0,d1];dtype[...]" per signature index
    "shape_signatures": _string_list,
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
    n_nodes: int, clock: Clock, interval: tuple[int, int] | None, n_sites: int = 0,
    n_shapes: int = 0,
) -> None:
    """Vectorized checks that every event can be interpreted (no per-event Python).

    ``offset_of(i)`` is the file offset of event i (for messages); ``n_sites`` the
    length of info's ``kernel_sites`` (kernel marks name a site), ``n_shapes`` of its
    ``shape_signatures`` (shape events name two)."""
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
    is_forward = (kind == ENTER) | (kind == EXIT) | (kind == NUMERICS) | (kind == SHAPES)
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
    bad = np.flatnonzero(((kind == KERNEL_BEGIN) | (kind == KERNEL_END)) & (ids >= n_sites))
    if bad.size:
        fail(bad, "id", f"kernel site {int(ids[bad[0]])} out of range (the kernel_sites table "
                        f"has {n_sites} sites)")
    # shape events: two signature indexes (or SHAPE_UNKNOWN: the table was full)
    shp = np.flatnonzero(kind == SHAPES)
    if shp.size:
        seq = events["seq"][shp]
        for half in (seq & np.uint64(0xFFFFFFFF), seq >> np.uint64(32)):
            bad = shp[(half >= n_shapes) & (half != SHAPE_UNKNOWN)]
            if bad.size:
                k = int(np.flatnonzero(shp == bad[0])[0])
                fail(bad, "seq", f"shape signature {int(half[k])} out of range (the "
                                 f"shape_signatures table has {n_shapes})")
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
    # The recorder sets FLAG_ERROR on EXITs, FLAG_NO_GRAD / FLAG_EVAL_MODE on ENTERs
    # only, and never writes the padding.
    # (Each check scans the nonzero/too-large values only: a load is I/O bound.)
    flagged = np.flatnonzero(events["flags"])
    flags = events["flags"][flagged]
    on = kind[flagged]
    bad = flagged[~(((on == EXIT) & (flags == FLAG_ERROR))
                    | ((on == ENTER) & ((flags & ~np.uint8(ENTER_FLAGS)) == 0))
                    | (((on == NUMERICS) | (on == NUMERICS_VALUE))
                       & ((flags & ~np.uint8(NUM_FLAGS)) == 0)))]
    if bad.size:
        fail(bad, "flags", f"expected flags 0 (or {FLAG_ERROR} on an EXIT, a combination of "
                           f"{ENTER_FLAGS} on an ENTER, of {NUM_FLAGS} on numerics), found "
                           f"{int(events['flags'][bad[0]])} on kind {int(kind[bad[0]])}")
    pad = events["pad"]
    if pad.any():
        fail(np.flatnonzero(pad), "pad", "expected zero padding")
    tid = events["tid"]
    if int(tid.max()) > _MAX_TID:
        bad = np.flatnonzero(tid > _MAX_TID)
        fail(bad, "tid", f"expected a thread id of at most {_MAX_TID}, found {int(tid[bad[0]])}")
    _validate_times(events, clock, interval, fail)
    _validate_steps(events, kind, clock, fail)


def _validate_steps(events: np.ndarray, kind: np.ndarray, clock: Clock,
                    fail: Callable[[np.ndarray, str, str], NoReturn]) -> None:
    """Step marks (seq: the step's number) count up from 0: each number below
    ``_MAX_STEP`` and, in time order, each mark's number above the one before
    (a gap is steps lost to a full buffer; a repeat or a step back no recorder writes)."""
    marks = np.flatnonzero(kind == STEP)
    if not marks.size:
        return
    number = events["seq"][marks]
    bad = marks[number >= np.uint64(_MAX_STEP)]
    if bad.size:
        found = int(np.uint64(events["seq"][bad[0]]).view(np.int64))  # -1, not 2**64-1
        fail(bad, "seq", f"expected a step number in [0, 2**62), found {found}")
    if marks.size < 2:
        return
    t = (events["t"][marks] - np.uint64(clock.ticks0)).view(np.int64)
    order = np.lexsort((number, t))  # by time; marks at the same tick by number
    n = number[order]
    later = np.flatnonzero(n[1:] <= n[:-1]) + 1
    if later.size:
        i, before = int(marks[order[later[0]]]), int(marks[order[later[0] - 1]])
        fail(np.sort(marks[order[later]]), "seq",
             f"step {int(events['seq'][i])} comes after step {int(events['seq'][before])} "
             f"(event {before}): expected step numbers that increase with time")


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
