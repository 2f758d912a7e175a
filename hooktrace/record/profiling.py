"""torch.profiler and hooktrace together while the model runs (issue #7): one
``with hooktrace.profile(model, out)`` block, or a ``merged_trace_handler`` as the
profiler's ``on_trace_ready``, writes merged traces (``hooktrace.merge`` does the
merging; this module drives a recorder and the profiler).

Example::

    with hooktrace.profile(model, "merged.json.gz") as prof:
        loss = model(x).sum(); loss.backward()
    print(prof.outputs)    # ['merged.json.gz']
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from hooktrace._naming import process_stem
from hooktrace._output import check_output_path
from hooktrace.errors import HooktraceError, OutputPathError
from hooktrace.exporters.merged import MergeResult, as_run, merge_traces
from hooktrace.reading import TraceData
from hooktrace.record.recorder import Recorder, Trace

__all__ = ["MergedTraceHandler", "Profile", "merged_trace_handler", "profile"]


def _snapshot(run: TraceData | Recorder | Callable[[], Any]) -> TraceData:
    """The run as far as it is recorded: a live trace's snapshot, or the finished data."""
    if not isinstance(run, TraceData) and not hasattr(run, "snapshot") and callable(run):
        run = run()
    snapshot = getattr(run, "snapshot", None)
    if snapshot is not None and getattr(run, "done", True) is False:
        return snapshot()  # type: ignore[no-any-return]
    return as_run(run)  # type: ignore[arg-type]


_MERGED_SUFFIXES = (".json", ".json.gz")


class MergedTraceHandler:
    """``on_trace_ready`` handler that writes one merged trace per profiler window.

    Each window is merged as soon as the profiler hands it over: with the run's
    events recorded so far (``Trace.snapshot()`` while the ``hooktrace.trace``
    block is still running), clipped to the window, into
    ``OUT_DIR/<host>_<pid>.<step>.merged.json.gz``. A window the run recorded
    no spans for (e.g. its buffer was full) is still written, and its drops are
    counted in the file's ``"hooktrace"`` block; a window that cannot be merged
    warns (one line) and keeps the profiler's own trace next to where the merged
    file would be, rather than stopping the training loop.

    ``keep_profiler_traces`` keeps ``<stem>.profiler.json`` (for ``hooktrace
    summary RUN --profiler``); ``merged_suffix`` is the merged files' ending
    (``.json`` or ``.json.gz``); ``number_by_window`` numbers each window's files
    by the last step of the hooktrace window merged into it (as
    :func:`~hooktrace.window_handler` and ``hooktrace run --schedule`` number
    their ``.htrace``) rather than by the profiler's ``step_num``.

    Example::

        with hooktrace.trace(model) as tr, torch.profiler.profile(
                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3),
                on_trace_ready=merged_trace_handler(tr, "traces")) as prof:
            for batch in loader:
                step(batch); prof.step()
        # traces/<host>_<pid>.<step>.merged.json.gz, one per active window
    """

    def __init__(
        self, run: TraceData | Recorder | Callable[[], TraceData | Recorder], out_dir: str | os.PathLike[str],
        *, worker_name: str | None = None, keep_profiler_traces: bool = False,
        merged_suffix: str = ".merged.json.gz", number_by_window: bool = False,
    ) -> None:
        if not merged_suffix.endswith(_MERGED_SUFFIXES):
            raise OutputPathError(f"merged_suffix {merged_suffix!r}: a merged trace is written "
                                  "as .json or .json.gz")
        self._run = run
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise OutputPathError(f"{self.out_dir}: exists and is not a directory; the merged "
                                  "traces go into a directory (one file per window)")
        self.worker_name = worker_name or process_stem(None)
        self.keep_profiler_traces = keep_profiler_traces
        self.merged_suffix = merged_suffix
        self.number_by_window = number_by_window
        self.outputs: list[str] = []
        self.results: list[MergeResult] = []
        self.failed: list[tuple[str, str]] = []  # (kept profiler trace, why)

    def __call__(self, prof: torch.profiler.profile) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run: TraceData | None = None
        failure: HooktraceError | None = None
        try:
            run = _snapshot(self._run)
        except HooktraceError as e:
            failure = e
        window = run.info.get("window") if run is not None and self.number_by_window else None
        step = window["last_step"] if window else getattr(prof, "step_num", len(self.outputs))
        stem = f"{self.worker_name}.{step}"
        raw = self.out_dir / f"{stem}.profiler.json"
        out = self.out_dir / f"{stem}{self.merged_suffix}"
        prof.export_chrome_trace(os.fspath(raw))
        try:
            if failure is not None:
                raise failure
            assert run is not None
            result = merge_traces(run, raw, out)
        except HooktraceError as e:
            self.failed.append((os.fspath(raw), str(e)))
            warnings.warn(f"hooktrace: window {stem} not merged ({e}); the profiler's trace is "
                          f"kept as {raw}", RuntimeWarning, stacklevel=2)
            return
        self.results.append(result)
        self.outputs.append(os.fspath(out))
        if result.dropped_events:
            warnings.warn(f"hooktrace: {result.dropped_events} events were dropped (buffer "
                          f"full) by the time window {stem} ended: its module spans may be "
                          "incomplete; raise trace(capacity=...)", RuntimeWarning, stacklevel=2)
        if not self.keep_profiler_traces:
            raw.unlink(missing_ok=True)

    def finish(self) -> list[str]:
        """Every merged path so far (windows are merged as they end; nothing is pending)."""
        return list(self.outputs)


