"""Version 3, the stream that ``hooktrace.trace(model, out=...)`` appends to while
the model runs: its blocks and their reader.

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
    MODULES (7)     u32 first, then a string table of 2n strings (the same u32
                    count + strings as NODE_NAMES, count = 2n): qualified name and
                    class name of modules [first, first + n). A process scope
                    (``hooktrace run``) names modules on their first call: its
                    META has ``modules: []`` and its table grows in these blocks,
                    each written before the EVENTS that use its modules. ``first``
                    is the number of modules so far, or less when earlier names
                    changed (the main model became known, record/scopes.py):
                    those are restated; the table never shrinks

A stream is readable at every moment: a block that is truncated or fails its
checksum ends the readable part (a killed process leaves a partly written last
block); the events before it load and ``info["cut"]`` says, in one line, where
and why the recording was cut. The complete blocks are validated like a version
2 file; their events are returned thread by thread, as a recording in memory
holds them.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable
from dataclasses import replace as dataclass_replace
from typing import Any, BinaryIO

import numpy as np

from hooktrace._input import file_kind, open_input
from hooktrace.errors import InputPathError
from hooktrace._events import (
    ENTER,
    EVENT_DTYPE,
    EXIT,
    KERNEL_BEGIN,
    KERNEL_END,
    SHAPE_UNKNOWN,
    SHAPES,
    Clock,
)
from hooktrace.format.meta import (
    BLOCK,
    BLOCK_CLOCK,
    BLOCK_CRC_AT,
    BLOCK_EVENTS,
    BLOCK_FOOTER,  # noqa: F401  (stream_block's example)
    BLOCK_META,
    BLOCK_MODULES,
    BLOCK_NAMES,
    BLOCK_NODE_NAMES,
    BLOCK_SIZE,
    BLOCK_STATS,
    CLOCK_BLOCK,
    EVENTS_SUB,
    MAGIC,
    MAX_PID,
    STATS_BLOCK,
    STREAM_FORMAT_VERSION,
    STREAM_HEADER,
    STREAM_HEADER_SIZE,
    U32,
    TraceFileContents,
    TraceFileError,
    crc_of,
    field_offset,
    is_int,
    meta_error,
    parse_meta,
    parse_strings,
)
from hooktrace.format.validate import (
    check_clock,
    check_dense,
    check_info,
    recorded_interval,
    too_big,
    validate_events,
)


def stream_header() -> bytes:
    """The 16 bytes a version 3 stream starts with."""
    return STREAM_HEADER.pack(MAGIC, STREAM_FORMAT_VERSION, STREAM_HEADER_SIZE)


def stream_block(block_type: int, payload: bytes) -> bytes:
    """One framed version 3 block (the Python-written ones: META and FOOTER).

    Example:
        >>> len(stream_block(BLOCK_FOOTER, b"{}"))
        26
    """
    head = BLOCK.pack(block_type, 0, len(payload), zlib.crc32(payload), 0)
    return head[:BLOCK_CRC_AT] + U32.pack(zlib.crc32(head[:BLOCK_CRC_AT])) + payload




class _Cut(Exception):
    """Where a stream's readable part ends, and why."""

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(why)
        self.offset = offset
        self.why = why


