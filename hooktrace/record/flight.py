"""The flight recorder's dumps: the newest events, every thread's Python stack, and the
module calls each thread is inside right now.

A trace with ``dump_on=`` (any of ``"exception"``, ``"signal"``, ``"hang"``) writes a
dump when an exception escapes its block, when the process receives ``dump_signal``
(SIGUSR1 by default), or when no event was recorded and no step ended for
``hang_timeout`` seconds; ``hooktrace.dump()`` writes one for every active trace on
demand. With ``policy="ring"`` the dump holds the newest events, whatever the run's
length. A dump is a ``.htrace`` file (``DIR/<host>_<pid>[_rank<R>].<reason>-<n>.htrace``)
whose ``info["dump"]`` holds the reason, the step, and per thread the open module calls
(outermost first), how long the innermost has been open and the Python stack; one
line on stderr says where each thread is ("MainThread is inside layers.17.mlp forward,
step 4211, for 93.0 s"), and ``hooktrace stacks DUMP.htrace`` prints it all again.

Taking a dump copies the events under the session's lock, which recording threads
take only when they need a new chunk, so they keep recording meanwhile.

Example::

    with hooktrace.trace(model, policy="ring", capacity=1 << 20,
                         dump_on=("exception", "signal", "hang"), hang_timeout=120) as tr:
        train()          # kill -USR1 <pid> writes hooktrace-dumps/<host>_<pid>.signal-0.htrace
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from hooktrace._naming import env_rank, process_stem
from hooktrace.record.process_state import STATE
from hooktrace.reading import CAT_FORWARD, SPAN_ERROR, SPAN_UNFINISHED, TraceData
from hooktrace.text import describe_dump as describe

__all__ = ["DUMP_REASONS", "FlightRecorder", "describe", "dump", "open_calls", "write_dump"]

DUMP_REASONS = ("exception", "signal", "hang", "nonfinite")

# the recording traces that hooktrace.dump() covers and the dump counter live in
# hooktrace.record.process_state (STATE.active, STATE.dumps_written, under STATE.lock)


def dump(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Write a dump of every recording trace now; returns the files written.

    ``directory`` defaults to each trace's ``dump_dir``.
    """
    with STATE.lock:
        traces = list(STATE.active)
    return [os.fspath(t._dump("request", directory=directory)) for t in traces]


def open_calls(data: TraceData, now_ns: int) -> list[dict[str, Any]]:
    """Per thread that is inside a module call: ``tid``, ``name``, ``open`` (the
    qualified names of the open forward calls, outermost first) and ``since_ns`` (how
    long the innermost has been open at ``now_ns``)."""
    spans = data.spans()
    names = data.info.get("thread_names") or {}
    out = []
    open_fwd = np.flatnonzero(((spans.flags & SPAN_UNFINISHED) != 0) & (spans.cat == CAT_FORWARD))
    for tid in np.unique(spans.tid[open_fwd]).tolist():
        mine = open_fwd[spans.tid[open_fwd] == tid]
        mine = mine[np.argsort(spans.depth[mine], kind="stable")]
        stack = [_module_name(data, int(spans.module[i])) for i in mine.tolist()]
        out.append({"tid": int(tid), "name": str(names.get(str(tid), f"thread {tid}")),
                    "open": stack, "since_ns": int(now_ns - spans.start_ns[mine[-1]])})
    return out


def _module_name(data: TraceData, slot: int) -> str:
    name, type_name = data.modules[slot] if slot < len(data.modules) else ("?", "?")
    return name or type_name


def _last_error(data: TraceData) -> str | None:
    """The innermost module call that raised last, if any."""
    spans = data.spans()
    err = np.flatnonzero((spans.flags & SPAN_ERROR) != 0)
    if not len(err):
        return None
    # An exception escapes through every enclosing call, flagging each: the one
    # that raised is the deepest of the latest chain.
    latest = err[np.lexsort((spans.start_ns[err], spans.depth[err]))[-1]]
    return _module_name(data, int(spans.module[latest]))


def python_stacks() -> dict[str, list[str]]:
    """Every thread's Python stack, keyed ``"<name> (<native id>)"``."""
    frames = sys._current_frames()
    return {f"{t.name} ({t.native_id})": traceback.format_stack(frames[t.ident])
            for t in threading.enumerate() if t.ident in frames}


def write_dump(trace: FlightRecorder, reason: str, directory: str | os.PathLike[str],
               exc: BaseException | None = None) -> Path:
    """Write ``trace``'s events so far with the dump block; print where threads are."""
    data = trace.snapshot()
    now = time.time_ns()
    block: dict[str, Any] = {
        "reason": reason, "time_unix_ns": now, "step": trace.current_step,
        "threads": open_calls(data, now),
    }
    stacks = python_stacks()
    for t in block["threads"]:
        t["python_stack"] = next((s for k, s in stacks.items()
                                  if k.endswith(f"({t['tid']})")), [])
    block["python_stacks"] = stacks
    if exc is not None:
        block["exception"] = f"{type(exc).__name__}: {exc}"[:500]
        block["error_in"] = _last_error(data)
    info = dict(data.info, dump=block)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    stem = process_stem(env_rank())
    n = STATE.next_dump_number()  # numbered per process: several traces may dump to one folder
    path = folder / f"{stem}.{reason}-{n}.htrace"
    TraceData(data.events, data.modules, data.node_names, data.clock, info).save(path)
    for line in describe(info):
        print(f"hooktrace: dump ({reason}) {path}: {line}", file=sys.stderr)
    return path


