"""Every recording option in one place (issue #27): :class:`RecordOptions`.

``trace()``, ``global_trace()``, ``hooktrace run``, ``HOOKTRACE=1`` and the trainer
callbacks all build one; it checks each option once, when it is made, with the same
one-line errors everywhere (before anything is touched: a bad argument never leaves a
model half-instrumented). Options that components refuse together (e.g.
``dump_on="nonfinite"`` without ``numerics``) are checked by the components
(:mod:`hooktrace.record.component`) when the recorder is made.

:data:`OPTION_HELP` holds each option's one-line help, read by ``hooktrace run``'s
argparse help (``HOOKTRACE_OPTIONS`` too) and the trainer callbacks.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DEFAULT_CAPACITY", "DetailPolicy", "MAX_CAPACITY", "OPTION_HELP", "RecordOptions",
           "STREAM_CAPACITY"]

Policy = Literal["drop", "ring"]

# 8 Mi events x 32 B = 256 MiB at most, allocated lazily 128 KiB at a time:
# ~40 training steps of a 100k-module-call model before anything is dropped.
DEFAULT_CAPACITY = 8 * 1024 * 1024
# 2**40 events = 32 TiB of buffers: far beyond any real trace, yet small enough that the
# chunk count fits the native session's 32-bit counter. Memory is allocated as recorded.
MAX_CAPACITY = 1 << 40
# Streaming (out=...): the capacity bounds the chunks in flight, not the run.
# 1 Mi events x 32 B = 32 MiB at most, within issue #9's 64 MiB above the untraced
# process; the writer wakes every STREAM_PERIOD_MS (record/recorder.py), so this is
# ~40x what a 2.6 M events/s model records between two wake-ups.
STREAM_CAPACITY = 1 << 20

# One line of help per option, written once: hooktrace run's --help (launch.py) and
# the trainer callbacks' option names (integrations/) read it.
OPTION_HELP: Mapping[str, str] = {
    "capacity": "events held in memory (32 bytes each): while streaming, those not yet "
                "written (default 1 Mi); with --ring or --schedule, the trace (default 8 Mi). "
                "Events beyond it are dropped and counted",
    "policy": "when full, 'drop' keeps the oldest events, 'ring' the newest (flight recorder)",
    "backward": "record autograd nodes (per-module backward spans)",
    "emit_profiler": "also open a torch.profiler range per module call",
    "steps": "what ends a training step: the first optimizer's step() or nothing",
    "dump_on": "flight-recorder dumps, any of exception,signal,hang,nonfinite",
    "dump_dir": "where dumps go",
    "hang_timeout": "with dump_on hang: seconds without a module call or step that count "
                    "as a hang",
    "dump_signal": "the signal that asks for a dump",
    "out": "stream the events to this .htrace file while the model runs",
    "schedule": "record only the steps a torch.profiler.schedule marks",
    "on_window": "called with each recorded window",
    "flops": "also count FLOPs per module call (as trace(model, flops=True)): hooktrace "
             "summary --flops shows them",
    "memory": "also record the bytes allocated at every module call and the peak inside it "
              "(CPU, and the current CUDA device when there is one)",
    "numerics": "also record each module call's output abs-max, RMS and non-finite count, "
                "and of the gradient of its inputs (as trace(model, numerics=True)); the "
                "first NaN/Inf is named on stderr and in hooktrace summary --json "
                "(first_nonfinite)",
    "numerics_every": "with numerics, measure steps 0, N, 2N, ... only (default: every step)",
    "shapes": "also record the dtypes and shapes of every forward call's tensor inputs and "
              "outputs (span args in_shapes/out_shapes; hooktrace summary --by-shape)",
    "max_disk": "with out, keep the stream within this many bytes (e.g. 2G, 500M): rolling "
                "segments OUT.1.htrace, OUT.2.htrace ... beside OUT, which holds the newest; "
                "the oldest are deleted and their events counted as rolled off",
    "aggregate": "reduce each step's events to per-module rows (calls, forward/backward "
                 "p50/max ms, numerics) in this folder (Parquet: DIR/aggregates), dropping the "
                 "raw events unless the detail policy keeps the step (DIR/steps/step-N.htrace)",
    "aggregate_interval": "with aggregate, seconds of steps reduced into one row per module "
                          "(default 1: disk grows with time, not with steps; 0: every step)",
    "detail": "with aggregate, which steps keep their raw events: every=N, slow=K (K x the "
              "median step), nonfinite (the first), signal (SIGUSR2); default "
              "every=10000,slow=3,nonfinite,signal",
}

_FLAGS = ("backward", "emit_profiler", "flops", "memory", "numerics", "shapes")


@dataclass(frozen=True)
class DetailPolicy:
    """``aggregate=``: which steps keep their raw events (record/aggregate.py)."""

    every: int = 1000
    slow: float = 3.0
    nonfinite: bool = True
    signal: bool = True

    @classmethod
    def parse(cls, text: object) -> DetailPolicy:
        """``"every=10000,slow=3,nonfinite,signal"`` (``every=0``/``slow=0``: off; a
        trigger left out is off), or the one-line error."""
        if isinstance(text, DetailPolicy):
            return text
        if not isinstance(text, str):
            raise TypeError(f"detail must be a string such as 'every=1000,slow=3,nonfinite', "
                            f"got {type(text).__name__} {text!r:.60}")
        every, slow, nonfinite, sig = 0, 0.0, False, False
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            try:
                if key == "every" and value:
                    every = int(value)
                    if every < 0:
                        raise ValueError
                elif key == "slow" and value:
                    slow = float(value)
                    if not (slow == 0 or slow > 1):
                        raise ValueError
                elif key == "nonfinite" and not value:
                    nonfinite = True
                elif key == "signal" and not value:
                    sig = True
                else:
                    raise KeyError
            except KeyError:
                raise ValueError(f"detail: unknown trigger {part!r}; expected every=N, slow=K, "
                                 "nonfinite, signal") from None
            except ValueError:
                raise ValueError(f"detail: {part!r}: expected every=N (N >= 0 steps) or slow=K "
                                 "(K > 1, times the median step)") from None
        return cls(every, slow, nonfinite, sig)


@dataclass(frozen=True)
class RecordOptions:
    """Every option of a recording, checked once (``__post_init__``): see
    :class:`hooktrace.record.Recorder` for what each does. ``capacity`` is resolved
    (its default depends on ``out``), ``dump_on`` is a frozenset, ``out`` a str."""

    capacity: int | None = None
    policy: Policy = "drop"
    backward: bool = True
    emit_profiler: bool = False
    steps: Literal["optimizer"] | None = "optimizer"
    dump_on: Any = None
    dump_dir: str | os.PathLike[str] = "hooktrace-dumps"
    hang_timeout: float = 300.0
    dump_signal: int = signal.SIGUSR1
    out: str | os.PathLike[str] | None = None
    schedule: Callable[[int], Any] | None = field(default=None, compare=False)
    on_window: Callable[[Any], Any] | None = field(default=None, compare=False)
    flops: bool = False
    memory: bool = False
    numerics: bool = False
    numerics_every: int = 1
    shapes: bool = False
    max_disk: int | str | None = None
    aggregate: str | os.PathLike[str] | None = None
    detail: Any = "every=10000,slow=3,nonfinite,signal"
    aggregate_interval: float = 1.0

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> RecordOptions:
        """The options of ``trace(model, **kwargs)``; an unknown name is a TypeError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"hooktrace: unknown option {unknown[0]!r}; the options are "
                            f"{', '.join(sorted(names))}")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        # (numpy and the flight recorder on first use: `hooktrace --help` reads OPTION_HELP)
        import numpy as np

        from hooktrace.record.flight import check_dump_on

        set_ = object.__setattr__
        policy = self.policy
        if not isinstance(policy, str) or policy not in ("drop", "ring"):
            error = ValueError if isinstance(policy, str) else TypeError
            raise error(f"policy must be one of 'drop', 'ring'; got {policy!r}")
        for flag in _FLAGS:
            value = getattr(self, flag)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{flag} must be True or False, got "
                                f"{type(value).__name__} {value!r}")
            set_(self, flag, bool(value))
        every = self.numerics_every
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"numerics_every must be a positive integer (steps), got "
                             f"{every!r}")
        set_(self, "numerics_every", int(every))
        if self.steps not in ("optimizer", None):
            raise ValueError(f"steps must be 'optimizer' or None, got {self.steps!r}")
        set_(self, "dump_on", check_dump_on(self.dump_on))
        if os.path.exists(self.dump_dir) and not os.path.isdir(self.dump_dir):
            raise ValueError(f"dump_dir {os.fspath(self.dump_dir)!r} exists and is not a "
                             "directory")
        timeout = self.hang_timeout
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"hang_timeout must be a positive number of seconds, got "
                             f"{timeout!r}")
        set_(self, "hang_timeout", float(timeout))
        sig = self.dump_signal
        if sig not in signal.valid_signals() or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"dump_signal must be a signal that can be handled, got {sig!r}")
        capacity = self.capacity
        if capacity is None:
            capacity = DEFAULT_CAPACITY if self.out is None else STREAM_CAPACITY
        set_(self, "capacity", check_capacity(capacity))
        if self.schedule is not None and not callable(self.schedule):
            raise TypeError(f"schedule must be a torch.profiler.schedule(...) or a callable "
                            f"step -> ProfilerAction, got {self.schedule!r:.60}")
        if self.on_window is not None and (self.schedule is None or not callable(self.on_window)):
            raise TypeError("on_window needs a schedule and must be callable(window)")
        if self.schedule is not None and (self.out is not None or policy == "ring"):
            raise ValueError("schedule= records windows and hands each to on_window; it cannot "
                             "be combined with out= or policy='ring' (write each window with "
                             "on_window=hooktrace.window_handler(DIR))")
        if self.out is not None:
            set_(self, "out", _check_stream_path(self.out, policy))
        if self.max_disk is not None:  # (needs out=: checked by the recorder, as hooktrace
            # run sets out when it starts)
            set_(self, "max_disk", parse_bytes(self.max_disk, "max_disk"))
        if self.aggregate is not None:
            agg = self.aggregate
            if not isinstance(agg, (str, os.PathLike)) or isinstance(os.fspath(agg), bytes):
                raise TypeError(f"aggregate must be a folder path, got {type(agg).__name__} "
                                f"{agg!r:.60}")
            if os.path.exists(agg) and not os.path.isdir(agg):
                raise ValueError(f"aggregate {os.fspath(agg)!r} exists and is not a folder")
            set_(self, "aggregate", os.fspath(agg))
        set_(self, "detail", DetailPolicy.parse(self.detail))
        interval = self.aggregate_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or \
                not 0 <= interval < float("inf"):
            raise ValueError(f"aggregate_interval must be a number of seconds >= 0, got "
                             f"{interval!r}")
        set_(self, "aggregate_interval", float(interval))


# The smallest --max-disk (segments of 256 KiB at least: record/recorder.py).
MIN_MAX_DISK = 2 << 20
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
    return n


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
