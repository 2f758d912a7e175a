"""The recorder: one class for both scopes (issue #16).

``hooktrace.trace(model)`` records the given model's modules, ``global_trace()``
(``hooktrace run``, ``HOOKTRACE=1``) every module in the process; both are a
:class:`Recorder` over one native hot path (``_C.ModuleCall``, record/dispatch.py)
and take the same options. A module's forward span is its whole call, hooks
included, in both (``info["span_definition"]``, hooktrace/_events.py).

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
import operator
import os
import signal
import socket
import stat
import sys
import threading
import time
import warnings
import weakref
from types import TracebackType
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

import hooktrace._C as _C
from hooktrace._events import EVENT_DTYPE, SPAN_DEFINITION, Clock
from hooktrace._naming import env_rank, process_stem
from hooktrace._output import check_output_path
from hooktrace._windows import StepMarks
from hooktrace.record.ranks import apply_test_clock_offset, rank_info
from hooktrace.errors import OutputPathError
from hooktrace.flight import FlightRecorder
from hooktrace.result import TraceResult
from hooktrace.record import dispatch, kernels
from hooktrace.record.scopes import ModelScope, ProcessScope, Scope
from hooktrace.format import (
    BLOCK_FOOTER,
    BLOCK_META,
    encode_json,
    read_trace,
    stream_block,
    stream_header,
)

__all__ = ["DEFAULT_CAPACITY", "GlobalTrace", "Recorder", "Trace", "global_trace", "trace",
           "window_handler"]

Policy = Literal["drop", "ring"]

# 8 Mi events x 32 B = 256 MiB at most, allocated lazily 128 KiB at a time:
# ~40 training steps of a 100k-module-call model before anything is dropped.
DEFAULT_CAPACITY = 8 * 1024 * 1024
# Events are allocated in chunks of this many (128 KiB); capacity is rounded up to whole chunks.
CHUNK_EVENTS = 4096
# 2**40 events = 32 TiB of buffers: far beyond any real trace, yet small enough that the
# chunk count fits the native session's 32-bit counter. Memory is allocated as recorded.
MAX_CAPACITY = 1 << 40
# Streaming (out=...): the capacity bounds the chunks in flight, not the run.
# 1 Mi events x 32 B = 32 MiB at most, within issue #9's 64 MiB above the untraced
# process; the writer wakes every STREAM_PERIOD_MS (or when half of it is in
# flight), so this is ~40x what a 2.6 M events/s model (1000 x Identity, the
# fastest the overhead benchmark records) records between two wake-ups.
STREAM_CAPACITY = 1 << 20
STREAM_PERIOD_MS = 10

# The one process scope of this process (nn.Module calls of the whole process).
_process_lock = threading.Lock()
_process_recorder: Recorder | None = None

# The recorders streaming now, for os.fork() (a DataLoader's workers): their writer
# threads hold no lock across a fork (_before_fork), and in the child the stream stays
# the parent's (nothing is written to it there, the file is not removed).
_streaming: weakref.WeakSet[Recorder] = weakref.WeakSet()
_fork_held: list[Any] = []  # the writers _before_fork locked, until the fork is done


def _before_fork() -> None:
    for recorder in list(_streaming):
        writer = recorder._writer
        if writer is not None and recorder._stream_pid == os.getpid():
            writer.before_fork()
            _fork_held.append(writer)


def _after_fork(in_child: bool) -> None:
    while _fork_held:
        _fork_held.pop().after_fork(in_child)


os.register_at_fork(before=_before_fork, after_in_parent=lambda: _after_fork(False),
                    after_in_child=lambda: _after_fork(True))

# What TraceData sets: read before the block ends, they raise one clear error.
_DATA_ATTRS = frozenset({"events", "modules", "node_names", "clock", "info", "_spans",
                         "_steps"})


class Recorder(StepMarks, FlightRecorder):
    """Records module calls in a ``with`` block: :class:`Trace` (the given model) and
    :class:`GlobalTrace` (every module in the process) are this class with a scope.

    Inside the block every module of the scope is recorded (forward calls, each span
    the module's whole call, hooks included; and backward spans from autograd nodes);
    on exit (exception or not) everything is undone and :attr:`result` holds the
    events as a :class:`~hooktrace.result.TraceResult`. ``snapshot()`` reads the events
    so far while recording goes on.

    Args:
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
        dump_on: flight-recorder dumps (see :mod:`hooktrace.flight`): any of
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
            :mod:`hooktrace.flops`); the summary gains ``flops``/``tflops`` columns.
            In a process scope the root is the first top-level module called.
        memory: record the bytes allocated at every module enter and exit, forward and
            backward, and the peak in between, on CPU and the current CUDA device
            (:mod:`hooktrace.memory`); the summary gains ``mem_net``/``mem_peak``
            columns and the exports a memory counter track.
        numerics: numeric health per module call (:mod:`hooktrace.numerics`): abs-max,
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
            outputs (:mod:`hooktrace.shapes`): span args ``in_shapes``/``out_shapes``
            (and ``*_dtypes``) in the exports, ``hooktrace summary --by-shape``.
    """

    def __init__(
        self,
        scope: Scope,
        *,
        capacity: int | None = None,
        policy: Policy = "drop",
        backward: bool = True,
        emit_profiler: bool = False,
        steps: Literal["optimizer"] | None = "optimizer",
        dump_on: str | Sequence[str] | None = None,
        dump_dir: str | os.PathLike[str] = "hooktrace-dumps",
        hang_timeout: float = 300.0,
        dump_signal: int = signal.SIGUSR1,
        out: str | os.PathLike[str] | None = None,
        schedule: Callable[[int], Any] | None = None,
        on_window: Callable[[TraceResult], Any] | None = None,
        flops: bool = False,
        memory: bool = False,
        numerics: bool = False,
        numerics_every: int = 1,
        shapes: bool = False,
    ) -> None:
        # Everything is checked here, before anything is touched: a bad argument must
        # never leave a model half-instrumented.
        if not isinstance(policy, str) or policy not in ("drop", "ring"):
            error = ValueError if isinstance(policy, str) else TypeError
            raise error(f"policy must be one of 'drop', 'ring'; got {policy!r}")
        flag_values: tuple[tuple[str, object], ...] = (
            ("backward", backward), ("emit_profiler", emit_profiler), ("flops", flops),
            ("memory", memory), ("numerics", numerics), ("shapes", shapes))
        for flag, flag_value in flag_values:
            if not isinstance(flag_value, (bool, np.bool_)):
                raise TypeError(f"{flag} must be True or False, got "
                                f"{type(flag_value).__name__} {flag_value!r}")
        if (isinstance(numerics_every, bool) or not isinstance(numerics_every, (int, np.integer))
                or numerics_every < 1):
            raise ValueError(f"numerics_every must be a positive integer (steps), got "
                             f"{numerics_every!r}")
        self._scope = scope
        self._init_steps(steps)
        self._init_flight_recorder(dump_on, dump_dir, hang_timeout, dump_signal)
        if "nonfinite" in self._dump_on and not numerics:
            raise ValueError("dump_on='nonfinite' needs numerics=True (the values are checked "
                             "only then)")
        if capacity is None:
            capacity = DEFAULT_CAPACITY if out is None else STREAM_CAPACITY
        capacity = _check_capacity(capacity)
        self._init_windows(schedule, on_window, policy, streaming=out is not None)
        self._out = None if out is None else _check_stream_path(out, policy)
        self._writer: Any = None
        self._stream_fd = -1
        self._stream_lost: tuple[str, int] | None = None  # (write error, events lost)
        self._stream_counts: dict[str, int] | None = None  # what the stream holds, at its end
        self._stream_pid = 0  # the process writing the stream (a forked child does not)
        self._capacity = capacity
        self._policy = policy
        self._backward = bool(backward)
        self._emit_profiler = bool(emit_profiler)
        self._flops = bool(flops)
        self._memory = bool(memory)
        self._numerics = bool(numerics)
        self._fused_reason: str | None = None  # why the deferred numerics are not fused
        self._shapes = bool(shapes)
        self._numerics_every = int(numerics_every)
        self._session: Any = None
        self._call: Any = None  # the _C.ModuleCall while this recorder holds it
        self._state: Literal["new", "recording", "done"] = "new"
        self._flop_recorder: Any = None
        self._memory_info: dict[str, Any] | None = None
        self._cuda_allocations = -1  # the CUDA device's allocations when memory recording began
        self._flop_window_start = 0  # the FLOP recorder's root calls before this window
        self._result: TraceResult | None = None
        self._start_unix_ns = 0

    # -- context manager ---------------------------------------------------

    def __enter__(self) -> Recorder:
        global _process_recorder
        if self._state != "new":
            raise RuntimeError(f"a hooktrace.{type(self).__name__} can be entered only once; "
                               "make another")
        self._check_flight_recorder_thread()
        scope = self._scope
        if self._numerics:  # (process-wide, harmless: before anything that needs undoing)
            self._fused_reason = _use_fused_numerics(scope)
        # What can fail without touching anything is done first (the session
        # allocates nothing until the first event).
        session = _C.Session(self._capacity, self._policy)
        if self._memory:
            from hooktrace.memory import cuda_allocations, enable

            self._memory_info = enable(
                session, scope.model() if isinstance(scope, ModelScope) else None)
            self._cuda_allocations = cuda_allocations(self._memory_info)
        # All or nothing: a Ctrl-C is held off until recording fully started, then
        # aborts the entry like any exception, undoing every step taken.
        with _SigintDeferred() as sigint:
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
            if self._emit_profiler:
                if isinstance(scope, ModelScope):
                    session.set_emit_names(scope.emit_names())
                elif isinstance(scope, ProcessScope):
                    session.set_emit_names([])
                    scope.on_new_slot = lambda slot, name: session.add_emit_name(name)
            try:
                self._start_unix_ns = time.time_ns()
                session.set_shapes(self._shapes)
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
                if self._backward:
                    _C.add_backward_session(session)
                _C.add_kernel_session(session)  # kernel marks of compiled code (kernels.py)
                if self._numerics:
                    session.set_nonfinite_callback(self._on_first_nonfinite)
                    session.set_numerics(True)  # step 0 is always measured
                self._start_steps()
                self._call = dispatch.acquire(self)
                scope.attach(self._call, session)
                if self._flops:
                    self._start_flops()
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
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._dump_on_exception(exc)
        self._finish()

    def _release_process_slot(self) -> None:
        global _process_recorder
        with _process_lock:
            if _process_recorder is self:
                _process_recorder = None

    def _start_flops(self) -> None:
        from hooktrace.flops import FlopRecorder

        root = self._scope.flops_root()
        if root is not None:
            self._flop_recorder = FlopRecorder(root)
            self._flop_recorder.start()
        elif isinstance(self._scope, ProcessScope):
            # FLOPs are counted from the first top-level module, once it is called.
            def first_root(module: nn.Module) -> None:
                if self._flop_recorder is None and self._state == "recording":
                    from hooktrace.flops import FlopRecorder

                    self._flop_recorder = FlopRecorder(module)
                    self._flop_recorder.start()

            self._scope.on_new_root = first_root

    # -- steps and windows (hooktrace._windows.StepMarks) -----------------

    def _before_step_mark(self) -> None:
        if self._flop_recorder is not None:
            self._flop_recorder.on_step()  # FlopCounterMode's slow dispatch ends here

    def _window_opened(self) -> None:
        if self._flop_recorder is not None:
            self._flop_window_start = len(self._flop_recorder.calls)

    def _window_meta(self) -> tuple[Clock, dict[str, Any]]:
        _, clock, info = self._collect(stop_unix_ns=time.time_ns(), with_events=False)
        if self._flop_recorder is not None:
            # A window's spans number its root calls from 0: its FLOP calls likewise
            info["flops"] = self._flop_recorder.to_info(first_call=self._flop_window_start)
        return clock, info

    def _window_modules(self) -> list[tuple[str, str]]:
        return self._scope.modules_table()

    # -- teardown ------------------------------------------------------------

    def _teardown(self) -> list[BaseException]:
        """Undoes everything __enter__ did. Every step runs even when one raises; one cut
        short by a KeyboardInterrupt (possible only when SIGINT could not be deferred) is
        redone, all steps being idempotent. Returns what was raised."""
        session, call = self._session, self._call
        steps: list[Any] = [self._stop_flight_recorder, session.stop]
        if self._numerics:  # deferred statistics (csrc/numerics.h) while it still records
            steps.insert(0, lambda: _C.flush_numerics(session))
        if self._flop_recorder is not None:
            steps.insert(0, self._flop_recorder.stop)  # idempotent
        if self._optimizer_hook is not None:
            steps.append(self._optimizer_hook.remove)  # idempotent
        if self._backward:
            steps.append(lambda: _C.remove_backward_session(session))
        steps.append(lambda: _C.remove_kernel_session(session))
        if self._numerics:
            steps.append(lambda: session.set_numerics(False))
            steps.append(lambda: session.set_nonfinite_callback(None))
            steps.append(lambda: _C.forget_numerics(session))
        if call is not None:
            steps.append(lambda: self._scope.detach(call, session))
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

    def _mark_step(self) -> int:
        if self._numerics and self._session is not None:
            # the step's deferred statistics (off-CPU tensors): one read for the step
            _C.flush_numerics(self._session)
        ended = super()._mark_step()
        if self._numerics and self._numerics_every > 1 and self._session is not None:
            self._session.set_numerics(self._step % self._numerics_every == 0)  # sampling
        return ended

    def _on_first_nonfinite(self, slot: int, backward: bool) -> None:
        """Called once by the native core (numerics.cpp), with the GIL, when the first
        non-finite value is seen: one line on stderr, and a dump if asked. The summary's
        ``first_nonfinite`` (hooktrace.numerics) is computed from the events, which also
        name the call and pick the innermost module of a tie."""
        table = self._scope.modules_table()
        name = (table[slot][0] or "<root>") if slot < len(table) else f"<module {slot}>"
        phase, what = ("backward", "gradient of its inputs") if backward else ("forward", "output")
        print(f"hooktrace: first non-finite value: {name} {phase} ({what}), step {self._step}",
              file=sys.stderr)
        if "nonfinite" in self._dump_on and self._state == "recording":
            self._dump("nonfinite", quiet_errors=True)

    def _release_call(self) -> None:
        dispatch.release(self)  # idempotent

    def _finish(self) -> None:
        if self._state != "recording":
            self._release_process_slot()
            return
        self._state = "done"
        errors: list[BaseException] = []
        try:
            with _SigintDeferred():
                errors = self._teardown()
        finally:
            if self._writer is not None:
                with _SigintDeferred():
                    self._finish_stream(stop_unix_ns=time.time_ns())
            elif self._schedule is not None:
                # Every finished window went to on_window; a window still being
                # recorded is handed over too (as torch.profiler saves one on exit),
                # and is the result.
                self._result = self._final_window(self._step)
            else:
                # The model is clean by now; reading the events out may be interrupted.
                events, clock, info = self._collect(stop_unix_ns=time.time_ns())
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
            model = scope._model_ref()
            return type(model).__name__ if model is not None else "a deleted model"
        return "every module"

    # -- reading ---------------------------------------------------------------

    def _compiles(self) -> dict[str, Any]:
        return _compiles_info(self._start_unix_ns or 0)

    def _run_info(self, session: Any) -> dict[str, Any]:
        """What describes the run itself (metadata of both file versions)."""
        return {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "torch_version": torch.__version__,
            "hooktrace_version": _version(),
            "scope": self._scope.kind,
            "span_definition": SPAN_DEFINITION,
            "backward": self._backward,
            "emit_profiler": self._emit_profiler,
            "policy": self._policy,
            "capacity": int(session.capacity),
            "start_unix_ns": self._start_unix_ns,
            "thread_names": _thread_names(),
            **({"memory": self._memory_info} if self._memory_info is not None else {}),
            **({"numerics": {"every": self._numerics_every, "backward": "input gradients",
                             **_deferred_path(self._fused_reason)}}
               if self._numerics else {}),
            **_kernel_sites(),
            **self._compiles(),
            **({"shape_signatures": _C.shape_signatures()} if self._shapes else {}),
            **self._scope.info(),
        }

    def _collect(self, stop_unix_ns: int, *, with_events: bool = True
                 ) -> tuple[np.ndarray, Clock, dict[str, Any]]:
        """The session's events so far, its clock, and the run's metadata."""
        session = self._session
        stats = session.stats()
        events = np.empty(stats["events"] if with_events else 0, dtype=EVENT_DTYPE)
        events = events[: session.copy_events(events)] if with_events else events
        ticks0, unix_ns0, ns_per_tick = session.clock()
        info = self._run_info(session)
        info.update(dropped_events=int(stats["dropped"]),
                    overwritten_events=int(stats["overwritten"]), stop_unix_ns=stop_unix_ns)
        self._add_memory(info)
        self._add_flops(info)
        clock = Clock(int(ticks0), int(unix_ns0), float(ns_per_tick))
        # Many ranks (issue #11, hooktrace/distributed.py): rank, world size, backend and
        # the clock offset to rank 0 measured by align_clocks(); {} in a single process.
        clock = apply_test_clock_offset(clock, info)  # the identity unless a test sets one
        info.update(rank_info(info["start_unix_ns"], info["stop_unix_ns"]))
        return events, clock, info

    def _add_memory(self, info: dict[str, Any]) -> None:
        """The memory block as of now: without a CUDA device the run did not allocate on."""
        if self._memory_info is not None:
            from hooktrace.memory import finish

            info["memory"] = finish(self._memory_info, self._cuda_allocations)

    def _add_flops(self, info: dict[str, Any]) -> None:
        if self._flop_recorder is not None:
            info["flops"] = self._flop_recorder.to_info()
            if torch.cuda.is_available():
                info["device_name"] = torch.cuda.get_device_name()

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
            contents = read_trace(self._out)  # type: ignore[arg-type]
            stats = self._session.stats()
            info = dict(contents.info)
            info.pop("cut", None)  # not cut: still recording
            info.update(dropped_events=int(stats["dropped"]), stop_unix_ns=time.time_ns(),
                        thread_names=_thread_names(), out=self._out)
            return TraceResult(contents.events, contents.modules, contents.node_names,
                             contents.clock, info)
        events, clock, info = self._collect(stop_unix_ns=time.time_ns())
        return TraceResult(events, self._scope.modules_table(), _C.node_names(), clock, info)

    # -- streaming (out=...) ------------------------------------------------

    def _open_stream(self, session: Any) -> None:
        """Starts the file (header and META) and creates its writer; nothing else yet.

        Written in place, not through a temporary file: the point of a stream is that
        the file at ``out`` is readable at every moment, a killed run included.
        """
        assert self._out is not None
        fd = os.open(self._out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        self._stream_fd = fd
        self._stream_pid = os.getpid()
        meta = self._run_info(session)
        meta["modules"] = [[name, type_name] for name, type_name in self._scope.modules_table()]
        _write_all(fd, stream_header() + stream_block(BLOCK_META, encode_json(meta)))
        self._writer = _C.StreamWriter(session, fd, STREAM_PERIOD_MS)
        _streaming.add(self)
        if isinstance(self._scope, ProcessScope):
            # its table grows while recording (it is [] in META): MODULES blocks
            self._scope.on_modules = self._writer.set_modules

    def _abandon_stream(self) -> None:
        """Entry failed before recording: the file holds no run, so it goes."""
        if self._stream_fd >= 0:
            os.close(self._stream_fd)
            self._stream_fd = -1
            self._writer = None
            assert self._out is not None
            with contextlib.suppress(OSError):
                os.unlink(self._out)

    def _finish_stream(self, stop_unix_ns: int) -> None:
        """Drains the last events (the session is stopped), then the FOOTER, then closes."""
        writer, session, scope = self._writer, self._session, self._scope
        _streaming.discard(self)
        if self.streamed_by_parent():
            # a forked child's copy: the writer thread and the file are the parent's
            writer.stop()  # (inert here: joins and writes nothing)
            os.close(self._stream_fd)
            self._stream_fd = -1
            self._writer = None
            return
        try:
            if isinstance(scope, ProcessScope):
                scope.on_modules = None
                writer.set_modules(0, scope.modules_table())  # (unchanged: nothing to write)
            writer.stop()
            stats, written = session.stats(), writer.stats()
            footer = {
                "dropped_events": int(stats["dropped"]),
                "overwritten_events": int(stats["overwritten"]),
                "stop_unix_ns": stop_unix_ns,
                "thread_names": _thread_names(),
                "events": int(written["events"]),
                # the writer's own figures: how far memory went, how busy it was
                "stream": {"chunks": int(stats["chunks"]), "rounds": int(written["rounds"]),
                           "blocks": int(written["blocks"]), "bytes": int(written["bytes"]),
                           "busy_ns": int(written["busy_ns"]),
                           "cpu_ns": int(written["cpu_ns"])},
            }
            # rank, world size and clock offsets (issue #11), as save()d files have them
            footer.update(rank_info(self._start_unix_ns, stop_unix_ns))
            footer.update(scope.info())  # a process scope's top-level modules, as of now
            footer.update(_kernel_sites())  # sites of regions compiled while streaming
            footer.update(self._compiles())
            if self._shapes:  # signatures seen while streaming
                footer["shape_signatures"] = _C.shape_signatures()
            self._add_memory(footer)  # the devices the run used
            self._add_flops(footer)  # (stopped by now: every count closed)
            self._stream_counts = {"events": int(written["events"]),
                                   "dropped_events": int(stats["dropped"]),
                                   "overwritten_events": int(stats["overwritten"])}
            if written["error"]:
                # Every block before the failed one is intact: the file loads up to it.
                # Its events after that are dropped events of the result (the file cannot
                # say so: it could not be written).
                self._stream_lost = (str(written["error"]),
                                     int(written["lost_events"]) + int(stats["dropped"]))
                self._stream_counts["dropped_events"] += int(written["lost_events"])
                warnings.warn(
                    f"hooktrace: writing {self._out} failed at {written['error']}; "
                    f"{int(written['lost_events']):,} events were lost and the file ends "
                    "there (it loads up to that point)", RuntimeWarning, stacklevel=4)
            else:
                _write_all(self._stream_fd, stream_block(BLOCK_FOOTER, encode_json(footer)))
        finally:
            os.close(self._stream_fd)
            self._stream_fd = -1
            self._writer = None

    @property
    def out(self) -> str | None:
        """The file this recorder streams to (``out=``), or None (kept in memory)."""
        return self._out

    def stream_counts(self) -> dict[str, int]:
        """After a streamed block: ``events`` (written to the file), ``dropped_events``
        and ``overwritten_events``, without reading the file back."""
        if self._stream_counts is None:
            raise RuntimeError("hooktrace: stream_counts() is there once a streamed (out=) "
                               "trace has ended")
        return dict(self._stream_counts)

    def streamed_by_parent(self) -> bool:
        """Whether this is a forked child's copy of a streaming recorder: the stream is
        the parent process's (the child writes nothing to it)."""
        return self._out is not None and self._stream_pid not in (0, os.getpid())

    def discard_stream(self) -> None:
        """After the block: deletes the streamed file (a run with nothing worth keeping,
        e.g. no module called); not in a forked child (the file is the parent's)."""
        if self._state != "done":
            raise RuntimeError("hooktrace: discard_stream() is for a trace that has ended")
        if self._out is not None and not self.streamed_by_parent():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._out)

    def _load_stream(self) -> TraceResult:
        assert self._out is not None
        contents = read_trace(self._out)
        info = dict(contents.info)
        info["out"] = self._out
        if self._stream_lost is not None:
            error, lost = self._stream_lost
            info["stream_error"] = error
            info["dropped_events"] = int(info.get("dropped_events", 0)) + lost
        return TraceResult(contents.events, contents.modules, contents.node_names,
                           contents.clock, info)