class HangWatchdog:
    """A thread that dumps once when nothing was recorded and no step ended for
    ``timeout`` seconds, and re-arms when progress resumes. Not on the hot path:
    it polls the session's counters a few times per timeout."""

    def __init__(self, trace: FlightRecorder, timeout: float) -> None:
        self._trace = trace
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hooktrace-watchdog",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        poll = min(1.0, self._timeout / 4)
        last, since, fired = self._trace.progress(), time.monotonic(), False
        while not self._stop.wait(poll):
            now = self._trace.progress()
            if now != last:
                last, since, fired = now, time.monotonic(), False
            elif not fired and time.monotonic() - since >= self._timeout:
                fired = True
                # (a failed dump is one line on stderr: the watchdog goes on)
                self._trace.dump_if_asked("hang")


def check_dump_on(dump_on: object) -> frozenset[str]:
    """``dump_on`` as a set of reasons, or the one-line error saying what is wrong."""
    if dump_on is None:
        return frozenset()
    items = (dump_on,) if isinstance(dump_on, str) else dump_on
    if not isinstance(items, (tuple, list, set, frozenset)) or not all(
            isinstance(i, str) for i in items):
        raise TypeError(f"dump_on must be a string or a sequence of strings, got {dump_on!r}")
    bad = [i for i in items if i not in DUMP_REASONS]
    if bad:
        raise ValueError(f"dump_on: unknown {bad}; choose from {list(DUMP_REASONS)}")
    return frozenset(items)


class FlightRecorder:
    """The flight recorder of a recording (``hooktrace.trace`` and ``global_trace``):
    ``dump_on=``, ``dump()``. The class using it has ``_state``, ``_step``,
    ``_session``, ``_writer`` (the stream writer, None unless streaming) and
    ``snapshot()``, checks its arguments with :meth:`_init_flight_recorder` (with options
    checked by ``RecordOptions``), calls :meth:`_start_flight_recorder` once recording and
    :meth:`_stop_flight_recorder` (idempotent) in its teardown."""

    _state: str
    _step: int
    _session: Any
    _writer: Any

    def snapshot(self) -> TraceData:  # provided by the recording class
        raise NotImplementedError

    def _init_flight_recorder(self, dump_on: frozenset[str], dump_dir: str | os.PathLike[str],
                              hang_timeout: float, dump_signal: int) -> None:
        """Sets the state up from options already checked (hooktrace.record.options)."""
        self._dump_on = dump_on
        self._dump_dir = dump_dir
        self._hang_timeout = float(hang_timeout)
        self._dump_signal = dump_signal
        self._previous_handler: Any = None
        self._watchdog: HangWatchdog | None = None

    def _check_flight_recorder_thread(self) -> None:
        if "signal" in self._dump_on and threading.current_thread() is not threading.main_thread():
            raise ValueError("dump_on='signal' needs the trace to start on the main thread "
                             "(Python runs signal handlers there only)")

    def dump(self, directory: str | os.PathLike[str] | None = None) -> str:
        """Write a flight-recorder dump of this trace now; returns the file's path."""
        if self._state != "recording":
            raise RuntimeError("hooktrace: trace.dump() dumps a trace inside its with block")
        return os.fspath(self._dump("request", directory=directory))

    @property
    def recording(self) -> bool:
        """Whether the block is recording now (entered, not yet exited)."""
        return self._state == "recording"

    @property
    def current_step(self) -> int:
        """The number of the step being recorded (from 0)."""
        return self._step

    def progress(self) -> tuple[int, int]:
        """(events recorded so far, written, dropped or overwritten included; the
        current step): what moves while the run makes progress."""
        stats = self._session.stats()
        # streaming (out=): the session holds only what the writer has not written yet
        written = int(self._writer.stats()["events"]) if self._writer is not None else 0
        return (stats["events"] + written + stats["dropped"] + stats["overwritten"],
                self._step)

    def dump_if_asked(self, reason: str) -> None:
        """A dump for ``reason`` (``"nonfinite"``, ``"hang"``) if ``dump_on`` asks for
        it and the block is recording; a failed dump is one line on stderr, never raised
        into the caller (a component's callback, the watchdog's thread)."""
        if reason in self._dump_on and self.recording:
            self._dump(reason, quiet_errors=True)

    def _dump(self, reason: str, *, exc: BaseException | None = None,
              directory: str | os.PathLike[str] | None = None,
              quiet_errors: bool = False) -> str:
        try:
            return os.fspath(write_dump(self, reason,  # type: ignore[arg-type]
                                        directory or self._dump_dir, exc))
        except Exception as e:
            if not quiet_errors:
                raise
            # (an exception is already escaping: a failed dump must not replace it)
            print(f"hooktrace: {reason} dump failed: {e}", file=sys.stderr)
            return ""

    def _dump_on_exception(self, exc: BaseException | None) -> None:
        """At the block's exit: a dump if an exception escapes it and dump_on asks."""
        if exc is not None and "exception" in self._dump_on and self._state == "recording":
            self._dump("exception", exc=exc, quiet_errors=True)

    def _start_flight_recorder(self) -> None:
        with STATE.lock:
            STATE.active.append(self)
        if "signal" in self._dump_on:
            self._previous_handler = signal.signal(self._dump_signal, self._on_dump_signal)
        if "hang" in self._dump_on:
            self._watchdog = HangWatchdog(self, self._hang_timeout)  # type: ignore[arg-type]
            self._watchdog.start()

    def _stop_flight_recorder(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        if self._previous_handler is not None:
            if signal.getsignal(self._dump_signal) == self._on_dump_signal:
                signal.signal(self._dump_signal, self._previous_handler)
            self._previous_handler = None
        with STATE.lock:
            if self in STATE.active:
                STATE.active.remove(self)

    def _on_dump_signal(self, signum: int, frame: Any) -> None:
        self._dump("signal", quiet_errors=True)
        previous = self._previous_handler
        if callable(previous):  # "safe with other handlers": theirs still runs
            previous(signum, frame)
