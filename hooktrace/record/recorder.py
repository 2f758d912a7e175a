"""The recorder: one class for both scopes (issue #16).

``hooktrace.trace(model)`` records the given model's modules, ``global_trace()``
(``hooktrace run``, ``HOOKTRACE=1``) every module in the process; both are a
:class:`Recorder` over one native hot path (``_C.ModuleCall``, record/dispatch.py)
and take the same options. A module's forward span is its whole call, hooks
included, in both (``info["span_definition"]``, hooktrace/_events.py). Its options are
one :class:`~hooktrace.record.options.RecordOptions`, checked once; each recording
feature (backward, memory, shapes, numerics, FLOPs, kernel marks, profiler ranges) is a
component (record/component.py) the recorder composes, with no branch on any of them.

The recorder is not its result: after the ``with`` block, :attr:`Recorder.result`
is the recorded :class:`~hooktrace.result.TraceResult`; the reading methods
(``summary()``, ``export_chrome()``, ``save()``, ``spans()``, ...) are forwarded to
it for convenience, and raise one clear error while the block still runs.

Example::

    import torch, hooktrace
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.randn(2, 4))
    print(tr.result.summary())
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from types import TracebackType
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hooktrace._native import load_native
from hooktrace._events import EVENT_DTYPE, SPAN_DEFINITION, Clock
from hooktrace._naming import env_rank, process_stem
from hooktrace.record.windows import StepMarks
from hooktrace.record.ranks import apply_test_clock_offset, rank_info
from hooktrace.errors import OutputPathError
from hooktrace.record.flight import FlightRecorder
from hooktrace.result import TraceResult
from hooktrace.record import dispatch, registry
from hooktrace.record.component import Component
from hooktrace.record.options import DEFAULT_CAPACITY, RecordOptions
from hooktrace.record.process_state import STATE
from hooktrace.record.scopes import ModelScope, ProcessScope, Scope
from hooktrace.record.streaming import StreamedRecording, thread_names

# (through load_native: a core built against another torch is refused, one line)
_C = load_native()

__all__ = ["DEFAULT_CAPACITY", "GlobalTrace", "Recorder", "Trace", "global_trace", "trace",
           "window_handler"]

# How old a window's clock may be (Recorder._window_meta): the stream's CLOCK blocks
# are written this often too (csrc/stream_writer.h, kClockPeriodMs).
WINDOW_CLOCK_S = 0.1

# The one process scope of this process (nn.Module calls of the whole process).
_process_lock = threading.Lock()
_process_recorder: Recorder | None = None

# What TraceData sets: read before the block ends, they raise one clear error.
_DATA_ATTRS = frozenset({"events", "modules", "node_names", "clock", "info", "_spans",
                         "_steps"})


class Recorder(StepMarks, FlightRecorder, StreamedRecording):
    """Records module calls in a ``with`` block: :class:`Trace` (the given model) and
    :class:`GlobalTrace` (every module in the process) are this class with a scope.

    Inside the block every module of the scope is recorded (forward calls, each span
    the module's whole call, hooks included; and backward spans from autograd nodes);
    on exit (exception or not) everything is undone and :attr:`result` holds the
    events as a :class:`~hooktrace.result.TraceResult`. ``snapshot()`` reads the events
    so far while recording goes on.

    Options (keyword arguments of ``trace()``/``global_trace()``, or one
    ``options=RecordOptions(...)``; checked once, :mod:`hooktrace.record.options`):
        capacity: number of events held (32 bytes each), an int from 1 to 2**40;
            by default 8 Mi (256 MiB), or 1 Mi (32 MiB) when streaming to ``out``.
            Rounded up to whole chunks of 4096 events (a capacity below 4096 is one
            chunk of exactly that size); ``info["capacity"]`` reports the effective
            value. Memory is allocated a chunk at a time as events are recorded.
        policy: when full, ``"drop"`` keeps the oldest events and counts the rest as
            dropped; ``"ring"`` keeps the newest (flight recorder) and counts the
            overwritten ones. A ring recycles a chunk at a time and holds one chunk
            more than ``capacity``, so a thread recording alone always keeps at least
            its newest ``capacity`` events; several threads share the chunks.
        backward: also record autograd nodes, which the reader turns into
            per-module backward spans (``"cat": "hooktrace.backward"``).
        emit_profiler: also open a ``torch.profiler`` user-scope range per module call
            (from C++), so module names show in the profiler's own trace, TensorBoard
            and HTA. Costs nothing measurable while no profiler runs.
        out: stream the events to this ``.htrace`` file while the model runs: a
            background thread drains full chunks to it, so memory stays within
            ``capacity`` for any run length, and the file loads at every moment (a
            killed run's file loads up to where it was cut, with ``info["cut"]``
            saying so). When the writer falls behind, events are dropped and
            counted rather than waited for. After the block the result reads the
            file (on first use); ``info["out"]`` is its path. The file is written
            in place (an existing one is replaced when the block starts). Not with
            ``policy="ring"``. A process scope names modules as they are first
            called: its table grows in the stream's MODULES blocks, each written
            before the events that use it (``hooktrace run`` streams this way).
        schedule: a ``torch.profiler.schedule(wait=, warmup=, active=, repeat=)`` (or
            any callable step -> ``ProfilerAction``): only the steps it marks RECORD
            or RECORD_AND_SAVE are recorded (during the others every module call
            costs what a disabled trace does), and each window is handed to
            ``on_window`` as its own read-only ``TraceData`` as soon as its last
            step ends, then dropped, so memory holds one window at most. Without
            ``on_window`` the windows are kept in ``windows``. A window still
            being recorded when the block ends is handed over too (its
            ``info["window"]["complete"]`` is False) and is the result.
            Not with ``out=`` or ``policy="ring"``.
        on_window: called with each window; :func:`window_handler` writes them to
            ``DIR/<host>_<pid>[_rank<R>].<last step>.htrace``. An exception in it is
            a warning, not the end of the training loop.
        dump_on: flight-recorder dumps (see :mod:`hooktrace.record.flight`): any of
            ``"exception"`` (an exception escapes the block), ``"signal"`` (the process
            receives ``dump_signal``; main thread only; a previous handler is still
            called), ``"hang"`` (nothing recorded and no step ended for
            ``hang_timeout`` seconds: a watchdog thread, not the hot path). Each dump
            writes the events so far (the newest with ``policy="ring"``), every
            thread's Python stack and open module calls to ``dump_dir``.
        dump_dir: where dumps go (default ``hooktrace-dumps``).
        hang_timeout: seconds without progress that count as a hang (default 300).
        dump_signal: the signal that asks for a dump (default SIGUSR1).
        steps: ``"optimizer"`` (default): a step ends at each ``step()`` of the first
            ``torch.optim.Optimizer`` that steps inside the block (a global optimizer
            hook; other optimizers, e.g. a GAN's second one, do not end steps); None:
            only :meth:`step` marks steps. Calling :meth:`step` yourself switches the
            optimizer hook off for the rest of the block.
        flops: count FLOPs per module, forward and backward, with torch's
            ``FlopCounterMode`` on the root's first call of each input signature (see
            :mod:`hooktrace.analysis.flops`); the summary gains ``flops``/``tflops`` columns.
            In a process scope the root is the first top-level module called.
        memory: record the bytes allocated at every module enter and exit, forward and
            backward, and the peak in between, on CPU and the current CUDA device
            (:mod:`hooktrace.analysis.memory`); the summary gains ``mem_net``/``mem_peak``
            columns and the exports a memory counter track.
        numerics: numeric health per module call (:mod:`hooktrace.analysis.numerics`): abs-max,
            RMS and the count of non-finite values of every call's floating-point
            output, and of the gradient with respect to its inputs in backward; the
            first non-finite value is named on stderr, in the summary and in
            ``summary --json`` (``first_nonfinite``), and ``dump_on=("nonfinite",)``
            writes a flight-recorder dump at that moment. On a CUDA model they are
            read once per step, computed by one fused Triton kernel per tensor when
            ``triton`` imports (``info["numerics"]["deferred_path"]`` says which).
        numerics_every: with ``numerics``, only steps ``0, N, 2N, ...`` are measured
            (the others cost nothing); the first-non-finite search covers those.
        shapes: record the dtypes and shapes of every forward call's tensor inputs and
            outputs (:mod:`hooktrace.analysis.shapes`): span args ``in_shapes``/``out_shapes``
            (and ``*_dtypes``) in the exports, ``hooktrace summary --by-shape``.
        gpu: record where the device's time went, forward and backward; needs a CUDA
            device (or an XPU or PrivateUse1 one). On CUDA, each kernel's busy time from
            CUPTI joined to the module that launched it (:mod:`hooktrace.record.cupti`,
            read by :mod:`hooktrace.analysis.kernel_time`); elsewhere, or when CUPTI is
            held by another tool, each call's device-event interval
            (:mod:`hooktrace.record.gpu_time`; read as ``TraceResult.gpu_spans()``).
        gpu_mode: with ``gpu``: ``"auto"`` (above), ``"kernels"``, ``"events"`` or
            ``"both"``.
        gpu_every: with ``gpu``, only steps ``0, N, 2N, ...`` are timed.
    """

    def __init__(self, scope: Scope, options: RecordOptions) -> None:
        # Everything is checked by now (RecordOptions, then each component's check),
        # before anything is touched: a bad argument never leaves a model half-instrumented.
        # the recording features (record/registry.py), in order
        components = registry.COMPONENTS
        for component in components:
            component.check(options)
        self.options = options
        self._scope = scope
        self._init_steps(options.steps)
        self._init_flight_recorder(options.dump_on, options.dump_dir, options.hang_timeout,
                                   options.dump_signal)
        self._init_windows(options.schedule, options.on_window)
        self._init_stream(options.out)
        if options.max_disk and options.out is None:
            raise ValueError("max_disk bounds a stream's files: it needs out=")
        self._session: Any = None
        self._call: Any = None  # the _C.ModuleCall while this recorder holds it
        self._state: Literal["new", "recording", "done"] = "new"
        self._components: list[Component] = [c(self) for c in components if c.enabled(options)]
        self._installed: list[Component] = []  # those whose install() returned
        self._result: TraceResult | None = None
        self._start_unix_ns = 0
        # the session's clock as last measured: (session, monotonic s, clock) (_collect)
        self._clock_cache: tuple[Any, float, tuple[int, int, float]] | None = None

    # -- context manager ---------------------------------------------------

    def __enter__(self) -> Recorder:
        if self._state != "new":
            raise RuntimeError(f"a hooktrace.{type(self).__name__} can be entered only once; "
                               "make another")
        self._check_flight_recorder_thread()
        # What can fail without touching anything is done first (the session
        # allocates nothing until the first event).
        # (RecordOptions resolves the capacity: never None here)
        session = _C.Session(int(self.options.capacity or 0), self.options.policy)
        scope = self._scope
        # All or nothing: a Ctrl-C is held off until recording fully started, then
        # aborts the entry like any exception, undoing every step taken.
        try:
            self._enter_deferred(session, scope)
            return self
        except KeyboardInterrupt:
            # one that landed where the deferral does not hold (while it swaps the
            # handler in or out): the entry is undone all the same
            if self._state == "recording":
                self._finish()
            raise

    def _enter_deferred(self, session: Any, scope: Any) -> None:
        """The steps of __enter__, with Ctrl-C deferred (see there)."""
        global _process_recorder
        with _SignalsDeferred() as sigint:
            if isinstance(scope, ProcessScope):
                with _process_lock:
                    if _process_recorder is not None:
                        raise RuntimeError(
                            "hooktrace: a global trace is already recording in this process "
                            "(hooktrace run, HOOKTRACE=1 or global_trace()); exit it first")
                    _process_recorder = self
            try:
                scope.check()  # a model scope's module table is known from here on
            except BaseException:
                self._release_process_slot()
                raise
            try:
                for component in self._components:  # (nothing to undo: the session goes)
                    component.prepare(session, scope)
                self._start_unix_ns = time.time_ns()
                if self._out is not None:
                    self._open_stream(session)
                if self._schedule is not None:
                    session.enable_collection()
                self._session = session
                self._state = "recording"  # from here on, _finish undoes what was done
                session.start()
                if self._schedule is not None:
                    self._enter_step(0)
                if self._writer is not None:
                    self._writer.start()
                for component in self._components:
                    component.install(session, scope)
                    self._installed.append(component)
                self._start_steps()
                self._call = dispatch.acquire(self)
                scope.attach(self._call, session)
                self._start_flight_recorder()
                sigint.raise_pending()
            except BaseException:
                if self._state == "recording":
                    self._finish()
                else:
                    self._abandon_stream()
                    with contextlib.suppress(Exception):
                        scope.detach(self._call or _NoCall(), session)
                    self._release_process_slot()
                raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._dump_on_exception(exc)
        finally:
            self._finish()

    def _release_process_slot(self) -> None:
        global _process_recorder
        with _process_lock:
            if _process_recorder is self:
                _process_recorder = None

    # -- steps and windows (hooktrace.record.windows.StepMarks) -----------------

    def _before_step_mark(self) -> None:
        for component in self._installed:
            component.before_step()

    def drains_at_step_mark(self) -> bool:
        """Whether the step being marked now hands its events over at its mark (the
        last step of a ``schedule=`` window, every step of ``aggregate=``): a
        component must have them complete before (device time: record/gpu_time.py)."""
        return any(c.drains for c in self._components) or self.window_ends_at(self._step)

    def _mark_step(self) -> int:
        # A signal's handler never runs inside a step mark (it would end the trace while
        # a component is halfway through its step): it runs once the mark is done.
        with _SignalsDeferred():
            ended = super()._mark_step()
            for component in self._installed:
                component.step(self._step)
        return ended

    def _window_opened(self) -> None:
        for component in self._installed:
            component.window_opened()

    def _window_meta(self) -> tuple[Clock, dict[str, Any]]:
        # (a clock measured up to WINDOW_CLOCK_S ago, as the stream's CLOCK blocks are:
        # measuring one costs ~0.1 ms, a window may be one step long)
        _, clock, info = self._collect(stop_unix_ns=time.time_ns(), with_events=False,
                                       clock_age_s=WINDOW_CLOCK_S)
        for component in self._installed:
            component.window_info(info)
        return clock, info

    def _window_modules(self) -> list[tuple[str, str]]:
        return self._scope.modules_table()

    def step_result(self, events: Any) -> TraceResult:
        """Events drained from the session (a step's: record/aggregate.py) as a result
        with the run's module table, node names, clock and info as of now."""
        clock, info = self._window_meta()
        return TraceResult(np.asarray(events).view(EVENT_DTYPE), self._scope.modules_table(),
                           _C.node_names(), clock, info)

    def keep_step(self) -> None:
        """With ``aggregate=``: keep the next step's raw events (the detail policy's
        ``signal`` trigger, from code)."""
        if not any(c.keep_next_step() for c in self._components):
            raise RuntimeError("hooktrace: this trace has no aggregate= output")

    def add_logger(self, log: Callable[[int, dict[str, list[Any]]], None]) -> None:
        """With ``aggregate=``: ``log(step, rows)`` after each step (hooktrace.log_to)."""
        if not any(c.take_logger(log) for c in self._components):
            raise RuntimeError("hooktrace: this trace has no aggregate= output")

    def close_window(self) -> None:
        """With ``aggregate=``: reduce the steps of the window still open to rows now,
        handing them to the loggers, rather than when ``aggregate_interval`` ends it (a
        trainer's epoch end: its loggers' epoch value is then the epoch's steps')."""
        if not any(c.close_window() for c in self._components):
            raise RuntimeError("hooktrace: this trace has no aggregate= output")

    # -- teardown ------------------------------------------------------------

    def _teardown(self) -> list[BaseException]:
        """Undoes everything __enter__ did. Every step runs even when one raises; one cut
        short by a KeyboardInterrupt (possible only when SIGINT could not be deferred) is
        redone, all steps being idempotent. Returns what was raised."""
        session, call = self._session, self._call
        installed = self._installed[::-1]  # in reverse order
        steps: list[Any] = [c.flush for c in installed]  # while the session still records
        steps += [self._stop_flight_recorder, session.stop]
        if self._optimizer_hook is not None:
            steps.append(self._optimizer_hook.remove)  # idempotent
        steps += [c.teardown for c in installed]
        # Detached even when entry failed before the call was acquired (an install that
        # raised): the scope's check() has claimed the model's modules by then.
        steps.append(lambda: self._scope.detach(call or _NoCall(), session))
        if call is not None:
            steps.append(self._release_call)
        errors: list[BaseException] = []
        for step in steps:
            for _ in range(2):
                try:
                    step()
                    break
                except KeyboardInterrupt as e:
                    errors.append(e)
                except Exception as e:
                    errors.append(e)
                    break
        return errors

    def _teardown_deferred(self) -> list[BaseException]:
        """:meth:`_teardown` with Ctrl-C deferred. A Ctrl-C can still land while the
        deferral swaps the handler in (then nothing was undone yet) or out (then all
        was): the teardown, idempotent, is run again, and the Ctrl-C is among what it
        returns, raised by _finish once the model is clean."""
        interrupts: list[BaseException] = []
        for _ in range(3):
            try:
                with _SignalsDeferred():
                    return interrupts + self._teardown()
            except KeyboardInterrupt as e:
                interrupts.append(e)
        return interrupts + self._teardown()  # (each step is retried once if interrupted)

    def _release_call(self) -> None:
        dispatch.release(self)  # idempotent

    def _finish(self) -> None:
        if self._state != "recording":
            self._release_process_slot()
            return
        self._state = "done"
        errors: list[BaseException] = []
        try:
            errors = self._teardown_deferred()
        finally:
            if self._writer is not None:
                with _SignalsDeferred():
                    self._finish_stream(stop_unix_ns=time.time_ns())
            elif self._schedule is not None:
                # Every finished window went to on_window; a window still being
                # recorded is handed over too (as torch.profiler saves one on exit),
                # and is the result.
                self._result = self._final_window(self._step)
            else:
                # The model is clean by now; reading the events out may be interrupted.
                events, clock, info = self._collect(stop_unix_ns=time.time_ns())
                if any(c.drains for c in self._components):
                    # drained at each step (aggregate=): what is left since the last one
                    events = np.asarray(self._session.drain()).view(EVENT_DTYPE)
                self._result = TraceResult(events, self._scope.modules_table(), _C.node_names(),
                                         clock, info)
            self._session = None  # frees the chunks
            self._release_process_slot()
        interrupt = next((e for e in errors if not isinstance(e, Exception)), None)
        if interrupt is not None:
            raise interrupt
        if errors:
            raise RuntimeError(f"hooktrace: failed to end the trace: {errors[0]!r}") from errors[0]

    # -- the result ------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the block has exited (the result is complete); False before and during it."""
        return self.__dict__.get("_state", "new") == "done"

    @property
    def result(self) -> TraceResult:
        """What was recorded, once the block has exited."""
        if self._result is None:
            if self._state == "done" and self._out is not None:
                self._result = self._load_stream()
            else:
                state = "still recording" if self._state == "recording" else "not started"
                raise RuntimeError(
                    f"hooktrace: the trace is {state}: its result is there after the with "
                    "block; use snapshot() for the events so far")
        return self._result

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the recorder does not have: the result's, for
        # convenience (tr.summary(), tr.save(), tr.events, ...).
        if name.startswith("__") or name not in _RESULT_ATTRS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        state = self.__dict__.get("_state", "new")
        if state != "done":
            raise RuntimeError(
                f"hooktrace: the trace is {'still recording' if state == 'recording' else 'not started'}"
                f" ({name} is not available yet): read it after the with block, or use "
                "trace.snapshot() for the events so far")
        return getattr(self.result, name)

    def __repr__(self) -> str:
        state = self.__dict__.get("_state", "new")
        if state == "done":
            if self._result is None and self._out is not None:
                return f"<{type(self).__name__} streamed to {self._out!r} (read on first use)>"
            return f"<{type(self).__name__} done: {self._result!r}>"
        label = {"new": "not started", "recording": "recording"}.get(state, "finishing")
        return f"<{type(self).__name__} of {self._scope_label()}: {label}>"

    def _scope_label(self) -> str:
        scope = self._scope
        if isinstance(scope, ModelScope):
            model = scope.model_or_none()
            return type(model).__name__ if model is not None else "a deleted model"
        return "every module"

    # -- reading ---------------------------------------------------------------

    def _run_info(self, session: Any) -> dict[str, Any]:
        """What describes the run itself (metadata of both file versions)."""
        info = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "torch_version": torch.__version__,
            "hooktrace_version": _version(),
            "scope": self._scope.kind,
            "span_definition": SPAN_DEFINITION,
            "backward": self.options.backward,
            "emit_profiler": self.options.emit_profiler,
            "policy": self.options.policy,
            "capacity": int(session.capacity),
            "start_unix_ns": self._start_unix_ns,
            "thread_names": thread_names(),
            **self._scope.info(),
        }
        for component in self._components:  # (prepared by now)
            component.run_info(info)
        attachment = STATE.attachment  # hooktrace attach: its process-wide recording
        if attachment is not None and isinstance(self._scope, ProcessScope):
            info["attach"] = attachment.run_info()
        return info

    def _collect(self, stop_unix_ns: int, *, with_events: bool = True,
                 clock_age_s: float = 0.0) -> tuple[np.ndarray, Clock, dict[str, Any]]:
        """The session's events so far, its clock (measured now, or up to
        ``clock_age_s`` ago), and the run's metadata."""
        session = self._session
        stats = session.stats()
        events = np.empty(stats["events"] if with_events else 0, dtype=EVENT_DTYPE)
        events = events[: session.copy_events(events)] if with_events else events
        now = time.monotonic()
        cached = self._clock_cache
        if clock_age_s > 0 and cached is not None and cached[0] is session and \
                now - cached[1] < clock_age_s:
            ticks0, unix_ns0, ns_per_tick = cached[2]
        else:
            ticks0, unix_ns0, ns_per_tick = session.clock()
            self._clock_cache = (session, now, (ticks0, unix_ns0, ns_per_tick))
        info = self._run_info(session)
        info.update(dropped_events=int(stats["dropped"]),
                    overwritten_events=int(stats["overwritten"]), stop_unix_ns=stop_unix_ns)
        self._add_metadata(info)
        clock = Clock(int(ticks0), int(unix_ns0), float(ns_per_tick))
        # Many ranks (issue #11, hooktrace/record/distributed.py): rank, world size, backend and
        # the clock offset to rank 0 measured by align_clocks(); {} in a single process.
        clock = apply_test_clock_offset(clock, info)  # the identity unless a test sets one
        info.update(rank_info(info["start_unix_ns"], info["stop_unix_ns"]))
        return events, clock, info

    def _add_metadata(self, info: dict[str, Any]) -> None:
        """Each component's part of the run's info as of now, and whether the process
        used CUDA (``accelerator``: then host times are launch times, issue #28)."""
        for component in self._components:
            component.metadata(info)
        if torch.cuda.is_initialized():
            info["accelerator"] = "cuda"

    def snapshot(self) -> TraceResult:
        """The events recorded so far, readable while recording goes on.

        A copy: recording continues unchanged. Spans still open now are marked
        unfinished in it. After the block, the result.

        Example::

            with hooktrace.trace(model) as tr:
                model(x)
                print(tr.snapshot().summary())
        """
        if self._state == "done":
            return self.result
        if self._state != "recording":
            raise RuntimeError("hooktrace: this trace has not started; enter its with block first")
        if self._writer is not None:
            # Streaming: memory holds only what the writer has not drained; the file,
            # once the writer has caught up with now, holds everything.
            self._writer.flush()
            stats = self._session.stats()
            return self._load_stream(dropped_events=int(stats["dropped"]),
                                     stop_unix_ns=time.time_ns(), thread_names=thread_names())
        events, clock, info = self._collect(stop_unix_ns=time.time_ns())
        return TraceResult(events, self._scope.modules_table(), _C.node_names(), clock, info)

    @property
    def scope(self) -> Scope:
        """What is recorded: one model's modules, or every module of the process."""
        return self._scope

    @property
    def start_unix_ns(self) -> int:
        """When recording began (Unix ns), 0 before."""
        return self._start_unix_ns

    @property
    def out(self) -> str | None:
        """The file this recorder streams to (``out=``), or None (kept in memory)."""
        return self._out


# The result's attributes and methods that the recorder forwards.
_RESULT_ATTRS = frozenset(
    {n for n in dir(TraceResult) if not n.startswith("__")} | _DATA_ATTRS)


class _NoCall:
    """Stands for the ModuleCall when entry failed before acquiring it."""

    def release(self, session: Any) -> None:
        pass

    def clear_global(self) -> None:
        pass


class Trace(Recorder):
    """``hooktrace.trace(model, ...)``: record every submodule's calls inside a ``with`` block.

    Inside the block every module of ``model.named_modules()`` is recorded: each
    forward span is the module's whole call (its forward pre-hooks, ``forward`` and
    forward hooks; FSDP2's unshard included), and backward spans come from autograd
    nodes. Compiled models are not changed: no graph break, no recompile, identical
    outputs; a compiled region is recorded as the span of the module whose call
    enters it. The model is left exactly as it was (nothing is set on it). Options:
    see :class:`Recorder`.

    Example::

        with hooktrace.trace(model) as tr:
            for batch in loader:
                loss = model(batch).sum(); loss.backward(); opt.step()   # a step each
        tr.result.export_chrome("trace.json")
        print(tr.result.summary())
    """

    def __init__(self, model: nn.Module, *, mode: str = "auto", **options: Any) -> None:
        if mode != "auto":
            error = ValueError if isinstance(mode, str) else TypeError
            raise error(
                f"hooktrace: mode={mode!r} is gone: there is one way to record a module call "
                "now, its whole call (hooks included) in every mode; drop the mode argument")
        super().__init__(ModelScope(model), _options(options))


class GlobalTrace(Recorder):
    """``hooktrace.global_trace()``: record every module call in the process in a ``with``
    block (what ``hooktrace run`` and ``HOOKTRACE=1`` use).

    Modules created inside the block (and in functions, threads, libraries) are
    recorded from their first call; nothing has to be passed in. Names: see
    :mod:`hooktrace.record.scopes`. One at a time per process. Options: see
    :class:`Recorder`.

    Example::

        with hooktrace.global_trace(backward=False) as tr:
            model(x)
        tr.result.save("run.htrace")
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(ProcessScope(), _options(options))

    def modules_table(self) -> list[tuple[str, str]]:
        """(qualified name, class name) per slot so far."""
        return self._scope.modules_table()


# Lower-case entry points, as torch.profiler.profile: one signature, documented once.
trace = Trace
global_trace = GlobalTrace


def process_recorder() -> Recorder | None:
    """The global trace recording in this process (hooktrace run, HOOKTRACE=1,
    global_trace()), or None."""
    with _process_lock:
        return _process_recorder


# The signals a critical section holds off when their handler is Python's (issue #46):
# Ctrl-C, and SIGTERM as hooktrace run (record/launch.py) or the program handles it. Their
# handlers end the trace (hooktrace run's writes it, then ends the process): run inside
# a step mark they re-entered the aggregates' window reduction, failed ("need at least one
# array to concatenate") and lost every row since the last part.
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _SignalsDeferred:
    """Holds off Ctrl-C and SIGTERM across a critical section (entering and leaving a
    trace, each step mark): one arriving inside it is recorded and delivered on leaving,
    once the recorder's state is whole again: Ctrl-C as KeyboardInterrupt (by
    ``raise_pending()``, or on leaving unless one is already propagating), a SIGTERM (or a
    Ctrl-C the program handles itself) by raising it again for its handler.

    Only on the main thread (the only one Python runs signal handlers on) and only for a
    handler written in Python: a signal with its default action (SIGTERM outside
    ``hooktrace run``) runs no Python and ends the process wherever it lands. Nested
    sections compose: an inner one raises what it held for the outer one's handler, which
    holds it in turn.
    """

    def __init__(self) -> None:
        self._pending: list[int] = []
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> _SignalsDeferred:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in DEFERRED_SIGNALS:
            handler = signal.getsignal(signum)
            if not callable(handler):  # SIG_DFL, SIG_IGN, or set outside Python
                continue
            try:
                signal.signal(signum, self._record)
            except ValueError:  # not the main interpreter
                continue
            self._saved[signum] = handler
        return self

    def _record(self, signum: int, frame: Any) -> None:
        if signum not in self._pending:
            self._pending.append(signum)

    def raise_pending(self) -> None:
        """A Ctrl-C recorded so far, raised now as KeyboardInterrupt (Python's default
        handler's only)."""
        if signal.SIGINT in self._pending and \
                self._saved.get(signal.SIGINT) is signal.default_int_handler:
            self._pending.remove(signal.SIGINT)
            raise KeyboardInterrupt

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        saved, self._saved = self._saved, {}
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        pending, self._pending = self._pending, []
        # A held signal is never lost: delivered to its handler now, a Ctrl-C unless one
        # is already propagating. SIGTERM first: hooktrace run's handler writes the trace
        # and ends the process, whatever else was held.
        for signum in sorted(pending, key=lambda s: s != signal.SIGTERM):
            if signum == signal.SIGINT and isinstance(exc, KeyboardInterrupt):
                continue
            if signum == signal.SIGINT and saved.get(signum) is signal.default_int_handler:
                raise KeyboardInterrupt
            signal.raise_signal(signum)


def window_handler(directory: str | os.PathLike[str]) -> Callable[[TraceResult], str]:
    """An ``on_window`` handler writing each window to
    ``DIR/<host>_<pid>[_rank<R>].<last step>.htrace`` as it ends; returns the path.

    Example::

        sched = torch.profiler.schedule(wait=5, warmup=1, active=2, repeat=10)
        with hooktrace.trace(model, schedule=sched,
                             on_window=hooktrace.window_handler("traces")):
            train()
    """
    folder = os.fspath(directory)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise OutputPathError(f"{folder}: exists and is not a directory; windows are written "
                              "into a directory")

    def write(window: TraceResult) -> str:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{process_stem(env_rank())}.{window.info['window']['last_step']}"
                                    ".htrace")
        window.save(path)
        return path

    return write


def _options(kwargs: dict[str, Any]) -> RecordOptions:
    """``trace(model, **kwargs)``'s options, or ``options=RecordOptions(...)`` as is."""
    if "options" in kwargs:
        options = kwargs.pop("options")
        if kwargs or not isinstance(options, RecordOptions):
            raise TypeError("hooktrace: give options=RecordOptions(...) alone, or the options "
                            "as keyword arguments")
        return options
    return RecordOptions.from_kwargs(**kwargs)


def _version() -> str:
    from hooktrace._version import __version__

    return __version__


