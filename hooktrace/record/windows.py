"""Steps and schedule windows, shared by ``hooktrace.trace`` and the global mode.

:class:`StepMarks`: a step ends at ``step()``, or at each ``step()`` of the first
``torch.optim.Optimizer`` that steps while recording (a global post hook; other
optimizers of the same iteration do not end another step); calling ``step()``
switches the optimizer hook off, so no step counts twice.

With ``schedule=`` (a ``torch.profiler.schedule`` or any callable step ->
``ProfilerAction``) a recording records only the steps marked RECORD or
RECORD_AND_SAVE: the session is paused during the others (every module call then
costs what a disabled trace does) and drained at each window's last step into
its own read-only ``TraceResult``, handed to ``on_window`` (or kept in
``windows``), so memory holds one window at most.

The class using this mixin has ``_session`` (a ``_C.Session`` on which
``enable_collection()`` was called before ``start()``), calls :meth:`_enter_step`
with 0 once recording and with each next step after marking one, and provides
``_window_meta()`` (the clock and metadata now, of the window being drained) and
``_window_modules()``; it may override ``_window_opened()``.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

import hooktrace._C as _C
from hooktrace._events import EVENT_DTYPE, Clock
from hooktrace.result import TraceResult

__all__ = ["ScheduleWindows", "StepMarks", "action_name"]


def action_name(action: Any) -> str:
    """torch.profiler.ProfilerAction (or its name) -> its name."""
    return str(getattr(action, "name", action))


class ScheduleWindows:
    _session: Any

    def _window_meta(self) -> tuple[Clock, dict[str, Any]]:  # provided by the recorder
        raise NotImplementedError

    def _window_modules(self) -> list[tuple[str, str]]:  # provided by the recorder
        raise NotImplementedError

    def _init_windows(self, schedule: Callable[[int], Any] | None,
                      on_window: Callable[[TraceResult], Any] | None) -> None:
        """Sets the state up from options already checked (hooktrace.record.options)."""
        self._schedule = schedule
        self._on_window = on_window
        self.windows: list[TraceResult] = []  # windows kept when no on_window is given
        self._window_first: int | None = None  # first step of the window being recorded
        self._window_dropped = 0  # drops counted before the window being recorded

    def _enter_step(self, step: int) -> None:
        """Record step ``step`` or not, as the schedule says (torch.profiler's actions:
        NONE and WARMUP do not record, RECORD and RECORD_AND_SAVE do)."""
        assert self._schedule is not None
        if action_name(self._schedule(step)) in ("RECORD", "RECORD_AND_SAVE"):
            if self._window_first is None:
                self._window_first = step
                self._window_opened()
            self._session.resume()
        else:
            self._session.pause()

    def _window_opened(self) -> None:
        """What the recorder does when a window starts recording (nothing by default)."""

    def window_ends_at(self, step: int) -> bool:
        """Whether a ``schedule=`` window ends with step ``step`` (its events are
        drained at that step's mark)."""
        return self._schedule is not None and \
            action_name(self._schedule(step)) == "RECORD_AND_SAVE"

    def _step_ended(self, ended: int) -> None:
        """After the mark of step ``ended``: end its window if it was the last step of
        one, then record the next step or not."""
        assert self._schedule is not None
        if self.window_ends_at(ended):
            self._end_window(ended, complete=True)
        self._enter_step(ended + 1)

    def _end_window(self, last_step: int, *, complete: bool) -> TraceResult | None:
        """Hand the window's events to on_window (or keep it in ``windows``)."""
        self._session.pause()
        first, self._window_first = self._window_first, None
        if first is None:
            return None
        window = self._drain_window(first, last_step, complete)
        if self._on_window is None:
            self.windows.append(window)
            return window
        try:
            self._on_window(window)
        except Exception as e:  # a failing handler must not stop the training loop
            warnings.warn(f"hooktrace: on_window failed for steps {first}..{last_step}: {e!r}",
                          RuntimeWarning, stacklevel=4)
        return window

    def _final_window(self, step: int) -> TraceResult:
        """At the end of the block: the window being recorded (handed over too, as
        torch.profiler saves one on exit), else an empty one: what the recorder holds."""
        last = self._end_window(step, complete=False)
        return last if last is not None else self._drain_window(step, step, False)

    def _drain_window(self, first: int, last: int, complete: bool) -> TraceResult:
        events = self._session.drain().view(EVENT_DTYPE)
        clock, info = self._window_meta()
        dropped = int(info["dropped_events"])
        info["dropped_events"], self._window_dropped = dropped - self._window_dropped, dropped
        info["window"] = {"first_step": first, "last_step": last, "complete": complete}
        return TraceResult(events, self._window_modules(), _C.node_names(), clock, info)


class StepMarks(ScheduleWindows):
    """Step marks (and, through :class:`ScheduleWindows`, windows of steps). The class
    using it calls :meth:`_init_steps` with its other argument checks,
    :meth:`_start_steps` once recording and removes ``_optimizer_hook`` (idempotent)
    in its teardown."""

    _state: str

    def _init_steps(self, steps: str | None) -> None:
        self._steps_from_optimizer = steps == "optimizer"
        self._step = 0  # the number of the step being recorded
        self._lead_optimizer: weakref.ref[Any] | None = None
        self._optimizer_hook: Any = None
        self._step_listeners: list[Callable[[int], None]] = []

    def _start_steps(self) -> None:
        if self._steps_from_optimizer:
            self._optimizer_hook = register_optimizer_step_post_hook(self._on_optimizer_step)

    def step(self) -> int:
        """Mark the end of a training step; returns the number of the step that ended.

        Steps are numbered from 0. Calling this switches off the default steps
        from ``Optimizer.step`` for the rest of the block, so no step is counted
        twice.
        """
        if self._state != "recording":
            raise RuntimeError("hooktrace: trace.step() marks steps inside the with block")
        self._steps_from_optimizer = False
        return self._mark_step()

    def _before_step_mark(self) -> None:
        """What the recorder does first at each step mark (nothing by default)."""

    def add_step_listener(self, listener: Callable[[int], None]) -> None:
        """``listener(ended)`` last at each step mark, once the step's window (if it was
        the last step of one) went to on_window; listeners run in the order added
        (``hooktrace run --profile`` steps its profiler, ``attach`` counts steps)."""
        self._step_listeners.append(listener)

    def _after_step_mark(self, ended: int) -> None:
        for listener in self._step_listeners:
            listener(ended)

    def _mark_step(self) -> int:
        self._before_step_mark()
        ended = self._step
        self._session.record_step(ended)
        self._step += 1
        if self._schedule is not None:
            self._step_ended(ended)
        self._after_step_mark(ended)
        return ended

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._steps_from_optimizer or self._state != "recording":
            return
        lead = self._lead_optimizer() if self._lead_optimizer is not None else None
        if lead is None:
            self._lead_optimizer = weakref.ref(optimizer)
        elif lead is not optimizer:
            return  # one step per iteration, however many optimizers step in it
        self._mark_step()
