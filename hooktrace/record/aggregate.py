"""Per-step aggregates and the detail policy (issue #31): a recording that can stay on
for weeks.

``trace(model, aggregate=DIR)`` (``hooktrace run --aggregate DIR``): at each step mark
(the recorder's output stage, never a module call) the step's events are drained from
the session; every ``aggregate_interval`` seconds (default 1; 0: every step) the steps
since the last time are reduced, per module and mode (forward, backward), to one row
each (sooner when the window holds ``capacity`` raw events: memory stays bounded):

    step (the window's first), steps, module, mode, calls, total_ms, p50_ms, max_ms
    (mode: forward, backward, or eval: the forward calls under no_grad or
    module.eval() of a window that also has training calls; + gpu_ms when device time
    is recorded, mem_peak_bytes with memory=True, tflops with flops=True, nonfinite and
    absmax with numerics=True; a mode "step" row holds the steps' wall times: their
    sum, median and max)

The rows go to ``DIR/aggregates/part-<run>-NNNNN.parquet`` (a Parquet dataset: one table,
``pyarrow.dataset.dataset(DIR/aggregates)`` or duckdb's ``read_parquet('DIR/aggregates/*')``
read it whole), a part when ``PART_ROWS`` rows wait or ``PART_SECONDS`` passed (a killed
run loses the rows not written yet only; a part is written as ``.part-*.tmp``, a name
dataset readers skip, then renamed). ``<run>`` (``<host>_<pid>[_rank<R>]_<random>``) and
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
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hooktrace._naming import env_rank, process_stem
from hooktrace.errors import HooktraceError
from hooktrace.record.component import Component, Flag, Option

if TYPE_CHECKING:  # numpy is imported where used: `hooktrace --version` reads this
    import numpy as np  # file's declarations (record/registry.py) without numpy

__all__ = ["AggregateComponent", "DetailPolicy", "KEPT_INDEX", "PART_ROWS", "kept_steps",
           "load_aggregates", "reduce_window"]

# A Parquet part is written once this many rows are waiting (and at the end).
PART_ROWS = 50_000
PART_SECONDS = 300.0
# the running median of step times looks at this many steps; none is "slow" before MIN
MEDIAN_WINDOW = 50
MIN_STEPS_FOR_SLOW = 5
# after a step kept as slow, none is for SLOW_COOLDOWN_S seconds (a loaded machine's
# preemptions make many millisecond steps "slow": disk stays bounded in time)
SLOW_COOLDOWN_S = 60.0
DETAIL_SIGNAL = signal.SIGUSR2
# DIR/KEPT_INDEX: a JSON line per step kept whole ({"step", "why", "file", "run", "rank"}:
# DIR/steps/file)
KEPT_INDEX = "kept.jsonl"
# DIR/aggregates/PART_NAME: a finished part (a part being written has a leading "." and
# ends in .tmp: pyarrow's datasets and duckdb's *.parquet both skip it, issue #35); the run
# is in the name so that runs and ranks sharing a folder never replace each other's parts
PART_NAME = re.compile(r"part-(?:(?P<run>.+)-)?(?P<n>\d+)\.parquet")
# DIR/steps/STEP_NAME: a step kept whole (step-N.htrace: written before the run was named)
STEP_NAME = re.compile(r"step-(?P<step>\d+)(?:_(?P<run>.+))?\.htrace")


# the module column's own labels; a submodule named as one is quoted (issue #35: one
# named "<root>" merged with the root's rows)
ROOT_ROW, STEP_ROW = "<root>", "<step>"


def row_name(name: str) -> str:
    """The module column's value for a qualified module name."""
    if not name:
        return ROOT_ROW
    return f"'{name}'" if name in (ROOT_ROW, STEP_ROW) else name


