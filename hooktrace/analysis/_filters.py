"""Cutting a run down before export: a time window, training steps, a depth limit.

Both exporters (Chrome JSON and Perfetto protobuf) and ``hooktrace export``
take the same filters:

* ``start`` / ``end``: seconds after the run's first span or autograd node
  (what Perfetto shows as 0), e.g. ``--start 1.5 --end 2.0``; either may be
  left out;
* ``steps=(a, b)``: steps ``a`` to ``b`` inclusive (``--steps 3:5``, or
  ``--steps 4`` for one), taken from the run's STEP events through
  ``trace.step_bounds(a, b) -> (start_ns, end_ns)``; combined with
  ``start``/``end`` the window is their intersection;
* ``max_depth=N``: module calls at depth 0..N only (the root is depth 0, as in
  ``du --max-depth``); a backward span has its forward call's depth, and an
  autograd node drawn under its module (``nodes=True``) goes with that span.

Spans and nodes crossing a window edge are clipped to it, not dropped, and get
the argument ``clipped: true`` (as ``hooktrace.merge`` clips to a profiler
window); everything wholly outside is left out. Unattributed autograd nodes
are filtered by time only.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 1000, 3000, 5000]
    >>> trace = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0})
    >>> select_spans(trace, max_depth=0).tolist(), select_spans(trace, start_ns=4000).tolist()
    ([True, False], [True, False])
    >>> c = cut(trace, Filters(start=2e-6))
    >>> c.span_start.tolist(), c.span_clipped.tolist()
    ([2000, 2000], [True, True])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.errors import HooktraceError

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["OPEN_WINDOW", "SPAN_CLIPPED", "Cut", "FilterError", "Filters", "cut", "cut_steps",
           "leading_compile_steps", "parse_steps", "select_spans", "trace_origin_ns"]

SPAN_CLIPPED = 4  # exporter-only span/node flag (csrc/spans.h kSpanClipped)
# A window open at both ends, as closed bounds (Unix ns).
OPEN_WINDOW = (-(1 << 62), 1 << 62)
# start/end in seconds: beyond this (31 years) the run's origin plus it leaves int64 ns
MAX_SECONDS = 1e9


class FilterError(HooktraceError):
    """A filter that cannot apply to this run (bad range, no steps recorded)."""


@dataclass(frozen=True)
class Filters:
    """What to keep of a run; all ``None`` keeps everything (see the module docstring)."""

    start: float | None = None  # seconds after the run's first span or node
    end: float | None = None
    max_depth: int | None = None
    steps: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and abs(v) <= MAX_SECONDS):
                raise FilterError(f"{name} must be a number of seconds within +-{MAX_SECONDS:g} "
                                  f"(the run's own times fit in it), got {v}")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise FilterError(f"end ({self.end} s) must be after start ({self.start} s)")
        if self.max_depth is not None and self.max_depth < 0:
            raise FilterError(f"max_depth must be >= 0, got {self.max_depth}")
        if self.steps is not None and not 0 <= self.steps[0] <= self.steps[1]:
            raise FilterError(f"steps must be A:B with 0 <= A <= B, got {self.steps[0]}:"
                              f"{self.steps[1]}")

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.start, self.end, self.max_depth, self.steps))

    def as_dict(self) -> dict[str, Any]:
        """The filters that are set, for the exported file's info block."""
        out: dict[str, Any] = {"steps": list(self.steps)} if self.steps is not None else {}
        return out | {name: getattr(self, name) for name in ("start", "end", "max_depth")
                      if getattr(self, name) is not None}


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` (inclusive) or ``"A"`` as a step range.

    Example:
        >>> parse_steps("3:5"), parse_steps("4")
        ((3, 5), (4, 4))
    """
    a, sep, b = text.partition(":")
    try:
        lo = int(a)
        hi = int(b) if sep else lo
    except ValueError:
        raise FilterError(f"--steps: expected A:B or A (step numbers), got {text!r}") from None
    if not 0 <= lo <= hi:
        raise FilterError(f"--steps: expected 0 <= A <= B, got {text!r}")
    return lo, hi


def trace_origin_ns(trace: TraceData) -> int:
    """Unix ns of the run's first span or autograd node: time 0 of ``start``/``end``."""
    spans = trace.spans()
    starts = [int(a.min()) for a in (spans.start_ns, spans.nodes.start_ns) if len(a)]
    return min(starts) if starts else int(trace.info.get("start_unix_ns", trace.clock.unix_ns0))


def _window(trace: TraceData, start_ns: int | None, end_ns: int | None,
            steps: tuple[int, int] | None) -> tuple[int | None, int | None]:
    if steps is not None:
        bounds = getattr(trace, "step_bounds", None)
        if not callable(bounds):
            raise FilterError("--steps: this trace has no steps (it was recorded without "
                              "step markers); use --start/--end instead")
        try:
            s0, s1 = bounds(*steps)
        except ValueError as e:  # no such step: say what the trace has, in one line
            raise FilterError(f"--steps {steps[0]}:{steps[1]}: {e}") from None
        start_ns = int(s0) if start_ns is None else max(start_ns, int(s0))
        end_ns = int(s1) if end_ns is None else min(end_ns, int(s1))
    return start_ns, end_ns


def _in_window(start: np.ndarray, end: np.ndarray, lo: int | None,
               hi: int | None) -> np.ndarray:
    """Intervals with some time inside [lo, hi]; an empty one counts if it lies inside."""
    keep = np.ones(len(start), bool)
    if lo is None and hi is None:
        return keep
    lo_ = np.iinfo(np.int64).min if lo is None else lo
    hi_ = np.iinfo(np.int64).max if hi is None else hi
    stop = np.maximum(start, end)
    overlap = np.minimum(stop, hi_) > np.maximum(start, lo_)
    point = (stop == start) & (start >= lo_) & (start <= hi_)
    return overlap | point


def select_spans(trace: TraceData, *, start_ns: int | None = None, end_ns: int | None = None,
                 max_depth: int | None = None,
                 steps: tuple[int, int] | None = None) -> np.ndarray:
    """Boolean mask over ``trace.spans()``: the spans an export with these filters keeps.

    ``start_ns``/``end_ns`` are absolute Unix ns; ``steps`` narrows the window
    to ``trace.step_bounds(*steps)`` (a :class:`FilterError` if the trace has
    no steps).
    """
    spans = trace.spans()
    lo, hi = _window(trace, start_ns, end_ns, steps)
    keep = _in_window(spans.start_ns, spans.end_ns, lo, hi)
    if max_depth is not None:
        keep &= spans.depth <= max_depth
    return keep


@dataclass
class Cut:
    """What an export writes: masks over spans and nodes, and their clipped times."""

    spans: np.ndarray  # bool per span
    nodes: np.ndarray  # bool per node
    span_start: np.ndarray  # int64 per span (all spans), clipped to the window
    span_end: np.ndarray
    node_start: np.ndarray  # int64 per node (all nodes), clipped
    node_end: np.ndarray
    span_clipped: np.ndarray  # bool per span: kept and cut at an edge
    node_clipped: np.ndarray
    window: tuple[int | None, int | None]  # absolute Unix ns, None = open
    filters: Filters

    @property
    def bounds(self) -> tuple[int, int] | None:
        """``window`` with an open end as OPEN_WINDOW's; None when both ends are open."""
        lo, hi = self.window
        if lo is None and hi is None:
            return None
        return (OPEN_WINDOW[0] if lo is None else lo, OPEN_WINDOW[1] if hi is None else hi)

    def summary(self) -> dict[str, Any]:
        """For the exported file's info block (filtered exports only)."""
        return {
            "filters": self.filters.as_dict(),
            "window_ns": list(self.window),
            "spans_kept": int(np.count_nonzero(self.spans)),
            "spans_left_out": int(np.count_nonzero(~self.spans)),
            "nodes_left_out": int(np.count_nonzero(~self.nodes)),
            "clipped_spans": int(np.count_nonzero(self.span_clipped)),
            "clipped_nodes": int(np.count_nonzero(self.node_clipped)),
        }


def _clip(start: np.ndarray, end: np.ndarray, keep: np.ndarray, lo: int | None,
          hi: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = start if lo is None else np.maximum(start, lo)
    e = end if hi is None else np.minimum(end, hi)
    clipped = keep & ((s != start) | (e != end))
    return s, e, clipped


def cut(trace: TraceData, filters: Filters | None = None) -> Cut:
    """Apply ``filters`` (seconds relative to :func:`trace_origin_ns`) to ``trace``."""
    filters = filters or Filters()
    spans = trace.spans()
    nodes = spans.nodes
    origin = trace_origin_ns(trace) if filters.start is not None or filters.end is not None else 0
    start_ns = None if filters.start is None else origin + round(filters.start * 1e9)
    end_ns = None if filters.end is None else origin + round(filters.end * 1e9)
    lo, hi = _window(trace, start_ns, end_ns, filters.steps)
    if lo is not None and hi is not None and hi <= lo:
        raise FilterError(f"the window is empty: steps {filters.steps} and start/end "
                          f"{filters.start}/{filters.end} s do not overlap")
    span_mask = select_spans(trace, start_ns=lo, end_ns=hi, max_depth=filters.max_depth)
    # nodes in the window, and an attributed node only with its span
    node_mask = _in_window(nodes.start_ns, nodes.end_ns, lo, hi)
    attributed = nodes.span >= 0
    node_mask[attributed] &= span_mask[nodes.span[attributed]]
    s0, s1, sc = _clip(spans.start_ns, spans.end_ns, span_mask, lo, hi)
    n0, n1, nc = _clip(nodes.start_ns, nodes.end_ns, node_mask, lo, hi)
    return Cut(span_mask, node_mask, s0, s1, n0, n1, sc, nc, (lo, hi), filters)


# Events whose time is when a later step mark resolved them, not when their call ran
# (a deferred numerics value, a GPU mark's device time): a cut keeps them from its start
# on, whatever its end, since a call inside it is resolved at the next mark
_RESOLVED_LATER = (13, 15)  # _events.NUMERICS_VALUE, _events.GPU_TIME
_STEP = 5  # _events.STEP


def cut_steps(trace: TraceData, after_ns: int | None, until_ns: int | None) -> TraceData:
    """The run of ``trace`` as it would read had it been recorded only after ``after_ns``
    up to ``until_ns`` (Unix ns; None: open): a new trace of the events in between,
    whose summary, steps and report cover those steps only (``hooktrace report
    --steps``). Cut at step marks (:meth:`~hooktrace.reading.TraceData.step_bounds`),
    no call crosses its edges; the FLOPs recorded per root call (``flops=True``) and the
    compiles (``info["compiles"]``) are those of the calls and time kept."""
    from hooktrace.reading import CAT_FORWARD, compile_intervals

    ev = trace.events
    t = trace.clock.to_unix_ns(ev["t"])
    # (an event at the mark's own time is the next step's, as Steps.index_of has it; the
    # mark itself ends the step before)
    keep = (np.ones(len(ev), bool) if after_ns is None else
            (t > after_ns) | ((t == after_ns) & (ev["kind"] != _STEP)))
    if until_ns is not None:
        keep &= (t <= until_ns) | np.isin(ev["kind"], _RESOLVED_LATER)
    info = dict(trace.info)
    spans = trace.spans()
    roots = spans.start_ns[(spans.module == 0) & (spans.cat == CAT_FORWARD)]
    lo = OPEN_WINDOW[0] if after_ns is None else after_ns  # (no root call is before it)
    hi = OPEN_WINDOW[1] if until_ns is None else until_ns
    if isinstance(info.get("flops"), dict):  # matched to the root calls kept
        first = int(np.count_nonzero(roots <= lo))
        n = int(np.count_nonzero((roots > lo) & (roots <= hi)))
        info["flops"] = _flop_info_slice(info["flops"], first, n)
    compiles = compile_intervals(info)
    if len(compiles):
        info["compiles"] = [c for c in compiles.tolist() if c[1] > lo and c[0] < hi]
    return type(trace)(ev[keep], trace.modules, trace.node_names, trace.clock, info)


def _flop_info_slice(info: dict[str, Any], first: int, n: int) -> dict[str, Any]:
    """``info["flops"]`` for a trace holding the root calls ``first .. first + n - 1``
    only (numbered from 0 there)."""
    calls, counted = info.get("calls"), info.get("counted")
    if not isinstance(calls, list) or not isinstance(counted, list):
        return info  # (the reader says what is wrong)
    return dict(info, calls=calls[first:first + n],
                counted=[c - first for c in counted
                         if isinstance(c, int) and first <= c < first + n])


def leading_compile_steps(trace: TraceData) -> int:
    """How many steps at the start of ``trace`` compiled (torch.compile's first calls),
    when complete steps that did not compile follow them; 0 otherwise. A report of a
    compiled run leaves them out by default (issue #47: a 25 s compile step against
    58 ms steps set every width of the report)."""
    from hooktrace.reading import compile_intervals, compile_steps

    steps = trace.steps()
    compiling = compile_steps(steps, compile_intervals(trace.info))
    n = 0
    while n < len(steps) and compiling[n] and steps.complete[n]:
        n += 1
    later = steps.complete[n:] & ~compiling[n:]
    return n if n and later.any() else 0
