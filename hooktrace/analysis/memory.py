"""Memory per module call: what ``trace(model, memory=True)`` recorded, per span.

**Recording** (``csrc/memory.h``). Right after every module enter/exit and
autograd node begin/end, on the same thread and with the same time, the
recorder writes a memory sample: ``MEM_CPU`` (CPU bytes allocated now through
hooktrace's counting CPU allocator, and the highest value since the previous
CPU sample of any thread) and, on a CUDA run, ``MEM_CUDA`` (the device's
allocated bytes now, and its high-water mark, as
``torch.cuda.memory_allocated``/``max_memory_allocated`` report them).

**Per call** (:func:`span_memory`), for forward and backward spans alike:

* ``enter``/``exit``: bytes allocated at the call's first and last event (a
  backward span's first node begin and last node end);
* ``peak``: the highest value in between. CPU: exact, from every thread's
  samples in time order (the counter is process-wide). CUDA: exact when the
  device's high-water mark rose during the call (the new mark is the peak);
  otherwise the highest sampled value, a lower bound (``exact`` False), since
  hooktrace never resets the mark the user may be reading;
* ``net`` = exit - enter: what the call left allocated (forward: activations
  kept for backward plus its output); ``peak_above`` = peak - enter.

The CPU counter counts tensors allocated while a memory trace records: a tensor
allocated before it started and freed inside a call is not subtracted (as
``torch.profiler``'s ``profile_memory`` does not). A span whose enter or exit
sample is missing (dropped with a full buffer, an unfinished call) has
``known`` False and counts in no column.

**Shown** by :class:`MemoryColumns`, the column provider (hooktrace.analysis.columns):
the summary's columns per device (:func:`memory_columns`), the spans table's ``mem_*``
(the first device), the aggregates' ``mem_peak_bytes`` (the highest over the devices).

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 6, 2, 6]      # ENTER, its CPU sample, EXIT, its CPU sample
    >>> ev["t"] = [10, 10, 30, 30]
    >>> ev["seq"] = [0, 100, 0, 400]   # samples: bytes allocated now
    >>> ev["id"] = [0, 100, 0, 900]    # samples: the peak since the previous one
    >>> trace = TraceData(ev, [("", "Net")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 1, "hostname": "h", "dropped_events": 0,
    ...                    "overwritten_events": 0, "memory": {"devices": ["cpu"]}})
    >>> m = span_memory(trace, "cpu")
    >>> m.net.tolist(), m.peak_above.tolist()
    ([300], [800])
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace._events import ENTER, EXIT, MEM_CPU, MEM_CUDA, NODE_BEGIN, NODE_END
from hooktrace.analysis._summary_columns import UNATTRIBUTED, group_mode, mode_groups
from hooktrace.analysis.calls import MEASURED
from hooktrace.analysis.column_provider import (
    Column,
    ColumnProvider,
    SpanColumn,
    SummaryPart,
    TextColumn,
    WindowGroup,
    measured_only,
)
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, counter_changes
from hooktrace.text import format_bytes

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls
    from hooktrace.reading import TraceData

__all__ = ["MEMORY_KEYS", "MemoryColumns", "MemorySamples", "SpanMemory", "add_memory",
           "counter_name", "counter_points", "memory_columns", "memory_devices", "samples",
           "span_memory"]

# The summary's memory columns (recorded only with trace(memory=True)), per device: net
# bytes a call leaves allocated (mean over calls) and the peak above its enter (max
# over calls).
MEMORY_KEYS = ("mem_net", "mem_peak", "bwd_mem_net", "bwd_mem_peak")


def memory_devices(trace: TraceData) -> list[str]:
    """The devices whose memory ``trace`` recorded: ``"cpu"``, ``"cuda:N"``; [] when
    it was recorded without ``memory=True``."""
    mem = trace.info.get("memory")
    devices = mem.get("devices") if isinstance(mem, dict) else None
    return [str(d) for d in devices] if isinstance(devices, list) else []


def _kind_of(device: str) -> int:
    return MEM_CPU if device == "cpu" else MEM_CUDA


@dataclass(frozen=True)
class MemorySamples:
    """A device's samples, all threads, in time order (stable: recorded order per thread).

    ``bytes``: allocated at the sample; ``peak``: CPU, the highest value since the
    previous sample; CUDA, the device's high-water mark. ``owner``: the kind of the
    event the sample follows (ENTER, EXIT, NODE_BEGIN, NODE_END). ``index``: the
    sample's row in ``trace.events``.
    """

    device: str
    t_ns: np.ndarray
    bytes: np.ndarray
    peak: np.ndarray
    tid: np.ndarray
    owner: np.ndarray
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.t_ns)


def samples(trace: TraceData, device: str) -> MemorySamples:
    """The samples of ``device`` that follow an event of their own thread."""
    ev = trace.events
    kind = ev["kind"]
    is_sample = (kind == MEM_CPU) | (kind == MEM_CUDA)
    # Each thread's events in recorded order (the file keeps it per thread).
    order = np.argsort(ev["tid"], kind="stable")
    k, tid = kind[order], ev["tid"][order]
    pos = np.arange(len(order))
    # the last non-sample event at or before each position, and its thread
    last = np.maximum.accumulate(np.where(is_sample[order], -1, pos)) if len(pos) else pos
    mine = np.flatnonzero((k == _kind_of(device)) & (last >= 0))
    owner_pos = last[mine]
    ok = tid[owner_pos] == tid[mine]
    owner_kind = k[owner_pos]
    ok &= np.isin(owner_kind, (ENTER, EXIT, NODE_BEGIN, NODE_END))
    rows = order[mine[ok]]
    owner_kind = owner_kind[ok]
    t_ns = trace.clock.to_unix_ns(ev["t"][rows])
    by_time = np.argsort(t_ns, kind="stable")
    rows, owner_kind, t_ns = rows[by_time], owner_kind[by_time], t_ns[by_time]
    sel = ev[rows]
    peak = (sel["id"].astype(np.uint64) | (sel["rf_tid"].astype(np.uint64) << np.uint64(32)))
    return MemorySamples(device, t_ns, sel["seq"].view(np.int64).copy(),
                         peak.view(np.int64), sel["tid"].copy(), owner_kind.astype(np.uint8),
                         rows.astype(np.int64))


@dataclass(frozen=True)
class SpanMemory:
    """Per span of ``trace.spans()`` (same order): bytes at enter and exit, the peak in
    between (-1 where unknown), whether both samples were found (``known``) and whether
    the peak is exact (``exact``; CUDA may give a lower bound)."""

    device: str
    enter: np.ndarray
    exit: np.ndarray
    peak: np.ndarray
    known: np.ndarray
    exact: np.ndarray

    @property
    def net(self) -> np.ndarray:
        """exit - enter (0 where unknown)."""
        return np.where(self.known, self.exit - self.enter, 0)

    @property
    def peak_above(self) -> np.ndarray:
        """peak - enter (0 where unknown)."""
        return np.where(self.known, self.peak - self.enter, 0)


def _lookup(times: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Index in sorted ``times`` equal to each ``wanted``, -1 when absent."""
    i = np.searchsorted(times, wanted)
    i_c = np.minimum(i, max(len(times) - 1, 0))
    hit = (i < len(times)) & (times[i_c] == wanted) if len(times) else np.zeros(len(wanted), bool)
    return np.where(hit, i_c, -1)


