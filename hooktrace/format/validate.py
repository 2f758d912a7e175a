"""The validation of what a ``.htrace`` reader reads (both versions): header values,
the metadata's known keys, the string-table references and every event.

The reader refuses, with one ``TraceFileError`` line naming the file, the
offset (or metadata key) and what it expected, anything that cannot be a
recording: bad checksums, clock conversions outside ``NS_PER_TICK_RANGE``,
unknown event kinds or flags, ids outside the tables, timestamps going back on
a thread or lying far outside the recorded interval (``INTERVAL_SLACK_NS``).
The format's layout and shared pieces are :mod:`hooktrace.format.meta`.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from hooktrace._events import (
    ENTER,
    ENTER_FLAGS,
    EXIT,
    FLAG_ERROR,
    GPU_KERNEL,
    GPU_MARK,
    GPU_MARK_FLAGS,
    GPU_NO_MODULE,
    GPU_TIME,
    CUPTI_GRAPH_NODE,
    CUPTI_KERNEL,
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
    Clock,
)
from hooktrace.errors import HooktraceError
from hooktrace.format.meta import (
    HEADER_SIZE,
    INTERVAL_SLACK_NS,
    MAGIC,
    MAX_PID,
    MAX_STEP,
    MAX_TID,
    MAX_UNIX_NS,
    NS_PER_TICK_RANGE,
    READABLE_KINDS,
    TraceFileError,
    VERSION_END,
    field_offset,
    is_int,
    meta_error,)


# hooktrace never writes a file with holes: a file whose bytes on disk are fewer than
# 1/SPARSE_FACTOR of what its header claims is refused before anything is allocated for
# it (a 4 KB file claiming 2 TiB of events: MemoryError; 3 GiB: 3.2 GB of memory and 20 s
# before its checksum failed: issue #46). Real traces compress 4.6-5.5x (zlib -9), so a
# compressing filesystem's blocks stay far above 1/64 of the length.
SPARSE_FACTOR = 64


def check_dense(name: str, st: os.stat_result, claimed: int, what: str) -> None:
    """Refuse ``claimed`` bytes (a header's claim, or the file's length) that the file's
    blocks on disk cannot hold (a filesystem that reports no blocks is not judged);
    ``what``: the claim's words ("the header's N events take")."""
    blocks = getattr(st, "st_blocks", 0)
    on_disk = blocks * 512
    if blocks and on_disk * SPARSE_FACTOR < claimed:
        raise TraceFileError(name, 0, f"{what} {claimed:,} bytes, but the file holds "
                                      f"{on_disk:,} bytes on disk: a sparse file (hooktrace "
                                      "writes none), not a recording")


def too_big(name: str, n_events: int) -> HooktraceError:
    """The one line for events that do not fit in memory."""
    return HooktraceError(f"{name}: its {n_events:,} events ({n_events * 32 / 2**30:.1f} GiB) "
                          "do not fit in this machine's memory; hooktrace.load(path, "
                          "mmap=True) maps them from the file instead")


def check_magic(name: str, head: bytes, size: int) -> None:
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
    if len(head) < VERSION_END:
        raise TraceFileError(
            name, len(head),
            f"truncated header: expected {HEADER_SIZE} bytes, file has {size}",
        )


def clock_problem(ticks0: int, unix_ns0: int, ns_per_tick: float) -> str | None:
    """What is wrong with a clock conversion, or None (shared by writer and reader)."""
    lo, hi = NS_PER_TICK_RANGE
    if not (isinstance(ns_per_tick, numbers.Real) and not isinstance(ns_per_tick, bool)
            and math.isfinite(ns_per_tick) and lo <= ns_per_tick <= hi):
        return f"expected ns_per_tick, a finite float in [{lo:g}, {hi:g}], found {ns_per_tick!r}"
    if not (is_int(unix_ns0) and 0 <= unix_ns0 < MAX_UNIX_NS):
        return f"expected unix_ns0 in [0, 2**62), found {unix_ns0!r}"
    if not (is_int(ticks0) and 0 <= ticks0 < 2**64):
        return f"expected ticks0 in [0, 2**64), found {ticks0!r}"
    return None


