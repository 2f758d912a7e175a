"""What merge and attribution need from a profiler trace, collected in one streaming pass.

Only compact columns are kept (``array('q')``, 8 bytes per value): the slices
of the run's own process (``pid`` equal to the run's) on integer thread rows,
GPU activities (kernels, memcpy, memset) with their correlation ids, the
``ac2g`` flow events that link launches to kernels, and the profiler window.
Everything else is only counted.

Every value used is checked first, so that a hostile or damaged trace is
refused with what was expected rather than failing later (an OverflowError in
``array('q')``, a TypeError for an unhashable key, a date out of range):
events are objects; ``ts``/``dur`` JSON numbers (not strings) within
±``TIME_LIMIT_NS``, ``dur`` not negative, an ``X`` event has a ``ts``; ``pid``/``tid`` int64 or
strings; ``cat`` a string; flow ids ints or strings; the integer args used fit
int64; ``baseTimeNanoseconds`` an int in [0, 2**62), with no event before 1970
or ending past 2**63 ns.

Example:
    >>> import io
    >>> src = (b'{"baseTimeNanoseconds": 1000000, "traceEvents": ['
    ...        b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":7,"tid":7,"ts":1.5,"dur":2}]}')
    >>> p = collect(io.BytesIO(src), "p.json", pid=7)
    >>> p.n_events, p.base_ns, p.names[p.name[0]], p.base_ns + p.start[0], p.window_abs()
    (1, 1000000, 'aten::mm', 1001500, (1001500, 1003500))
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from hooktrace.format._kineto import (
    TIME_LIMIT_NS,
    BadValue,
    JsonNumber,
    ProfilerTraceError,
    open_binary,
    scan,
    show,
    us_to_ns,
)

__all__ = ["BASE_LIMIT_NS", "GPU_CATS", "NODE_PREFIX", "ProfilerEvents", "check_base", "collect",
           "time_ns"]

# Categories of device-side activities in kineto traces.
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Host-side launch calls whose "correlation" arg matches a GPU activity's.
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# How the profiler names the RecordFunction of an autograd node run by the engine.
NODE_PREFIX = "autograd::engine::evaluate_function: "

CAT_CPU_OP = 0
CAT_LAUNCH = 1
CAT_OTHER = 2  # user_annotation, python_function, ...: kept for nesting checks only


# baseTimeNanoseconds: a Unix time in ns, below 2**62 (year 2116); see TIME_LIMIT_NS.
BASE_LIMIT_NS = 2**62
_INT64 = 2**63


def time_ns(e: dict[str, Any], key: str) -> int:
    """``e[key]`` (µs) as ns; BadValue unless it is a JSON number within ±TIME_LIMIT_NS."""
    v = e[key]
    t = type(v)
    if t is JsonNumber:
        # kineto's form, "4389865968648.250", at the cost of one int(): a JsonNumber
        # is a JSON number's text, so whole is [-]digits; at most 15 of them keep
        # |ns| < 10**18 < TIME_LIMIT_NS. (Negative: int("-1" + "250") is right.)
        whole, _, frac = v.partition(".")
        if len(frac) == 3 and len(whole) <= 15 and frac.isdigit():
            return int(whole + frac)
    elif t is int:
        if -TIME_LIMIT_NS <= v * 1000 <= TIME_LIMIT_NS:
            return v * 1000  # type: ignore[no-any-return]
    else:  # (a JSON string holding digits is not a time)
        raise BadValue(f"{key!r} is {show(v)}, expected a number of microseconds")
    try:
        return us_to_ns(v)
    except ValueError:
        raise BadValue(f"{key!r} is {show(v)}, expected a number of microseconds within "
                       "+-2**62 ns (146 years)") from None


def _row_id(e: dict[str, Any], key: str) -> int | str | None:
    """``pid``/``tid``: an int64, a string (kineto's "Spans", "stream 7"), or absent (None)."""
    v = e.get(key)
    t = type(v)
    if t is int:
        assert isinstance(v, int)  # (for the type checker: `type(v) is int` above)
        if -_INT64 <= v < _INT64:
            return v
        raise BadValue(f"{key!r} is {show(v)}, expected an integer that fits 64 bits")
    if t is str or (v is None and key not in e):
        return v  # type: ignore[no-any-return]
    raise BadValue(f"{key!r} is {show(v)}, expected an integer or a string")


def _arg_int(args: dict[str, Any], key: str) -> int:
    """An integer arg (sequence number, thread id, correlation), -1 when absent or not an int."""
    v = args.get(key)
    if type(v) is not int:
        return -1
    if -_INT64 <= v < _INT64:
        return v  # type: ignore[no-any-return]
    raise BadValue(f"args {key!r} is {show(v)}, expected an integer that fits 64 bits")


def check_base(path: str, value: Any) -> int:
    """``baseTimeNanoseconds`` as an int, else ProfilerTraceError naming ``path``."""
    if type(value) is not int or not 0 <= value < BASE_LIMIT_NS:
        raise ProfilerTraceError(f"{path}: 'baseTimeNanoseconds' is {show(value)}, expected an "
                                 "integer number of Unix nanoseconds in [0, 2**62)")
    return value  # type: ignore[no-any-return]


@dataclass
class ProfilerEvents:
    """Columns collected from one profiler trace (times: ns relative to ``base_ns``)."""

    path: str
    pid: int
    base_ns: int = 0
    top: dict[str, Any] = field(default_factory=dict)
    n_events: int = 0
    pids: set[int] = field(default_factory=set)  # integer pids of X events
    # Host slices of `pid` on integer tids.
    tid: array = field(default_factory=lambda: array("q"))
    start: array = field(default_factory=lambda: array("q"))
    dur: array = field(default_factory=lambda: array("q"))
    kind: array = field(default_factory=lambda: array("b"))  # CAT_*
    name: array = field(default_factory=lambda: array("q"))  # index into names
    seq: array = field(default_factory=lambda: array("q"))  # "Sequence number", -1 if none
    fwd_tid: array = field(default_factory=lambda: array("q"))  # "Fwd thread id", -1 if none
    corr: array = field(default_factory=lambda: array("q"))  # launch correlation, -1 if none
    names: list[str] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)  # tid -> name, of `pid`
    # GPU activities (any pid): start, dur, correlation (-1 if none).
    gpu_start: array = field(default_factory=lambda: array("q"))
    gpu_dur: array = field(default_factory=lambda: array("q"))
    gpu_corr: array = field(default_factory=lambda: array("q"))
    gpu_where: list[tuple[Any, Any]] = field(default_factory=list)  # (pid, tid) per activity
    # ac2g flows: id -> (start, tid) of the "s" end; (pid, tid, ts) of "f" ends -> id
    flow_start: dict[Any, tuple[int, Any]] = field(default_factory=dict)
    flow_finish: dict[tuple[Any, Any, int], Any] = field(default_factory=dict)
    max_tid: int = -1  # largest integer tid of any event (synthetic track tids go above)
    min_ts: int | None = None  # earliest ts of any event but metadata ("M")
    min_ts_event: int = -1  # index of that event in traceEvents
    base_known: bool = False
    window: tuple[int, int] | None = None  # the "PyTorch Profiler (N)" span
    extent: tuple[int, int] | None = None  # min start, max end of all X events
    max_end_event: int = -1  # index in traceEvents of the X event ending last
    _name_ids: dict[str, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.start)

    def name_id(self, name: str) -> int:
        i = self._name_ids.get(name)
        if i is None:
            i = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return i

    def window_abs(self) -> tuple[int, int] | None:
        """The profiled interval in Unix ns: the profiler's own span, else all events'."""
        w = self.window or self.extent
        return None if w is None else (self.base_ns + w[0], self.base_ns + w[1])

    def columns(self) -> dict[str, np.ndarray]:
        """The host slices as numpy arrays (absolute Unix ns for ``start``/``end``)."""
        start = np.frombuffer(self.start, dtype=np.int64) + np.int64(self.base_ns)
        dur = np.frombuffer(self.dur, dtype=np.int64)
        return {
            "tid": np.frombuffer(self.tid, dtype=np.int64),
            "start": start,
            "end": start + dur,
            "kind": np.frombuffer(self.kind, dtype=np.int8),
            "name": np.frombuffer(self.name, dtype=np.int64),
            "seq": np.frombuffer(self.seq, dtype=np.int64),
            "fwd_tid": np.frombuffer(self.fwd_tid, dtype=np.int64),
            "corr": np.frombuffer(self.corr, dtype=np.int64),
        }

    # -- the per-event callback -------------------------------------------

    def add(self, e: Any) -> None:
        # Every value used below is checked (type, 64-bit range, hashable): a
        # malformed event is refused here with what was expected (BadValue,
        # which scan() reports with the event's index and position).
        index = self.n_events
        self.n_events += 1
        if type(e) is not dict:
            raise BadValue(f"is {show(e)}, expected an event object {{...}}")
        ph = e.get("ph")
        pid = _row_id(e, "pid")
        tid = _row_id(e, "tid")
        cat = e.get("cat")
        if cat is not None and type(cat) is not str:
            raise BadValue(f"'cat' is {show(cat)}, expected a string")
        if type(tid) is int and tid > self.max_tid:
            self.max_tid = tid
        ts: int | None = None
        if ph != "M" and "ts" in e:  # (metadata's ts means nothing; merge leaves it)
            ts = time_ns(e, "ts")
            if self.min_ts is None or ts < self.min_ts:
                self.min_ts, self.min_ts_event = ts, index
        if ph == "X":
            if ts is None:
                raise BadValue("an 'X' event without 'ts'")
            self._add_slice(e, index, ts, pid, tid, cat)
        elif ph == "M":
            if e.get("name") == "thread_name" and pid == self.pid and type(tid) is int:
                args = e.get("args")
                if isinstance(args, dict) and "name" in args:
                    self.thread_names.setdefault(tid, _text(args["name"]))
        elif (ph == "s" or ph == "f") and cat == "ac2g" and "id" in e and ts is not None:
            fid = e["id"]
            if type(fid) is not int and not isinstance(fid, str):  # (a dict key below)
                raise BadValue(f"flow 'id' is {show(fid)}, expected an integer or a string")
            if ph == "s":
                self.flow_start[fid] = (ts, tid)
            else:
                self.flow_finish[(pid, tid, ts)] = fid

    def _add_slice(self, e: dict[str, Any], index: int, ts: int, pid: int | str | None,
                   tid: int | str | None, cat: str | None) -> None:
        dur = time_ns(e, "dur") if "dur" in e else 0
        if dur < 0:  # (it became negative module times: issue #46)
            raise BadValue(f"'dur' is {show(e['dur'])}, a negative duration (expected a "
                           "number of µs >= 0)")
        ext = self.extent
        end = ts + dur
        if ext is None:
            self.extent, self.max_end_event = (ts, end), index
        else:
            if end > ext[1]:
                self.max_end_event = index
            self.extent = (min(ext[0], ts), max(ext[1], end))
        if cat == "Trace" and str(e.get("name", "")).startswith("PyTorch Profiler"):
            w = self.window
            self.window = (ts, ts + dur) if w is None else (min(w[0], ts), max(w[1], ts + dur))
            return
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        if cat in GPU_CATS:
            self.gpu_start.append(ts)
            self.gpu_dur.append(dur)
            self.gpu_corr.append(_arg_int(args, "correlation"))
            self.gpu_where.append((pid, tid))
            return
        if type(pid) is not int:
            return
        self.pids.add(pid)
        if pid != self.pid or type(tid) is not int:
            return
        kind = CAT_CPU_OP if cat == "cpu_op" else CAT_LAUNCH if cat in LAUNCH_CATS else CAT_OTHER
        seq = _arg_int(args, "Sequence number")
        fwd = _arg_int(args, "Fwd thread id")
        corr = _arg_int(args, "correlation")
        self.tid.append(tid)
        self.start.append(ts)
        self.dur.append(dur)
        self.kind.append(kind)
        self.name.append(self.name_id(_text(e.get("name", ""))))
        self.seq.append(seq)
        self.fwd_tid.append(fwd)
        self.corr.append(corr if kind == CAT_LAUNCH else -1)

    def finish(self, top: dict[str, Any]) -> None:
        """Take the top-level keys; ``base_known`` says if baseTimeNanoseconds was among them."""
        self.top = top
        self.base_known = "baseTimeNanoseconds" in top
        self.base_ns = check_base(self.path, top["baseTimeNanoseconds"]) if self.base_known else 0
        # (Without a base, one may yet follow traceEvents: merge checks the start then.)
        if self.base_known and self.min_ts is not None and self.base_ns + self.min_ts < 0:
            raise ProfilerTraceError(
                f"{self.path}: traceEvents[{self.min_ts_event}] is at {self.min_ts} ns from "
                f"baseTimeNanoseconds {self.base_ns}, before 1970; expected Unix times")
        if self.extent is not None and self.base_ns + self.extent[1] >= _INT64:
            raise ProfilerTraceError(
                f"{self.path}: traceEvents[{self.max_end_event}] ends {self.extent[1]} ns after "
                f"baseTimeNanoseconds {self.base_ns}, beyond 2**63 ns; expected Unix times "
                "that fit 64 bits")


