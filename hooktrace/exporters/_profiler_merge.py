"""The merge of a hooktrace run into a torch.profiler (kineto) Chrome trace: its time
base, rebasing, rows and window (described in :mod:`hooktrace.exporters.merged`, the
exporter, which re-exports these names).

A helper, not an exporter (issue #27): both the ``merged`` exporter and the ``ranks``
exporter (one merge per rank with a profiler trace) call :func:`merge_traces`, so it
lives here and neither exporter imports the other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from hooktrace.format._kineto import BadValue, ProfilerTraceError
from hooktrace._output import check_output_path, open_output
from hooktrace.format._profiler_events import ProfilerEvents, check_base, collect, time_ns
from hooktrace.exporters._layout import UNATTRIBUTED_CAT, TrackLayout, gpu_slices, kernel_slices
from hooktrace.exporters._chrome_json import SkipFirstComma, dumps, micros
from hooktrace.exporters._chrome_events import (
    write_gpu_events,
    write_kernel_events,
    write_node_events,
    write_memory_counters,
    write_span_events,
    write_steps,
)
from hooktrace.errors import HooktraceError
from hooktrace.reading import CAT_BACKWARD, TraceData, as_data, load

__all__ = [
    "BASE_MARGIN_NS",
    "MergeError",
    "MergeResult",
    "ProfilerTraceError",
    "RunLike",
    "as_run",
    "assign_lanes",
    "check_compatible",
    "crossing",
    "merge_traces",
    "place_spans",
    "run_interval",
    "write_spans",
]

# The merged file's base is a whole second at least this long before the run, so
# profiler events from just before the run (the profiler started first) keep a
# positive ts without a second pass over the profiler trace.
BASE_MARGIN_NS = 60 * 10**9

RunLike = TraceData | str | os.PathLike[str]


class MergeError(HooktraceError):
    """The profiler trace cannot be merged with this run (other run, other process, ...)."""


@dataclass
class MergeResult:
    """What :func:`merge_traces` wrote (counts of spans by where they went)."""

    out_path: str
    profiler_events: int
    shared: int  # forward spans on the profiler's thread rows
    adjacent: int  # forward spans moved to "T forward" tracks
    backward: int  # backward spans, on "T backward" lanes
    unattributed_nodes: int  # autograd nodes of no module, on "T autograd (unattributed)"
    clipped: int  # spans cut at the profiler window's edges
    outside_window: int  # spans left out: entirely outside the window
    lanes: int  # most backward lanes any thread needed
    dropped_events: int  # events the run could not record (full buffer): spans may be missing
    base_ns: int  # the merged file's baseTimeNanoseconds


def as_run(run_or_path: RunLike) -> TraceData:
    """The run's data: ``run_or_path`` itself, a finished recorder's result, or the
    ``.htrace`` file at that path. A recorder whose block has not exited (its public
    ``done`` is False) is refused with a one-line ``MergeError``."""
    if getattr(run_or_path, "done", True) is False:
        raise MergeError("the hooktrace.trace() block has not exited yet: merge after the "
                         "with block, or merge trace.snapshot()")
    run_or_path = as_data(run_or_path)
    if isinstance(run_or_path, TraceData):
        return run_or_path
    return load(run_or_path)


def _fmt_ns(unix_ns: int) -> str:
    import datetime

    try:
        t = datetime.datetime.fromtimestamp(unix_ns // 10**9, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):  # a date datetime cannot hold: say the ns
        return f"{unix_ns} ns (Unix)"
    return f"{t:%Y-%m-%d %H:%M:%S}.{unix_ns % 10**9 // 1000:06d} UTC"


def run_interval(run: TraceData) -> tuple[int, int]:
    """The run's recording interval in Unix ns: from the session's start to its stop.

    Traces written before start/stop were recorded fall back to the spans' extent.
    """
    info = run.info
    start, stop = info.get("start_unix_ns"), info.get("stop_unix_ns")
    spans = run.spans()
    lo = [int(spans.start_ns.min())] if len(spans) else []
    hi = [int(spans.end_ns.max())] if len(spans) else []
    if isinstance(start, int):
        lo.append(start)
    if isinstance(stop, int):
        hi.append(stop)
    if not lo or not hi:
        t = int(run.clock.unix_ns0)
        return t, t
    return min(lo), max(hi)


def check_compatible(run: TraceData, p: ProfilerEvents, run_name: str) -> tuple[int, int]:
    """Refuse a profiler trace of another process or time; return its window (Unix ns)."""
    if "hooktrace" in p.top:
        raise MergeError(f"{p.path}: is a trace written by hooktrace (it has a top-level "
                         "'hooktrace' key), not a torch.profiler trace; give the profiler's own "
                         "export_chrome_trace() file")
    window = p.window_abs()
    if window is None:
        raise MergeError(f"{p.path}: the profiler trace has no timed events (no 'X' slices); "
                         "nothing to merge with")
    if p.pids and run.pid not in p.pids:
        raise MergeError(f"{p.path}: the profiler trace is of process {sorted(p.pids)} but "
                         f"{run_name} is of pid {run.pid} on {run.hostname!r}: merge the trace "
                         "recorded by the same process")
    r0, r1 = run_interval(run)
    if r1 < window[0] or r0 > window[1]:
        raise MergeError(
            f"{p.path}: the profiler trace ({_fmt_ns(window[0])} to {_fmt_ns(window[1])}) does not "
            f"overlap {run_name} ({_fmt_ns(r0)} to {_fmt_ns(r1)}): it was recorded by another "
            "run; merge the trace recorded alongside this run"
        )
    return window


# -- nesting and lanes -----------------------------------------------------


def _range_max(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(v[lo[i]:hi[i]]) per i; int64 min where the range is empty."""
    low = np.iinfo(np.int64).min
    out = np.full(len(lo), low, dtype=np.int64)
    ok = lo < hi
    if ok.any():
        idx = np.empty(2 * int(ok.sum()), dtype=np.int64)
        idx[0::2], idx[1::2] = lo[ok], hi[ok]
        # reduceat over [idx[2k], idx[2k+1]); the sentinel makes hi == len(v) valid.
        out[ok] = np.maximum.reduceat(np.append(v, low), idx)[0::2]
    return out