def read_stream(name: str, f: BinaryIO, size: int, head: bytes) -> TraceFileContents:
    """A version 3 stream: blocks up to the footer, or up to the first damaged one."""
    if len(head) < STREAM_HEADER_SIZE:
        raise TraceFileError(name, len(head), f"truncated header: expected {STREAM_HEADER_SIZE} "
                                              f"bytes, file has {size}")
    _magic, _version, header_size = STREAM_HEADER.unpack_from(head)
    if header_size != STREAM_HEADER_SIZE:
        raise TraceFileError(name, 12, f"expected header size {STREAM_HEADER_SIZE}, found "
                                       f"{header_size}")
    check_dense(name, os.fstat(f.fileno()), size, "the stream is")
    # Events are read straight into one array, in file order; every block
    # header is 40 bytes or more, so this bounds their number. Pages never
    # written are never touched, so the slack costs address space only.
    try:
        buf = np.empty(max(0, (size - STREAM_HEADER_SIZE) // EVENT_DTYPE.itemsize), EVENT_DTYPE)
    except MemoryError:
        raise too_big(name, (size - STREAM_HEADER_SIZE) // EVENT_DTYPE.itemsize) from None
    n = 0
    runs: list[tuple[int, int, int, int]] = []  # (thread, start in buf, count, file offset)
    known_modules: list[int] = []  # per run: the modules known when its block was read
    threads: dict[int, list[int]] = {}  # thread index -> [tid, events so far]
    meta: dict[str, Any] | None = None
    meta_at = footer_at = clock_at = 0
    meta_bytes = footer_bytes = b""
    footer: dict[str, Any] | None = None
    clock: Clock | None = None
    node_names: list[str] = []
    modules: list[tuple[str, str]] = []
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
        at = pos + BLOCK_SIZE  # the payload's offset
        what = BLOCK_NAMES[btype]
        if meta is None and btype != BLOCK_META:
            raise TraceFileError(name, pos, f"expected the META block first, found {what}")
        if btype == BLOCK_META:
            if meta is not None:
                raise TraceFileError(name, pos, "expected one META block, found a second one")
            meta, meta_bytes, meta_at = parse_meta(name, payload, at), payload, at
            modules = _stream_modules(name, meta_bytes, meta_at, meta.pop("modules", None))
        elif btype == BLOCK_CLOCK:
            if length != CLOCK_BLOCK.size:
                raise TraceFileError(name, pos + 8, f"CLOCK block: expected {CLOCK_BLOCK.size} "
                                                    f"payload bytes, found {length}")
            ticks0, unix_ns0, ns_per_tick = CLOCK_BLOCK.unpack(payload)
            check_clock(name, at, ticks0, unix_ns0, ns_per_tick)
            clock, clock_at = Clock(ticks0, unix_ns0, ns_per_tick), at
        elif btype == BLOCK_NODE_NAMES:
            if length < 4:
                raise TraceFileError(name, pos + 8, f"NODE_NAMES block: expected at least 4 "
                                                    f"payload bytes, found {length}")
            (first,) = U32.unpack_from(payload)
            if first != len(node_names):
                raise TraceFileError(name, at, f"NODE_NAMES block: expected names from index "
                                               f"{len(node_names)} on, found {first}")
            node_names += parse_strings(name, at + 4, payload[4:])
        elif btype == BLOCK_MODULES:
            modules = _grown_modules(name, pos, payload, modules)
        elif btype == BLOCK_EVENTS:
            assert events is not None
            thread, tid, first = EVENTS_SUB.unpack(payload)
            if clock is None:
                raise TraceFileError(name, pos, "expected a CLOCK block before the first EVENTS")
            # a rolling stream's later segment (csrc/stream_writer.h): a thread's first
            # block here continues its index from the segments before
            rolling = meta is not None and bool(meta.get("rolling"))
            known = threads.setdefault(thread, [tid, first if rolling else 0])
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
                    name, at + EVENTS_SUB.size + i * EVENT_DTYPE.itemsize + field_offset("tid"),
                    f"EVENTS block: expected every event on tid {tid}, event {i} is on "
                    f"{int(events['tid'][i])}")
            known_modules.append(len(modules))
            runs.append((thread, n, len(events), at + EVENTS_SUB.size))
            known[1] += len(events)
            n += len(events)
        elif btype == BLOCK_STATS:
            if length != STATS_BLOCK.size:
                raise TraceFileError(name, pos + 8, f"STATS block: expected {STATS_BLOCK.size} "
                                                    f"payload bytes, found {length}")
            stats = STATS_BLOCK.unpack(payload)
            if max(stats) > 2**63 - 1:
                raise TraceFileError(name, at, f"STATS block: expected counts below 2**63, "
                                               f"found {stats}")
        else:  # BLOCK_FOOTER
            footer, footer_bytes, footer_at = parse_meta(name, payload, at), payload, at
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

    _check_modules_known(name, buf, runs, known_modules, len(modules))
    if "node_names" in meta:
        meta_error(name, meta_bytes, "node_names", "expected node names in NODE_NAMES blocks, "
                                                   "not in META", meta_at)
    pid = meta.get("pid")
    if not (isinstance(pid, int) and is_int(pid) and 1 <= pid <= MAX_PID):
        meta_error(name, meta_bytes, "pid", f"expected an int in [1, {MAX_PID}], found "
                                             f"{pid!r:.60}", meta_at)
    check_info(name, meta_bytes, meta, pid, meta_at)
    info = dict(meta)
    if footer is not None:
        written = footer.pop("events", None)
        if written != n:
            meta_error(name, footer_bytes, "events", f"expected the {n} events the EVENTS "
                                                      f"blocks hold, found {written!r:.40}",
                        footer_at)
        check_info(name, footer_bytes, footer, pid, footer_at)
        info.update(footer)
    else:
        assert cut is not None
        info["dropped_events"], info["overwritten_events"] = stats
        info["cut"] = (f"{name}: recording cut at byte {cut.offset} ({cut.why}); {n:,} events "
                       "before it loaded")
        segment = meta.get("rolling")
        if isinstance(segment, dict) and os.path.basename(name) != segment.get("newest"):
            info["cut"] = (f"{name}: an older segment of a rolling stream (--max-disk), "
                           f"{n:,} events; the run went on in the next segment, up to "
                           f"{segment.get('newest')}")
    if clock is None:  # no events either
        clock = Clock(0, int(info.get("start_unix_ns", 0)), 1.0)
    interval = (recorded_interval(name, footer_bytes, info, clock, footer_at, clock_at + 8)
                if footer is not None else None)

    # Thread by thread, as a recording in memory is (Session::copy_events).
    order = sorted(range(len(runs)), key=lambda r: runs[r][0])
    if order == list(range(len(runs))):
        events = buf[:n]
    else:
        events = np.concatenate([buf[runs[r][1] : runs[r][1] + runs[r][2]] for r in order])
    starts = np.cumsum([0] + [runs[r][2] for r in order])
    offsets = [runs[r][3] for r in order]

    def file_offset(i: int) -> int:
        k = int(np.searchsorted(starts, i, side="right")) - 1
        return offsets[k] + (i - int(starts[k])) * EVENT_DTYPE.itemsize

    offset_of: Callable[[int], int] = file_offset
    n_sites = len(info.get("kernel_sites", ()))
    if footer is None:
        # the sites of regions compiled after the stream began are in the footer: a cut
        # stream drops those kernels' marks (their region keeps its span) and says so
        kernel = (events["kind"] == KERNEL_BEGIN) | (events["kind"] == KERNEL_END)
        unknown = kernel & (events["id"] >= n_sites)
        if unknown.any():
            keep = np.flatnonzero(~unknown)
            events = events[keep]
            where = offset_of
            offset_of = lambda i: where(int(keep[i]))  # noqa: E731  (the kept events')
            info["cut"] += (f"; {int(unknown.sum()):,} kernel marks of regions compiled "
                            "after the stream began left out (their sites are in the footer)")
    n_shapes = len(info.get("shape_signatures", ()))
    if footer is None:
        # signatures first seen after the stream began are in the footer too: a cut stream
        # keeps those calls' shape events as unknown shapes
        shp = np.flatnonzero(events["kind"] == SHAPES)
        seq = events["seq"][shp]
        lost = 0
        for shift in (np.uint64(0), np.uint64(32)):
            half = (seq >> shift) & np.uint64(0xFFFFFFFF)
            beyond = (half >= n_shapes) & (half != SHAPE_UNKNOWN)
            lost += int(beyond.sum())
            seq = np.where(beyond, seq | (np.uint64(SHAPE_UNKNOWN) << shift), seq)
        if lost:
            events = events.copy()
            events["seq"][shp] = seq
            info["cut"] += (f"; {lost:,} shape signatures first seen after the stream began "
                            "are unknown (the table is in the footer)")
    validate_events(name, offset_of, events, len(modules), len(node_names), clock, interval,
                     n_sites, n_shapes)
    contents = TraceFileContents(events=events, modules=modules, node_names=node_names,
                                 clock=clock, info=info, pid=pid)
    return _with_older_segments(name, contents)


def rolling_segments(name: str, rolling: dict[str, Any]) -> list[str]:
    """The older segments of the rolling stream whose newest file is ``name`` (its META's
    ``rolling``), oldest first: ``<stem>.<k>.htrace`` beside it."""
    folder = os.path.dirname(name) or "."
    stem = rolling.get("stem")
    if not isinstance(stem, str) or not os.path.isdir(folder):
        return []
    pattern = re.compile(re.escape(stem) + r"\.([0-9]+)\.htrace")
    found = [(int(m.group(1)), entry) for entry in os.listdir(folder)
             if (m := pattern.fullmatch(entry))]
    return [os.path.join(folder, entry) for _, entry in sorted(found)]


def _with_older_segments(name: str, newest: TraceFileContents) -> TraceFileContents:
    """A rolling stream's newest file (``--max-disk``) loads with the older segments
    still on disk as one run: their events first, thread by thread; the newest file's
    tables (which restate and extend theirs), clock and counts. A segment file given
    by name loads alone. A segment missing between two on disk (or, once the run
    finished, between the oldest it kept and the newest) is named in
    ``info["rolling"]["missing_segments"]``: its events and steps are not there (issue
    #46: they were silently absent); what is no regular file (a FIFO, a device named like
    a segment) is never opened, and missing too."""
    rolling = newest.info.get("rolling")
    if not isinstance(rolling, dict) or os.path.basename(name) != rolling.get("newest"):
        return newest
    parts: list[TraceFileContents] = []
    found: list[int] = []  # the numbers of the segments loaded
    unreadable: dict[int, str] = {}  # number -> why it is not a segment
    for seg in rolling_segments(name, rolling):
        number = int(seg.rsplit(".", 2)[-2])
        try:
            with open_input(seg) as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(STREAM_HEADER_SIZE)
                if head[:8] != MAGIC:
                    raise TraceFileError(seg, 0, "expected a hooktrace stream segment")
                part = read_stream(seg, f, size, head)
        except FileNotFoundError:  # rolled off while listed
            continue
        except InputPathError:  # a FIFO, a device, a folder: never read
            unreadable[number] = f"{file_kind(seg)}, not a segment"
            continue
        if part.info.get("start_unix_ns") != newest.info.get("start_unix_ns"):
            continue  # a segment of another run at the same path
        found.append(number)
        parts.append(part)
    info = dict(newest.info)
    info["rolling"] = dict(rolling, segments_loaded=len(parts) + 1)
    if "rolled_off_segments" not in rolling and found and found[0] > 1:
        # no FOOTER (killed): segments are numbered from 1, so those below the oldest
        # left were rolled off; what they held is not known
        info["rolling"]["rolled_off_segments"] = found[0] - 1
    missing = _missing_segments(rolling, found)
    if missing:
        stem = rolling["stem"]
        info["rolling"]["missing_segments"] = [
            f"{stem}.{k}.htrace" + (f" ({unreadable[k]})" if k in unreadable else "")
            for k in missing]
    if not parts:
        return dataclass_replace(newest, info=info)
    events = np.concatenate([p.events for p in parts] + [newest.events])
    # thread by thread (as one recording holds them), each thread's events in order
    _, first_seen = np.unique(events["tid"], return_index=True)
    rank = np.argsort(np.argsort(first_seen))
    tids = np.unique(events["tid"])
    key = rank[np.searchsorted(tids, events["tid"])]
    events = events[np.argsort(key, kind="stable")]
    return dataclass_replace(newest, events=events, info=info)


# the most missing segments named (a folder emptied by hand would name thousands)
MAX_MISSING_NAMED = 20


def _missing_segments(rolling: dict[str, Any], found: list[int]) -> list[int]:
    """The numbers of the older segments that should be on disk and are not: between the
    oldest and the newest loaded, and once the run finished (its FOOTER counts the
    segments it started and rolled off) up to the last one it closed."""
    first, last = (found[0], found[-1]) if found else (0, -1)
    started: Any = rolling.get("segments")
    rolled: Any = rolling.get("rolled_off_segments")
    if is_int(started) and is_int(rolled) and 0 <= rolled < started:
        first, last = rolled + 1, started - 1  # (closed segments: 1 .. started - 1)
    have = set(found)
    return [k for k in range(first, last + 1) if k not in have][:MAX_MISSING_NAMED]


def _next_block(name: str, f: BinaryIO, pos: int, size: int, room: np.ndarray,
                ) -> tuple[int, int, bytes, np.ndarray | None]:
    """The intact block at ``pos``: (type, payload length, payload, events).

    An EVENTS block's events are read into ``room`` (returned as a view of it) and
    its payload holds the 16-byte sub-header only. Raises _Cut where the readable
    part ends: a block that is truncated or fails a checksum."""
    if pos == size:
        raise _Cut(pos, "no footer: the process did not finish")
    head = f.read(BLOCK_SIZE)
    if len(head) < BLOCK_SIZE:
        raise _Cut(pos, f"a partly written block header, {len(head)} of {BLOCK_SIZE} bytes: "
                        "the process did not finish")
    btype, reserved, length, crc_payload, crc_head = BLOCK.unpack(head)
    if zlib.crc32(head[:BLOCK_CRC_AT]) != crc_head:
        raise _Cut(pos, "a block header that fails its checksum")
    if length > size - pos - BLOCK_SIZE:
        raise _Cut(pos, f"a partly written block, {size - pos - BLOCK_SIZE} of {length} payload "
                        "bytes: the process did not finish")
    # From here the header is intact: what it says is refused, not cut, when wrong.
    if reserved != 0:
        raise TraceFileError(name, pos + 4, f"expected a reserved 0 in the block header, "
                                            f"found {reserved}")
    if btype not in BLOCK_NAMES:
        raise TraceFileError(name, pos, f"unknown block type {btype} (expected 1-7; the file "
                                        "was written by a newer hooktrace?)")
    events: np.ndarray | None = None
    if btype == BLOCK_EVENTS:
        sub = EVENTS_SUB.size
        if length < sub or (length - sub) % EVENT_DTYPE.itemsize:
            raise TraceFileError(name, pos + 8, f"EVENTS block: expected {sub} + a multiple of "
                                                f"{EVENT_DTYPE.itemsize} payload bytes, found "
                                                f"{length}")
        payload = f.read(sub)
        events = room[: (length - sub) // EVENT_DTYPE.itemsize]
        got = f.readinto(memoryview(events.view(np.uint8)))  # type: ignore[attr-defined,arg-type]
        if len(payload) + (got or 0) != length:  # the file shrank under us
            raise _Cut(pos, "a partly written block: the file shrank while read")
        crc = crc_of(events, zlib.crc32(payload))
    else:
        payload = f.read(length)
        if len(payload) != length:
            raise _Cut(pos, "a partly written block: the file shrank while read")
        crc = zlib.crc32(payload)
    if crc != crc_payload:
        raise _Cut(pos, f"a block ({BLOCK_NAMES[btype]}) whose payload fails its checksum")
    return btype, length, payload, events


def _stream_modules(name: str, meta_bytes: bytes, base: int, raw: Any) -> list[tuple[str, str]]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        meta_error(name, meta_bytes, "modules",
                    f"expected a list of [name, class name], found {raw!r:.60}", base)
    for i, entry in enumerate(raw):
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(x, str) for x in entry)):
            meta_error(name, meta_bytes, "modules",
                        f"[{i}]: expected [name, class name], found {entry!r:.60}", base)
    return [(entry[0], entry[1]) for entry in raw]


def _grown_modules(name: str, pos: int, payload: bytes,
                   modules: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The module table after the MODULES block at ``pos``: modules [first, first + n)
    set (restated or new). Refused: a gap, a table that shrinks, unpaired names."""
    at = pos + BLOCK_SIZE
    if len(payload) < 8:
        raise TraceFileError(name, pos + 8, f"MODULES block: expected at least 8 payload "
                                            f"bytes, found {len(payload)}")
    (first,), (count,) = U32.unpack_from(payload), U32.unpack_from(payload, 4)
    if first > len(modules):
        raise TraceFileError(name, at, f"MODULES block: expected modules from index "
                                       f"{len(modules)} on (or earlier ones restated), found "
                                       f"{first}")
    if count % 2:
        raise TraceFileError(name, at + 4, f"MODULES block: expected (name, class name) "
                                           f"pairs, an even count of strings, found {count}")
    if first + count // 2 < len(modules):
        raise TraceFileError(name, at + 4, f"MODULES block: expected the table to keep its "
                                           f"{len(modules)} modules, found modules [{first}, "
                                           f"{first + count // 2}) only")
    strings = parse_strings(name, at + 4, payload[4:])
    return modules[:first] + list(zip(strings[::2], strings[1::2], strict=True))


def _check_modules_known(name: str, buf: np.ndarray, runs: list[tuple[int, int, int, int]],
                         known: list[int], n_modules: int) -> None:
    """Every EVENTS block names only the modules of the MODULES blocks before it (the
    final table is checked with every event later)."""
    for run, k in zip(runs, known, strict=True):
        if k == n_modules:
            continue
        _, start, count, offset = run
        ev = buf[start : start + count]
        bad = np.flatnonzero(((ev["kind"] == ENTER) | (ev["kind"] == EXIT)) & (ev["id"] >= k))
        if bad.size:
            j = int(bad[0])
            raise TraceFileError(
                name, offset + j * EVENT_DTYPE.itemsize + field_offset("id"),
                f"EVENTS block: event {j} names module {int(ev['id'][j])}, which no MODULES "
                f"block before it names (the table had {k} modules; expected a module's "
                "MODULES block before the events that use it)")
