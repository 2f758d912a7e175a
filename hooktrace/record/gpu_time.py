"""``gpu=True``: device time per module call (issues #28, #36; csrc/gpu_time.h). Each
timed forward call gets one timing event on the current stream of the current device at
its start and one at its end; backward one where the module of the autograd nodes
changes. The events come from a pool per device, made at the first mark on that device
(``dropped`` counts calls a full pool could not serve), are resolved at each step mark
(only those the device has completed: no host sync), with one wait where the step's
events are about to be handed over (the end of a ``schedule=`` window, a timed step
of ``aggregate=``) and at the end, and are stored as GPU_MARK / GPU_TIME events; the
reader pairs them into :class:`hooktrace.reading.GpuSpans`. ``gpu_every=N`` times steps
0, N, 2N, ...

The device type is the one the work runs on: CUDA (ROCm's HIP too), XPU, or a
PrivateUse1 backend, through c10's device-generic events; ``HOOKTRACE_GPU_TIMER=<device
type>`` (``cuda``, ``xpu``, ``privateuse1``) forces one (a test's fake accelerator),
``HOOKTRACE_GPU_TIMER=host`` selects the host-clock timer (its "events" are host
timestamps), which runs the whole pipeline without a device. ``HOOKTRACE_GPU_POOL`` sets
the pool's size (default 16384 events per device); ``HOOKTRACE_GPU_MODE`` what
``gpu_mode="auto"`` means (a test of one path). None of these is a user option.

``gpu_mode``: on CUDA, ``gpu=True`` records each kernel's busy time from CUPTI
(:mod:`hooktrace.record.cupti`, read by :mod:`hooktrace.analysis.kernel_time`) when
CUPTI loads and no other tool holds it, else it says so in one line and times calls
with device events as below; ``"events"``, ``"kernels"`` and ``"both"`` choose.

``info["gpu"]`` says how: ``timer``, ``every``, ``timed_steps``, ``devices`` (the
device indexes timed), ``skipped_capturing`` (calls made while a graph was being
captured, seen by hooktrace's wrapper or by the stream's own capture state: not
timed), ``dropped``, ``failed`` (marks whose time the device would not give, e.g. an
event recorded into a capture: counted, never raised), ``align_error_ns`` (the bound of
the device-to-host clock alignment of every time resolved: the alignment's bracket, the
resolution of an elapsed time, and the drift allowed since, 22 ppm), ``realigned`` and
``max_realign_correction_ns`` (re-alignments at step marks where the stream was idle,
and the largest correction one made: the drift and rounding they removed),
``align_waits`` (waits spent aligning: at most one per device and trace) and
``align_estimated`` (alignments no idle stream gave, issue #50: the bracket of the one
wait, or of a probe seen done at a later resolution, kept as a bounded estimate; a
device that never idles gets one, its durations exact, its placement on the host clock
within the bound). (``info["accelerator"] = "cuda"``, whenever
the process used CUDA, timed or not, is the recorder's.)
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from hooktrace.errors import NoDeviceError
from hooktrace.record.component import Component, Flag, Option, Options, one_of, positive_int
from hooktrace.record.cupti import KernelTimer

__all__ = ["GpuTimeComponent", "gpu_timer"]

DEFAULT_POOL = 16384

# Process-wide: the recorders timing now, and torch.cuda.CUDAGraph's own methods while
# they are wrapped (capture_begin/capture_end raise the native "capturing" flag).
_capture_users = 0
_capture_saved: dict[str, Any] = {}


def gpu_timer() -> str | None:
    """The timer ``gpu=True`` would use here: ``HOOKTRACE_GPU_TIMER`` when set (``host``
    or a device type), else the first of CUDA, XPU and a PrivateUse1 backend with a
    device, else None."""
    forced = os.environ.get("HOOKTRACE_GPU_TIMER", "")
    if forced:
        return forced
    import torch

    if torch.cuda.is_available():
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and getattr(xpu, "is_available", lambda: False)():
        return "xpu"
    name = torch._C._get_privateuse1_backend_name()
    backend = getattr(torch, name, None) if name != "privateuseone" else None
    try:
        if backend is not None and backend.is_available():
            return name
    except Exception:  # a backend module without is_available: not ours to judge
        pass
    return None


def _native() -> Any:
    """The native core, imported when first used (``hooktrace run --help`` reads this
    file's declarations without importing torch)."""
    import hooktrace._C as _C

    return _C


GPU_MODES = ("auto", "kernels", "events", "both")


def _wrap_profiler(timer: KernelTimer) -> Any:
    """torch.profiler needs CUPTI too (Kineto: one subscriber per process): around its
    prepare and its disable, hooktrace yields CUPTI and takes it back. Returns the
    undo."""
    try:
        import torch.autograd.profiler as prof
    except ImportError:
        return lambda: None
    prepare, disable = prof._prepare_profiler, prof._disable_profiler

    def _prepare_profiler(*args: Any, **kwargs: Any) -> Any:
        timer.yield_to_profiler()
        return prepare(*args, **kwargs)

    def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
        try:
            return disable(*args, **kwargs)
        finally:
            timer.resume()

    prof._prepare_profiler, prof._disable_profiler = _prepare_profiler, _disable_profiler

    def undo() -> None:
        if prof._prepare_profiler is _prepare_profiler:
            prof._prepare_profiler, prof._disable_profiler = prepare, disable
    return undo


def _pool_size() -> int:
    raw = os.environ.get("HOOKTRACE_GPU_POOL", "")
    try:
        return max(2, int(raw)) if raw else DEFAULT_POOL
    except ValueError:
        return DEFAULT_POOL


def _synchronize_cuda() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


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
        Option("gpu_mode", "auto", "with gpu, what is recorded: 'kernels' (each kernel's "
               "busy time from CUPTI, joined to the module that launched it), 'events' "
               "(a device-event interval per call, idle gaps included), 'both', or 'auto' "
               "(kernels on CUDA when CUPTI is free, else events)", check=one_of(*GPU_MODES),
               cli=Flag("choice", choices={m: m for m in GPU_MODES}, metavar="MODE")),
        Option("gpu_every", 1, "with gpu, time steps 0, N, 2N, ... only (default: every "
               "step)", check=positive_int("steps"), cli="int",
               flag_help="with --gpu, time steps 0, N, 2N, ... only (default: every step)"),
    )

    @classmethod
    def enabled(cls, options: Options) -> bool:
        return options.gpu

    @classmethod
    def check(cls, options: Options) -> None:
        if options.gpu and options.gpu_mode != "kernels" and gpu_timer() is None:
            raise NoDeviceError("gpu=True needs a CUDA device (or an XPU or PrivateUse1 "
                                "one): torch.cuda.is_available() is False on this machine")

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self._session: Any = None
        self._timer: str | None = None
        self._on = False  # the step running now is timed
        self._timed_ended = 0  # timed steps a step mark ended
        self._marks_at_step = 0  # marks recorded when the last step mark came
        self._wrapped = False
        self._warned = False
        self._kernels: KernelTimer | None = None
        self._unwrap_profiler: Any = None
        self._kernels_note = ""

    def _start_kernels(self, session: Any) -> str | None:
        """Kernel busy time (CUPTI): None once started, else why not."""
        timer = KernelTimer()
        why = timer.start(session)
        if why is None:
            self._kernels = timer
            self._unwrap_profiler = _wrap_profiler(timer)
        return why

    def prepare(self, session: Any, scope: Any) -> None:
        self._session = session
        mode = self.recorder.options.gpu_mode
        if mode == "auto" and os.environ.get("HOOKTRACE_GPU_MODE", "") in GPU_MODES:
            mode = os.environ["HOOKTRACE_GPU_MODE"]  # (tests and checks of one path)
        self._timer = gpu_timer()
        auto = self._timer == "cuda" or bool(os.environ.get("HOOKTRACE_CUPTI_LIB"))
        if mode in ("kernels", "both") or (mode == "auto" and auto):
            why = self._start_kernels(session)
            if why is not None and mode != "auto":
                raise NoDeviceError(f"gpu_mode={mode!r}: kernel busy time needs CUPTI: {why}")
            if why is not None:
                self._kernels_note = why
                warnings.warn(f"hooktrace: gpu=True: no kernel busy time ({why}); timing "
                              "module calls with device events instead", RuntimeWarning,
                              stacklevel=2)
            if self._kernels is not None and mode != "both":
                self._timer = None  # kernels only: no event per call
                return
        if self._timer is None:  # (checked when the recorder was made)
            raise NoDeviceError("gpu=True needs a CUDA device")
        try:
            _native().gpu_start(session, self._timer, _pool_size())
        except (ValueError, RuntimeError) as e:
            raise NoDeviceError(f"gpu=True: {e}") from None

    def install(self, session: Any, scope: Any) -> None:
        if self._timer is None:
            return
        if self._timer == "cuda" and self._kernels is None:
            _wrap_capture()
            self._wrapped = True
        session.set_gpu(True)  # step 0 is always timed
        self._on = True

    def before_step(self) -> None:
        if self._kernels is not None and self.recorder.drains_at_step_mark():
            self._kernels.flush(True)  # the records so far, before the window is handed over
        if self._timer is None:
            return
        # Completed marks only (no wait), unless the step's events are handed over
        # now (a window's end, an aggregate's step): then one wait, or a device that
        # runs behind loses their times (issue #36: 0 of 14 rows timed at 400 ms).
        wait = self._on and self.recorder.drains_at_step_mark()
        self._resolve(wait)

    def _resolve(self, wait: bool) -> None:
        try:
            _native().gpu_resolve(self._session, wait)
        except Exception as e:  # never into the user's step (the native side counts)
            if not self._warned:
                self._warned = True
                warnings.warn(f"hooktrace: device times could not be read: {e}",
                              RuntimeWarning, stacklevel=2)

    def step(self, step_no: int) -> None:
        every = self.recorder.options.gpu_every
        if self._kernels is not None:
            if self._timer is None:
                self._timed_ended += self._on
                self._on = step_no % every == 0
            if every > 1:
                self._kernels.set_enabled(step_no % every == 0)
        if self._timer is None:
            return
        self._timed_ended += self._on
        self._marks_at_step = _marks(self._session)
        self._on = step_no % every == 0
        if every > 1:
            self._session.set_gpu(self._on)

    def flush(self) -> None:
        if self._kernels is not None:
            _synchronize_cuda()  # the last kernels' records exist once they ran
            self._kernels.flush(True)
        if self._timer is not None:
            self._resolve(True)  # the one wait, at the end

    def teardown(self) -> None:
        if self._kernels is not None:
            if self._unwrap_profiler is not None:
                self._unwrap_profiler()
            self._kernels.stop()
        if self._timer is not None and self._session is not None:
            self._session.set_gpu(False)
        if self._wrapped:
            self._wrapped = False
            _unwrap_capture()

    def metadata(self, info: dict[str, Any]) -> None:
        if self._kernels is not None:
            info["kernels"] = self._kernels.metadata()
            info["kernels"]["timed_steps"] = self._timed_ended + self._on
            info["kernels"]["every"] = self.recorder.options.gpu_every
        elif self._kernels_note:
            info["kernels"] = {"unavailable": self._kernels_note}
        if self._timer is None or self._session is None:
            return
        stats = _native().gpu_stats(self._session)
        # the steps ended while timed, and the one running now if it timed a call
        running = self._on and _marks(self._session) > self._marks_at_step
        info["gpu"] = {"timer": self._timer, "every": self.recorder.options.gpu_every,
                       "timed_steps": self._timed_ended + running,
                       "devices": [int(d) for d in stats["devices"]],
                       "skipped_capturing": int(stats["skipped_capturing"]),
                       "dropped": int(stats["dropped"]),
                       "failed": int(stats["failed"]),
                       "align_error_ns": int(stats["align_error_ns"]),
                       "realigned": int(stats["realigned"]),
                       "max_realign_correction_ns": int(stats["max_realign_correction_ns"]),
                       "align_waits": int(stats["align_waits"]),
                       "align_estimated": int(stats["align_estimated"])}
