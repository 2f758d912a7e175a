"""The recording's own options, declared as the components declare theirs
(record/component.py): how many events are held and what happens when full, the
stream, what ends a step, the schedule's windows, and the flight recorder's dumps.
The recorder core (record/recorder.py, record/flight.py, hooktrace/record/windows.py) reads
them; :class:`~hooktrace.record.options.RecordOptions` is built from these and every
component's."""

from __future__ import annotations

import operator
import os
import signal
from typing import Any

from hooktrace.record.component import Declares, Flag, Option, folder, one_of

__all__ = ["CoreOptions", "DEFAULT_CAPACITY", "MAX_CAPACITY", "MIN_MAX_DISK", "STREAM_CAPACITY",
           "check_capacity", "parse_bytes"]

# 8 Mi events x 32 B = 256 MiB at most, allocated lazily 128 KiB at a time:
# ~40 training steps of a 100k-module-call model before anything is dropped.
DEFAULT_CAPACITY = 8 * 1024 * 1024
# 2**40 events = 32 TiB of buffers: far beyond any real trace, yet small enough that the
# chunk count fits the native session's 32-bit counter. Memory is allocated as recorded.
MAX_CAPACITY = 1 << 40
# Streaming (out=...): the capacity bounds the chunks in flight, not the run.
# 1 Mi events x 32 B = 32 MiB at most, within issue #9's 64 MiB above the untraced
# process; the writer wakes every STREAM_PERIOD_MS (record/streaming.py), so this is
# ~40x what a 2.6 M events/s model records between two wake-ups.
STREAM_CAPACITY = 1 << 20


def check_capacity(capacity: object) -> int:
    """``capacity`` as an int, or the one-line error saying what is wrong with it."""
    import numpy as np

    # bool is an int, and int(2.5) truncates silently: both are refused.
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"capacity must be an int number of events, got "
                        f"{type(capacity).__name__} {capacity!r}")
    value = operator.index(capacity)
    if not 1 <= value <= MAX_CAPACITY:
        raise ValueError(f"capacity must be between 1 and 2**40 events, got {value}")
    return value


