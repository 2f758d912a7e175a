"""Trainer adapters: each a small callback over :func:`hooktrace.trace`.

``hooktrace.integrations.hf``: a Hugging Face ``transformers.TrainerCallback``;
``hooktrace.integrations.lightning``: a Lightning ``Callback``. Each imports its
framework, an optional extra (``pip install hooktrace[hf]`` /
``hooktrace[lightning]``); the core never imports them. Both trace the trainer's
model from the start of training to its end, mark a step at each of the
trainer's own optimizer steps, and write one file per rank.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from hooktrace._naming import output_path
from hooktrace.integrations.scalars import Scalars
from hooktrace.record import Trace
from hooktrace.record.options import RecordOptions

__all__ = ["MAX_PENDING", "TraceSession", "trace_options", "weighted_means"]

# The windows' scalars held for a trainer that has not logged yet: beyond this many the
# oldest are dropped and counted (issue #35: a Trainer logging rarely or never held one
# dict per window, ~2.7 KB each with log_top=10, ~235 MB a day); a day of 1 s windows
# would need 86 400
MAX_PENDING = 10_000


def trace_options() -> frozenset[str]:
    """What a callback passes on to trace() as keywords: the recording options declared
    for the callbacks (``Option.callbacks``, hooktrace/record/component.py; their help:
    OPTION_HELP); the others are the trainer's (steps) or the callback's own (backward,
    capacity)."""
    return frozenset(o.name for o in RecordOptions.declared() if o.callbacks)


def weighted_means(windows: Iterable[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Each scalar's mean per step over ``windows`` (each window's steps, its scalars):
    every window weighted by its steps."""
    sums: dict[str, list[float]] = {}
    for steps, scalars in windows:
        for name, value in scalars.items():
            total = sums.setdefault(name, [0.0, 0.0])
            total[0] += value * steps
            total[1] += steps
    return {name: t / n for name, (t, n) in sums.items() if n}