def check_clock(name: str, at: int, ticks0: int, unix_ns0: int, ns_per_tick: float) -> None:
    """Refuses a clock conversion read at file offset ``at`` (u64 ticks0, i64 unix_ns0,
    f64 ns_per_tick: v2's header, v3's CLOCK block), at the offset of the field at fault."""
    problem = clock_problem(ticks0, unix_ns0, ns_per_tick)
    if problem:
        field = 16 if "ns_per_tick" in problem else 8 if "unix_ns0" in problem else 0
        raise TraceFileError(name, at + field, f"clock conversion: {problem}")


def _int_in(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if is_int(value) and lo <= value <= hi else f"an int in [{lo}, {hi}]"
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
        if not (isinstance(m, dict) and all(is_int(m.get(f)) for f in _CLOCK_SYNC_FIELDS)
                and m["uncertainty_ns"] >= 0 and abs(m["offset_ns"]) < MAX_UNIX_NS):
            return f"{expected}; entry {m!r:.60} is not"
    return None


def _attach_info(value: Any) -> str | None:
    """hooktrace attach's ``info["attach"]`` (hooktrace/record/attach_agent.py)."""
    ok = (isinstance(value, dict) and isinstance(value.get("first_step_partial"), bool)
          and isinstance(value.get("compiled_before"), bool)
          and is_int(value.get("attached_unix_ns")))
    return None if ok else ("{first_step_partial, compiled_before: true or false, "
                            "attached_unix_ns: an int}")


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


# Nested values (issue #46: one value of another type in a CRC-correct file was a
# traceback at 6 sites of summary, report, export and stacks): a check of an object's
# fields or a list's items says where inside the value it failed, and what it found.
Check = Callable[[Any], "str | None"]


class _Inside(str):
    """A finding inside a value: ``["threads"][0]["since_ns"]: expected ..., found ...``
    (check_info prints it after the key as it is)."""


def _inside(where: str, check: Check, value: Any) -> str | None:
    found = check(value)
    if found is None:
        return None
    if isinstance(found, _Inside):
        return _Inside(where + found)
    return _Inside(f"{where}: expected {found}, found {value!r:.60}")


def _object(label: str, fields: dict[str, Check]) -> Check:
    """An object whose listed fields, where present, pass their checks (others are
    free-form)."""
    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return label
        for key, sub in fields.items():
            if key in value:
                found = _inside(f"[{json.dumps(key)}]", sub, value[key])
                if found is not None:
                    return found
        return None
    return check


def _list_of(item: Check, label: str, *, keyed: bool = False) -> Check:
    """A list whose items pass ``item``; ``keyed``: an object of string keys, each value
    passing ``item``."""
    def check(value: Any) -> str | None:
        if not isinstance(value, dict if keyed else list):
            return label
        for k, x in value.items() if isinstance(value, dict) else enumerate(value):
            found = _inside(f"[{json.dumps(k)[:40]}]", item, x)  # ([0] for an index)
            if found is not None:
                return found
        return None
    return check


def _or_none(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


_STR = _of_type(str, "a string")
_COUNT = _int_in(0, 2**63 - 1)
_ANY_INT = _int_in(-(2**63), 2**63 - 1)
_STRINGS = _list_of(_STR, "a list of strings")

# flight-recorder dumps (hooktrace.record.flight.write_dump): read by summary, report,
# stacks (hooktrace.text.describe_dump, hooktrace/commands/stacks.py)
_dump = _object("an object (a flight-recorder dump: reason, step, threads)", {
    "reason": _STR, "time_unix_ns": _COUNT, "step": _COUNT, "exception": _STR,
    "error_in": _or_none(_STR),
    "threads": _list_of(_object("an object (a thread: tid, name, open, since_ns)", {
        "tid": _COUNT, "name": _STR, "open": _STRINGS, "since_ns": _ANY_INT,
        "python_stack": _STRINGS}), "a list of threads"),
    "python_stacks": _list_of(_STRINGS, "an object mapping threads to their stack's lines",
                              keyed=True),
})
# --max-disk (hooktrace.record.streaming): the summary's notes, the segments' loading
_rolling = _object("an object (--max-disk: newest, stem, max_disk, ...)", {
    "newest": _STR, "stem": _STR, "max_disk": _COUNT, "segment_bytes": _COUNT,
    **{k: _COUNT for k in ("segments", "rolled_off_segments", "rolled_off_events",
                           "rolled_off_bytes", "full_disk_rolled_off_segments",
                           "full_disk_lost_events", "events_written", "segments_loaded")},
    "missing_segments": _STRINGS,
})
# schedule windows (hooktrace.record.windows): diff's window numbers, the Parquet export's
_window = _object("an object (a schedule window: first_step, last_step, complete)", {
    "first_step": _COUNT, "last_step": _COUNT, "complete": _of_type(bool, "true or false")})
# flops=True (hooktrace.record.flops; hooktrace.analysis.flops reads it)
_FLOPS_PER_MODULE = _list_of(_COUNT, "an object mapping modules to FLOPs", keyed=True)
_flops = _object("an object (flops=True: signatures, calls, counted)", {
    "signatures": _list_of(_object("an object (forward, backward)", {
        "forward": _FLOPS_PER_MODULE, "backward": _FLOPS_PER_MODULE}), "a list of signatures"),
    "calls": _list_of(_COUNT, "a list of signature indices"),
    "counted": _list_of(_COUNT, "a list of root call numbers"),
})


_INFO_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "pid": _int_in(1, MAX_PID),
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
    "start_unix_ns": _int_in(0, MAX_UNIX_NS - 1),
    "stop_unix_ns": _int_in(0, MAX_UNIX_NS - 1),
    "thread_names": _thread_names,
    "cut": _of_type(str, "a string"),
    # kernel call sites of compiled code (issue #18): [kernel, module path, phase]
    "kernel_sites": _kernel_sites,
    # trace(shapes=True) (issue #19): "dtype[d0,d1];dtype[...]" per signature index
    "shape_signatures": _string_list,
    # many ranks (issue #11, hooktrace/record/distributed.py)
    "rank": _int_in(0, _MAX_RANK - 1),
    "world_size": _int_in(1, _MAX_RANK),
    "local_rank": _int_in(0, _MAX_RANK - 1),
    "local_world_size": _int_in(1, _MAX_RANK),
    "backend": _of_type(str, "a string"),
    "rank_source": _of_type(str, "a string"),
    "clock_offset_ns": _int_in(-MAX_UNIX_NS, MAX_UNIX_NS),
    "clock_offset_uncertainty_ns": _int_in(0, MAX_UNIX_NS),
    "clock_offset_injected_ns": _int_in(-MAX_UNIX_NS, MAX_UNIX_NS),
    "clock_sync": _clock_sync,
    "memory": _memory_info,
    # hooktrace attach (issue #47): the first step is partial; compiled before or not
    "attach": _attach_info,
    # flops=True on a CUDA device: its name picks the peak for MFU
    "device_name": _STR,
    "dump": _dump,
    "rolling": _rolling,
    "window": _window,
    "flops": _flops,
}


def check_info(name: str, meta_bytes: bytes, meta: dict[str, Any], pid: int,
                base: int = HEADER_SIZE) -> None:
    for key, check in _INFO_CHECKS.items():
        if key not in meta:
            continue
        expected = check(meta[key])
        if isinstance(expected, _Inside):  # (says where inside, and what it found)
            meta_error(name, meta_bytes, key, expected, base)
        if expected:
            meta_error(name, meta_bytes, key, f"expected {expected}, found {meta[key]!r:.60}",
                        base)
    if "rank" in meta and "world_size" in meta and meta["rank"] >= meta["world_size"]:
        meta_error(name, meta_bytes, "rank", f"expected a rank below world_size "
                                              f"{meta['world_size']}, found {meta['rank']}", base)
    if "pid" in meta and meta["pid"] != pid:
        meta_error(name, meta_bytes, "pid", f"expected the header's pid {pid}, found "
                                             f"{meta['pid']}", base)


def recorded_interval(name: str, meta_bytes: bytes, meta: dict[str, Any], clock: Clock,
                       base: int = HEADER_SIZE, clock_offset: int = 48,
                       ) -> tuple[int, int] | None:
    """[start, stop] widened by INTERVAL_SLACK_NS when the run recorded both, else None.

    ``meta_bytes`` (at file offset ``base``) holds stop_unix_ns; ``clock_offset`` is
    where the clock's unix_ns0 lies, for messages."""
    if "start_unix_ns" not in meta or "stop_unix_ns" not in meta:
        return None
    start, stop = meta["start_unix_ns"], meta["stop_unix_ns"]
    if stop < start:
        meta_error(name, meta_bytes, "stop_unix_ns",
                    f"expected a time at or after start_unix_ns {start}, found {stop}", base)
    lo, hi = start - INTERVAL_SLACK_NS, stop + INTERVAL_SLACK_NS
    if not lo <= clock.unix_ns0 <= hi:
        # the conversion is measured at the session's start, inside the run
        raise TraceFileError(
            name, clock_offset, f"clock conversion: expected unix_ns0 within the recorded interval "
                      f"[{start}, {stop}] (+-{INTERVAL_SLACK_NS} ns), found {clock.unix_ns0}",
        )
    return lo, hi


def _string_at(name: str, meta_bytes: bytes, strings: list[str], idx: Any, key: str,
               what: str) -> str:
    if not is_int(idx) or not 0 <= idx < len(strings):
        meta_error(
            name, meta_bytes, key,
            f"{what}: string index {idx!r:.40} out of range "
            f"(the string table has {len(strings)} strings)",
        )
    return strings[idx]


def resolve_modules(name: str, meta_bytes: bytes, raw: Any,
                     strings: list[str]) -> list[tuple[str, str]]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        meta_error(name, meta_bytes, "modules",
                    f"expected a list of [name_idx, type_idx], found {raw!r:.60}")
    modules: list[tuple[str, str]] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, list) or len(entry) != 2:
            meta_error(name, meta_bytes, "modules",
                        f"[{i}]: expected [name_idx, type_idx], found {entry!r:.60}")
        modules.append((
            _string_at(name, meta_bytes, strings, entry[0], "modules", f"[{i}][0]"),
            _string_at(name, meta_bytes, strings, entry[1], "modules", f"[{i}][1]"),
        ))
    return modules


