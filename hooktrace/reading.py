"""One recorded run, in memory: events, module table, clock, and what derives from them.

``TraceData`` is the data every analysis and output reads (``hooktrace.result.TraceResult``,
what ``hooktrace.load`` and a recorder hand back, adds the output methods); ``Spans`` is the
paired-up view of its module calls (forward, backward, recompute) and ``Nodes`` the autograd
node executions behind the backward ones.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 1000, 3000, 5000]
    >>> trace = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0})
    >>> s = trace.spans()
    >>> s.duration_ns.tolist(), s.self_ns.tolist(), s.depth.tolist()
    ([5000, 2000], [3000, 2000], [0, 1])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from hooktrace._events import EVENT_DTYPE, Clock
from hooktrace._span_tables import GpuSpans, Nodes, RunOrder, SpanIndex, Spans, Steps
from hooktrace.format import read_trace, write_trace


_T = TypeVar("_T")
_D = TypeVar("_D", bound="TraceData")

__all__ = [
    "SPAN_ERROR",
    "SPAN_UNFINISHED",
    "CAT_FORWARD",
    "CAT_BACKWARD",
    "CAT_RECOMPUTE",
    "CAT_NAMES",
    "CONTAINER_TYPES",
    "join_name",
    "kernel_sites",
    "site_modules",
    "attached_compiled",
    "attached_mid_step",
    "forward_span_before",
    "compile_parents",
    "compile_in_backward",
    "counter_changes",
    "NO_PASS",
    "GpuSpans",
    "Nodes",
    "RunOrder",
    "SpanIndex",
    "Spans",
    "Steps",
    "TraceData",
    "load",
]

SPAN_ERROR = 1  # the forward call raised (its EXIT carried FLAG_ERROR)
SPAN_UNFINISHED = 2  # no EXIT was recorded; end_ns is a lower bound
SPAN_EVAL = 16  # an eval/inference call: grad mode off or module.training False at ENTER
CAT_FORWARD = 0
CAT_BACKWARD = 1  # one per (forward module call, backward pass)
CAT_RECOMPUTE = 2  # forward calls re-run inside backward by activation checkpointing
CAT_NAMES = ("forward", "backward", "recompute")
NO_PASS = 0xFFFF_FFFF  # Nodes.pass_id when the backward pass is unknown

# Containers are never called, so they have no row in eager runs either.
CONTAINER_TYPES = frozenset({"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})

_REQUIRED_INFO = ("pid", "hostname", "dropped_events", "overwritten_events")


class TraceData:
    """One recorded run: raw events plus everything needed to interpret them.

    ``events``: EVENT_DTYPE array; ``modules``: ``(qualified name, class name)``
    per module slot (``""`` names the root module); ``node_names``: backward
    node names indexed by NODE_* event ids; ``clock``: ticks to Unix ns;
    ``info``: free-form metadata, with at least ``pid``, ``hostname``,
    ``dropped_events`` and ``overwritten_events``.

    Example:
        >>> import numpy as np
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> t = TraceData(np.zeros(0, EVENT_DTYPE), [], [], Clock(0, 0, 1.0),
        ...               {"pid": 7, "hostname": "h", "dropped_events": 2,
        ...                "overwritten_events": 0})
        >>> t.pid, t.dropped_events
        (7, 2)
    """

    def __init__(
        self,
        events: np.ndarray,
        modules: Sequence[tuple[str, str]],
        node_names: Sequence[str],
        clock: Clock,
        info: Mapping[str, Any],
    ) -> None:
        if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE or events.ndim != 1:
            raise TypeError("events must be a 1-D numpy array of hooktrace EVENT_DTYPE")
        missing = [k for k in _REQUIRED_INFO if k not in info]
        if missing:
            raise ValueError(f"TraceData info is missing the required keys {missing}")
        self.events = events
        self.modules: list[tuple[str, str]] = [(str(n), str(t)) for n, t in modules]
        self.node_names: list[str] = list(node_names)
        self.clock = clock
        self.info: dict[str, Any] = dict(info)
        self._spans: Spans | None = None
        self._steps: Steps | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached for a missing attribute: the outputs live on the result above
        # the exporters (hooktrace.result), so this class imports none of them.
        if name in _RESULT_METHODS:
            raise AttributeError(
                f"TraceData.{name}() is a method of hooktrace.TraceResult (what hooktrace.load "
                f"and a recorder's .result return): hooktrace.load(path).{name}(...), or "
                f"hooktrace.TraceResult.of(data).{name}(...)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {len(self.events)} events, {len(self.modules)} modules, "
                f"pid {self.pid} on {self.hostname!r}>")

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    @property
    def hostname(self) -> str:
        return str(self.info["hostname"])

    @property
    def dropped_events(self) -> int:
        """Events the recorder could not store (buffer full, ``policy="drop"``)."""
        return int(self.info["dropped_events"])

    @property
    def overwritten_events(self) -> int:
        """Events the flight-recorder ring buffer overwrote with newer ones."""
        return int(self.info["overwritten_events"])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the run to a ``.htrace`` file; ``hooktrace.load`` reads it back."""
        write_trace(path, self.events, self.modules, self.node_names, self.clock, self.info)

    def as_type(self, cls: type[_D]) -> _D:
        """This run as an instance of ``cls`` (a subclass, e.g. ``TraceResult``): the
        arrays and everything derived so far are shared, not copied."""
        other = cls.__new__(cls)
        other.__dict__.update(self.__dict__)
        return other

    def derived(self, key: str, build: Callable[[], _T]) -> _T:
        """What an analysis derives from this run (its kernels, numerics, shapes per
        span): ``build()`` on first use under ``key``, the same object after."""
        cache: dict[str, Any] = self.__dict__.setdefault("_derived", {})
        if key not in cache:
            cache[key] = build()
        return cache[key]  # type: ignore[no-any-return]

    def spans(self) -> Spans:
        """The run's spans (computed once, then cached)."""
        spans = getattr(self, "_spans", None)
        if spans is None:
            spans = self._spans = Spans.from_events(self.events, self.clock, self.node_names)
        return spans

    def steps(self) -> Steps:
        """The run's training steps (computed once, then cached); empty without step marks."""
        steps = getattr(self, "_steps", None)
        if steps is None:
            spans = self.spans()
            ends = [int(a.max()) for a in (spans.end_ns, spans.nodes.end_ns) if len(a)]
            starts = [int(a.min()) for a in (spans.start_ns, spans.nodes.start_ns) if len(a)]
            # The first step starts at the first recorded call, not at the with
            # statement (whatever ran before the loop is not a step's time).
            begin = self.info.get("start_unix_ns")
            begin = int(begin) if isinstance(begin, int) else int(self.clock.unix_ns0)
            start = min(starts, default=begin)
            last = max(ends, default=start)
            steps = Steps.from_events(self.events, self.clock, start, last, last)
            if len(steps) and attached_mid_step(self.info):
                # hooktrace attach landed inside step 0: it ran before the recording
                # began, so it is not a complete step (issue #47)
                steps.complete[0] = False
            self._steps = steps
        return steps

    def span_index(self) -> SpanIndex:
        """What holds a time or an interval among the run's spans, nodes and their
        orders (built once: :class:`SpanIndex`)."""
        return self.spans().index()

    def span_steps(self) -> np.ndarray:
        """Per span: the row in :meth:`steps` of the step it started in (-1 for none)."""
        return self.steps().index_of(self.spans().start_ns)

    def step_bounds(self, first: int, last: int) -> tuple[int, int]:
        """(start, end) in Unix ns of steps numbered ``first`` to ``last`` inclusive.

        Raises ValueError naming what the trace has when no such step was recorded.
        """
        steps = self.steps()
        sel = (steps.number >= first) & (steps.number <= last)
        if not sel.any():
            have = (f"steps {int(steps.number.min())} to {int(steps.number.max())}"
                    if len(steps) else "no step marks (call trace.step(), or step an optimizer)")
            raise ValueError(f"no step in {first}..{last}: the trace has {have}")
        return int(steps.start_ns[sel].min()), int(steps.end_ns[sel].max())