class TraceSession:
    """What both callbacks do: trace a model, mark steps, write the files at the end.

    ``output``/``chrome``: as ``hooktrace run -o``/``--chrome`` (a file, a folder, or
    None for ``hooktrace-<host>_<pid>_rank<R>.htrace`` in the current folder); the
    rank is always part of the name in a multi-process run. ``options``: what else
    ``hooktrace.trace()`` records (:func:`trace_options`: numerics, shapes, memory, flops,
    gpu, dumps: any option a component declares for the callbacks), checked here so a
    wrong name fails before training starts.
    """

    def __init__(self, output: str | os.PathLike[str] | None, *, chrome: str | os.PathLike[str] | None,
                 backward: bool, capacity: int, summary: bool, **options: Any) -> None:
        accepted = trace_options()
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise TypeError(f"hooktrace: unknown option {unknown[0]!r}; the callback takes "
                            f"{', '.join(sorted(accepted))}")
        # checked now (names and values), not when training starts
        self.record = RecordOptions(steps=None, backward=backward, capacity=capacity, **options)
        if self.record.aggregate is not None and chrome is not None:
            # (issue #35: it held the events after the last step only)
            raise ValueError("hooktrace: chrome= exports the trace in memory; with aggregate= "
                             "each step's events go into the aggregates: export a step kept "
                             "whole (DIR/steps/step-N_<run>.htrace) instead")
        self.output, self.chrome = output, chrome
        self.backward, self.capacity, self.summary = backward, capacity, summary
        self.options = options
        self.trace: Trace | None = None
        # hooktrace run --aggregate's trace, when this callback's aggregate= uses it (a
        # second recorder into a second folder is refused: issue #47)
        self.shared: Any = None
        self.written: list[str] = []
        self.scalars: Scalars | None = None
        # per window, oldest first, until logged: (its last step, its steps, the scalars)
        self.pending: list[tuple[int, int, dict[str, float]]] = []
        self.dropped_pending = 0  # windows' scalars dropped beyond MAX_PENDING

    def start(self, model: Any) -> None:
        if self.trace is not None or self.shared is not None:
            return  # a second fit() on the same callback traces from its first one
        if self.record.aggregate is not None:
            from hooktrace.record.aggregate import process_aggregate

            shared = process_aggregate()
            if shared is not None:
                self._share(shared)
                return
        # steps=None: the trainer's own step events end steps (an optimizer hook
        # would count a GAN's or an accumulation step's optimizers differently)
        self.trace = Trace(model, options=self.record)
        self.trace.__enter__()
        if self.scalars is not None:
            self.trace.add_logger(self._collect_scalars)

    def _share(self, shared: Any) -> None:
        """``hooktrace run --aggregate`` (or ``HOOKTRACE=1``) aggregates the process: the
        callback records nothing of its own; its logs come from that trace's windows, and
        its steps are that trace's (one at each optimizer step)."""
        self.shared = shared
        folder = shared.dir
        print(f"hooktrace: the callback's aggregate={self.record.aggregate} is not "
              f"used: hooktrace run --aggregate already aggregates this process into "
              f"{folder}; the rows go there, and the callback's logs come from there",
              file=sys.stderr)
        if self.scalars is not None:
            shared.take_logger(self._collect_scalars)

    def log_scalars(self, top: int, include: Any) -> None:
        """With ``aggregate=``: each step's scalars (integrations/scalars.py) are kept in
        :attr:`pending` for the trainer's logger."""
        if self.record.aggregate is None:
            raise ValueError("hooktrace: logs=True sends the per-step aggregates to the "
                             "trainer's loggers: it needs aggregate=DIR")
        try:
            self.scalars = Scalars(top, include)
        except (TypeError, ValueError) as e:  # (named as the callback's keyword)
            raise type(e)(f"hooktrace: log_{e}") from None

    def _collect_scalars(self, step: int, rows: dict[str, list[Any]]) -> None:
        assert self.scalars is not None
        self.scalars.add(step, rows)
        self._bound(self.scalars.take())

    def take_pending(self, *, force: bool = False) -> list[tuple[int, int, dict[str, float]]]:
        """The windows' scalars not logged yet, oldest first, as (the window's last step,
        its steps, ``{name: value}``); ``force``: the modules chosen now from the windows
        there if they are not yet (a trainer logging; else they are once a window after
        the warm-up one is there)."""
        if force and self.scalars is not None:
            self._bound(self.scalars.take(force=True))
        out, self.pending = self.pending, []
        return out

    def _bound(self, windows: list[tuple[int, int, dict[str, float]]]) -> None:
        self.pending += windows
        if len(self.pending) > MAX_PENDING:  # bounded: the trainer has not logged for long
            excess = len(self.pending) - MAX_PENDING
            del self.pending[:excess]
            if not self.dropped_pending:
                print(f"hooktrace: the trainer has not logged for {MAX_PENDING} windows: "
                      "the oldest windows' scalars are dropped (counted in "
                      "dropped_pending; the aggregates keep every row)", file=sys.stderr)
            self.dropped_pending += excess

    def step(self) -> None:
        if self.trace is not None:
            self.trace.step()

    def close_window(self) -> None:
        """With ``aggregate=``: the steps of the open window reduced to rows now (a
        trainer's epoch end), their scalars pending."""
        if self.trace is not None and self.record.aggregate is not None:
            self.trace.close_window()

    def finish(self, rank: int, world_size: int) -> None:
        shared, self.shared = self.shared, None
        if shared is not None:  # written by hooktrace run at exit
            self.written = [shared.dir]
            return
        trace, self.trace = self.trace, None
        if trace is None:
            return
        trace.__exit__(None, None, None)
        if self.record.aggregate is not None:
            self._finish_aggregates(trace, rank)
            return
        named_rank = rank if world_size > 1 or self.output is None else None
        path = output_path(self.output, ".htrace", named_rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        trace.save(path)
        self.written = [str(path)]
        if self.chrome is not None:
            chrome = output_path(self.chrome, ".json", named_rank)
            chrome.parent.mkdir(parents=True, exist_ok=True)
            trace.export_chrome(chrome)
            self.written.append(str(chrome))
        if self.summary and rank == 0:
            print(trace.summary(), file=sys.stderr)
        print(f"hooktrace: wrote {' and '.join(self.written)}", file=sys.stderr)

    def _finish_aggregates(self, trace: Trace, rank: int) -> None:
        """With ``aggregate=``: the steps are in the folder; no ``.htrace`` of the events
        after the last step (it read as the run's trace: issue #35), they are counted."""
        from hooktrace.record.launch import print_aggregates

        agg = trace.info.get("aggregate") or {}
        self.written = [str(agg.get("dir", self.record.aggregate))]
        # (as hooktrace run --aggregate --summary: a line where no step was aggregated)
        print_aggregates(trace.info, self.summary and rank == 0, len(trace.result.events),
                         hints=False)