def resolve_node_names(name: str, meta_bytes: bytes, raw: Any, strings: list[str]) -> list[str]:
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        meta_error(name, meta_bytes, "node_names",
                    f"expected a list of string indices, found {raw!r:.60}")
    return [_string_at(name, meta_bytes, strings, idx, "node_names", f"[{i}]")
            for i, idx in enumerate(raw)]


def validate_events(
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

    def check(bad: np.ndarray, field: str, message: Callable[[int], str]) -> None:
        """Fail on ``bad`` (event indexes), if any: ``message(i)`` says what the first holds."""
        if bad.size:
            i = int(bad[0])
            raise TraceFileError(name, offset_of(i) + field_offset(field),
                                 f"event {i}: {message(i)} ({bad.size} bad events in all)")

    kind = np.ascontiguousarray(events["kind"])
    valid = np.zeros(256, dtype=bool)
    valid[list(READABLE_KINDS)] = True
    check(np.flatnonzero(~valid[kind]), "kind",
          lambda i: f"expected kind in {list(READABLE_KINDS)}, found {int(kind[i])}")
    ids = events["id"]
    is_forward = (kind == ENTER) | (kind == EXIT) | (kind == NUMERICS) | (kind == SHAPES)
    check(np.flatnonzero(is_forward & (ids >= n_modules)), "id",
          lambda i: f"module id {int(ids[i])} out of range (the module table has {n_modules} modules)")
    # NODE_END's id is the graph task id (csrc/backward.h), not a name
    check(np.flatnonzero((kind == NODE_BEGIN) & (ids >= n_nodes)), "id",
          lambda i: f"node name id {int(ids[i])} out of range "
                    f"(the node name table has {n_nodes} names)")
    check(np.flatnonzero((kind == STEP) & (ids != 0)), "id",
          lambda i: f"expected id 0 on a step mark, found {int(ids[i])}")
    check(np.flatnonzero(((kind == KERNEL_BEGIN) | (kind == KERNEL_END)) & (ids >= n_sites)), "id",
          lambda i: f"kernel site {int(ids[i])} out of range (the kernel_sites table "
                    f"has {n_sites} sites)")
    # shape events: two signature indexes (or SHAPE_UNKNOWN: the table was full)
    shp = np.flatnonzero(kind == SHAPES)
    if shp.size:
        seq = events["seq"][shp]
        for half in (seq & np.uint64(0xFFFFFFFF), seq >> np.uint64(32)):
            check(shp[(half >= n_shapes) & (half != SHAPE_UNKNOWN)], "seq",
                  lambda i: f"shape signature {int(half[np.searchsorted(shp, i)])} out of range "
                            f"(the shape_signatures table has {n_shapes})")
    _validate_gpu(events, kind, n_modules, n_sites, interval, check)
    # memory samples: bytes now (seq) and the peak (id | rf_tid << 32) are int64 >= 0
    mem = np.flatnonzero((kind == MEM_CPU) | (kind == MEM_CUDA))
    if mem.size:
        check(mem[(events["seq"][mem] >> np.uint64(62)) != 0], "seq",
              lambda i: f"expected a memory sample's bytes below 2**62, found {int(events['seq'][i])}")
        check(mem[(events["rf_tid"][mem] >> np.uint32(30)) != 0], "rf_tid",
              lambda i: "expected a memory sample's peak below 2**62, found high "
                        f"bits {int(events['rf_tid'][i])}")
    # The recorder sets FLAG_ERROR on EXITs, FLAG_NO_GRAD / FLAG_EVAL_MODE on ENTERs
    # only, and never writes the padding.
    # (Each check scans the nonzero/too-large values only: a load is I/O bound.)
    flagged = np.flatnonzero(events["flags"])
    flags = events["flags"][flagged]
    on = kind[flagged]
    check(flagged[~(((on == EXIT) & (flags == FLAG_ERROR))
                    | ((on == ENTER) & ((flags & ~np.uint8(ENTER_FLAGS)) == 0))
                    | (((on == NUMERICS) | (on == NUMERICS_VALUE))
                       & ((flags & ~np.uint8(NUM_FLAGS)) == 0))
                    | ((on == GPU_MARK) & np.isin(flags, GPU_MARK_FLAGS))
                    | ((on == CUPTI_KERNEL) & np.isin(flags & 3, (1, 2, 3)))
                    | ((on == CUPTI_GRAPH_NODE) & np.isin(flags, (1, 2))))], "flags",
          lambda i: f"expected flags 0 (or {FLAG_ERROR} on an EXIT, a combination of "
                    f"{ENTER_FLAGS} on an ENTER, of {NUM_FLAGS} on numerics, one of "
                    f"{list(GPU_MARK_FLAGS)} on a GPU mark, a record kind 1-3 | device "
                    "<< 2 on a kernel record, 1 or 2 on a graph node), found "
                    f"{int(events['flags'][i])} on kind {int(kind[i])}")
    pad = events["pad"]
    if pad.any():
        check(np.flatnonzero(pad), "pad", lambda i: "expected zero padding")
    tid = events["tid"]
    if int(tid.max()) > MAX_TID:
        check(np.flatnonzero(tid > MAX_TID), "tid",
              lambda i: f"expected a thread id of at most {MAX_TID}, found {int(tid[i])}")
    _validate_times(events, clock, interval, check)
    _validate_steps(events, kind, clock, check)


_Check = Callable[[np.ndarray, str, Callable[[int], str]], None]


def _validate_gpu(events: np.ndarray, kind: np.ndarray, n_modules: int, n_sites: int,
                  interval: tuple[int, int] | None, check: _Check) -> None:
    """Device time (csrc/gpu_time.h): a GPU mark names a module (or GPU_NO_MODULE in
    backward), or a kernel site; a GPU time is Unix ns within the run and names a
    device index."""
    marks = np.flatnonzero(kind == GPU_MARK)
    if marks.size:
        ids = events["id"][marks]
        site = (events["flags"][marks] & GPU_KERNEL) != 0
        check(marks[~site & (ids >= n_modules) & (ids != GPU_NO_MODULE)], "id",
              lambda i: f"GPU mark's module id {int(events['id'][i])} out of range "
                        f"(the module table has {n_modules} modules)")
        check(marks[site & (ids >= n_sites)], "id",
              lambda i: f"GPU mark's kernel site {int(events['id'][i])} out of range "
                        f"(the kernel_sites table has {n_sites} sites)")
    times = np.flatnonzero(kind == GPU_TIME)
    if times.size:
        t = events["seq"][times].view(np.int64)
        lo, hi = interval if interval is not None else (0, MAX_UNIX_NS)
        check(times[(t < lo) | (t > hi)], "seq",
              lambda i: f"expected a GPU time within [{lo}, {hi}] Unix ns, found "
                        f"{int(np.uint64(events['seq'][i]).view(np.int64))}")
        check(times[events["rf_tid"][times] > 0x7FFF], "rf_tid",
              lambda i: f"expected a device index below 32768 on a GPU time, found "
                        f"{int(events['rf_tid'][i])}")


def _validate_steps(events: np.ndarray, kind: np.ndarray, clock: Clock, check: _Check) -> None:
    """Step marks (seq: the step's number) count up from 0: each number below
    ``MAX_STEP`` and, in time order, each mark's number above the one before
    (a gap is steps lost to a full buffer; a repeat or a step back no recorder writes)."""
    marks = np.flatnonzero(kind == STEP)
    if not marks.size:
        return
    number = events["seq"][marks]
    check(marks[number >= np.uint64(MAX_STEP)], "seq",  # found: -1, not 2**64-1
          lambda i: "expected a step number in [0, 2**62), found "
                    f"{int(np.uint64(events['seq'][i]).view(np.int64))}")
    if marks.size < 2:
        return
    t = (events["t"][marks] - np.uint64(clock.ticks0)).view(np.int64)
    order = np.lexsort((number, t))  # by time; marks at the same tick by number
    n = number[order]
    later = np.flatnonzero(n[1:] <= n[:-1]) + 1
    if later.size:
        i, before = int(marks[order[later[0]]]), int(marks[order[later[0] - 1]])
        check(np.sort(marks[order[later]]), "seq",
              lambda _: f"step {int(events['seq'][i])} comes after step "
                        f"{int(events['seq'][before])} (event {before}): expected step "
                        "numbers that increase with time")


def _validate_times(events: np.ndarray, clock: Clock, interval: tuple[int, int] | None,
                    check: _Check) -> None:
    """Timestamps convert without overflow, stay in the run, never go back on a thread."""
    # Same signed tick delta as Clock.to_unix_ns, converted in float first so that
    # a wild tick count is caught before an int64 conversion could wrap it.
    delta = (np.ascontiguousarray(events["t"]) - np.uint64(clock.ticks0)).view(np.int64)
    approx = float(clock.unix_ns0) + delta * clock.ns_per_tick
    lo, hi = interval if interval is not None else (0, MAX_UNIX_NS)
    # float rounding is far below 1 us; only times that close to a bound need the
    # exact int64 conversion to decide
    outside = ~((approx >= lo + 1e3) & (approx <= hi - 1e3))
    near = np.flatnonzero(outside & (approx >= lo - 1e3) & (approx <= hi + 1e3))
    if near.size:
        exact = clock.to_unix_ns(events["t"][near])
        outside[near] = (exact < lo) | (exact > hi)
    where = ("the recorded interval (start_unix_ns/stop_unix_ns +- "
             f"{INTERVAL_SLACK_NS} ns)" if interval is not None else "[0, 2**62)")
    check(np.flatnonzero(outside), "t",
          lambda i: f"expected a time within {where}: [{lo}, {hi}] Unix ns, found "
                    + (f"{approx[i]:.0f}" if math.isfinite(approx[i]) else "overflow"))
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

    def went_back(i: int) -> str:
        earlier = np.flatnonzero((tid[:i] == tid[i]) & (delta[:i] > delta[i]))[0]
        return (f"time goes back on thread {int(tid[i])}: {approx[i]:.0f} ns after "
                f"{approx[earlier]:.0f} ns at event {int(earlier)} (expected "
                "non-decreasing times per thread)")
    check(np.sort(np.array(back, dtype=np.int64)), "t", went_back)