# The smallest max_disk (segments of 256 KiB at least: record/recorder.py).
MIN_MAX_DISK = 2 << 20
# The largest: the native writer takes a uint64 (csrc/stream_writer.h); 2**60 bytes (an
# exbibyte) is beyond any disk, and a larger one was a pybind11 traceback (issue #35)
MAX_MAX_DISK = 1 << 60
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_bytes(value: object, what: str) -> int:
    """``2G``, ``500M``, ``1.5GiB`` or an int of bytes (units are powers of 1024), or the
    one-line error naming ``what``."""
    import re

    if isinstance(value, bool):
        raise TypeError(f"{what} must be a size such as '2G' or an int of bytes, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).upper() if m else ""
        if m is None or unit not in _UNITS:
            raise ValueError(f"{what} must be a size such as 2G, 500M or 1.5GiB, got {value!r}")
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise TypeError(f"{what} must be a size such as '2G' or an int of bytes, got "
                        f"{type(value).__name__} {value!r:.60}")
    if n < MIN_MAX_DISK:
        raise ValueError(f"{what} must be at least 2M, got {value!r}")
    if n > MAX_MAX_DISK:
        raise ValueError(f"{what} must be at most {MAX_MAX_DISK >> 40}T (2**60 bytes), got "
                         f"{value!r:.60}")
    return n


def _max_disk(name: str, value: Any) -> int | None:
    # (needs out=: the recorder checks it, as hooktrace run sets out when it starts)
    return None if value is None else parse_bytes(value, name)


def _capacity(name: str, value: Any) -> int | None:
    return None if value is None else check_capacity(value)  # (None: resolve() picks)


def _steps(name: str, value: Any) -> Any:
    if value not in ("optimizer", None):
        raise ValueError(f"steps must be 'optimizer' or None, got {value!r}")
    return value


def _dump_on(name: str, value: Any) -> frozenset[str]:
    from hooktrace.record.flight import check_dump_on

    return check_dump_on(value)


def _hang_timeout(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 < value < float("inf"):
        raise ValueError(f"hang_timeout must be a positive number of seconds, got "
                         f"{value!r:.60}")
    return float(value)


# Signals a Python handler cannot serve: SIGKILL and SIGSTOP cannot be caught; a fault
# (SIGSEGV, SIGBUS, SIGFPE, SIGILL) or abort() returns to the faulting instruction before
# the handler can run between bytecodes, so the process hangs or dies all the same
_UNHANDLED_SIGNALS = tuple(getattr(signal, n) for n in (
    "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
    if hasattr(signal, n))


def _dump_signal(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or \
            value not in signal.valid_signals() or value in _UNHANDLED_SIGNALS:
        raise ValueError(f"dump_signal must be a signal a Python handler can serve (such as "
                         f"signal.SIGUSR1; not SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGFPE, "
                         f"SIGILL or SIGABRT), got {value!r:.60}")
    return value


def _schedule(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"schedule must be a torch.profiler.schedule(...) or a callable "
                        f"step -> ProfilerAction, got {value!r:.60}")
    return value


class CoreOptions(Declares):
    """The recording's own options (not a component: the recorder core uses them)."""

    OPTIONS = (
        Option("capacity", None,
               "events held in memory (32 bytes each): while streaming, those not yet "
               "written (default 1 Mi); with --ring or --schedule, the trace (default 8 Mi). "
               "Events beyond it are dropped and counted",
               type="int | None", check=_capacity, cli="int", callbacks=False),
        Option("policy", "drop",
               "when full, 'drop' keeps the oldest events, 'ring' the newest (flight recorder)",
               type="Literal['drop', 'ring']", check=one_of("drop", "ring"),
               cli=Flag("switch", flag="--ring", value="ring"),
               flag_help="flight recorder: keep the newest --capacity events, not the oldest "
                         "(in memory, written at exit: a ring cannot stream)",
               callbacks=False),
        Option("steps", "optimizer", "what ends a training step: the first optimizer's "
               "step() or nothing",
               type="Literal['optimizer'] | None", check=_steps,
               cli=Flag("choice", choices={"optimizer": "optimizer", "none": None}),
               flag_help="what ends a training step: the first optimizer's step() (default) "
                         "or nothing",
               callbacks=False),
        Option("dump_on", None, "flight-recorder dumps, any of exception,signal,hang,nonfinite",
               type="Any", check=_dump_on, cli=Flag("list", metavar="WHEN"),
               flag_help="flight-recorder dumps, any of exception,signal,hang,nonfinite "
                         "(comma-separated): the events, Python stacks and open module calls "
                         "of every thread, to --dump-dir; with --ring, the newest events; "
                         "nonfinite (the first NaN/Inf of --numerics) turns --numerics on"),
        Option("dump_dir", "hooktrace-dumps", "where dumps go",
               type="str | os.PathLike[str]", check=folder("directory"),
               cli=Flag("str", metavar="DIR"),
               flag_help="where dumps go (default: %(default)s)"),
        Option("hang_timeout", 300.0, "with dump_on hang: seconds without a module call or "
               "step that count as a hang",
               check=_hang_timeout, cli=Flag("float", metavar="SECONDS"),
               flag_help="with --dump-on hang: seconds without a module call or step that "
                         "count as a hang (default: %(default)s)"),
        Option("dump_signal", signal.SIGUSR1, "the signal that asks for a dump",
               type=int, check=_dump_signal, callbacks=False),
        Option("out", None, "stream the events to this .htrace file while the model runs",
               type="str | os.PathLike[str] | None", callbacks=False),
        Option("max_disk", None, "with out, keep the stream within this many bytes (e.g. 2G, "
               "500M): rolling segments OUT.1.htrace, OUT.2.htrace ... beside OUT, which holds "
               "the newest; the oldest are deleted and their events counted as rolled off",
               type="int | None", check=_max_disk, cli=Flag("str", metavar="SIZE"),
               flag_help="keep the streamed --output within this many bytes (e.g. 2G, 500M): "
                         "rolling segments OUTPUT.1.htrace, OUTPUT.2.htrace ... beside OUTPUT, "
                         "which holds the newest; the oldest are deleted and their events "
                         "counted as rolled off",
               callbacks=False),
        Option("schedule", None, "record only the steps a torch.profiler.schedule marks",
               type="Callable[[int], Any] | None", check=_schedule, callbacks=False,
               compare=False),
        Option("on_window", None, "called with each recorded window",
               type="Callable[[Any], Any] | None", callbacks=False, compare=False),
    )

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> None:
        if values["capacity"] is None:
            values["capacity"] = DEFAULT_CAPACITY if values["out"] is None else STREAM_CAPACITY
        schedule, on_window = values["schedule"], values["on_window"]
        if on_window is not None and (schedule is None or not callable(on_window)):
            raise TypeError("on_window needs a schedule and must be callable(window)")
        if schedule is not None and (values["out"] is not None or values["policy"] == "ring"):
            raise ValueError("schedule= records windows and hands each to on_window; it cannot "
                             "be combined with out= or policy='ring' (write each window with "
                             "on_window=hooktrace.window_handler(DIR))")
        if values["out"] is not None:
            values["out"] = _check_stream_path(values["out"], values["policy"])


def _check_stream_path(out: object, policy: str) -> str:
    """The stream's path, or the one-line error saying why it cannot be one."""
    import stat

    from hooktrace._output import check_output_path
    from hooktrace.errors import OutputPathError

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
