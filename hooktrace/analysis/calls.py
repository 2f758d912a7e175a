"""The per-call table (issue #37): every module call of a run once, with the one
definition of its total and self time. Every per-module view groups it with
:class:`hooktrace.analysis.groups.Groups`: the summary of a trace and of its Parquet
export, diff, the aggregates and the Parquet ``spans`` table itself.

A row is one of

* a measured call (``timing`` 0): a forward, backward or recomputed module span;
* a kernel-derived call (``timing`` 1): a module inside a compiled region, timed by
  the kernels it ran (hooktrace.analysis.kernels); its ``dur`` is their summed time;
* a compile (``timing`` 2): torch.compile compiling while recording, the
  ``<torch.compile>`` row's call, forward or backward by the span it ran in.

Self time (:func:`hooktrace.analysis.kernels.span_self_ns`): a span's duration less its
children's; a compiled region keeps what its kernels leave it; the compile time that
ran directly inside a span is the compile row's, not the span's.

:meth:`Calls.from_trace` builds the table from a trace (cached on it);
:meth:`Calls.from_arrow` from a Parquet export's ``spans`` table, which is this table
written out (hooktrace.data.tables): both give the same rows.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 1000, 3000, 5000]
    >>> run = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                 {"pid": 1, "hostname": "h", "dropped_events": 0,
    ...                  "overwritten_events": 0})
    >>> c = Calls.from_trace(run)
    >>> [c.names[m] for m in c.module], c.dur.tolist(), c.self_ns.tolist()
    (['', 'fc'], [5000, 2000], [3000, 2000])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.analysis.phases import MODES, PHASES, phase_label
from hooktrace.reading import (
    CAT_BACKWARD,
    CAT_FORWARD,
    SPAN_ERROR,
    SPAN_EVAL,
    SPAN_UNFINISHED,
    compile_in_backward,
    compile_intervals,
    compile_parents,
)

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["COMPILE", "COMPILE_MODULE", "KERNELS", "MEASURED", "MODES", "PHASES", "TIMINGS",
           "Calls", "phase_label"]

TIMINGS = ("measured", "kernels", "compile")
MEASURED, KERNELS, COMPILE = 0, 1, 2
COMPILE_MODULE = "<torch.compile>"  # the module of a compile's row

_I64 = np.int64


@dataclass
class Calls:
    """One row per module call (see the module docstring), as parallel numpy arrays.

    ``names``/``types``: per module index, the qualified name and class (the module
    slots, then ``<torch.compile>``); ``module``: the row's index into them; ``slot``:
    the module slot (-1 for a compile); ``cat``: phase (0 forward, 1 backward,
    2 recompute); ``eval``; ``timing`` (MEASURED, KERNELS, COMPILE); ``dur``/``self_ns``
    (ns); ``start``/``end`` (Unix ns); ``step``: the step number it started in, valid
    where ``step_valid``; ``root``: a measured call with no parent; ``call``, ``thread``,
    ``depth``, ``span`` (the measured span behind it, -1: none), ``parent`` (-1: none),
    ``error``, ``unfinished``.
    """

    names: list[str]
    types: list[str]
    module: np.ndarray
    slot: np.ndarray
    cat: np.ndarray
    eval: np.ndarray
    timing: np.ndarray
    dur: np.ndarray
    self_ns: np.ndarray
    start: np.ndarray
    end: np.ndarray
    step: np.ndarray
    step_valid: np.ndarray
    call: np.ndarray
    thread: np.ndarray
    depth: np.ndarray
    span: np.ndarray
    parent: np.ndarray
    error: np.ndarray
    unfinished: np.ndarray

    def __len__(self) -> int:
        return len(self.dur)

    @property
    def root(self) -> np.ndarray:
        """Measured calls with no parent: the outermost calls, whose time is the run's."""
        return (self.timing == MEASURED) & (self.parent < 0)

    @property
    def compile_module(self) -> int:
        """The module index of the ``<torch.compile>`` rows."""
        return len(self.names) - 1

    def step_columns(self, numbers: np.ndarray) -> np.ndarray:
        """Per row, the position in ``numbers`` (step numbers, distinct) of the step it
        started in; -1 for a row in none of them (or in no step)."""
        out = np.full(len(self), -1, np.int64)
        if not len(numbers):
            return out
        order = np.argsort(numbers)
        at = np.minimum(np.searchsorted(numbers[order], self.step), len(numbers) - 1)
        inside = self.step_valid & (numbers[order][at] == self.step)
        out[inside] = order[at[inside]]
        return out

    def group_ids(self) -> tuple[np.ndarray, int]:
        """Per row, its (module, mode) group: ``module`` for training calls, ``module +
        n`` for eval calls; and ``n`` (so group ``g`` is module ``g % n``)."""
        n = len(self.names)
        return self.module + n * self.eval.astype(_I64), n

    @classmethod
    def from_trace(cls, trace: TraceData) -> Calls:
        """The calls of ``trace`` (cached on it)."""
        return trace.derived("calls", lambda: cls._build(trace))

    @classmethod
    def _build(cls, trace: TraceData) -> Calls:
        from hooktrace.analysis.kernels import derived_spans, span_self_ns

        spans = trace.spans()
        d = derived_spans(trace)
        compiles = compile_intervals(trace.info)
        n, m, c = len(spans), len(d), len(compiles)
        self_ns = span_self_ns(spans, d, compiles)  # (the one definition)
        c_parent = compile_parents(spans, compiles)
        slot = np.r_[spans.module.astype(_I64), d.module.astype(_I64)]
        n_mod = max(len(trace.modules), int(slot.max(initial=-1)) + 1)
        names = [name for name, _ in trace.modules] + [
            f"<module {k}>" for k in range(len(trace.modules), n_mod)]
        types = [t for _, t in trace.modules] + ["?"] * (n_mod - len(trace.modules))
        start = np.r_[spans.start_ns, d.start_ns, compiles[:, 0]].astype(_I64)
        steps = trace.steps()
        row = steps.index_of(start)
        # a compile's phase: that of the span it ran in (a lazy backward compile: backward)
        c_cat = np.where(compile_in_backward(spans, c_parent), CAT_BACKWARD, CAT_FORWARD)
        # depth of a derived entry: its region's depth + how far below the region it is
        below = np.array([names[int(k)].count(".") - names[int(r)].count(".")
                          if names[int(r)] else names[int(k)].count(".") + 1
                          for k, r in zip(d.module, spans.module[d.span])], _I64)
        c_depth = np.zeros(c, _I64)
        c_depth[c_parent >= 0] = spans.depth[c_parent[c_parent >= 0]].astype(_I64) + 1
        flags = np.r_[spans.flags, np.zeros(m + c, np.uint8)]
        return cls(
            names=names + [COMPILE_MODULE], types=types + ["torch.compile"],
            module=np.r_[slot, np.full(c, n_mod, _I64)],
            slot=np.r_[slot, np.full(c, -1, _I64)],
            cat=np.r_[spans.cat, d.cat, c_cat].astype(_I64),
            eval=np.r_[(spans.flags & SPAN_EVAL) != 0, d.flags != 0, np.zeros(c, bool)],
            timing=np.r_[np.full(n, MEASURED, _I64), np.full(m, KERNELS, _I64),
                         np.full(c, COMPILE, _I64)],
            # a kernel-derived row lasts the time its kernels ran, not first kernel start
            # to last kernel end; a compile's self time is all of it
            dur=np.r_[spans.end_ns - spans.start_ns, d.total_ns,
                      compiles[:, 1] - compiles[:, 0]].astype(_I64),
            self_ns=np.r_[self_ns, d.self_ns, compiles[:, 1] - compiles[:, 0]].astype(_I64),
            start=start,
            end=np.r_[spans.end_ns, d.end_ns, compiles[:, 1]].astype(_I64),
            step=(steps.number[np.maximum(row, 0)].astype(_I64) if len(steps)
                  else np.zeros(n + m + c, _I64)),
            step_valid=row >= 0,
            call=np.r_[spans.call.astype(_I64), spans.call[d.span].astype(_I64),
                       np.arange(c, dtype=_I64)],
            thread=np.r_[spans.tid.astype(_I64), spans.tid[d.span].astype(_I64), compiles[:, 2]],
            depth=np.r_[spans.depth.astype(_I64), spans.depth[d.span].astype(_I64) + below,
                        c_depth],
            span=np.r_[np.arange(n, dtype=_I64), d.span.astype(_I64), np.full(c, -1, _I64)],
            # a compile's parent: the span it ran in (whose self time it is out of)
            parent=np.r_[spans.parent, np.full(m, -1, _I64), c_parent],
            error=(flags & SPAN_ERROR) != 0, unfinished=(flags & SPAN_UNFINISHED) != 0)

    @classmethod
    def from_arrow(cls, table: Any) -> Calls:
        """The calls of a Parquet export's ``spans`` table (a ``pyarrow.Table`` of one
        run, hooktrace.data.schema), as they were written (checked on reading by
        hooktrace.data.validate). Module indices are the slots that occur, densely: the
        names of a trace's slots that made no call are not in the table."""

        import pyarrow as pa
        import pyarrow.compute as pc

        def ints(name: str, null: int = -1) -> np.ndarray:
            return np.asarray(table.column(name).fill_null(null).to_numpy(), _I64)

        def codes(name: str, values: tuple[str, ...]) -> np.ndarray:
            # (hooktrace.data.validate refused any other value before this is read)
            found = pc.index_in(table.column(name).cast(pa.string()), value_set=pa.array(values))
            return np.asarray(found.to_numpy(zero_copy_only=False), _I64)

        slot = ints("slot")
        # module index: the slots that occur, densely (a slot is any int64 a file holds);
        # a slot's name and class: its last row's (one row per slot is read)
        slots, last, index = np.unique(slot[::-1], return_index=True, return_inverse=True)
        index = index.reshape(-1)[::-1]
        last = len(slot) - 1 - last
        measured = slots >= 0
        n_mod = int(np.count_nonzero(measured))
        first = len(slots) - n_mod  # (the compile slot, -1, sorts first)
        rows = pa.array(last[measured])
        names = table.column("module").take(rows).cast(pa.string()).to_pylist()
        types = table.column("type").take(rows).cast(pa.string()).to_pylist()
        step_valid = ~np.asarray(table.column("step").is_null().to_numpy(zero_copy_only=False))
        return cls(
            names=names + [COMPILE_MODULE], types=types + ["torch.compile"],
            module=np.where(slot >= 0, index - first, n_mod), slot=slot,
            cat=codes("phase", PHASES), eval=codes("mode", MODES) == 1,
            timing=codes("timing", TIMINGS), dur=ints("dur_ns"), self_ns=ints("self_ns"),
            start=ints("start_ns"), end=ints("end_ns"), step=ints("step", 0),
            step_valid=step_valid, call=ints("call"), thread=ints("thread"),
            depth=ints("depth"), span=ints("span"), parent=ints("parent"),
            error=np.asarray(table.column("error").to_numpy(zero_copy_only=False), bool),
            unfinished=np.asarray(table.column("unfinished").to_numpy(zero_copy_only=False),
                                  bool))