def span_memory(trace: TraceData, device: str) -> SpanMemory:
    """Memory of every span of ``trace`` on ``device`` (see the module docstring)."""

    spans = trace.spans()
    n = len(spans)
    s = samples(trace, device)
    pos_enter = np.full(n, -1, np.int64)
    pos_exit = np.full(n, -1, np.int64)
    backward = spans.cat == CAT_BACKWARD
    # Forward (and recompute) calls: the samples after their ENTER and EXIT, found on
    # their own thread by time (a thread's ENTER times strictly increase).
    fwd = np.flatnonzero(~backward)
    for tid in np.unique(spans.tid[fwd]).tolist():
        calls = fwd[spans.tid[fwd] == tid]
        on_thread = s.tid == tid
        for owner, wanted, out in ((ENTER, spans.start_ns, pos_enter),
                                   (EXIT, spans.end_ns, pos_exit)):
            where = np.flatnonzero(on_thread & (s.owner == owner))
            hit = _lookup(s.t_ns[where], wanted[calls])
            out[calls[hit >= 0]] = where[hit[hit >= 0]]
    # Backward spans: the sample after the first node's begin and the last node's end,
    # whichever thread ran them. A span reaching over its module's hooks starts at the
    # previous node's end, or ends at the next node's begin (csrc/backward_spans.cpp):
    # then the other kind's sample is the one at that time.
    bwd = np.flatnonzero(backward)
    if len(bwd):
        for owners, wanted, out in (((NODE_BEGIN, NODE_END), spans.start_ns, pos_enter),
                                    ((NODE_END, NODE_BEGIN), spans.end_ns, pos_exit)):
            for owner in owners:
                todo = bwd[out[bwd] < 0]
                where = np.flatnonzero(s.owner == owner)
                hit = _lookup(s.t_ns[where], wanted[todo])
                out[todo[hit >= 0]] = where[hit[hit >= 0]]
    known = (pos_enter >= 0) & (pos_exit > pos_enter)
    enter = np.where(known, s.bytes[np.maximum(pos_enter, 0)] if len(s) else 0, -1)
    exit_ = np.where(known, s.bytes[np.maximum(pos_exit, 0)] if len(s) else 0, -1)
    peak = np.full(n, -1, np.int64)
    exact = np.zeros(n, bool)
    k = np.flatnonzero(known)
    if len(k):
        lo, hi = pos_enter[k] + 1, pos_exit[k] + 1  # samples (enter, exit]
        bounds = np.empty(2 * len(k), np.int64)
        bounds[0::2], bounds[1::2] = lo, hi
        # reduceat over consecutive pairs; index len(s) is not allowed, so pad one
        if device == "cpu":
            high = np.maximum.reduceat(np.append(s.peak, 0), bounds)[0::2]
            peak[k] = np.maximum(high, enter[k])
            exact[k] = True
        else:
            high = np.maximum.reduceat(np.append(s.bytes, 0), bounds)[0::2]
            sampled = np.maximum(high, enter[k])
            mark_in, mark_out = s.peak[pos_enter[k]], s.peak[pos_exit[k]]
            rose = mark_out > mark_in
            peak[k] = np.where(rose, np.maximum(mark_out, sampled), sampled)
            exact[k] = rose
    return SpanMemory(device, enter, exit_, peak, known, exact)