def _compiles_info(start_unix_ns: int) -> dict[str, Any]:
    """``compiles``: [start, end, thread id, trigger] of each torch.compile compile while
    recording (record/dispatch.py), when there were any."""
    found = dispatch.compiles_since(start_unix_ns)
    return {"compiles": found} if found else {}


def _use_fused_numerics(scope: Scope) -> str | None:
    """Hands the fused Triton reduction (record/fused_numerics.py) to the native core
    for the deferred numerics, when the traced model is on a CUDA device (a global
    trace: when CUDA is available), ``triton`` imports and ``HOOKTRACE_NUMERICS_FUSED``
    is not ``0``; else returns why not.
    Triton is imported only then (never on a CPU-only run). A launcher already
    registered (by an earlier trace, or a test) is kept; after a failure of the fused
    kernel in this process, the ATen ops stay in charge."""
    registered, error = _C.numerics_fused_state()
    if registered:
        return None
    if os.environ.get("HOOKTRACE_NUMERICS_FUSED", "") == "0":
        return "turned off (HOOKTRACE_NUMERICS_FUSED=0)"
    if error is not None:
        return f"the fused kernel failed earlier in this process ({error})"
    if not torch.cuda.is_available():
        return "no CUDA device: on the CPU each call's statistics are read at once"
    if isinstance(scope, ModelScope):
        model = scope.model()
        on_cuda = any(t.is_cuda for t in (*model.parameters(), *model.buffers()))
        if not on_cuda:
            return "the model is not on a CUDA device"
    try:
        from hooktrace.record import fused_numerics

        fused_numerics.register()
    except Exception as e:  # (not installed, or an import that fails on this system)
        return f"triton is not usable ({type(e).__name__}: {e})".splitlines()[0]
    return None