def merged_trace_handler(
    run: TraceData | Recorder | Callable[[], TraceData | Recorder], out_dir: str | os.PathLike[str], *,
    worker_name: str | None = None, keep_profiler_traces: bool = False,
) -> MergedTraceHandler:
    """An ``on_trace_ready`` handler merging each profiler window with ``run``.

    ``run`` is the ``hooktrace.Trace`` (or a callable returning the run). See
    :class:`MergedTraceHandler`.
    """
    return MergedTraceHandler(run, out_dir, worker_name=worker_name,
                              keep_profiler_traces=keep_profiler_traces)


def _merged_file(out: Path, is_dir_hint: bool) -> Path:
    """The merged file ``profile(model, out)`` writes without a schedule."""
    if is_dir_hint or out.is_dir():
        return out / f"{process_stem(None)}.merged.json.gz"
    if not out.name.endswith(_MERGED_SUFFIXES):
        raise OutputPathError(f"{out}: a merged trace is written as .json or .json.gz; give "
                              "such a file name, or a directory (ending in '/')")
    return out


class Profile:
    """Context manager of :func:`profile`: ``.trace``, ``.profiler``, ``.outputs``."""

    def __init__(
        self, model: torch.nn.Module, out: str | os.PathLike[str], *,
        schedule: Callable[[int], Any] | None = None,
        trace_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any,
    ) -> None:
        if "on_trace_ready" in profiler_kwargs:
            raise TypeError("hooktrace.profile writes the merged traces itself; use "
                            "hooktrace.record.profiling.merged_trace_handler for a custom "
                            "on_trace_ready")
        name = os.fspath(out)
        self.out = Path(name)
        self.handler: MergedTraceHandler | None = None
        self._file: Path | None = None
        # Output paths are checked here, before the run, not when it is over.
        if schedule is None:
            self._file = _merged_file(self.out, name.endswith(("/", os.sep)))
            if self._file.exists():
                check_output_path(self._file)
        trace_kwargs = dict(trace_kwargs or {})
        self._window: TraceData | None = None
        if schedule is not None:
            # The trace follows the same schedule: it records only the active steps
            # and drains each window at its last step, just before the profiler hands
            # over its own (step() steps the trace first), so memory holds one window.
            trace_kwargs.update(schedule=schedule, steps=None, on_window=self._keep_window)
        self.trace: Recorder = Trace(model, **trace_kwargs)
        if schedule is not None:
            self.handler = MergedTraceHandler(self._run_for_window, self.out)
            profiler_kwargs.update(schedule=schedule, on_trace_ready=self.handler)
        self.profiler = torch.profiler.profile(**profiler_kwargs)
        self.outputs: list[str] = []
        self.result: MergeResult | None = None

    def __enter__(self) -> Profile:
        target = self.out if self._file is None else self._file.parent
        target.mkdir(parents=True, exist_ok=True)
        if self._file is not None:
            check_output_path(self._file)
        self.trace.__enter__()
        try:
            self.profiler.__enter__()
        except BaseException:
            self.trace.__exit__(None, None, None)
            raise
        return self

    def step(self) -> None:
        """Call once per training step with a schedule: ends the step of the trace
        (a window's events are drained at its last step), then the profiler's
        (whose ``on_trace_ready`` then merges that window)."""
        self.trace.step()
        self.profiler.step()

    def _keep_window(self, window: TraceData) -> None:
        self._window = window

    def _run_for_window(self) -> TraceData | Recorder:
        """The window the trace just handed over, else the trace as far as it is
        recorded (a window the profiler saves on exit, before the trace's own exit)."""
        window, self._window = self._window, None
        return window if window is not None else self.trace

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.profiler.__exit__(exc_type, exc, tb)
        finally:
            self.trace.__exit__(exc_type, exc, tb)
        if self.handler is not None:
            self.outputs = self.handler.finish()
            return
        if exc_type is not None:
            return
        assert self._file is not None
        with tempfile.TemporaryDirectory(dir=self._file.parent) as d:
            raw = os.path.join(d, "profiler.json")
            self.profiler.export_chrome_trace(raw)
            self.result = merge_traces(self.trace, raw, self._file)
        self.outputs = [os.fspath(self._file)]


def profile(
    model: torch.nn.Module, out: str | os.PathLike[str], *,
    schedule: Callable[[int], Any] | None = None,
    trace_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any,
) -> Profile:
    """Run ``torch.profiler`` and ``hooktrace.trace`` together; write merged traces.

    Without ``schedule``, ``out`` is the merged file (``.json`` or ``.json.gz``)
    written when the block exits, or a directory (existing, or a name ending in
    ``/``) that receives ``<host>_<pid>.merged.json.gz``. With a
    ``torch.profiler.schedule``, ``out`` is a directory receiving
    ``<host>_<pid>.<step>.merged.json.gz`` for each active window as soon as
    the window ends (call ``.step()`` once per step: it steps the trace and the
    profiler; the trace then records only the active steps, with the same
    schedule, so memory holds one window at most). Output paths are checked
    when the block starts. Other keyword arguments go to
    ``torch.profiler.profile``; ``trace_kwargs`` to ``hooktrace.trace``.

    Example::

        with hooktrace.profile(model, "merged.json.gz") as prof:
            loss = model(x).sum(); loss.backward()
        print(prof.outputs)    # ['merged.json.gz']
    """
    return Profile(model, out, schedule=schedule, trace_kwargs=trace_kwargs, **profiler_kwargs)