def reduce_window(first: int, trace: Any, step_ms: list[float]) -> dict[str, list[Any]]:
    """The aggregate rows of the steps ``first``, ``first + 1``, ... (``len(step_ms)`` of
    them, their wall times) whose events ``trace`` holds, as columns: per module and
    mode, calls and time; a "step" row for the steps themselves (total, median, max)."""
    import numpy as np

    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, SPAN_EVAL

    s = trace.spans()
    names = [row_name(m[0]) for m in trace.modules]
    cols: dict[str, list[Any]] = {k: [] for k in (
        "step", "steps", "module", "mode", "calls", "total_ms", "p50_ms", "max_ms",
        "gpu_ms", "mem_peak_bytes", "tflops", "nonfinite", "absmax")}
    step, steps = first, len(step_ms)
    peaks = _memory_peaks(trace, s)
    tflops = tflops_by_module(trace)
    # eval calls (no_grad or module.eval(): a validation pass between steps) get rows of
    # their own, as in the summary, so that they do not swell the training forward; not
    # when every forward call is one (a model trained in eval mode: those are its steps)
    flagged = (s.cat == CAT_FORWARD) & ((s.flags & SPAN_EVAL) != 0)
    eval_ = flagged if ((s.cat == CAT_FORWARD) & ~flagged).any() else np.zeros(len(s), bool)
    gpu = gpu_ms_by_module(trace, eval_)
    numerics = _numerics_by_module(trace, split_eval=bool(eval_.any()))
    for mode, cat in (("forward", CAT_FORWARD), ("eval", CAT_EVAL), ("backward", CAT_BACKWARD)):
        sel = np.flatnonzero((s.cat == CAT_FORWARD) & eval_ if cat == CAT_EVAL
                             else (s.cat == cat) & ~eval_)
        if not sel.size:
            continue
        dur = (s.end_ns[sel] - s.start_ns[sel]).astype(np.float64) / 1e6
        mod = s.module[sel]
        # per module, vectorized: sorted by (module, duration), each group's sum, median
        # (middle of its sorted run) and max (its last)
        order = np.lexsort((dur, mod))
        mod, dur, sel = mod[order], dur[order], sel[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(mod)) + 1))
        ends = np.concatenate((starts[1:], [len(mod)]))
        counts = ends - starts
        totals = np.add.reduceat(dur, starts)
        p50 = (dur[starts + (counts - 1) // 2] + dur[starts + counts // 2]) / 2
        longest = dur[ends - 1]
        for g, start in enumerate(starts):
            m = int(mod[start])
            cols["step"].append(step)
            cols["steps"].append(steps)
            cols["module"].append(names[m] if 0 <= m < len(names) else f"<module {m}>")
            cols["mode"].append(mode)
            cols["calls"].append(int(counts[g]))
            cols["total_ms"].append(float(totals[g]))
            cols["p50_ms"].append(float(p50[g]))
            cols["max_ms"].append(float(longest[g]))
            cols["gpu_ms"].append(gpu.get((m, cat)) if gpu is not None else None)
            name = (str(trace.modules[m][0]) if 0 <= m < len(trace.modules)
                    else f"<module {m}>")
            # (TFLOP/s: of the module's training calls, none for eval rows)
            cols["tflops"].append(tflops.get((name, mode)) if tflops is not None else None)
            if peaks is not None:
                group = peaks[sel[start:ends[g]]]
                cols["mem_peak_bytes"].append(int(group.max()) if (group >= 0).any() else None)
            else:
                cols["mem_peak_bytes"].append(None)
            got = numerics.get((m, mode)) if numerics is not None else None
            if got is not None:
                cols["nonfinite"].append(got[0])
                cols["absmax"].append(got[1] if np.isfinite(got[1]) else None)
            else:
                cols["nonfinite"].append(None)
                cols["absmax"].append(None)
    cols["step"].append(step)
    cols["steps"].append(steps)
    cols["module"].append(STEP_ROW)
    cols["mode"].append("step")
    for key, value in (("calls", steps), ("total_ms", float(sum(step_ms))),
                       ("p50_ms", float(np.median(step_ms))), ("max_ms", float(max(step_ms))),
                       ("gpu_ms", None), ("mem_peak_bytes", None), ("tflops", None),
                       ("nonfinite", None),
                       ("absmax", None)):
        cols[key].append(value)
    return cols


# the category key of eval rows (reduce_window, gpu_ms_by_module): no span category's
CAT_EVAL = -1


def gpu_ms_by_module(trace: Any, eval_spans: np.ndarray | None = None
                     ) -> dict[tuple[int, int], float] | None:
    """Device time per (module, category) when it was recorded (TraceData.gpu_spans(),
    issue #28), else None; the intervals of the spans ``eval_spans`` marks (per span,
    bool) under (module, CAT_EVAL)."""
    import numpy as np

    g = trace.gpu_spans()
    if not len(g):
        return None
    out: dict[tuple[int, int], float] = {}
    dur = (g.end_ns - g.start_ns).astype(np.float64) / 1e6
    cats = g.cat.astype(np.int64)
    if eval_spans is not None and len(eval_spans):
        has = (g.span >= 0) & (g.span < len(eval_spans))
        marked = np.zeros(len(g), bool)
        marked[has] = eval_spans[g.span[has]]
        cats = np.where(marked, CAT_EVAL, cats)
    for m, c, d in zip(g.module.tolist(), cats.tolist(), dur.tolist(), strict=True):
        out[(m, c)] = out.get((m, c), 0.0) + d
    return out


def tflops_by_module(trace: Any) -> dict[tuple[str, str], float] | None:
    """Achieved TFLOP/s per (module name, "forward"/"backward") of a window, as the
    summary computes it (hooktrace.analysis.flops.flop_columns: the FLOPs of the root calls not
    run under the counter over their time; device time when it was recorded, else host
    time), when FLOPs were recorded (``flops=True``), else None. None too for a CUDA run
    without device time: launch time says nothing of the speed."""
    if "flops" not in trace.info:
        return None
    from hooktrace.analysis.device_time import gpu_recorded, launch_time_only, span_gpu
    from hooktrace.analysis.flops import flop_columns, newest_flop_info

    spans = trace.spans()
    # the window's spans number its root calls from 0; the info holds the run's
    info = newest_flop_info(trace.info["flops"], spans)
    if gpu_recorded(trace):
        total, _, timed = span_gpu(trace)
        columns = flop_columns(info, spans, trace.modules, None, durations=total, timed=timed)
    elif launch_time_only(trace):
        return None
    else:
        columns = flop_columns(info, spans, trace.modules, None)
    out: dict[tuple[str, str], float] = {}
    for name, values in columns.items():
        for mode, key in (("forward", "tflops"), ("backward", "bwd_tflops")):
            if values.get(key) is not None:
                out[(name, mode)] = float(values[key])  # type: ignore[arg-type]
    return out


def _memory_peaks(trace: Any, spans: Any) -> np.ndarray | None:
    """Per span, the highest memory peak over the recorded devices (-1: unknown), when
    memory was recorded (``memory=True``), else None."""
    import numpy as np

    from hooktrace.analysis.memory import memory_devices, span_memory

    devices = memory_devices(trace)
    if not devices:
        return None
    peak = np.full(len(spans), -1, np.int64)
    for device in devices:
        sm = span_memory(trace, device)
        peak = np.maximum(peak, np.where(sm.known, sm.peak, -1))
    return peak


def _any_nonfinite(trace: Any) -> bool:
    numerics = _numerics_by_module(trace, split_eval=False)
    return numerics is not None and any(nf for nf, _ in numerics.values())


def _numerics_by_module(trace: Any, split_eval: bool
                        ) -> dict[tuple[int, str], tuple[int, float]] | None:
    """(non-finite count, abs-max) per (module, row mode: forward, eval or backward), or
    None when the trace recorded no numerics. ``split_eval``: the window's eval calls
    have rows of their own (reduce_window), else they are its forward calls."""
    import numpy as np

    if "numerics" not in trace.info:
        return None
    from hooktrace.analysis.numerics import Numerics

    n = Numerics.from_trace(trace)
    out: dict[tuple[int, str], tuple[int, float]] = {}
    measured = ~(n.skipped | n.failed)
    for i in np.flatnonzero(measured):
        mode = ("backward" if n.backward[i] else
                "eval" if split_eval and n.eval[i] else "forward")
        key = (int(n.module[i]), mode)
        nf, am = out.get(key, (0, float("nan")))
        out[key] = (nf + int(n.nonfinite[i]), float(np.fmax(am, n.absmax[i])))
    return out


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
    if agg is None:
        return None
    if not isinstance(agg, (str, os.PathLike)) or isinstance(os.fspath(agg), bytes):
        raise TypeError(f"aggregate must be a folder path, got {type(agg).__name__} "
                        f"{agg!r:.60}")
    if os.path.exists(agg) and not os.path.isdir(agg):
        raise ValueError(f"aggregate {os.fspath(agg)!r} exists and is not a folder")
    return os.fspath(agg)


def _interval(name: str, interval: Any) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or \
            not 0 <= interval < float("inf"):
        raise ValueError(f"aggregate_interval must be a number of seconds >= 0, got "
                         f"{interval!r}")
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
        self._numerics = bool(options.numerics)
        self._window_first: int | None = None  # the first step of the open window
        self._window_start = 0.0
        self._window_events: list[np.ndarray] = []
        self._window_held = 0  # events in _window_events
        # a window closes early once it holds this many raw events: memory stays within
        # the capacity whatever the interval (issue #35: 600 s held +384 MB)
        self._window_limit = max(1, int(options.capacity or 1))
        self._window_times: list[float] = []
        self._part_time = time.perf_counter()

    def prepare(self, session: Any, scope: Any) -> None:
        os.makedirs(os.path.join(self.dir, "aggregates"), exist_ok=True)
        os.makedirs(os.path.join(self.dir, "steps"), exist_ok=True)
        session.enable_collection()  # drained at each step mark
        self._session = session

    def install(self, session: Any, scope: Any) -> None:
        self._last = time.perf_counter()
        if self.policy.signal:
            _listen(self)
            self._listening = True

    def keep_next_step(self) -> bool:
        self.keep_step()
        return True

    def take_logger(self, log: Callable[[int, dict[str, list[Any]]], None]) -> bool:
        self.loggers.append(log)
        return True

    def keep_step(self) -> None:
        """Keep the next step's raw events (the ``signal`` trigger, from code)."""
        self._keep_next.set()

    def step(self, step_no: int) -> None:
        import numpy as np
        from hooktrace._events import EVENT_DTYPE

        now = time.perf_counter()
        step_ms, self._last = (now - self._last) * 1e3, now
        ended = step_no - 1
        events = np.asarray(self._session.drain()).view(EVENT_DTYPE)
        trace = self._result(events) if self._numerics else None
        nonfinite = trace is not None and _any_nonfinite(trace)
        why = self._why_keep(ended, step_ms, nonfinite)
        self._times.append(step_ms)
        if why:
            trace = trace if trace is not None else self._result(events)
            self._keep(ended, why, trace)
        if self._window_first is None:
            self._window_first, self._window_start = ended, now - step_ms / 1e3
        self._window_events.append(events)
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
        self._write_error = f"{what}: {error}"
        warnings.warn(f"hooktrace: aggregate=: {what} ({error}); training goes on, what "
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
        """Reduce the steps since the window opened to rows; hand them to the loggers."""
        import numpy as np

        if self._window_first is None:
            return
        events = np.concatenate(self._window_events)
        self._window_events, self._window_held = [], 0
        # thread by thread, as one drain (and a recording in memory) holds them
        events = events[np.argsort(events["tid"], kind="stable")]
        rows = reduce_window(self._window_first, self._result(events),
                             self._window_times)
        self._window_first, self._window_events, self._window_times = None, [], []
        for key, values in rows.items():
            self._rows.setdefault(key, []).extend(values)
        for log in list(self.loggers):
            try:
                log(last, rows)
            except Exception as e:  # a failing logger must not stop training
                warnings.warn(f"hooktrace: a logger failed at step {last}: {e!r}",
                              RuntimeWarning, stacklevel=2)
        if len(self._rows.get("step", ())) >= PART_ROWS or \
                time.perf_counter() - self._part_time >= PART_SECONDS:
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
        table = pa.table({
            "rank": pa.array([self.rank] * n, pa.int64()),
            "window": pa.nulls(n, pa.int64()),
            "step": pa.array(self._rows["step"], pa.int64()),
            "steps": pa.array(self._rows["steps"], pa.int32()),
            "module": pa.array(self._rows["module"], pa.string()).dictionary_encode(),
            "mode": pa.array(self._rows["mode"], pa.string()).dictionary_encode(),
            "calls": pa.array(self._rows["calls"], pa.int64()),
            "total_ms": pa.array(self._rows["total_ms"], pa.float32()),
            "p50_ms": pa.array(self._rows["p50_ms"], pa.float32()),
            "max_ms": pa.array(self._rows["max_ms"], pa.float32()),
            "gpu_ms": pa.array(self._rows["gpu_ms"], pa.float32()),
            "mem_peak_bytes": pa.array(self._rows["mem_peak_bytes"], pa.int64()),
            "tflops": pa.array(self._rows["tflops"], pa.float32()),
            "nonfinite": pa.array(self._rows["nonfinite"], pa.int64()),
            "absmax": pa.array(self._rows["absmax"], pa.float32()),
            "run": pa.array([self.run_id] * n, pa.string()).dictionary_encode(),
        }).cast(schema(AGGREGATES))  # (the declared schema: docs/schema.md)
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
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        self._parts += 1

    def flush(self) -> None:
        self._close_window(self._steps - 1)  # the steps of the window still open
        self._write_part()

    def teardown(self) -> None:
        if self._listening:
            _unlisten(self)
            self._listening = False

    def metadata(self, info: dict[str, Any]) -> None:
        info["aggregate"] = {"dir": self.dir, "run": self.run_id, "rank": self.rank,
                             "steps": self._steps, "parts": self._parts,
                             "lost_rows": self.lost_rows, "lost_steps": self.lost_steps,
                             "write_error": self._write_error,
                             "detail": [dict(k) for k in self.kept],
                             "policy": {"every": self.policy.every, "slow": self.policy.slow,
                                        "nonfinite": self.policy.nonfinite,
                                        "signal": self.policy.signal}}


def part_files(folder: str) -> list[str]:
    """The finished parts in an aggregates folder, by name: a part a killed run left half
    written (``.part-*.tmp``, or ``part-N.parquet.tmp`` of older versions) is not one."""
    return sorted(f for f in os.listdir(folder) if not f.startswith((".", "_"))
                  and f.endswith(".parquet"))


def load_aggregates(path: str | os.PathLike[str]) -> Any:
    """The aggregate table of ``trace(aggregate=DIR)`` (DIR, DIR/aggregates or one part) as a
    pyarrow Table, rows in (run, rank, step) order, with the ``run`` and ``rank`` of each
    row (a part written before they were: ``run`` from its name, ``rank`` null); an
    unreadable part is hooktrace's one-line InputPathError (``summary``, ``diff`` and
    ``report`` all read through here)."""
    folder = os.fspath(path)
    if os.path.isdir(os.path.join(folder, "aggregates")):
        folder = os.path.join(folder, "aggregates")
    names: list[str]
    if os.path.isfile(folder) and folder.endswith(".parquet"):  # one part (issue #38)
        folder, name = os.path.split(folder)
        names = [name]
    else:
        names = part_files(folder) if os.path.isdir(folder) else []
    if not names:
        raise FileNotFoundError(f"{os.fspath(path)}: no aggregate parts (part-*.parquet) there")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hooktrace.data.schema import AGGREGATES, schema
    from hooktrace.data.validate import ParquetInputError, check_rows, check_table
    from hooktrace.errors import InputPathError
    from hooktrace.text import display_path

    declared = schema(AGGREGATES)
    # every part checked against the schema first (issue #35): a part from elsewhere is
    # one line naming it and its column (parts of older versions, without the run and
    # rank columns, are read as below)
    parts = [os.path.join(folder, n) for n in names]
    try:
        check_table(AGGREGATES, parts)
        check_rows(AGGREGATES, parts)
    except ParquetInputError as e:
        raise InputPathError(f"{display_path(os.fspath(path))}: the aggregate table cannot be "
                             f"read: {e}") from None
    tables = []
    for name in names:
        try:
            t = pq.read_table(os.path.join(folder, name))
        except (pa.ArrowException, OSError) as e:  # a part cut short, or not Parquet
            first = next((line.strip() for line in str(e).splitlines() if line.strip()),
                         type(e).__name__)
            raise InputPathError(f"{os.fspath(path)}: the aggregate table cannot be read: "
                                 f"{name}: {first}") from None
        if "run" not in t.column_names:  # (written before runs were told apart)
            match = PART_NAME.fullmatch(name)
            t = t.append_column("run", pa.array([match and match["run"] or ""] * len(t),
                                                pa.string()))
        for f in declared:  # a column a part was written without (older versions): null
            if f.name not in t.column_names:
                t = t.append_column(f.name, pa.nulls(len(t), f.type))
        tables.append(t)
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
        table = table.select(declared.names).cast(declared)
    except (pa.ArrowException, KeyError) as e:
        raise InputPathError(f"{os.fspath(path)}: the aggregate parts do not make one "
                             f"table of the declared columns: {str(e).splitlines()[0]}"
                             ) from None
    import pyarrow.compute as pc

    keys = pa.table({"run": table["run"].cast(pa.string()), "rank": table["rank"],
                     "step": table["step"]})
    return table.take(pc.sort_indices(keys, sort_keys=[
        ("run", "ascending"), ("rank", "ascending"), ("step", "ascending")]))


def runs_of(table: Any) -> list[tuple[str, int | None]]:
    """The (run, rank) pairs of an aggregate table, rank order first."""
    pairs = {(str(r), k) for r, k in zip(table["run"].to_pylist(), table["rank"].to_pylist(),
                                         strict=True)}
    return sorted(pairs, key=lambda p: (p[1] is None, p[1] or 0, p[0]))


def kept_steps(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The steps an ``aggregate=`` folder kept whole, in step order: ``step``, ``why``
    (None when DIR/kept.jsonl does not say) and ``path``, for each step-N_<run>.htrace still
    there."""
    steps = os.path.join(os.fspath(path), "steps")
    if not os.path.isdir(steps):
        return []
    why: dict[str, str] = {}
    rank: dict[str, int] = {}
    try:
        with open(os.path.join(os.fspath(path), KEPT_INDEX), encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    why[str(entry["file"])] = str(entry["why"])
                    if isinstance(entry.get("rank"), int):
                        rank[str(entry["file"])] = entry["rank"]
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a line cut short by a kill: that step's why is unknown
    except OSError:
        pass
    out = []
    for name in os.listdir(steps):
        match = STEP_NAME.fullmatch(name)
        if match:
            out.append({"step": int(match["step"]), "why": why.get(name),
                        "run": match["run"] or "", "rank": rank.get(name),
                        "path": os.path.join(steps, name)})
    return sorted(out, key=lambda k: (k["step"], k["run"]))


def aggregate_summary(path: str | os.PathLike[str], top: int | None = None) -> str:
    """``hooktrace summary DIR`` of an ``aggregate=`` folder: per module and mode over the
    whole run, the calls, the total time, the time per step, the median of the windows'
    medians and the longest call; the steps kept whole (DIR/steps) after it."""
    import pyarrow.compute as pc

    from hooktrace.text import text_lines

    table = load_aggregates(path)
    steps_row = table.filter(pc.equal(table["mode"].cast("string"), "step"))
    n_steps = int(pc.sum(steps_row["steps"]).as_py() or 0)
    grouped = table.group_by(["module", "mode"]).aggregate([
        ("calls", "sum"), ("total_ms", "sum"), ("p50_ms", "approximate_median"),
        ("max_ms", "max"), ("nonfinite", "sum")]).to_pylist()
    grouped.sort(key=lambda r: (r["mode"] != "step", -(r["total_ms_sum"] or 0.0)))
    if top is not None:
        grouped = grouped[: top + 1]
    # with flops=True: TFLOP/s over the run (each window's weighed by its time), as the
    # report has it
    tflops: dict[tuple[str, str], float | None] = {}
    if "tflops" in table.column_names and table["tflops"].null_count < len(table):
        from hooktrace.reporters.aggregate import aggregate_rows

        tflops = {(r["module"], r["mode"]): r["tflops"] for r in aggregate_rows(table)[0]}
    runs = runs_of(table)
    # several runs or ranks in the folder: ms/step per rank (or run), as the straggler
    # table of a folder of rank traces has a column per rank
    per_source = _per_source(table, runs) if len(runs) > 1 else {}
    labels = _source_labels(runs)
    head = f"{os.fspath(path)}: {n_steps} steps aggregated, {len(table)} rows"
    if len(runs) > 1:
        counts = _steps_per_source(table)
        head += f", {len(runs)} {'ranks' if _ranks_only(runs) else 'runs'}: " + ", ".join(
            f"{labels[r]}: {counts.get(r, 0)} steps" for r in runs[:MAX_SOURCE_COLUMNS])
        if len(runs) > MAX_SOURCE_COLUMNS:
            head += f" and {len(runs) - MAX_SOURCE_COLUMNS} more"
    shown = runs[:MAX_SOURCE_COLUMNS] if per_source else []
    lines = [head,
             f"{'module':<40}{'mode':<10}{'calls':>10}{'total ms':>12}{'ms/step':>10}"
             + "".join(f"{labels[r][:11]:>12}" for r in shown)
             + f"{'p50 ms':>10}{'max ms':>10}{'nonfinite':>10}"
             + (f"{'TFLOP/s':>10}" if tflops else "")]
    for r in grouped:
        per_step = (r["total_ms_sum"] or 0.0) / max(1, n_steps)
        nf = r["nonfinite_sum"]
        key = (str(r["module"]), str(r["mode"]))
        tf = tflops.get(key)
        each = [per_source.get((key, s)) for s in shown]
        lines.append(f"{str(r['module'])[:39]:<40}{str(r['mode']):<10}{r['calls_sum']:>10}"
                     f"{r['total_ms_sum']:>12.2f}{per_step:>10.3f}"
                     + "".join(f"{'' if v is None else f'{v:.3f}':>12}" for v in each)
                     + f"{r['p50_ms_approximate_median']:>10.3f}{r['max_ms_max']:>10.3f}"
                     f"{'' if nf is None else nf:>10}"
                     + (f"{'' if tf is None else f'{tf:.3g}':>10}" if tflops else ""))
    if shown:
        lines.append(f"(ms/step: over all {'ranks' if _ranks_only(runs) else 'runs'}' steps; "
                     f"then per {'rank' if _ranks_only(runs) else 'run'}; the runs: "
                     f"hooktrace query {os.fspath(path)} \"SELECT DISTINCT run, rank FROM "
                     f"aggregates\")")
    kept = kept_steps(path)
    if kept:
        steps = os.path.join(os.fspath(path), "steps")
        names = [os.path.join(steps, os.path.basename(k["path"])) for k in kept[:5]]
        lines.append(f"steps kept whole ({len(kept)}), each a trace for summary, diff, "
                     f"report, export: {', '.join(names)}"
                     + (f" and {len(kept) - 5} more" if len(kept) > 5 else ""))
    return text_lines(lines)


# summary of a folder of several runs or ranks: a ms/step column for this many
MAX_SOURCE_COLUMNS = 8


def _ranks_only(runs: list[tuple[str, int | None]]) -> bool:
    """Whether the runs are one each of distinct ranks (one launch's ranks)."""
    ranks = [k for _, k in runs]
    return None not in ranks and len(set(ranks)) == len(ranks)


def _source_labels(runs: list[tuple[str, int | None]]) -> dict[tuple[str, int | None], str]:
    """``rank R`` per run when the runs are distinct ranks, else ``run N`` (N: 1, 2, ... in
    the runs' order; the names are in the table's ``run`` column)."""
    if _ranks_only(runs):
        return {r: f"rank {r[1]}" for r in runs}
    return {r: f"run {i + 1}" + (f" r{r[1]}" if r[1] is not None else "")
            for i, r in enumerate(runs)}


def _steps_per_source(table: Any) -> dict[tuple[str, int | None], int]:
    out: dict[tuple[str, int | None], int] = {}
    for run, rank, mode, steps in zip(table["run"].to_pylist(), table["rank"].to_pylist(),
                                      table["mode"].cast("string").to_pylist(),
                                      table["steps"].to_pylist(), strict=True):
        if mode == "step":
            out[(str(run), rank)] = out.get((str(run), rank), 0) + int(steps or 0)
    return out


def _per_source(table: Any, runs: list[tuple[str, int | None]]
                ) -> dict[tuple[tuple[str, str], tuple[str, int | None]], float]:
    """ms per step of each (module, mode) in each (run, rank), over that run's steps."""
    steps = _steps_per_source(table)
    totals: dict[tuple[tuple[str, str], tuple[str, int | None]], float] = {}
    for run, rank, module, mode, total in zip(
            table["run"].to_pylist(), table["rank"].to_pylist(),
            table["module"].cast("string").to_pylist(), table["mode"].cast("string").to_pylist(),
            table["total_ms"].to_pylist(), strict=True):
        key = ((str(module), str(mode)), (str(run), rank))
        totals[key] = totals.get(key, 0.0) + float(total or 0.0)
    return {k: v / max(1, steps.get(k[1], 0)) for k, v in totals.items()}


def _per_step(path: str | os.PathLike[str]) -> dict[tuple[str, str], float]:
    """ms per step of each (module, mode) over an aggregate= folder's run."""
    import pyarrow.compute as pc

    table = load_aggregates(path)
    steps_rows = table.filter(pc.equal(table["mode"].cast("string"), "step"))
    n_steps = max(1, int(pc.sum(steps_rows["steps"]).as_py() or 0))
    grouped = table.group_by(["module", "mode"]).aggregate([("total_ms", "sum")]).to_pylist()
    return {(str(r["module"]), str(r["mode"])): float(r["total_ms_sum"] or 0.0) / n_steps
            for r in grouped}


def aggregate_diff(a: str | os.PathLike[str], b: str | os.PathLike[str],
                   top: int | None = None, fail_above: float | None = None,
                   min_share: float = 1.0) -> tuple[str, list[str]]:
    """``hooktrace diff A B`` of two aggregate= folders: per module and mode, the ms per
    step in each and the change, largest first; and, with ``fail_above`` (percent), the
    lines of those slower by more than that among the rows holding at least
    ``min_share`` percent of A's step time."""
    from hooktrace.text import printable, text_lines

    pa_, pb = _per_step(a), _per_step(b)
    step_a = pa_.get(("<step>", "step"), 0.0)
    keys = sorted(set(pa_) | set(pb), key=lambda k: (k[1] != "step",
                                                     -abs(pb.get(k, 0.0) - pa_.get(k, 0.0))))
    if top is not None:
        keys = keys[: top + 1]
    lines = [f"A: {os.fspath(a)}  B: {os.fspath(b)} (ms per step, over each run)",
             f"{'module':<40}{'mode':<10}{'A ms':>10}{'B ms':>10}{'delta':>10}{'change':>11}"]
    failed = []
    for key in keys:
        x, y = pa_.get(key), pb.get(key)
        change = f"{(y - x) / x * 100:+.1f}%" if x and y is not None else "new" if x is None \
            else "gone"
        lines.append(f"{key[0][:39]:<40}{key[1]:<10}{'' if x is None else f'{x:.3f}':>10}"
                     f"{'' if y is None else f'{y:.3f}':>10}{(y or 0.0) - (x or 0.0):>+10.3f}"
                     f"{change:>11}")
        if fail_above is not None and x and y is not None and key[1] != "step" and \
                x >= step_a * min_share / 100 and (y - x) / x * 100 > fail_above:
            failed.append(f"{key[0]} {key[1]}: {x:.3f} -> {y:.3f} ms/step ({change})")
    return text_lines(lines), [printable(line) for line in failed]