def _text(v: Any) -> str:
    """A JSON string read as Latin-1 (see _kineto), back to the text it encodes."""
    s = str(v)
    if s.isascii():
        return s
    try:
        return s.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return s


def collect(
    source: str | os.PathLike[str] | IO[bytes],
    name: str | None = None,
    *,
    pid: int,
    out: IO[bytes] | None = None,
    before_array_end: Callable[[ProfilerEvents, bool], bytes] | None = None,
    before_object_end: Callable[[ProfilerEvents], bytes] | None = None,
    rewrite_event: Callable[[Any, str], str | None] | None = None,
    rewrite_top: Callable[[str, Any], str | None] | None = None,
) -> ProfilerEvents:
    """Stream a profiler trace (path or binary file; gzip or not) into :class:`ProfilerEvents`.

    With ``out``, the trace is copied there byte for byte, and the callbacks'
    bytes are inserted before the end of ``traceEvents`` and of the object; at
    that point everything of ``traceEvents`` has been collected.
    ``rewrite_event``/``rewrite_top``: see :func:`hooktrace.format._kineto.scan`.
    """
    label = name if name is not None else os.fspath(source) if isinstance(
        source, (str, os.PathLike)) else "<profiler trace>"
    p = ProfilerEvents(path=label, pid=pid)
    top_seen: dict[str, Any] = {}

    def array_end(nonempty: bool) -> bytes:
        # The header keys before traceEvents are known here (kineto writes
        # baseTimeNanoseconds first); merge checks that it was.
        assert before_array_end is not None
        p.finish(top_seen)
        return before_array_end(p, nonempty)

    def object_end() -> bytes:
        assert before_object_end is not None
        return before_object_end(p)

    with (open_binary(source) if isinstance(source, (str, os.PathLike))
          else contextlib.nullcontext(source)) as f:
        top = scan(
            f, label, p.add, out=out,
            before_array_end=array_end if before_array_end is not None else None,
            before_object_end=object_end if before_object_end is not None else None,
            top=top_seen, rewrite_event=rewrite_event, rewrite_top=rewrite_top,
        )
    p.finish(top)
    return p
