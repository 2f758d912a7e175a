"""The versioned ``.htrace`` binary trace file: writer and validating reader.

Layout (little-endian; ``FORMAT_VERSION`` 1)::

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
    76  4   u32 reserved 0
    80      meta JSON (meta_len bytes)
            string table: u32 count, then count x (u32 byte length + UTF-8 bytes)
            zero padding so the events start at a multiple of 32 from file start
            events: n_events x 32 bytes (EVENT_DTYPE, see csrc/event.h)

The module table and backward node names are string-table indices stored in the
metadata: ``meta["modules"] = [[name_idx, type_idx], ...]`` (slot i = module i)
and ``meta["node_names"] = [idx, ...]`` (the id of NODE_BEGIN events indexes
this list; a NODE_END's id is the autograd graph task id). Every other metadata
key is free-form run information.

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
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from hooktrace._events import EVENT_DTYPE, ENTER, EXIT, NODE_BEGIN, VALID_KINDS, Clock

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "HEADER_SIZE",
    "TraceFileError",
    "TraceFileContents",
    "write_trace",
    "read_trace",
]

MAGIC = b"HTRACE\x00\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQQQQqdIIII")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 80
_EVENT_ALIGN = EVENT_DTYPE.itemsize  # events start at a multiple of 32
_U32 = struct.Struct("<I")
# Keys of the metadata block that the file format itself owns.
_RESERVED_META = ("modules", "node_names")
_CHUNK = 1 << 24  # bytes per crc32 / write step over the events block


class TraceFileError(ValueError):
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


def _crc_of(array: np.ndarray) -> int:
    flat = array.view(np.uint8).reshape(-1) if array.size else np.zeros(0, np.uint8)
    crc = 0
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

    ``info`` is free-form JSON-serializable metadata; ``info["pid"]`` (default 0)
    also goes into the header. The events array is streamed to the file as-is.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> p = os.path.join(tempfile.mkdtemp(), "empty.htrace")
        >>> write_trace(p, np.zeros(0, EVENT_DTYPE), [], [], Clock(0, 0, 1.0), {})
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

    pid = int(info.get("pid", 0))
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
        pid & 0xFFFFFFFF,
        0,
    )
    with open(path, "wb") as f:
        f.write(header)
        f.write(meta_bytes)
        f.write(strings_bytes)
        f.write(b"\x00" * padding)
        _write_array(f, events)


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

    Raises ``TraceFileError`` naming the file, the byte offset and what was
    expected if the file is empty, truncated, corrupt or of another version.
    With ``mmap=True`` the events stay memory-mapped (read-only) instead of
    being read into memory; the checksum still reads them once.

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
        if size == 0:
            raise TraceFileError(
                name, 0, f"empty file (expected an {HEADER_SIZE}-byte hooktrace header)"
            )
        if head[: len(MAGIC)] != MAGIC[: len(head)]:
            raise TraceFileError(
                name, 0, f"expected magic {MAGIC!r}, found {head[: len(MAGIC)]!r} "
                "(not a hooktrace .htrace file)"
            )
        if len(head) < HEADER_SIZE:
            raise TraceFileError(
                name, len(head),
                f"truncated header: expected {HEADER_SIZE} bytes, file has {size}",
            )
        (
            _magic, version, header_size, meta_len, strings_len, n_events,
            ticks0, unix_ns0, ns_per_tick, crc_meta, crc_events, pid, _reserved,
        ) = _HEADER.unpack(head)
        if version != FORMAT_VERSION:
            raise TraceFileError(
                name, 8,
                f"unsupported format version {version} (this hooktrace reads version "
                f"{FORMAT_VERSION})",
            )
        if header_size != HEADER_SIZE:
            raise TraceFileError(
                name, 12, f"expected header size {HEADER_SIZE}, found {header_size}"
            )
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
    modules = _resolve_modules(name, meta.pop("modules", None), strings)
    node_names = _resolve_node_names(name, meta.pop("node_names", None), strings)
    _validate_events(name, events_off, events, len(modules), len(node_names))
    meta.setdefault("pid", pid)
    return TraceFileContents(
        events=events,
        modules=modules,
        node_names=node_names,
        clock=Clock(ticks0, unix_ns0, ns_per_tick),
        info=meta,
        pid=pid,
    )


def _parse_meta(name: str, meta_bytes: bytes) -> dict[str, Any]:
    try:
        text = meta_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFileError(name, HEADER_SIZE + e.start, "metadata is not valid UTF-8") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        offset = HEADER_SIZE + len(text[: e.pos].encode("utf-8"))
        raise TraceFileError(name, offset, f"metadata is not valid JSON: {e.msg}") from None
    if not isinstance(meta, dict):
        raise TraceFileError(
            name, HEADER_SIZE, f"expected a JSON object as metadata, found {type(meta).__name__}"
        )
    return meta


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


def _string_at(name: str, strings: list[str], idx: Any, what: str) -> str:
    if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(strings):
        raise TraceFileError(
            name, HEADER_SIZE,
            f"metadata {what}: string index {idx!r} out of range "
            f"(the string table has {len(strings)} strings)",
        )
    return strings[idx]


def _resolve_modules(name: str, raw: Any, strings: list[str]) -> list[tuple[str, str]]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise TraceFileError(
            name, HEADER_SIZE, f'expected metadata "modules" to be a list, found {raw!r:.60}'
        )
    modules: list[tuple[str, str]] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, list) or len(entry) != 2:
            raise TraceFileError(
                name, HEADER_SIZE,
                f'expected metadata "modules"[{i}] to be [name_idx, type_idx], found {entry!r:.60}',
            )
        modules.append((
            _string_at(name, strings, entry[0], f'"modules"[{i}][0]'),
            _string_at(name, strings, entry[1], f'"modules"[{i}][1]'),
        ))
    return modules


def _resolve_node_names(name: str, raw: Any, strings: list[str]) -> list[str]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise TraceFileError(
            name, HEADER_SIZE, f'expected metadata "node_names" to be a list, found {raw!r:.60}'
        )
    return [_string_at(name, strings, idx, f'"node_names"[{i}]') for i, idx in enumerate(raw)]


def _validate_events(
    name: str, events_off: int, events: np.ndarray, n_modules: int, n_nodes: int
) -> None:
    """Vectorized checks that every event can be interpreted (no per-event Python)."""
    if not len(events):
        return
    itemsize = EVENT_DTYPE.itemsize
    kind = events["kind"]
    valid = np.zeros(256, dtype=bool)
    valid[list(VALID_KINDS)] = True
    bad = np.flatnonzero(~valid[kind])
    if bad.size:
        i = int(bad[0])
        raise TraceFileError(
            name, events_off + i * itemsize + _field_offset("kind"),
            f"event {i}: expected kind in {list(VALID_KINDS)}, found {int(kind[i])} "
            f"({bad.size} bad events in all)",
        )
    ids = events["id"]
    is_forward = (kind == ENTER) | (kind == EXIT)
    id_off = _field_offset("id")
    bad = np.flatnonzero(is_forward & (ids >= n_modules))
    if bad.size:
        i = int(bad[0])
        raise TraceFileError(
            name, events_off + i * itemsize + id_off,
            f"event {i}: module id {int(ids[i])} out of range "
            f"(the module table has {n_modules} modules)",
        )
    # NODE_END's id is the graph task id (csrc/backward.h), not a name
    bad = np.flatnonzero((kind == NODE_BEGIN) & (ids >= n_nodes))
    if bad.size:
        i = int(bad[0])
        raise TraceFileError(
            name, events_off + i * itemsize + id_off,
            f"event {i}: node name id {int(ids[i])} out of range "
            f"(the node name table has {n_nodes} names)",
        )
