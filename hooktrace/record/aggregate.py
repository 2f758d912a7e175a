"""Per-step aggregates and the detail policy (issue #31): a recording that can stay on
for weeks.

``trace(model, aggregate=DIR)`` (``hooktrace run --aggregate DIR``): at each step mark
(the recorder's output stage, never a module call) the step's events are drained from
the session; every ``aggregate_interval`` seconds (default 1; 0: every step) the steps
since the last time are reduced, per module and mode (forward, backward), to one row
each (sooner when the window holds ``capacity`` raw events: memory stays bounded):

    step (the window's first), steps, module, mode, calls, total_ms, p50_ms, max_ms
    (mode: forward, backward, recompute; eval for the forward calls under no_grad or
    module.eval(), eval backward and eval recompute for the others made in eval mode:
    the summary's rows, from the one per-call table, hooktrace.analysis.calls; + total_ns
    and self_ns, the summary's numbers exactly; + the recorded quantities' columns, each
    from its provider (hooktrace.analysis.columns): gpu_ms when device time is recorded,
    mem_peak_bytes with memory=True, tflops with flops=True, nonfinite and absmax with
    numerics=True; a mode "step" row holds the steps' wall times: their sum, median and
    max)

The rows go to ``DIR/aggregates/part-<run>-NNNNN.parquet`` (a Parquet dataset: one table,
``pyarrow.dataset.dataset(DIR/aggregates)`` or duckdb's ``read_parquet('DIR/aggregates/*')``
read it whole), a part when ``PART_ROWS`` rows wait or ``aggregate_part_interval`` seconds
passed (default ``PART_SECONDS``), and at the end: on any end that runs Python (the block's
exit, an exception, ``sys.exit``, Ctrl-C, ``hooktrace run``'s SIGTERM). A signal never
lands inside a step's reduction: the recorder holds its handler until the step mark is
done (issue #46). A part is written as ``.part-*.tmp``, a name dataset readers skip, then
renamed. What ``kill -9`` (the OOM killer, a crash) costs is the steps since the last part:
the run's live file (below) says how far it got and whether it ended, and ``hooktrace
summary DIR`` says which steps a run that did not end is missing. ``<run>``
(``<host>_<pid>[_rank<R>]_<random>``) and
the ``run`` and ``rank`` columns keep the runs and ranks that share a folder apart
(issue #35: they replaced each other's parts). The raw events are then dropped, unless
the **detail policy** keeps a step's, as ``DIR/steps/step-<n>_<run>.htrace`` (a trace
like any other: summary, diff, report, export load it). A part or step that cannot be
written (a full disk, a read-only folder) is a warning, once, and counted in the
recording's ``info["aggregate"]`` (``lost_rows``, ``lost_steps``): training goes on.
Its triggers, ``detail="every=10000,slow=3,nonfinite,signal"``:

* ``every=N``: steps 0, N, 2N, ...;
* ``slow=K``: a step slower than K x the median of the last steps (at most one a minute,
  SLOW_COOLDOWN_S);
* ``nonfinite``: the first step with a non-finite value (with ``numerics=True``);
* ``signal``: the step after ``SIGUSR2`` (``kill -USR2 <pid>``), or ``keep_step()``.

Disk then grows with time x modules, not with events or steps (benchmarks/RESULTS.md
measures it). Loggers (``hooktrace.log_to``) receive each window's rows.

``DIR/live/<run>.json`` holds the rows of the windows closed in about the last second
(written once a second at most, replaced whole; ``"ended": true`` once the recording
ended): what ``hooktrace top DIR`` shows while the job runs
(:mod:`hooktrace.analysis.live` reads it). One small file per run, whatever the run's length.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hooktrace._naming import env_rank, process_stem
from hooktrace._output import failure_reason
from hooktrace.errors import HooktraceError
from hooktrace.analysis.aggregates import KEPT_INDEX, LIVE_DIR
from hooktrace.data.aggregates import kept_steps, load_aggregates
from hooktrace.record.component import Component, Flag, Option, folder
from hooktrace.record.process_state import STATE

if TYPE_CHECKING:  # numpy is imported where used: `hooktrace --version` reads this
    import numpy as np  # file's declarations (record/registry.py) without numpy

# (load_aggregates and kept_steps, the folder's reading side, are
# hooktrace.data.aggregates'; named here too, where the recording is)
__all__ = ["AggregateComponent", "DetailPolicy", "KEPT_INDEX", "PART_ROWS", "kept_steps",
           "load_aggregates", "process_aggregate"]

# A Parquet part is written once this many rows are waiting, once PART_SECONDS passed
# since the last (aggregate_part_interval=), and at the end. kill -9 loses what a part
# would have held: 60 s of steps at most (it was 300 s, not settable: issue #47); a part
# a minute is 1,440 files a day per process, which the readers take in one pass.
PART_ROWS = 50_000
PART_SECONDS = 60.0
# the running median of step times looks at this many steps; none is "slow" before MIN
MEDIAN_WINDOW = 50
MIN_STEPS_FOR_SLOW = 5
# after a step kept as slow, none is for SLOW_COOLDOWN_S seconds (a loaded machine's
# preemptions make many millisecond steps "slow": disk stays bounded in time)
SLOW_COOLDOWN_S = 60.0
DETAIL_SIGNAL = signal.SIGUSR2
# DIR/LIVE_DIR/<run>.json: the newest windows' rows, rewritten every LIVE_SECONDS at most
LIVE_SECONDS = 1.0


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


def _aggregate(name: str, agg: Any) -> str | None:
    return None if agg is None else os.fspath(folder()(name, agg))


def _interval(name: str, interval: Any) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or \
            not 0 <= interval < float("inf"):
        raise ValueError(f"{name} must be a number of seconds >= 0, got {interval!r:.60}")
    return float(interval)


DEFAULT_DETAIL = "every=10000,slow=3,nonfinite,signal"


# The traces listening to DETAIL_SIGNAL, oldest first, and the handler before the first.
# One handler (_on_detail_signal) serves them all and the old one comes back when the last
# ends, whatever order they end in: each trace saving and restoring its own left SIG_DFL
# (kill -USR2 then terminates the process) after two traces ended out of order (issue #35).
_listening: list[AggregateComponent] = []
_before_listening: Any = None
_listening_lock = threading.Lock()
SIGNAL_OFF_MAIN = ("aggregate=: the detail trigger 'signal' (SIGUSR2) needs the trace to "
                   "start on the main thread (Python runs signal handlers there only; "
                   "kill -USR2 would end the process): start it there, or leave 'signal' out "
                   "of detail= (e.g. detail='every=10000,slow=3,nonfinite') and call "
                   "keep_step()")


def _on_detail_signal(signum: int, frame: Any) -> None:
    for component in list(_listening):
        component.keep_step()


def _listen(component: AggregateComponent) -> None:
    """Add ``component`` to the traces ``kill -USR2`` keeps the next step of: the handler
    is set on the main thread (Python runs handlers there only); off it, another trace
    must have set it already, else the one-line error (the signal would end the process)."""
    global _before_listening
    with _listening_lock:
        if not _listening or signal.getsignal(DETAIL_SIGNAL) is not _on_detail_signal:
            if threading.current_thread() is not threading.main_thread():
                raise HooktraceError(SIGNAL_OFF_MAIN)
            previous = signal.signal(DETAIL_SIGNAL, _on_detail_signal)
            if not _listening:
                _before_listening = previous
        _listening.append(component)


def _unlisten(component: AggregateComponent) -> None:
    """Remove ``component``; the last one out restores the handler from before the first
    (unless someone else has set one since, or this is not the main thread)."""
    global _before_listening
    with _listening_lock:
        if component not in _listening:
            return
        _listening.remove(component)
        if _listening or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(DETAIL_SIGNAL) is _on_detail_signal:
            signal.signal(DETAIL_SIGNAL, _before_listening if _before_listening is not None
                          else signal.SIG_DFL)
        _before_listening = None


def process_aggregate() -> AggregateComponent | None:
    """What aggregates the whole process (``hooktrace run --aggregate``, ``HOOKTRACE=1``:
    the process-wide trace's component) while it records, else None."""
    return STATE.aggregating


class AggregateComponent(Component):
    """``aggregate=DIR``: see the module docstring."""

    OPTIONS = (
        Option("aggregate", None, "reduce each step's events to per-module rows (calls, "
               "forward/backward p50/max ms, numerics) in this folder (Parquet: "
               "DIR/aggregates), dropping the raw events unless the detail policy keeps the "
               "step (DIR/steps/step-N_<run>.htrace)",
               type="str | os.PathLike[str] | None", check=_aggregate,
               cli=Flag("str", metavar="DIR")),
        Option("detail", DEFAULT_DETAIL, "with aggregate, which steps keep their raw events: "
               "every=N, slow=K (K x the median step), nonfinite (the first), signal "
               "(SIGUSR2); default every=10000,slow=3,nonfinite,signal",
               type="Any", check=lambda name, value: DetailPolicy.parse(value),
               cli=Flag("str", metavar="POLICY"),
               flag_help="with --aggregate, which steps keep their raw events: every=N, "
                         "slow=K (K x the median step), nonfinite (the first), signal "
                         "(SIGUSR2); default every=10000,slow=3,nonfinite,signal"),
        Option("aggregate_interval", 1.0, "with aggregate, seconds of steps reduced into one "
               "row per module (default 1: disk grows with time, not with steps; 0: every "
               "step)", check=_interval, cli=Flag("float", metavar="SECONDS"),
               flag_help="with --aggregate, seconds of steps reduced into one row per module "
                         "(default 1: disk grows with time, not with steps; 0: every step)"),
        Option("aggregate_part_interval", PART_SECONDS, "with aggregate, seconds between "
               "two Parquet parts (default 60; also a part every 50,000 rows and at the end): "
               "kill -9 loses the steps since the last part, a shorter interval writes more "
               "files", check=_interval, cli=Flag("float", metavar="SECONDS"),
               flag_help="with --aggregate, seconds between two Parquet parts (default 60; "
                         "also one every 50,000 rows and at exit): kill -9 loses the steps "
                         "since the last part, a shorter interval writes more files"),
    )

    drains = True

    @classmethod
    def enabled(cls, options: Any) -> bool:
        return options.aggregate is not None

    @classmethod
    def check(cls, options: Any) -> None:
        if options.aggregate is None:
            return
        if options.out is not None or options.schedule is not None or options.policy == "ring":
            raise ValueError("aggregate= reduces each step's events in memory: it cannot be "
                             "combined with out=, schedule= or policy='ring'")
        if options.detail.signal and threading.current_thread() is not threading.main_thread() \
                and signal.getsignal(DETAIL_SIGNAL) is not _on_detail_signal:
            raise HooktraceError(SIGNAL_OFF_MAIN)
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ValueError("aggregate= writes Parquet: it needs pyarrow "
                             "(pip install pyarrow)") from None

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        options = recorder.options
        self.dir = os.fspath(options.aggregate)
        self.policy: DetailPolicy = options.detail
        self._rows: dict[str, list[Any]] = {}
        self._parts = 0  # written
        self._part_no = 0  # tried (a part the disk refused leaves its number unused)
        self._steps = 0
        self._times: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self._last = 0.0
        self._seen_nonfinite = False
        self._last_slow = float("-inf")
        self._keep_next = threading.Event()
        self._listening = False
        self.kept: list[dict[str, Any]] = []  # {"step", "why", "path"}
        # this run in part and step names, and in each row: runs and ranks that share the
        # folder stay apart (issue #35); the random part: a pid is reused, in a container
        # every run may have the same
        self.rank = env_rank()
        self.run_id = f"{process_stem(self.rank)}_{uuid.uuid4().hex[:8]}"
        # what a full disk or read-only folder cost (a warning, once; training goes on)
        self.lost_rows = 0
        self.lost_steps = 0
        self._write_error: str | None = None
        self.loggers: list[Callable[[int, dict[str, list[Any]]], None]] = []
        self._session: Any = None
        self.interval = float(options.aggregate_interval)
        self.part_interval = float(options.aggregate_part_interval)
        self._numerics = bool(options.numerics)
        self._window_first: int | None = None  # the first step of the open window
        self._window_start = 0.0
        self._window_events: list[np.ndarray] = []
        # the trace of the window's step when the window has one and it was made (a kept
        # step, numerics=True): the window reduces that trace, not a second one of the
        # same events
        self._window_trace: Any = None
        self._window_held = 0  # events in _window_events
        # a window closes early once it holds this many raw events: memory stays within
        # the capacity whatever the interval (issue #35: 600 s held +384 MB)
        self._window_limit = max(1, int(options.capacity or 1))
        self._window_times: list[float] = []
        self._part_time = time.perf_counter()
        self._live_rows: dict[str, list[Any]] = {}  # the windows since the last live file
        self._live_time = 0.0
        self._live_last: dict[str, list[Any]] = {}  # the rows of the last live file
        # A step marked on another thread and a signal's handler ending the trace on the
        # main thread take turns (on the main thread the recorder holds the handler until
        # the mark is done); reentrant: the trace ended from a logger goes through
        self._lock = threading.RLock()
        self._host = socket.gethostname()
        self._ended = False
        self._process_wide = False  # the process-wide trace's (hooktrace run --aggregate)

    def prepare(self, session: Any, scope: Any) -> None:
        from hooktrace.record.scopes import ProcessScope

        self._process_wide = isinstance(scope, ProcessScope)
        shared = process_aggregate()
        if shared is not None:  # (issue #47: two recorders, two folders, no word)
            raise HooktraceError(
                f"aggregate={self.dir!r}: hooktrace run --aggregate (or HOOKTRACE=1) already "
                f"aggregates every module call of this process into {shared.dir!r}; a "
                "second aggregate= trace would write the same calls into a second folder: "
                "leave aggregate= out here (the trainer callbacks use that folder), or run "
                "without --aggregate")
        for sub in ("aggregates", "steps", LIVE_DIR):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        session.enable_collection()  # drained at each step mark
        self._session = session

    def install(self, session: Any, scope: Any) -> None:
        # the process's own (hooktrace run --aggregate, HOOKTRACE=1), not hooktrace top's
        # or attach's private recording: the job's traces and callbacks go on as without
        if self._process_wide and STATE.attachment is None:
            STATE.aggregating = self
        self._last = time.perf_counter()
        if self.policy.signal:
            _listen(self)
            self._listening = True
        # a trace still recording when the interpreter exits (never exited: a callback
        # whose trainer did not end it) writes its rows all the same
        atexit.register(self._flush_at_exit)

    def keep_next_step(self) -> bool:
        self.keep_step()
        return True

    def take_logger(self, log: Callable[[int, dict[str, list[Any]]], None]) -> bool:
        self.loggers.append(log)
        return True

    def close_window(self) -> bool:
        with self._lock:
            if not self._ended:
                self._close_window(self._steps - 1)  # (nothing when no step is in it)
        return True

    def keep_step(self) -> None:
        """Keep the next step's raw events (the ``signal`` trigger, from code)."""
        self._keep_next.set()

    def step(self, step_no: int) -> None:
        with self._lock:
            if not self._ended:
                self._step(step_no)

    def _step(self, step_no: int) -> None:
        import numpy as np
        from hooktrace._events import EVENT_DTYPE
        from hooktrace.analysis.numerics import any_nonfinite

        now = time.perf_counter()
        step_ms, self._last = (now - self._last) * 1e3, now
        ended = step_no - 1
        events = np.asarray(self._session.drain()).view(EVENT_DTYPE)
        trace = self._result(events) if self._numerics else None
        nonfinite = trace is not None and any_nonfinite(trace)
        why = self._why_keep(ended, step_ms, nonfinite)
        self._times.append(step_ms)
        if why:
            trace = trace if trace is not None else self._result(events)
            self._keep(ended, why, trace)
        opening = self._window_first is None
        if opening:
            self._window_first, self._window_start = ended, now - step_ms / 1e3
        self._window_events.append(events)
        self._window_trace = trace if opening else None
        self._window_held += len(events)
        self._window_times.append(step_ms)
        self._steps += 1
        if now - self._window_start >= self.interval or self._window_held >= self._window_limit:
            self._close_window(ended)

    def _keep(self, step: int, why: str, trace: Any) -> None:
        """Save the step's trace in DIR/steps and say why in DIR/kept.jsonl; a disk that
        refuses it costs the step (counted), not the training run."""
        path = os.path.join(self.dir, "steps", f"step-{step}_{self.run_id}.htrace")
        try:
            trace.save(path)
        except (OSError, HooktraceError) as e:
            self.lost_steps += 1
            self._failed(f"step {step} could not be kept whole in {path}", e)
            return
        self.kept.append({"step": step, "why": why, "path": path})
        try:  # why each was kept, for summary and report (a line per kept step)
            with open(os.path.join(self.dir, KEPT_INDEX), "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "why": why, "file": os.path.basename(path),
                                    "run": self.run_id, "rank": self.rank}) + "\n")
        except OSError as e:
            self._failed(f"{os.path.join(self.dir, KEPT_INDEX)} could not be written", e)

    def _failed(self, what: str, error: BaseException) -> None:
        """A write the disk refused: a warning the first time (the stream writer's way:
        what is written stays, what is not is counted in info["aggregate"])."""
        if self._write_error is not None:
            return
        # (a full disk names itself: issue #46)
        error_text = failure_reason(self.dir, error) if isinstance(error, OSError) else str(error)
        self._write_error = f"{what}: {error_text}"
        warnings.warn(f"hooktrace: aggregate=: {what} ({error_text}); training goes on, what "
                      "cannot be written is dropped and counted (info['aggregate']: "
                      "lost_rows, lost_steps)", RuntimeWarning, stacklevel=2)

    def _result(self, events: np.ndarray) -> Any:
        """The drained ``events`` as a trace; its FLOP info matched to its root calls
        (numbered from 0 in its spans; the recorder's info lists the run's)."""
        trace = self.recorder.step_result(events)
        if "flops" in trace.info:
            from hooktrace.analysis.flops import newest_flop_info

            trace.info["flops"] = newest_flop_info(trace.info["flops"], trace.spans())
        return trace

    def _close_window(self, last: int) -> None:
        """Reduce the steps since the window opened to rows; hand them to the loggers.
        The window's state changes only once its rows are made: whatever interrupts the
        reduction (an exception, a KeyboardInterrupt where the signal could not be held)
        leaves the window open, whole, for the end to reduce."""
        import numpy as np

        if self._window_first is None:
            return
        # a window of one step whose trace was made reduces that trace (a kept step's
        # rows are then its file's to the ns: the recorder's clock is re-measured every
        # WINDOW_CLOCK_S, and a second trace of the same events could read it 1 ns apart)
        trace = self._window_trace
        if trace is None:
            events = np.concatenate(self._window_events)
            # thread by thread, as one drain (and a recording in memory) holds them
            trace = self._result(events[np.argsort(events["tid"], kind="stable")])
        from hooktrace.analysis.aggregates import reduce_window

        rows = reduce_window(self._window_first, trace, self._window_times)
        for key, values in rows.items():
            self._rows.setdefault(key, []).extend(values)
            self._live_rows.setdefault(key, []).extend(values)
        self._window_first, self._window_trace = None, None
        self._window_events, self._window_held, self._window_times = [], 0, []
        if time.perf_counter() - self._live_time >= LIVE_SECONDS:
            self._write_live(ended=False)
        for log in list(self.loggers):
            try:
                log(last, rows)
            except Exception as e:  # a failing logger must not stop training
                warnings.warn(f"hooktrace: a logger failed at step {last}: {e!r}",
                              RuntimeWarning, stacklevel=2)
        if len(self._rows.get("step", ())) >= PART_ROWS or \
                time.perf_counter() - self._part_time >= self.part_interval:
            self._write_part()

    def _why_keep(self, step: int, step_ms: float, nonfinite: bool) -> str:
        p = self.policy
        if self._keep_next.is_set():
            self._keep_next.clear()
            return "signal"
        if p.nonfinite and not self._seen_nonfinite and nonfinite:
            self._seen_nonfinite = True
            return "nonfinite"
        now = time.perf_counter()
        if p.slow and len(self._times) >= MIN_STEPS_FOR_SLOW and \
                now - self._last_slow >= SLOW_COOLDOWN_S and \
                step_ms > p.slow * statistics.median(self._times):
            self._last_slow = now
            return "slow"
        if p.every and step % p.every == 0:
            return "every"
        return ""

    def _write_part(self) -> None:
        if not self._rows.get("step"):
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        from hooktrace.data.schema import AGGREGATES, schema

        n = len(self._rows["step"])
        declared = schema(AGGREGATES)  # (the declared schema: docs/schema.md)
        own = {"rank": [self.rank] * n, "window": [None] * n, "run": [self.run_id] * n}
        columns = {}
        for fld in declared:  # the rows' columns, each recorded quantity's among them
            values = own[fld.name] if fld.name in own else self._rows[fld.name]
            columns[fld.name] = (pa.array(values, pa.string()).dictionary_encode()
                                 if pa.types.is_dictionary(fld.type)
                                 else pa.array(values, fld.type))
        table = pa.table(columns).cast(declared)
        self._rows = {}  # written or lost: memory stays bounded either way
        self._part_time = time.perf_counter()
        self._part_no += 1
        name = f"part-{self.run_id}-{self._part_no:05d}.parquet"
        path = os.path.join(self.dir, "aggregates", name)
        tmp = os.path.join(self.dir, "aggregates", f".{name}.tmp")
        try:
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, path)  # a part is there whole or not at all
        except (OSError, pa.ArrowException) as e:  # a full disk, a read-only folder
            self.lost_rows += n
            self._failed(f"the part {path} could not be written", e)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        self._parts += 1

    def _write_live(self, ended: bool) -> None:
        """DIR/live/<run>.json: the windows closed since the last one (hooktrace top DIR);
        a disk that refuses it costs that second's view only."""
        self._live_time = time.perf_counter()
        # (the last file written says it ended, its rows kept when no window closed since)
        rows = self._live_rows or (self._live_last if ended else {})
        self._live_rows, self._live_last = {}, rows
        if not rows and not ended:
            return
        path = os.path.join(self.dir, LIVE_DIR, f"{self.run_id}.json")
        # (host, pid, steps, ended and part_interval also tell the readers which steps a
        # run killed before its last part lost: data.aggregates.unwritten_lines)
        live = {"run": self.run_id, "rank": self.rank, "pid": os.getpid(),
                "host": self._host, "unix_ns": time.time_ns(), "ended": ended,
                "steps": self._steps, "part_interval": self.part_interval,
                "dropped_events": int(self._session.stats()["dropped"]), "rows": rows}
        try:
            with open(f"{path}.tmp", "w", encoding="utf-8") as f:
                json.dump(live, f)
            os.replace(f"{path}.tmp", path)
        except (OSError, TypeError, ValueError):
            pass

    def flush(self) -> None:
        """The steps of the window still open, and every row not yet in a part, written
        now (idempotent: the end of the trace, and at interpreter exit)."""
        with self._lock:
            if self._ended:
                return
            try:
                self._close_window(self._steps - 1)
            finally:
                self._write_part()
                self._ended = True
                self._write_live(ended=True)

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except Exception as e:  # (the interpreter is exiting: one line, no traceback)
            print(f"hooktrace: aggregate=: the rows since the last part could not be "
                  f"written at exit: {e}", file=sys.stderr)

    def teardown(self) -> None:
        if STATE.aggregating is self:
            STATE.aggregating = None
        atexit.unregister(self._flush_at_exit)
        if self._listening:
            _unlisten(self)
            self._listening = False

    def metadata(self, info: dict[str, Any]) -> None:
        info["aggregate"] = {"dir": self.dir, "run": self.run_id, "rank": self.rank,
                             "steps": self._steps, "parts": self._parts,
                             "part_interval": self.part_interval,
                             "lost_rows": self.lost_rows, "lost_steps": self.lost_steps,
                             "write_error": self._write_error,
                             "detail": [dict(k) for k in self.kept],
                             "policy": asdict(self.policy)}
