"""A run's tables as parallel numpy arrays, decoded from its events: :class:`Spans`
(module calls: forward, backward, recompute), :class:`Nodes` (the autograd node
executions behind the backward spans), :class:`Steps` (step marks) and
:class:`GpuSpans` (device time of module calls). :class:`hooktrace.reading.TraceData`
builds them (the device intervals: ``hooktrace.analysis.device_time.gpu_spans``);
import them from ``hooktrace.reading``.

And containment, answered one way (issue #48): which row of a run's table (a span, an
autograd node, a compiled kernel's mark run) holds a time or an interval, with the
rules every view uses (summary, exports, kernels, device time, profiler attribution):

* a row *holds* a time ``t`` when ``start_ns <= t <= end_ns``, and an interval
  ``[a, b]`` when ``start_ns <= a`` and ``b <= end_ns``: both ends count, so a time at
  a span's exit is still that span's and a zero-length span holds its one instant;
* an unfinished span (SPAN_UNFINISHED) holds up to its ``end_ns``, the last time known
  to be inside it, and no later;
* the *innermost* span holding a query is found from the span of the query's thread
  that started last at or before it (equal starts: the later row, i.e. the child in
  recorded pre-order, a backward span over a forward one), walking out through
  ``parent`` to the first that holds it;
* the *latest* row of a table at or before a time is the one with the greatest key
  at or before it (equal keys: the later row).

:class:`RunOrder` answers "latest row at or before" for any table (precomputed once,
then two ``searchsorted`` per query); :class:`SpanIndex` (one per
:class:`~hooktrace.reading.Spans`: ``spans.index()``) the span questions on top of it.

Example:
    >>> import numpy as np
    >>> order = RunOrder(np.array([7, 7, 8]), np.array([0, 10, 5]))
    >>> last, nxt = order.latest(np.array([7, 7, 8, 9]), np.array([10, 9, 4, 50]))
    >>> last.tolist(), nxt.tolist()
    ([1, 0, -1, -1], [-1, 1, 2, -1])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hooktrace._native import load_native
from hooktrace._events import EVENT_DTYPE, STEP, Clock

_C = load_native()  # torch's libraries, not torch (hooktrace._native)


_SPAN_FIELDS: dict[str, np.dtype[Any]] = {
    "start_ns": np.dtype(np.int64),
    "end_ns": np.dtype(np.int64),
    "self_ns": np.dtype(np.int64),
    "parent": np.dtype(np.int64),
    "module": np.dtype(np.uint32),
    "tid": np.dtype(np.uint32),
    "depth": np.dtype(np.uint32),
    "call": np.dtype(np.uint32),
    "flags": np.dtype(np.uint8),
    "cat": np.dtype(np.uint8),
}

_NODE_FIELDS: dict[str, np.dtype[Any]] = {
    "start_ns": np.dtype(np.int64),
    "end_ns": np.dtype(np.int64),
    "self_ns": np.dtype(np.int64),
    "seq": np.dtype(np.uint64),
    "name": np.dtype(np.uint32),
    "tid": np.dtype(np.uint32),
    "pass_id": np.dtype(np.uint32),
    "span": np.dtype(np.int64),
}
# Optional: zeros when not given (synthetic tables, or none recorded).
_OPTIONAL_NODE_FIELDS: dict[str, np.dtype[Any]] = {"fwd_tid": np.dtype(np.uint32)}
# Autograd nodes whose post-hooks are their module's backward hooks
# (torch.utils.hooks.BackwardHook: register_full_backward_hook), csrc/backward_spans.cpp.
_POST_HOOK_NODES = frozenset({"BackwardHookFunctionBackward"})

# build_spans' dict key for each Nodes field
_NODE_KEYS = {name: "node_pass" if name == "pass_id" else f"node_{name}"
              for name in (*_NODE_FIELDS, *_OPTIONAL_NODE_FIELDS)}


def _checked_arrays(owner: object, what: str, fields: Mapping[str, np.dtype[Any]],
                    arrays: Mapping[str, np.ndarray]) -> int:
    n = len(arrays["start_ns"])
    for name, dtype in fields.items():
        a = np.asarray(arrays[name])
        if a.dtype != dtype or a.shape != (n,):
            raise ValueError(f"{what}.{name}: expected {dtype} array of shape ({n},), "
                             f"got {a.dtype} {a.shape}")
        setattr(owner, name, a)
    return n


class _Table:
    """What the tables below share: parallel arrays, one entry per interval, with the
    fields (name: dtype) of ``_fields``."""

    _fields: Mapping[str, np.dtype[Any]]
    start_ns: np.ndarray
    end_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.start_ns)

    @property
    def duration_ns(self) -> np.ndarray:
        """``end_ns - start_ns`` (int64)."""
        return self.end_ns - self.start_ns

    def to_records(self) -> np.ndarray:
        """The table as one structured array with the field names above."""
        out = np.empty(len(self), dtype=list(self._fields.items()))
        for name in self._fields:
            out[name] = getattr(self, name)
        return out


class Nodes(_Table):
    """Autograd node executions of one run as parallel numpy arrays, one entry each.

    Fields: ``start_ns``/``end_ns`` (int64 Unix ns), ``self_ns`` (duration minus
    nested nodes'), ``seq`` (uint64 autograd sequence number), ``name`` (uint32
    index into ``TraceData.node_names``), ``tid`` (OS thread that ran it),
    ``pass_id`` (uint32 backward pass, ``NO_PASS`` when unknown), ``span``
    (int64 index of the backward span it is attributed to directly; -1 when
    unattributed, e.g. the loss's nodes or AccumulateGrad), ``fwd_tid`` (uint32
    RecordFunction id of the thread whose forward created it, the profiler's
    "Fwd thread id"; optional, zeros when not given). No order is implied.

    Example:
        >>> import numpy as np
        >>> n = Nodes({"start_ns": np.array([0, 5]), "end_ns": np.array([4, 9]),
        ...            "self_ns": np.array([4, 4]), "seq": np.array([7, 6], np.uint64),
        ...            "name": np.array([0, 1], np.uint32), "tid": np.array([1, 1], np.uint32),
        ...            "pass_id": np.array([0, 0], np.uint32), "span": np.array([3, -1])})
        >>> len(n), n.unattributed, n.duration_ns.tolist()
        (2, 1, [4, 4])
        >>> len(Nodes.empty())
        0
    """

    _fields = _NODE_FIELDS
    self_ns: np.ndarray
    seq: np.ndarray
    name: np.ndarray
    tid: np.ndarray
    pass_id: np.ndarray
    span: np.ndarray
    fwd_tid: np.ndarray

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        n = _checked_arrays(self, "Nodes", _NODE_FIELDS, arrays)
        optional = {k: arrays[k] if k in arrays else np.zeros(n, dtype)
                    for k, dtype in _OPTIONAL_NODE_FIELDS.items()}
        _checked_arrays(self, "Nodes", _OPTIONAL_NODE_FIELDS, {"start_ns": arrays["start_ns"],
                                                               **optional})

    @classmethod
    def empty(cls) -> Nodes:
        """No nodes (a forward-only run, or a trace from before backward recording)."""
        return cls({name: np.zeros(0, dtype) for name, dtype in _NODE_FIELDS.items()})

    def __repr__(self) -> str:
        return f"Nodes({len(self)} nodes, {self.unattributed} unattributed)"

    @property
    def unattributed(self) -> int:
        """How many nodes belong to no module call (``span == -1``)."""
        return int(np.count_nonzero(self.span < 0))


class Spans(_Table):
    """Calls of one run as parallel numpy arrays, one entry per span.

    Three categories (``cat``): CAT_FORWARD and CAT_RECOMPUTE spans (forward
    calls re-run by activation checkpointing) come first, by ``tid`` ascending,
    then in recorded pre-order within the thread: every parent before its
    children, start ascending whenever the thread's clock readings are; they
    nest strictly per thread. CAT_BACKWARD spans follow, sorted by (tid, start,
    depth): one per (forward module call, backward pass), with the ``module``,
    ``call`` and ``depth`` of that forward call, ``tid`` the thread of its first
    autograd node, start/end spanning the nodes of the call and its descendants,
    ``self_ns`` the time of the nodes attributed directly to it; siblings may
    overlap in time, so backward spans need not nest.

    Fields: ``start_ns``/``end_ns`` (int64 Unix ns), ``self_ns`` (forward:
    duration minus direct children's), ``parent`` (int64 span index of the
    parent call in the same category and pass, -1 for none), ``module`` (module
    slot), ``tid``, ``depth``, ``call`` (ordinal of the forward call among the
    module's calls by start time, across threads), ``flags`` (SPAN_ERROR |
    SPAN_UNFINISHED), ``cat``. Counts: ``orphan_exits`` (EXITs without a
    matching ENTER, normal at the start of a ring buffer), ``unfinished``
    (spans without an EXIT), ``node_events`` (NODE_BEGIN/NODE_END events).
    ``threads`` lists every tid that recorded an event; ``nodes`` holds the
    autograd node executions (``Nodes``, empty when none were recorded).

    Example:
        >>> import numpy as np
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> ev = np.zeros(3, EVENT_DTYPE); ev["kind"] = [2, 1, 2]; ev["t"] = [1, 2, 5]
        >>> s = Spans.from_events(ev, Clock(0, 0, 1.0))
        >>> len(s), s.orphan_exits, s.unfinished
        (1, 1, 0)
    """

    _fields = _SPAN_FIELDS
    self_ns: np.ndarray
    parent: np.ndarray
    module: np.ndarray
    tid: np.ndarray
    depth: np.ndarray
    call: np.ndarray
    flags: np.ndarray
    cat: np.ndarray

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        *,
        threads: np.ndarray,
        orphan_exits: int,
        unfinished: int,
        node_events: int = 0,
        nodes: Nodes | None = None,
    ) -> None:
        n = _checked_arrays(self, "Spans", _SPAN_FIELDS, arrays)
        self.threads = np.asarray(threads, dtype=np.uint32)
        self.orphan_exits = int(orphan_exits)
        self.unfinished = int(unfinished)
        self.node_events = int(node_events)
        self.nodes = Nodes.empty() if nodes is None else nodes
        self._index: SpanIndex | None = None
        if len(self.nodes) and int(self.nodes.span.max()) >= n:
            raise ValueError(f"Nodes.span: index {int(self.nodes.span.max())} is out of range "
                             f"for {n} spans")

    @classmethod
    def from_events(cls, events: np.ndarray, clock: Clock,
                    node_names: Sequence[str] = ()) -> Spans:
        """Pair ENTER/EXIT events into spans (C++; rules in ``csrc/spans.h``).
        ``node_names`` (the trace's autograd node names) lets a module's
        ``register_full_backward_hook`` hooks count in its backward span."""
        events = np.ascontiguousarray(events)
        if events.dtype != EVENT_DTYPE or events.ndim != 1:
            raise TypeError(f"events must be a 1-D array of EVENT_DTYPE, got {events.dtype}")
        t_ns = np.ascontiguousarray(clock.to_unix_ns(events["t"]), dtype=np.int64)
        post_hooks = [i for i, name in enumerate(node_names) if name in _POST_HOOK_NODES]
        out = _C.build_spans(events, t_ns, post_hooks)
        nodes = None
        if "node_start_ns" in out:
            nodes = Nodes({name: out[key] for name, key in _NODE_KEYS.items()})
        return cls(
            {name: out[name] for name in _SPAN_FIELDS},
            threads=out["threads"],
            orphan_exits=out["orphan_exits"],
            unfinished=out["unfinished"],
            node_events=out["node_events"],
            nodes=nodes,
        )

    def __repr__(self) -> str:
        return (f"Spans({len(self)} spans, {len(self.nodes)} nodes, {len(self.threads)} threads, "
                f"orphan_exits={self.orphan_exits}, unfinished={self.unfinished})")

    def index(self) -> SpanIndex:
        """What holds a time or an interval (:class:`SpanIndex`: the rules every view
        uses), built on first use."""
        if self._index is None:
            self._index = SpanIndex(self)
        return self._index

    @property
    def unattributed_nodes(self) -> int:
        """Autograd nodes attributed to no module call (``nodes.span == -1``)."""
        return self.nodes.unattributed


class Steps:
    """Training steps of one run, in time order; step ``i`` ran from ``start_ns[i]``
    to ``end_ns[i]`` (Unix ns).

    A step mark (``Trace.step()``, or ``Optimizer.step()`` by default) ends a step:
    the mark numbered n ends step n, which began at the previous mark (the first
    at the start of the recording). After the last mark, what was recorded up to
    the end of the recording is one more step, ``complete`` False. ``number``
    (int64) keeps the recorder's numbering, so steps lost to a full buffer show
    as gaps.

    Example:
        >>> import numpy as np
        >>> s = Steps(np.array([0, 1]), np.array([100, 150]), np.array([150, 400]),
        ...           np.array([True, False]))
        >>> len(s), s.duration_ns.tolist(), s.index_of(np.array([120, 160, 90])).tolist()
        (2, [50, 250], [0, 1, -1])
    """

    def __init__(self, number: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray,
                 complete: np.ndarray) -> None:
        self.number = np.asarray(number, np.int64)
        self.start_ns = np.asarray(start_ns, np.int64)
        self.end_ns = np.asarray(end_ns, np.int64)
        self.complete = np.asarray(complete, bool)

    @classmethod
    def from_events(cls, events: np.ndarray, clock: Clock, start_ns: int, stop_ns: int,
                    last_event_ns: int) -> Steps:
        marks = np.flatnonzero(events["kind"] == STEP)
        if not len(marks):
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                       np.zeros(0, bool))
        t = clock.to_unix_ns(events["t"][marks])
        order = np.argsort(t, kind="stable")
        t = t[order]
        number = events["seq"][marks][order].astype(np.int64)
        start = np.concatenate([[min(start_ns, int(t[0]))], t[:-1]])
        end, complete = t, np.ones(len(t), bool)
        if last_event_ns > int(t[-1]):  # recorded after the last mark: a step not ended
            number = np.append(number, number[-1] + 1)
            start = np.append(start, t[-1])
            end = np.append(end, max(stop_ns, last_event_ns))
            complete = np.append(complete, False)
        return cls(number, start, end, complete)

    def __len__(self) -> int:
        return len(self.number)

    def __repr__(self) -> str:
        return f"Steps({len(self)} steps, {int(self.complete.sum())} complete)"

    @property
    def duration_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    def index_of(self, t_ns: np.ndarray) -> np.ndarray:
        """Row of the step containing each time (a mark's own time belongs to the step
        it ends); -1 before the first step or after the last."""
        t = np.asarray(t_ns, np.int64)
        if not len(self):
            return np.full(len(t), -1, np.int64)
        i = np.searchsorted(self.end_ns, t, "left")
        inside = (i < len(self)) & (t >= self.start_ns[np.minimum(i, len(self) - 1)])
        return np.where(inside, i, -1)


GPU_FIELDS: dict[str, np.dtype[Any]] = {
    "start_ns": np.dtype(np.int64),
    "end_ns": np.dtype(np.int64),
    "self_ns": np.dtype(np.int64),
    "span": np.dtype(np.int64),
    "module": np.dtype(np.uint32),
    "cat": np.dtype(np.uint8),
    "device": np.dtype(np.int16),
    "stream": np.dtype(np.int64),
}


class GpuSpans(_Table):
    """Device time of module calls (``trace(gpu=True)``, issue #28), one entry per timed
    interval, as parallel numpy arrays.

    Fields: ``start_ns``/``end_ns`` (int64 Unix ns: the device's timeline aligned to the
    host clock, so they sit beside the host spans), ``self_ns`` (the interval minus the
    device time of the intervals nested in it: its module's children on the same stream),
    ``span`` (int64 index into :meth:`TraceData.spans` of the host span it times, forward,
    recompute or backward; -1 when it has none, e.g. a kernel site of a compiled region),
    ``module`` (module slot), ``cat`` (CAT_FORWARD, CAT_BACKWARD or CAT_RECOMPUTE: the
    phase it ran in), ``device`` (accelerator index), ``stream`` (stream id on it).

    How the run was timed is in ``TraceData.info["gpu"]`` when it was: ``timer``
    (``"cuda"``, or ``"host"`` for the host-clock backend the tests use), ``every``,
    ``timed_steps``, ``skipped_capturing`` (calls not timed while a CUDA graph was
    being captured), ``dropped`` (calls not timed: the event pool was exhausted) and
    ``align_error_ns`` (the device-to-host clock alignment's bound).

    Example:
        >>> import numpy as np
        >>> g = GpuSpans({"start_ns": np.array([0, 2]), "end_ns": np.array([10, 6]),
        ...               "self_ns": np.array([6, 4]), "span": np.array([0, 1]),
        ...               "module": np.array([0, 1], np.uint32), "cat": np.array([0, 0], np.uint8),
        ...               "device": np.array([0, 0], np.int16), "stream": np.array([7, 7])})
        >>> len(g), g.duration_ns.tolist()
        (2, [10, 4])
        >>> len(GpuSpans.empty())
        0
    """

    _fields = GPU_FIELDS
    self_ns: np.ndarray
    span: np.ndarray
    module: np.ndarray
    cat: np.ndarray
    device: np.ndarray
    stream: np.ndarray

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        _checked_arrays(self, "GpuSpans", GPU_FIELDS, arrays)

    @classmethod
    def empty(cls) -> GpuSpans:
        """No device time (not recorded, or a run without an accelerator)."""
        return cls({name: np.zeros(0, dtype) for name, dtype in GPU_FIELDS.items()})

    def __repr__(self) -> str:
        return f"GpuSpans({len(self)} intervals)"


_CAT_BACKWARD = 1  # hooktrace.reading.CAT_BACKWARD (reading imports this module)
# which spans a question looks among: every span, forward and recompute, or backward
FAMILIES = ("all", "forward", "backward")


def thread_module(tid: np.ndarray, module: np.ndarray) -> np.ndarray:
    """(thread, module slot) as one uint64 group of a :class:`RunOrder`."""
    return (np.asarray(tid).astype(np.uint64) << np.uint64(32)) | np.asarray(module).astype(
        np.uint64)


class RunOrder:
    """The rows of a table (``keep``: those to consider) sorted by (group, key, row);
    :meth:`latest` answers, per (group, time), the last row of that group whose key is
    at or before that time. Groups are ints (a thread; :func:`thread_module` for a pair),
    keys int64 times (ns)."""

    def __init__(self, group: np.ndarray, key: np.ndarray, keep: np.ndarray | None = None
                 ) -> None:
        rows = np.arange(len(key)) if keep is None else np.flatnonzero(keep)
        group, key = np.asarray(group)[rows], np.asarray(key).astype(np.int64)[rows]
        order = np.lexsort((key, group))  # stable: equal keys keep the rows' order
        self.rows, self._key, group = rows[order], key[order], group[order]
        first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else rows
        self._groups, self._bounds = group[first], np.r_[first, len(group)]

    def latest(self, group: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query: the row (index into the table) of that group with the latest key
        at or before ``t`` (-1: none), and the row after it in that group's order (its
        first row when none is at or before; -1: none)."""
        group, t = np.asarray(group), np.asarray(t).astype(np.int64)
        last = np.full(len(t), -1, np.int64)
        nxt = np.full(len(t), -1, np.int64)
        if not len(self._groups) or not len(t):
            return last, nxt
        g = np.minimum(np.searchsorted(self._groups, group), len(self._groups) - 1)
        g[self._groups[g] != group] = -1
        by_group = np.argsort(g, kind="stable")
        cut = np.searchsorted(g[by_group], np.arange(len(self._groups) + 1))
        for i in np.flatnonzero(np.diff(cut)).tolist():  # each group queried: its rows
            q = by_group[cut[i]:cut[i + 1]]
            lo, hi = self._bounds[i], self._bounds[i + 1]
            k = lo + np.searchsorted(self._key[lo:hi], t[q], "right") - 1
            last[q] = np.where(k >= lo, self.rows[np.maximum(k, lo)], -1)
            nxt[q] = np.where(k + 1 < hi, self.rows[np.minimum(k + 1, hi - 1)], -1)
        return last, nxt

    def holding(self, group: np.ndarray, start: np.ndarray, end: np.ndarray,
                row_end: np.ndarray) -> np.ndarray:
        """Per query interval [start, end]: the latest row of its group started at or
        before ``start`` if it holds the interval (its ``row_end`` at or after ``end``),
        else -1 (tables whose rows of a group do not nest: kernel runs, nodes)."""
        last, _ = self.latest(group, start)
        ok = (last >= 0) & (row_end[np.maximum(last, 0)] >= end)
        return np.where(ok, last, -1)


class SpanIndex:
    """The containment questions every view asks of a run's spans, with the rules of
    this module; built once per run (``spans.index()``, ``TraceData.span_index()``).

    Example:
        >>> import numpy as np
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> ev = np.zeros(4, EVENT_DTYPE)
        >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 10, 30, 50]
        >>> from hooktrace.reading import Spans
        >>> idx = Spans.from_events(ev, Clock(0, 0, 1.0)).index()
        >>> idx.innermost(np.zeros(4), np.array([5, 10, 30, 31])).tolist()
        [0, 1, 1, 0]
    """

    def __init__(self, spans: Spans) -> None:
        self.spans = spans
        self._orders: dict[str, RunOrder] = {}

    def _family(self, family: str) -> np.ndarray | None:
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
        cat = self.spans.cat
        return None if family == "all" else (cat != _CAT_BACKWARD) if family == "forward" \
            else (cat == _CAT_BACKWARD)

    def order(self, name: str) -> RunOrder:
        """The span order a question uses (built on first use): ``"<family>"`` by
        (thread, start), ``"module/<family>"`` by (module, start), ``"ended/forward"`` by
        (thread, module, end), ``"nodes"`` the autograd nodes by (thread, start)."""
        if name not in self._orders:
            s = self.spans
            what, _, family = name.rpartition("/")
            if name == "nodes":
                o = RunOrder(s.nodes.tid, s.nodes.start_ns)
            elif what == "":
                o = RunOrder(s.tid, s.start_ns, self._family(family))
            elif what == "module":
                o = RunOrder(s.module, s.start_ns, self._family(family))
            elif what == "ended":
                o = RunOrder(thread_module(s.tid, s.module), s.end_ns, self._family(family))
            else:
                raise ValueError(f"no span order {name!r}")
            self._orders[name] = o
        return self._orders[name]

    def innermost(self, tid: np.ndarray, start: np.ndarray, end: np.ndarray | None = None,
                  family: str = "all") -> np.ndarray:
        """Per query (thread, time ``start``, or interval [``start``, ``end``]): the
        innermost span of ``family`` of that thread holding it, or -1."""
        s = self.spans
        start = np.asarray(start).astype(np.int64)
        end = start if end is None else np.asarray(end).astype(np.int64)
        cur, _ = self.order(family).latest(np.asarray(tid), start)
        out = np.full(len(start), -1, np.int64)
        # the latest-starting span may have ended before; a span enclosing it may not
        while (cur >= 0).any():
            live = cur >= 0
            at = np.maximum(cur, 0)
            done = live & (s.start_ns[at] <= start) & (s.end_ns[at] >= end)
            out[done] = cur[done]
            cur = np.where(live & ~done, s.parent[at], -1)
        return out

    def of_module(self, module: np.ndarray, t: np.ndarray, family: str) -> np.ndarray:
        """Per (module slot, time): the innermost span of ``family`` of that module
        holding that time, on any thread: the latest of it started at or before, else
        its nearest ancestor of the same module holding it (a module calling itself: a
        mark after its inner call ended belongs to the outer one, issue #35); -1."""
        s = self.spans
        t = np.asarray(t).astype(np.int64)
        idx, _ = self.order("module/" + family).latest(np.asarray(module), t)
        at = np.maximum(idx, 0)
        ok = (idx >= 0) & (s.end_ns[at] >= t)
        pick = self._family(family)
        for i in np.flatnonzero((idx >= 0) & ~ok).tolist():
            j = int(s.parent[idx[i]])
            while j >= 0 and not ((pick is None or pick[j]) and s.module[j] == module[i]
                                  and s.start_ns[j] <= t[i] <= s.end_ns[j]):
                j = int(s.parent[j])
            if j >= 0:
                idx[i], ok[i] = j, True
        return np.where(ok, idx, -1)

    def ended_before(self, tid: np.ndarray, module: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Per (thread, module slot, time): the forward (or recompute) span of that
        module on that thread that ended last at or before that time, or -1 (what an
        event recorded right after a call's exit, its shapes or numerics, belongs to)."""
        return self.order("ended/forward").latest(thread_module(tid, module), t)[0]

    def latest_node(self, tid: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per (thread, time): the autograd node of that thread started last at or
        before it, and the one that started next; -1 for none (:meth:`RunOrder.latest`)."""
        return self.order("nodes").latest(np.asarray(tid), t)
