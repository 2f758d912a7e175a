"""What merge and attribution need from a profiler trace, collected in one streaming pass.

Only compact columns are kept (``array('q')``, 8 bytes per value): the slices
of the run's own process (``pid`` equal to the run's) on integer thread rows,
GPU activities (kernels, memcpy, memset) with their correlation ids, the
``ac2g`` flow events that link launches to kernels, and the profiler window.
Everything else is only counted.

Example:
    >>> import io
    >>> src = (b'{"baseTimeNanoseconds": 1000000, "traceEvents": ['
    ...        b'{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":7,"tid":7,"ts":1.5,"dur":2}]}')
    >>> p = collect(io.BytesIO(src), "p.json", pid=7)
    >>> p.n_events, p.base_ns, p.names[p.name[0]], p.start_abs(0), p.window_abs()
    (1, 1000000, 'aten::mm', 1001500, (1001500, 1003500))
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from hooktrace._kineto import ProfilerTraceError, open_binary, scan, us_to_ns

__all__ = ["GPU_CATS", "NODE_PREFIX", "ProfilerEvents", "collect"]

# Categories of device-side activities in kineto traces.
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Host-side launch calls whose "correlation" arg matches a GPU activity's.
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
# How the profiler names the RecordFunction of an autograd node run by the engine.
NODE_PREFIX = "autograd::engine::evaluate_function: "

CAT_CPU_OP = 0
CAT_LAUNCH = 1
CAT_OTHER = 2  # user_annotation, python_function, ...: kept for nesting checks only


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


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
    base_known: bool = False
    window: tuple[int, int] | None = None  # the "PyTorch Profiler (N)" span
    extent: tuple[int, int] | None = None  # min start, max end of all X events
    _name_ids: dict[str, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.start)

    def name_id(self, name: str) -> int:
        i = self._name_ids.get(name)
        if i is None:
            i = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return i

    def start_abs(self, i: int) -> int:
        return self.base_ns + self.start[i]

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
        self.n_events += 1
        if not isinstance(e, dict):
            return
        ph = e.get("ph")
        tid = _int(e.get("tid"))
        if tid is not None and tid > self.max_tid:
            self.max_tid = tid
        if ph != "M" and ph != "X" and "ts" in e:
            try:
                ts = us_to_ns(e["ts"])
            except ValueError:
                pass
            else:
                self.min_ts = ts if self.min_ts is None else min(self.min_ts, ts)
        if ph == "X":
            self._add_slice(e)
        elif ph == "M":
            if e.get("name") == "thread_name" and e.get("pid") == self.pid:
                tid = _int(e.get("tid"))
                args = e.get("args")
                if tid is not None and isinstance(args, dict) and "name" in args:
                    self.thread_names.setdefault(tid, _text(args["name"]))
        elif ph in ("s", "f") and e.get("cat") == "ac2g" and "id" in e:
            try:
                ts = us_to_ns(e.get("ts"))
            except ValueError:
                return
            if ph == "s":
                self.flow_start[e["id"]] = (ts, e.get("tid"))
            else:
                self.flow_finish[(e.get("pid"), e.get("tid"), ts)] = e["id"]

    def _add_slice(self, e: dict[str, Any]) -> None:
        try:
            ts = us_to_ns(e["ts"])
            dur = us_to_ns(e.get("dur", 0))
        except (KeyError, ValueError):
            return
        ext = self.extent
        self.extent = (ts, ts + dur) if ext is None else (min(ext[0], ts), max(ext[1], ts + dur))
        self.min_ts = ts if self.min_ts is None else min(self.min_ts, ts)
        cat = e.get("cat")
        if cat == "Trace" and str(e.get("name", "")).startswith("PyTorch Profiler"):
            w = self.window
            self.window = (ts, ts + dur) if w is None else (min(w[0], ts), max(w[1], ts + dur))
            return
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        if cat in GPU_CATS:
            self.gpu_start.append(ts)
            self.gpu_dur.append(dur)
            c = _int(args.get("correlation"))
            self.gpu_corr.append(-1 if c is None else c)
            self.gpu_where.append((e.get("pid"), e.get("tid")))
            return
        pid = _int(e.get("pid"))
        if pid is None:
            return
        self.pids.add(pid)
        tid = _int(e.get("tid"))
        if pid != self.pid or tid is None:
            return
        self.tid.append(tid)
        self.start.append(ts)
        self.dur.append(dur)
        kind = CAT_CPU_OP if cat == "cpu_op" else CAT_LAUNCH if cat in LAUNCH_CATS else CAT_OTHER
        self.kind.append(kind)
        self.name.append(self.name_id(_text(e.get("name", ""))))
        s = _int(args.get("Sequence number"))
        f = _int(args.get("Fwd thread id"))
        c = _int(args.get("correlation"))
        self.seq.append(-1 if s is None else s)
        self.fwd_tid.append(-1 if f is None else f)
        self.corr.append(-1 if c is None or kind != CAT_LAUNCH else c)

    def finish(self, top: dict[str, Any]) -> None:
        """Take the top-level keys; ``base_known`` says if baseTimeNanoseconds was among them."""
        self.top = top
        self.base_known = "baseTimeNanoseconds" in top
        base = top.get("baseTimeNanoseconds", 0)
        if not isinstance(base, int) or isinstance(base, bool):
            raise ProfilerTraceError(f"{self.path}: baseTimeNanoseconds is {base!r}, expected an "
                                     "integer number of nanoseconds")
        self.base_ns = base


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
    ``rewrite_event``/``rewrite_top``: see :func:`hooktrace._kineto.scan`.
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

    def on_event(e: Any) -> None:
        p.add(e)

    if isinstance(source, (str, os.PathLike)):
        f: IO[bytes] = open_binary(source)
        close = True
    else:
        f, close = source, False
    try:
        top = scan(
            f, label, on_event, out=out,
            before_array_end=array_end if before_array_end is not None else None,
            before_object_end=object_end if before_object_end is not None else None,
            top=top_seen, rewrite_event=rewrite_event, rewrite_top=rewrite_top,
        )
    finally:
        if close:
            f.close()
    p.finish(top)
    return p