def _deferred_path(reason: str | None) -> dict[str, str]:
    """``info["numerics"]``'s word on the deferred (GPU) path: ``deferred_path``,
    "triton" (one fused kernel per tensor) or "aten" (five ATen ops per tensor), and
    ``deferred_note`` saying why not triton (a failure of the fused kernel included:
    the ATen ops took over from it)."""
    registered, error = _C.numerics_fused_state()
    if error is not None:
        return {"deferred_path": "aten",
                "deferred_note": f"the fused Triton kernel failed, the ATen ops took over: {error}"}
    if registered:
        return {"deferred_path": "triton"}
    return {"deferred_path": "aten", "deferred_note": reason or "no fused launcher registered"}


def _kernel_sites() -> dict[str, Any]:
    """``kernel_sites``: the kernel call sites of compiled code marked so far
    (record/kernels.py), when there are any: kernel events name them by index."""
    n = kernels.site_count()
    return {"kernel_sites": kernels.sites()} if n else {}


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
        super().__init__(ModelScope(model), **options)


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
        super().__init__(ProcessScope(), **options)

    def modules_table(self) -> list[tuple[str, str]]:
        """(qualified name, class name) per slot so far."""
        return self._scope.modules_table()


# Lower-case entry points, as torch.profiler.profile: one signature, documented once.
trace = Trace
global_trace = GlobalTrace


