"""Version 2, the file ``save()`` writes, and the reader of every version
(``read_trace``: version 3 files go to :mod:`hooktrace.format.stream`).

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

import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hooktrace._input import open_input
from hooktrace._output import open_output
from hooktrace._events import EVENT_DTYPE, Clock
from hooktrace.format.meta import (
    FORMAT_VERSION,
    HEADER,
    HEADER_CRC_AT,
    HEADER_SIZE,
    MAGIC,
    MAX_PID,
    RESERVED_META,
    STREAM_FORMAT_VERSION,
    U32,
    StringTable,
    TraceFileContents,
    TraceFileError,
    chunks,
    crc_of,
    encode_json,
    events_offset,
    parse_meta,
    parse_strings,
)
from hooktrace.format.validate import (
    check_clock,
    check_dense,
    check_info,
    check_magic,
    clock_problem,
    recorded_interval,
    resolve_modules,
    resolve_node_names,
    too_big,
    validate_events,
)
from hooktrace.format.stream import read_stream


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
    clash = [k for k in RESERVED_META if k in info]
    if clash:
        raise ValueError(f"info must not contain the reserved metadata keys {clash}")

    table = StringTable()
    meta: dict[str, Any] = dict(info)
    meta["modules"] = [[table.add(name), table.add(type_name)] for name, type_name in modules]
    meta["node_names"] = [table.add(name) for name in node_names]
    meta_bytes = encode_json(meta)
    strings_bytes = table.encode()
    events_off = events_offset(len(meta_bytes), len(strings_bytes))
    padding = events_off - HEADER_SIZE - len(meta_bytes) - len(strings_bytes)

    pid = info.get("pid")
    if not (isinstance(pid, (int, np.integer)) and not isinstance(pid, bool)
            and 1 <= pid <= MAX_PID):
        raise ValueError(f'info["pid"] must be an int in [1, {MAX_PID}], got {pid!r:.60}')
    pid = int(pid)
    problem = clock_problem(clock.ticks0, clock.unix_ns0, clock.ns_per_tick)
    if problem:
        raise ValueError(f"clock {clock}: {problem}")
    header = HEADER.pack(
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
        crc_of(events),
        pid,
        0,
    )
    header = header[:HEADER_CRC_AT] + U32.pack(zlib.crc32(header[:HEADER_CRC_AT]))
    # Through a temporary file renamed when complete: a failure or Ctrl-C never
    # leaves a truncated .htrace where a good one was (hooktrace._output).
    with open_output(path, gzip_by_name=False) as f:
        f.write(header)
        f.write(meta_bytes)
        f.write(strings_bytes)
        f.write(b"\x00" * padding)
        for chunk in chunks(events):
            f.write(chunk)


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
    with open_input(path) as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        head = f.read(HEADER_SIZE)
        check_magic(name, head, size)
        (version,) = U32.unpack_from(head, 8)
        if version == STREAM_FORMAT_VERSION:
            return read_stream(name, f, size, head)
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
        ) = HEADER.unpack(head)
        if header_size != HEADER_SIZE:
            raise TraceFileError(
                name, 12, f"expected header size {HEADER_SIZE}, found {header_size}"
            )
        crc = zlib.crc32(head[:HEADER_CRC_AT])
        if crc != crc_header:
            raise TraceFileError(
                name, HEADER_CRC_AT,
                f"header checksum mismatch: header says {crc_header:#010x}, bytes "
                f"0-{HEADER_CRC_AT - 1} hash to {crc:#010x} (file is corrupt)",
            )
        check_clock(name, 40, ticks0, unix_ns0, ns_per_tick)
        if not 1 <= pid <= MAX_PID:
            raise TraceFileError(name, 72, f"expected a pid in [1, {MAX_PID}], found {pid}")
        strings_off = HEADER_SIZE + meta_len
        events_off = events_offset(meta_len, strings_len)
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
        check_dense(name, st, end, f"the header's {n_events:,} events make a file of")

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
        meta = parse_meta(name, meta_bytes)
        strings = parse_strings(name, strings_off, strings_bytes)

        events: np.ndarray
        if mmap and n_events:
            events = np.memmap(f, dtype=EVENT_DTYPE, mode="r", offset=events_off,
                               shape=(n_events,))
        else:
            f.seek(events_off)
            try:
                events = np.fromfile(f, dtype=EVENT_DTYPE, count=n_events)
            except MemoryError:
                raise too_big(name, n_events) from None
            if len(events) != n_events:  # the file shrank under us
                raise TraceFileError(
                    name, events_off, f"truncated: expected {n_events} events, read {len(events)}"
                )
    crc = crc_of(events)
    if crc != crc_events:
        raise TraceFileError(
            name, events_off,
            f"events checksum mismatch: header says {crc_events:#010x}, "
            f"events hash to {crc:#010x} (file is corrupt)",
        )
    modules = resolve_modules(name, meta_bytes, meta.pop("modules", None), strings)
    node_names = resolve_node_names(name, meta_bytes, meta.pop("node_names", None), strings)
    check_info(name, meta_bytes, meta, pid)
    clock = Clock(ticks0, unix_ns0, ns_per_tick)
    interval = recorded_interval(name, meta_bytes, meta, clock)
    validate_events(name, lambda i: events_off + i * EVENT_DTYPE.itemsize, events,
                     len(modules), len(node_names), clock, interval,
                     len(meta.get("kernel_sites", ())), len(meta.get("shape_signatures", ())))
    meta.setdefault("pid", pid)
    return TraceFileContents(
        events=events,
        modules=modules,
        node_names=node_names,
        clock=clock,
        info=meta,
        pid=pid,
    )
