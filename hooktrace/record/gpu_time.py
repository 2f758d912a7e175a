"""``gpu=True``: device time per module call (issue #28, csrc/gpu_time.h). Each timed
forward call gets one timing event on its CUDA stream at its start and one at its end;
backward one where the module of the autograd nodes changes. The events come from a
pool made when recording starts (``dropped`` counts calls it could not serve), are
resolved at each step mark (only those the device has completed: no host sync) and at
the end (one wait), and are stored as GPU_MARK / GPU_TIME events; the reader pairs them
into :class:`hooktrace.reading.GpuSpans`. ``gpu_every=N`` times steps 0, N, 2N, ...

``info["gpu"]`` says how: ``timer``, ``every``, ``timed_steps``, ``skipped_capturing``
(calls made while a CUDA graph was being captured: not timed), ``dropped`` and
``align_error_ns`` (the bound of the device-to-host clock alignment). (``info
["accelerator"] = "cuda"``, whenever the process used CUDA, timed or not, is the
recorder's.)

Test seam: ``HOOKTRACE_GPU_TIMER=host`` selects the host-clock timer (its "events"
are host timestamps), which runs the whole pipeline without a GPU; ``HOOKTRACE_GPU_POOL``
sets the pool's size (default 16384 events). Neither is a user option.
"""

from __future__ import annotations

import os
from typing import Any

from hooktrace.errors import NoDeviceError
from hooktrace.record.component import Component, Option, Options, positive_int

__all__ = ["GpuTimeComponent", "gpu_timer"]

DEFAULT_POOL = 16384

# Process-wide: the recorders timing now, and torch.cuda.CUDAGraph's own methods while
# they are wrapped (capture_begin/capture_end raise the native "capturing" flag).
_capture_users = 0
_capture_saved: dict[str, Any] = {}


def gpu_timer() -> str | None:
    """The timer ``gpu=True`` would use here: ``"host"`` when the test seam asks for it,
    ``"cuda"`` when CUDA is available, else None."""
    if os.environ.get("HOOKTRACE_GPU_TIMER", "") == "host":
        return "host"
    import torch

    return "cuda" if torch.cuda.is_available() else None


def _native() -> Any:
    """The native core, imported when first used (``hooktrace run --help`` reads this
    file's declarations without importing torch)."""
    import hooktrace._C as _C

    return _C


def _pool_size() -> int:
    raw = os.environ.get("HOOKTRACE_GPU_POOL", "")
    try:
        return max(2, int(raw)) if raw else DEFAULT_POOL
    except ValueError:
        return DEFAULT_POOL


def _marks(session: Any) -> int:
    """The marks the session's timer has taken from its pool so far."""
    stats = _native().gpu_stats(session)
    return int(stats["pending"]) + int(stats["resolved"])


def _wrap_capture() -> None:
    """While a CUDA graph is being captured, the native timer records nothing (timing
    events do not work inside a graph): torch.cuda.CUDAGraph.capture_begin/capture_end,
    which torch.cuda.graph(), make_graphed_callables and torch.compile's CUDA graphs
    all go through, raise and lower the flag."""
    global _capture_users
    _capture_users += 1
    if _capture_users > 1:
        return
    import torch

    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is None or not hasattr(graph, "capture_begin"):
        return
    begin, end = graph.capture_begin, graph.capture_end
    _capture_saved.update(cls=graph, begin=begin, end=end)

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        _native().gpu_set_capturing(True)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            _native().gpu_set_capturing(False)
            raise

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            _native().gpu_set_capturing(False)

    graph.capture_begin, graph.capture_end = capture_begin, capture_end


def _unwrap_capture() -> None:
    global _capture_users
    if _capture_users == 0:
        return
    _capture_users -= 1
    if _capture_users == 0 and _capture_saved:
        graph = _capture_saved.pop("cls")
        graph.capture_begin, graph.capture_end = _capture_saved.pop("begin"), _capture_saved.pop("end")


class GpuTimeComponent(Component):
    OPTIONS = (
        Option("gpu", False, "also record each module call's device time on its CUDA stream, "
               "forward and backward (timing events resolved at step marks: no sync per "
               "call); needs a CUDA device", cli="switch"),
        Option("gpu_every", 1, "with gpu, time steps 0, N, 2N, ... only (default: every "
               "step)", check=positive_int("steps"), cli="int",
               flag_help="with --gpu, time steps 0, N, 2N, ... only (default: every step)"),
    )

    @classmethod
    def enabled(cls, options: Options) -> bool:
        return options.gpu

    @classmethod
    def check(cls, options: Options) -> None:
        if options.gpu and gpu_timer() is None:
            raise NoDeviceError("gpu=True needs a CUDA device: torch.cuda.is_available() is "
                                "False on this machine")

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self._session: Any = None
        self._timer: str | None = None
        self._on = False  # the step running now is timed
        self._timed_ended = 0  # timed steps a step mark ended
        self._marks_at_step = 0  # marks recorded when the last step mark came
        self._wrapped = False

    def prepare(self, session: Any, scope: Any) -> None:
        self._session = session
        self._timer = gpu_timer()
        if self._timer is None:  # (checked when the recorder was made)
            raise NoDeviceError("gpu=True needs a CUDA device")
        _native().gpu_start(session, self._timer, _pool_size())

    def install(self, session: Any, scope: Any) -> None:
        if self._timer is None:
            return
        if self._timer == "cuda":
            _wrap_capture()
            self._wrapped = True
        session.set_gpu(True)  # step 0 is always timed
        self._on = True

    def before_step(self) -> None:
        if self._timer is not None:
            _native().gpu_resolve(self._session, False)  # completed ones only: no wait

    def step(self, step_no: int) -> None:
        if self._timer is None:
            return
        self._timed_ended += self._on
        self._marks_at_step = _marks(self._session)
        every = self.recorder.options.gpu_every
        self._on = step_no % every == 0
        if every > 1:
            self._session.set_gpu(self._on)

    def flush(self) -> None:
        if self._timer is not None:
            _native().gpu_resolve(self._session, True)  # the one wait, at the end

    def teardown(self) -> None:
        if self._timer is not None and self._session is not None:
            self._session.set_gpu(False)
        if self._wrapped:
            self._wrapped = False
            _unwrap_capture()

    def metadata(self, info: dict[str, Any]) -> None:
        if self._timer is None or self._session is None:
            return
        stats = _native().gpu_stats(self._session)
        # the steps ended while timed, and the one running now if it timed a call
        running = self._on and _marks(self._session) > self._marks_at_step
        info["gpu"] = {"timer": self._timer, "every": self.recorder.options.gpu_every,
                       "timed_steps": self._timed_ended + running,
                       "skipped_capturing": int(stats["skipped_capturing"]),
                       "dropped": int(stats["dropped"]),
                       "align_error_ns": int(stats["align_error_ns"])}