class _SigintDeferred:
    """Holds off Ctrl-C across a critical section: a SIGINT arriving inside it is
    recorded and raised as KeyboardInterrupt by ``raise_pending()`` or on leaving.

    Only on the main thread (the only one Python runs signal handlers on) and only
    while the handler is Python's default one; another handler was installed by
    someone who wants it called, and is left alone. Nested sections defer to the
    outermost (the handler is then ours, not the default).
    """

    def __init__(self) -> None:
        self._pending = False
        self._active = False

    def __enter__(self) -> _SigintDeferred:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            try:
                signal.signal(signal.SIGINT, self._record)
                self._active = True
            except ValueError:  # not the main interpreter
                pass
        return self

    def _record(self, signum: int, frame: Any) -> None:
        self._pending = True

    def raise_pending(self) -> None:
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._active:
            self._active = False
            signal.signal(signal.SIGINT, signal.default_int_handler)
        # A Ctrl-C is never lost: raised here unless one is already propagating.
        if self._pending and not isinstance(exc, KeyboardInterrupt):
            self._pending = False
            raise KeyboardInterrupt


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


def _thread_names() -> dict[str, str]:
    return {str(t.native_id): t.name for t in threading.enumerate()}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _check_stream_path(out: object, policy: str) -> str:
    """The stream's path, or the one-line error saying why it cannot be one."""
    if not isinstance(out, (str, os.PathLike)) or isinstance(os.fspath(out), bytes):
        raise TypeError(f"out must be a file path (str or os.PathLike), got "
                        f"{type(out).__name__} {out!r:.60}")
    name = os.fspath(out)
    if policy == "ring":
        raise ValueError("out= cannot be combined with policy='ring': a ring recycles chunks "
                         "the stream writer may still be reading; streaming drops (and counts) "
                         "events when the writer falls behind")
    if name == "-":
        raise OutputPathError("-: a stream is read back when the block ends; give a file name")
    check_output_path(name)
    folder = os.path.dirname(os.path.abspath(name))
    if os.path.exists(name):
        if not stat.S_ISREG(os.stat(name).st_mode):
            raise OutputPathError(f"{name}: not a regular file; a stream is read back when the "
                                  "block ends, give a file name")
        if not os.access(name, os.W_OK):
            raise OutputPathError(f"{name}: is not writable")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{name}: the folder {folder} is not writable")
    return name


def _check_capacity(capacity: object) -> int:
    # bool is an int, and int(2.5) truncates silently: both are refused.
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"capacity must be an int number of events, got {type(capacity).__name__} {capacity!r}")
    value = operator.index(capacity)
    if not 1 <= value <= MAX_CAPACITY:
        raise ValueError(f"capacity must be between 1 and 2**40 events, got {value}")
    return value


def _version() -> str:
    from hooktrace._version import __version__

    return __version__