def kernel_sites(info: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The trace's kernel site table ([] when it has none or it is malformed; a malformed
    entry reads as ``("?", "", "forward")``): ``[kernel name, module path relative to
    the region's module, "forward" | "backward"]`` per site (hooktrace.analysis.kernels)."""
    raw = info.get("kernel_sites")
    if not isinstance(raw, list):
        return []
    out = []
    for s in raw:
        if isinstance(s, (list, tuple)) and len(s) >= 3 and all(isinstance(x, str) for x in s[:3]):
            out.append((s[0], s[1], s[2]))
        else:
            out.append(("?", "", "forward"))
    return out


def join_name(prefix: str, name: str) -> str:
    """A module's qualified name from its parent's and its relative path."""
    return f"{prefix}.{name}" if prefix and name else prefix or name


def site_modules(modules: Sequence[tuple[str, str]], sites: Sequence[tuple[str, str, str]],
                 region: np.ndarray, site: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The one resolver of compiled code's kernel sites to modules, for host and device
    time alike: per kernel (``region``: slot of the module whose call ran it, -1 for none;
    ``site``: its index in ``sites``), the slot of the module it counts to, and whether
    the site's path named it. The path is joined to the region's name (the first slot of
    that name); a container (never called, so it has no row) gives way to its nearest
    parent that is not one (a kernel fusing ops of ``blocks.0`` and ``blocks.1`` counts
    in the module holding ``blocks``); a name the table lacks falls back to the region
    (named False). -1 where there is no region or no such site."""
    slots: dict[str, int] = {}
    for i, (name, _) in enumerate(modules):
        slots.setdefault(name, i)
    out = np.full(len(region), -1, np.int64)
    named = np.zeros(len(region), bool)
    if not len(region):
        return out, named
    keys, inverse = np.unique(np.stack([np.asarray(region, np.int64), np.asarray(site, np.int64)]),
                              axis=1, return_inverse=True)
    inverse = inverse.reshape(-1)
    for k, (r, s) in enumerate(keys.T.tolist()):
        if r < 0 or not 0 <= s < len(sites):
            continue
        base, path = modules[r][0], sites[s][1]
        slot = slots.get(join_name(base, path))
        while slot is not None and path and modules[slot][1] in CONTAINER_TYPES:
            path = path.rpartition(".")[0]
            slot = slots.get(join_name(base, path))
        here = inverse == k
        out[here] = r if slot is None else slot
        named[here] = slot is not None
    return out, named


_RESULT_METHODS = frozenset({"summary", "export_chrome", "export_perfetto", "gpu_spans"})


def as_data(obj: Any) -> Any:
    """``obj`` itself, or, for a recorder (``hooktrace.trace()`` and the like, which
    hand back their result rather than being it), its result: the recorder's own
    one-line error if its block has not exited. Anything else is returned as is."""
    if isinstance(obj, TraceData):
        return obj
    if isinstance(getattr(type(obj), "result", None), property):
        return obj.result
    return obj


def load(path: str | os.PathLike[str], *, mmap: bool = False) -> TraceData:
    """Load a ``.htrace`` file written by ``TraceData.save``.

    Raises ``hooktrace.format.TraceFileError`` (a ValueError), one line naming
    the file, the byte offset or metadata key and what was expected, when the
    file is truncated, corrupt, of another version or holds values no recorder
    writes. The events are read into memory; ``mmap=True`` maps them instead
    (for files larger than memory), at the price that truncating the file while
    the run is in use kills the process with SIGBUS (see ``read_trace``).

    Example:
        >>> import numpy as np, tempfile, os
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> p = os.path.join(tempfile.mkdtemp(), "run.htrace")
        >>> TraceData(np.zeros(0, EVENT_DTYPE), [("", "Net")], [], Clock(0, 0, 1.0),
        ...           {"pid": 7, "hostname": "h", "dropped_events": 0,
        ...            "overwritten_events": 0}).save(p)
        >>> load(p).modules
        [('', 'Net')]
    """
    contents = read_trace(path, mmap=mmap)
    info = dict(contents.info)
    info.setdefault("hostname", "")
    info.setdefault("dropped_events", 0)
    info.setdefault("overwritten_events", 0)
    return TraceData(contents.events, contents.modules, contents.node_names, contents.clock, info)


def compile_intervals(info: Mapping[str, Any]) -> np.ndarray:
    """``info["compiles"]`` (torch.compile compiles while recording, record/dispatch.py)
    as an int64 array of rows [start Unix ns, end Unix ns, OS thread id]; empty for a
    file without them. Entries that are not three integers with start <= end are left
    out (a file written by hand or cut)."""
    raw = info.get("compiles")
    rows = []
    if isinstance(raw, list):
        for c in raw:
            if (isinstance(c, (list, tuple)) and len(c) >= 3
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in c[:3])
                    and c[0] <= c[1]):
                rows.append(c[:3])
    return np.array(rows, np.int64).reshape(-1, 3)


def compile_parents(spans: Spans, intervals: np.ndarray) -> np.ndarray:
    """Per compile of ``intervals`` (:func:`compile_intervals`): the span it ran in, -1
    for none: the innermost span of the compile's thread containing it (while Dynamo
    compiles no module call is recorded, so its time is that span's own). The summary's
    ``<torch.compile>`` row and the data tables' compile rows take it out of that span's
    self time."""
    return spans.index().innermost(intervals[:, 2], intervals[:, 0], intervals[:, 1])


def compile_in_backward(spans: Spans, parents: np.ndarray) -> np.ndarray:
    """Per compile (``parents``: :func:`compile_parents`): whether it ran inside a backward
    span (a lazy backward compile: AOTAutograd compiles a region's backward the first
    time it runs), rather than in a forward call or outside every span."""
    out = np.zeros(len(parents), bool)
    ok = parents >= 0
    out[ok] = spans.cat[parents[ok]] == CAT_BACKWARD
    return out


def attached_mid_step(info: Mapping[str, Any]) -> bool:
    """Whether the recording began inside a step (``hooktrace attach``: its step 0 ran
    from the attach to the first step mark, a partial step)."""
    attached = info.get("attach")
    return isinstance(attached, dict) and attached.get("first_step_partial") is True


def attached_compiled(info: Mapping[str, Any]) -> bool:
    """Whether ``hooktrace attach`` found the model compiled before it attached (its
    compiled regions are then one span each: nothing is recompiled for a trace)."""
    attached = info.get("attach")
    return isinstance(attached, dict) and attached.get("compiled_before") is True


def compile_steps(steps: Steps, intervals: np.ndarray) -> np.ndarray:
    """Per step: whether a compile ran during it (it overlaps one of ``intervals``)."""
    if not len(steps) or not len(intervals):
        return np.zeros(len(steps), bool)
    start, end = intervals[:, 0], intervals[:, 1]
    overlaps = (steps.start_ns[:, None] < end[None, :]) & (steps.end_ns[:, None] > start[None, :])
    return np.asarray(overlaps.any(axis=1), bool)


def forward_span_before(trace: TraceData, tid: np.ndarray, module: np.ndarray, t: np.ndarray
                  ) -> np.ndarray:
    """Per event (thread ``tid``, module slot ``module``, Unix ns ``t``): the index of
    the latest forward (or recomputed) span of that module on that thread ending at
    or before ``t``, -1 if none. Events recorded right after a call's EXIT (shapes,
    numerics) find their call so."""
    return trace.spans().index().ended_before(tid, module, t)


def counter_changes(t: np.ndarray, values: np.ndarray, window: tuple[int, int] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A counter track's points from samples ``(t, values)`` in time order: those inside
    ``window`` (when given) where the value changes, and the first and last."""
    if window is not None:
        keep = (t >= window[0]) & (t <= window[1])
        t, values = t[keep], values[keep]
    if len(t) > 2:
        change = np.r_[True, values[1:] != values[:-1]]
        change[-1] = True
        t, values = t[change], values[change]
    return t, values