def crossing(s: np.ndarray, e: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each interval [s, e]: does it cross (partially overlap) any of [a, b]?

    Touching ends and containment either way are fine (strict nesting allows them).

    Example:
        >>> import numpy as np
        >>> crossing(np.array([0, 10, 20]), np.array([10, 20, 30]),
        ...          np.array([2, 15, 20]), np.array([5, 25, 30])).tolist()
        [False, True, True]
    """
    out = np.zeros(len(s), dtype=bool)
    if not len(s) or not len(a):
        return out
    # A slice starting strictly inside [s, e] and ending after e.
    o = np.argsort(a, kind="stable")
    a1, b1 = a[o], b[o]
    out |= _range_max(b1, np.searchsorted(a1, s, "right"), np.searchsorted(a1, e, "left")) > e
    # A slice ending strictly inside [s, e] and starting before s.
    o = np.argsort(b, kind="stable")
    a2, b2 = a[o], b[o]
    lo, hi = np.searchsorted(b2, s, "right"), np.searchsorted(b2, e, "left")
    out |= (lo < hi) & (-_range_max(-a2, lo, hi) < s)  # (empty ranges: -min overflows)
    return out


def assign_lanes(start: np.ndarray, end: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Lane per interval so that, within each group, every lane nests strictly.

    Greedy first fit in start order (longest first on ties): ``_C.assign_lanes``
    (csrc/lanes.h), the layout the Chrome export uses too.

    Example:
        >>> import numpy as np
        >>> assign_lanes(np.array([0, 5, 1, 8]), np.array([10, 15, 2, 9]),
        ...              np.zeros(4, np.int64)).tolist()
        [0, 1, 0, 0]
    """
    from hooktrace._native import load_native

    _C = load_native()
    return np.asarray(
        _C.assign_lanes(
            np.ascontiguousarray(start, dtype=np.int64),
            np.ascontiguousarray(end, dtype=np.int64),
            np.ascontiguousarray(group, dtype=np.uint32),
        ),
        dtype=np.int64,
    )


# -- the merge -------------------------------------------------------------


@dataclass
class _Placement:
    spans: np.ndarray  # span indices written
    start: np.ndarray  # per span (all spans): clipped/widened start, Unix ns
    end: np.ndarray
    row: np.ndarray  # per span (all spans): the tid written
    nodes: np.ndarray  # unattributed node indices written
    node_start: np.ndarray  # per node (all nodes), clipped
    node_end: np.ndarray
    node_row: np.ndarray  # per written node
    layout: TrackLayout
    thread_rows: list[int]  # OS threads with spans on their own row that the profiler did not name
    profiler_threads: list[int]  # the profiler's named thread rows of the run's process
    result: dict[str, int] = field(default_factory=dict)


def _backward_extents(run: TraceData, p: ProfilerEvents) -> tuple[np.ndarray, np.ndarray]:
    """Span start/end, backward spans widened to cover the profiler's own node ranges.

    hooktrace and the profiler time the same autograd-node RecordFunction from two
    callbacks that run one after the other, so their clock reads differ by the
    other callback's cost (~0.1 µs): a profiler node range can stick out of the
    module's backward span by that much. Each node hooktrace attributed is matched
    to the profiler's range of the same name, sequence number and forward thread
    that starts nearest to it, and its span and the span's ancestors are widened
    to contain that range.
    """
    spans = run.spans()
    start, end = spans.start_ns.copy(), spans.end_ns.copy()
    nodes = spans.nodes
    if not len(nodes) or not len(p):
        return start, end
    cols = p.columns()
    has_seq = cols["seq"] >= 0
    by_key: dict[tuple[str, int, int], list[int]] = {}
    for j in np.flatnonzero(has_seq).tolist():
        key = (p.names[int(cols["name"][j])], int(cols["seq"][j]), int(cols["fwd_tid"][j]))
        by_key.setdefault(key, []).append(j)
    node_names = run.node_names
    for i in np.flatnonzero(nodes.span >= 0).tolist():
        name_id = int(nodes.name[i])
        if name_id >= len(node_names):
            continue
        cands = by_key.get((node_names[name_id], int(nodes.seq[i]), int(nodes.fwd_tid[i])))
        if not cands:
            continue
        t = int(nodes.start_ns[i])
        j = min(cands, key=lambda k: abs(int(cols["start"][k]) - t))
        ps, pe = int(cols["start"][j]), int(cols["end"][j])
        b = int(nodes.span[i])
        while b >= 0:
            start[b] = min(int(start[b]), ps)
            end[b] = max(int(end[b]), pe)
            b = int(spans.parent[b])
    return start, end


def place_spans(run: TraceData, p: ProfilerEvents, window: tuple[int, int]) -> _Placement:
    """Decide the row of every span and unattributed node inside ``window``."""
    spans = run.spans()
    nodes = spans.nodes
    w0, w1 = window
    span_start, span_end = _backward_extents(run, p)
    keep = np.flatnonzero((span_end >= w0) & (span_start <= w1))
    start = np.maximum(span_start, w0)
    end = np.minimum(span_end, w1)
    clipped = int(np.count_nonzero((start[keep] != span_start[keep])
                                   | (end[keep] != span_end[keep])))
    backward = spans.cat[keep] == CAT_BACKWARD
    fwd, bwd = keep[~backward], keep[backward]
    cols = p.columns()
    adjacent: list[np.ndarray] = []
    own_rows: list[int] = []
    fwd_tid = spans.tid[fwd].astype(np.int64)
    for t in np.unique(fwd_tid).tolist():
        f = fwd[fwd_tid == t]
        on_row = cols["tid"] == t
        cross = crossing(start[f], end[f], cols["start"][on_row], cols["end"][on_row])
        adjacent.append(f[cross])
        if (~cross).any() and t not in p.thread_names:
            own_rows.append(t)
    moved = np.concatenate(adjacent) if adjacent else np.zeros(0, np.int64)
    loose = np.flatnonzero((nodes.span < 0) & (nodes.end_ns >= w0) & (nodes.start_ns <= w1))
    node_start = np.maximum(nodes.start_ns, w0)
    node_end = np.minimum(nodes.end_ns, w1)
    run_tids = np.union1d(np.union1d(spans.threads, spans.tid), nodes.tid).astype(np.int64)
    try:
        layout = TrackLayout(
            spans, span_start=start, span_end=end, node_start=node_start, node_end=node_end,
            backward=bwd, nodes_on_backward=np.zeros(0, np.int64), unattributed=loose,
            forward=moved, used_tids=np.append(run_tids, p.max_tid),
        )
    except ValueError as e:  # its one refusal: no 32-bit tids left above the trace's
        raise MergeError(f"{p.path}: largest tid {p.max_tid}: {e}") from None
    row = spans.tid.astype(np.uint32)
    row[bwd] = layout.backward_tid
    row[moved] = layout.forward_tid
    place = _Placement(keep, start, end, row, loose, node_start, node_end,
                       layout.unattributed_tid, layout, own_rows, sorted(p.thread_names))
    place.result = {
        "shared": int(len(fwd) - len(moved)),
        "adjacent": int(len(moved)),
        "backward": int(len(bwd)),
        "unattributed_nodes": int(len(loose)),
        "clipped": clipped,
        "outside_window": int(len(spans) - len(keep)),
        "lanes": layout.lanes,
    }
    return place


def write_spans(write: Callable[[bytes], Any], run: TraceData, place: _Placement,
                base_ns: int, window: tuple[int, int]) -> list[dict[str, Any]]:
    """Write the placed spans, unattributed nodes, steps and their rows' metadata as
    ``,\\n{event}`` items; return the ``"tracks"`` table."""
    meta = place.layout.metadata(run.pid, run.info.get("thread_names"), named=place.thread_rows,
                                 sorted_too=place.profiler_threads)
    write("".join(",\n" + dumps(m) for m in meta).encode("utf-8"))
    idx = place.spans
    write_span_events(write, run, idx, place.start[idx], place.end[idx], place.row[idx], base_ns)
    n = place.nodes
    write_node_events(write, run, n, place.node_start[n], place.node_end[n], place.node_row,
                      UNATTRIBUTED_CAT, base_ns)
    # kernels of compiled regions, in their region's slice on its row
    write_kernel_events(write, run, kernel_slices(run, idx, place.start[idx], place.end[idx],
                                                  place.row[idx]), base_ns)
    tracks = place.layout.track_table()
    step_track = write_steps(write, run, place.layout.next_tid, base_ns, window)
    # device time (trace(gpu=True)): hooktrace's "GPU d stream s" rows, per module call,
    # beside the profiler's own per-kernel GPU rows
    gpu_tracks = write_gpu_events(write, run, gpu_slices(run, window),
                                  place.layout.next_tid + 1, base_ns)
    write_memory_counters(write, run, base_ns, window)
    return tracks + ([step_track] if step_track is not None else []) + gpu_tracks


# A top-level "ts" key and its number, in an event's JSON text.
_TS_VALUE = re.compile(r'"ts"\s*:\s*(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)')


def _top_level_ts(text: str) -> tuple[int, int] | None:
    """(start, end) of the event's own "ts" number in ``text`` (not one inside its args).

    None unless there is exactly one: with two "ts" keys json keeps the last, and
    rewriting one of them would leave the event at a time that is not rebased.

    Example:
        >>> t = '{"args": {"ts": 1}, "a\\\\"ts": 2, "ts": 3}'
        >>> t[slice(*_top_level_ts(t))], _top_level_ts('{"ts": 1, "ts": 2}')
        ('3', None)
    """
    found = list(_TS_VALUE.finditer(text))
    if len(found) == 1:  # the event has a "ts" (the caller checked): this is it
        return found[0].span(1)
    # rare: "ts" in args too, or in a string; keep the matches outside strings at depth 1
    starts = {m.start(): m for m in found}
    top: list[re.Match[str]] = []
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            if depth == 1 and i in starts:
                top.append(starts[i])
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return top[0].span(1) if len(top) == 1 else None


class _NegativeTime(Exception):
    pass


class _BaseAfterEvents(Exception):
    pass


def merge_traces(
    run_or_path: RunLike,
    profiler_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    compresslevel: int = 1,
) -> MergeResult:
    """Write ``out_path``: the profiler trace, rebased, plus the run's module spans.

    ``run_or_path`` is a finished :class:`~hooktrace.Trace` (or its
    ``snapshot()``), a ``TraceData`` or a ``.htrace`` path; ``profiler_path`` a
    ``torch.profiler`` Chrome trace (``.json`` or gzip); ``out_path`` is
    gzip-compressed when it ends in ``.gz``. Raises :class:`MergeError` when the
    trace is of another process or does not overlap the run,
    :class:`~hooktrace.format._kineto.ProfilerTraceError` (naming file, line, column and
    byte, and the event's index or the key) when it is not valid trace JSON or a
    value is unusable (see ``hooktrace.format._profiler_events``), and
    :class:`~hooktrace.errors.OutputPathError` for an unusable ``out_path``.

    Example::

        merge_traces("run.htrace", "profiler.json.gz", "merged.json.gz")
    """
    inputs = [profiler_path] + ([run_or_path] if isinstance(run_or_path, (str, os.PathLike))
                                else [])
    check_output_path(out_path, inputs)
    run = as_run(run_or_path)
    run_name = os.fspath(run_or_path) if isinstance(run_or_path, (str, os.PathLike)) else "the run"
    r0, _ = run_interval(run)
    new_base = (r0 - BASE_MARGIN_NS) // 10**9 * 10**9
    known_base: int | None = None  # the profiler's base, when it follows traceEvents
    result: dict[str, int] = {}
    delta: list[int] = []  # [profiler base - new base], once known

    def rewrite_top(key: str, value: Any) -> str | None:
        if key != "baseTimeNanoseconds":
            return None
        delta[:] = [check_base(os.fspath(profiler_path), value) - new_base]
        return str(new_base)

    def rewrite_event(event: Any, text: str) -> str | None:
        if not isinstance(event, dict) or event.get("ph") == "M" or "ts" not in event:
            return None
        if not delta:
            if known_base is None:
                raise _BaseAfterEvents
            delta[:] = [known_base - new_base]
        ns = time_ns(event, "ts") + delta[0]  # (collect checked it already: a number, in range)
        if ns < 0:
            raise _NegativeTime
        where = _top_level_ts(text)
        if where is None:
            raise BadValue("has several top-level 'ts' keys (json keeps the last) or none "
                           "written as a plain number; expected exactly one, to rebase it")
        return text[: where[0]] + micros(ns) + text[where[1]:]

    def array_end(out: IO[bytes]) -> Callable[[ProfilerEvents, bool], bytes]:
        def insert(p: ProfilerEvents, nonempty: bool) -> bytes:
            if not p.base_known:
                p.base_ns = int(known_base or 0)
            window = check_compatible(run, p, run_name)
            place = place_spans(run, p, window)
            result.update(place.result, profiler_events=p.n_events)
            place_tracks[:] = [write_spans(SkipFirstComma(out.write, not nonempty), run, place,
                                           new_base, window)]
            return b""
        return insert

    def object_end(p: ProfilerEvents) -> bytes:
        from hooktrace._version import __version__

        if "hooktrace" in p.top:  # (when the key follows traceEvents, seen only now)
            check_compatible(run, p, run_name)

        block = {"version": __version__, "pid": run.pid, "hostname": run.hostname,
                 "profiler_base_ns": p.base_ns, "dropped_events": run.dropped_events,
                 "overwritten_events": run.overwritten_events, **result}
        block["tracks"] = place_tracks[0] if place_tracks else []
        extra = "" if p.base_known else f',\n"baseTimeNanoseconds":{new_base}'
        return (extra + ',\n"hooktrace":' + dumps(block) + "\n").encode("utf-8")

    place_tracks: list[list[dict[str, Any]]] = []
    for _ in range(3):
        try:
            with open_output(out_path, compresslevel=compresslevel, inputs=inputs) as out:
                collect(profiler_path, pid=run.pid, out=out, before_array_end=array_end(out),
                        before_object_end=object_end, rewrite_event=rewrite_event,
                        rewrite_top=rewrite_top)
            break
        except (_BaseAfterEvents, _NegativeTime):
            # baseTimeNanoseconds follows traceEvents, or the profiler started more
            # than BASE_MARGIN_NS before the run: learn its base and first event.
            pre = collect(profiler_path, pid=run.pid)
            known_base = pre.base_ns
            first = known_base + (pre.min_ts if pre.min_ts is not None else 0)
            if first < 0:  # (a trace without baseTimeNanoseconds: its ts are Unix times)
                raise ProfilerTraceError(f"{profiler_path}: traceEvents[{pre.min_ts_event}] is "
                                         f"at {first} Unix ns, before 1970; expected Unix times")
            new_base = min(new_base, first // 10**9 * 10**9)
            delta.clear()
            result.clear()
            place_tracks.clear()
    else:  # pragma: no cover - the third attempt has everything it needs
        raise MergeError(f"{profiler_path}: could not rebase the profiler trace")
    return MergeResult(out_path=os.fspath(out_path), base_ns=new_base,
                       dropped_events=run.dropped_events, **result)  # type: ignore[arg-type]