def counter_name(device: str) -> str:
    """The name of ``device``'s counter track in the exports."""
    return f"memory {device} (hooktrace)"


def counter_points(trace: TraceData, device: str, window: tuple[int, int] | None = None,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(Unix ns, bytes allocated) of ``device``'s counter track: every sample where the
    value changes (and the first and last), inside ``window`` when given."""
    s = samples(trace, device)
    return counter_changes(s.t_ns, s.bytes, window)


def memory_columns(device: str) -> tuple[str, ...]:
    """The summary's memory columns of ``device`` (``"cpu"`` unprefixed, ``"cuda:N"``
    as ``cuda_...``)."""
    prefix = "" if device == "cpu" else "cuda_"
    return tuple(prefix + k for k in MEMORY_KEYS)


def add_memory(rows: list[dict[str, Any]], trace: TraceData, device: str) -> list[str]:
    """Fill ``device``'s memory columns of the summary's ``rows``; returns notes."""
    spans = trace.spans()
    mem = span_memory(trace, device)
    keys = memory_columns(device)
    by_module: dict[tuple[str, str], dict[str, int]] = {}
    groups, n_mod = mode_groups(spans)
    for phase, cats in ((0, (CAT_FORWARD,)), (2, (CAT_BACKWARD,))):
        sel = np.flatnonzero(np.isin(spans.cat, cats) & mem.known)
        if not len(sel):
            continue
        module = groups[sel]
        n = 2 * n_mod
        calls = np.bincount(module, minlength=n)
        net = np.bincount(module, weights=mem.net[sel].astype(np.float64), minlength=n)
        peak = np.full(n, np.iinfo(np.int64).min, np.int64)
        np.maximum.at(peak, module, mem.peak_above[sel])
        for m in np.flatnonzero(calls).tolist():
            values = by_module.setdefault(
                (trace.modules[m % n_mod][0], group_mode(m, n_mod)), {})
            values[keys[phase]] = int(round(net[m] / calls[m]))
            values[keys[phase + 1]] = int(peak[m])
    for row in rows:
        values = (by_module.get((row["module"], row["mode"]), {})
                  if row["module"] != UNATTRIBUTED else {})
        for key in keys:
            row[key] = values.get(key)
    unknown = int(np.count_nonzero(~mem.known))
    # (each note fits the 120-column table with its "note: " prefix, for "cuda:NNN" too)
    notes = [f"memory ({device}): {keys[0]} = bytes a call leaves allocated (mean), "
             f"{keys[1]} = peak above its start (max)"]
    if unknown:
        notes.append(f"memory ({device}): {unknown} call(s) without both samples left out")
    if device != "cpu" and len(mem.exact) and not mem.exact[mem.known].all():
        notes.append(f"memory ({device}): where the device's high-water mark did not rise in "
                     "a call, its peak is a lower bound")
    return notes


def memory_peaks(trace: TraceData) -> np.ndarray | None:
    """Per span, the highest memory peak over the recorded devices (-1: unknown), when
    memory was recorded (``memory=True``), else None."""
    devices = memory_devices(trace)
    if not devices:
        return None
    peak = np.full(len(trace.spans()), -1, np.int64)
    for device in devices:
        sm = span_memory(trace, device)
        peak = np.maximum(peak, np.where(sm.known, sm.peak, -1))
    return peak


class MemoryColumns(ColumnProvider):
    """Memory's columns (``trace(memory=True)``) in the summary, the spans table and the
    aggregates."""

    name = "memory"
    columns = (
        Column("mem_device", "string", "memory device sampled (memory=True)", order=60),
        Column("mem_enter_bytes", "int64", "bytes allocated at enter", order=60),
        Column("mem_exit_bytes", "int64", "bytes allocated at exit", order=60),
        Column("mem_peak_bytes", "int64", "peak bytes between enter and exit", order=60,
               check="nonnegative"),
        Column("mem_peak_bytes", "int64", "peak bytes allocated in the calls (memory=True)",
               "aggregates", 30, "nonnegative", reduce="max", title="mem peak",
               tip="the highest memory peak inside a call (memory=True)"))
    text_flag = "memory"
    flag_help = ("add memory per module call to the table (recorded with "
                 "trace(model, memory=True); --wide, --csv and --json always have it)")
    # (each device's columns: memory_columns)
    headers = {key: (key, what) for device in ("cpu", "cuda") for key, what in zip(
        memory_columns(device), (
            "bytes a forward call leaves allocated (activations kept for backward and its "
            "output), mean over calls (trace(memory=True))",
            "peak allocated bytes above the forward call's start, max over calls",
            "bytes a backward span leaves allocated, mean over calls",
            "peak allocated bytes above the backward span's start, max over calls"),
        strict=True)}

    def text_columns(self, keys: Collection[str], rows: Sequence[dict[str, Any]], *,
                     wide: bool, backward: bool) -> list[TextColumn]:
        mine = [k for k in keys if k in self.headers]
        if not wide and any(k.startswith("cuda_") for k in mine):
            mine = [k for k in mine if k.startswith("cuda_")]  # (the device's, when recorded)
        return [(self.headers[k][0], k) for k in mine if backward or "bwd_" not in k]

    def format_cell(self, key: str, value: Any) -> str | None:
        return format_bytes(value) if "mem_" in key else None

    def recorded(self, trace: TraceData) -> bool:
        return bool(memory_devices(trace))

    def note_shown(self, note: str, shown: Collection[str]) -> bool | None:
        if note.startswith("memory (") and "mem_net = " in note:
            return any("mem_" in k for k in shown)
        return None

    def facts(self, root: Mapping[str, Any] | None, columns: Collection[str]) -> list[str]:
        # the device's, when recorded; else the CPU's
        for prefix, device in (("cuda_", "CUDA"), ("", "CPU")):
            if root is not None and root.get(f"{prefix}mem_peak") is not None:
                return [f"{device} memory: forward peak +{format_bytes(root[prefix + 'mem_peak'])}"
                        f", keeps {format_bytes(root[prefix + 'mem_net'])} for backward"]
        return []

    def summary(self, rows: list[dict[str, Any]], trace: TraceData,
                options: Mapping[str, Any]) -> SummaryPart:
        part = SummaryPart()
        for device in memory_devices(trace):
            part.columns += memory_columns(device)
            part.notes += add_memory(rows, trace, device)
        return part

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        device = memory_devices(trace)[0]
        mem = span_memory(trace, device)
        return {"mem_device": (*measured_only(np.zeros(n, np.int64), mem.known, m), [device]),
                "mem_enter_bytes": measured_only(mem.enter, mem.known, m),
                "mem_exit_bytes": measured_only(mem.exit, mem.known, m),
                "mem_peak_bytes": measured_only(mem.peak, mem.known & (mem.peak >= 0), m)}

    def aggregate(self, trace: TraceData, calls: Calls
                  ) -> Callable[[WindowGroup], dict[str, list[Any]]] | None:
        peaks = memory_peaks(trace)
        if peaks is None:
            return None
        measured_span = np.where(calls.timing == MEASURED, calls.span, -1)

        def values(group: WindowGroup) -> dict[str, list[Any]]:
            order = np.argsort(calls.module[group.sel], kind="stable")
            span = measured_span[group.sel][order]
            peak = np.where(span >= 0, peaks[np.maximum(span, 0)], -1)
            highest = np.maximum.reduceat(peak, group.groups.starts)
            return {"mem_peak_bytes": [int(v) if v >= 0 else None for v in highest.tolist()]}

        return values
