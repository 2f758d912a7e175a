"""Kernel busy time from CUPTI (issue #49; csrc/cupti.h): the recording side of
``gpu=True``'s kernel mode on CUDA.

CUPTI's launch callbacks record each kernel launch (its correlation id) on the
launching thread; its activity records (each kernel's, copy's and set's device
interval) arrive later, on CUPTI's thread or at a flush; graph node callbacks name a
CUDA graph's kernels by the span open at capture. The reader
(:mod:`hooktrace.analysis.kernel_time`) joins them to module spans.

libcupti is loaded at run time: ``HOOKTRACE_CUPTI_LIB`` when set (the tests' fake
CUPTI), else the CUDA torch wheel's own NVIDIA package (``nvidia/cuda_cupti/lib`` for
cu12, ``nvidia/cu13/lib`` for cu13), else the loader's search path. Building hooktrace
needs no CUDA toolkit. ``info["kernels"]`` says how it went: ``library``, ``launches``,
``records``, ``lost`` (records CUPTI dropped or a full buffer pool refused: counted,
never guessed), ``names`` (kernel names by index), ``clock`` (CUPTI ns to Unix ns
pairs), and ``yielded`` (steps given back to torch.profiler, which needs CUPTI too).
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

__all__ = ["KernelTimer", "cupti_candidates"]

# Activity buffers: 16 x 4 MiB (~20,000 kernel records each) in flight at most; CUPTI
# fills one while the last is delivered, so two are the usual use.
BUFFER_BYTES = 4 << 20
MAX_BUFFERS = 16


def _native() -> Any:
    import hooktrace._C as _C

    return _C


def cupti_candidates() -> list[str]:
    """The libcupti paths to try, first the one ``HOOKTRACE_CUPTI_LIB`` names."""
    forced = os.environ.get("HOOKTRACE_CUPTI_LIB", "")
    if forced:
        return [forced]
    found: list[str] = []
    for base in sys.path:
        for sub in ("nvidia/cuda_cupti/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"):
            found += sorted(glob.glob(os.path.join(base, sub, "libcupti.so*")), reverse=True)
    try:
        import torch

        found += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib",
                                               "libcupti*.so*")))
    except ImportError:
        pass
    return found + ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]


class KernelTimer:
    """Kernel busy time for one session: :meth:`start` subscribes (None) or says why
    not (one line); :meth:`flush` delivers completed records into the session;
    :meth:`stop` gives CUPTI back. CUPTI's subscription is the process's: traces at the
    same time (a model traced inside ``hooktrace run``) share it, each session getting
    every record, and the last one to stop lets it go."""

    _users = 0

    def __init__(self) -> None:
        self._session: Any = None
        self._base: dict[str, Any] = {}
        self.yielded = 0
        self.refused = ""  # why CUPTI could not be (re)taken after a yield

    def start(self, session: Any) -> str | None:
        C = _native()
        why = C.cupti_start(cupti_candidates(), BUFFER_BYTES, MAX_BUFFERS)
        if why:
            return str(why)
        self._session = session
        self._base = dict(C.cupti_stats())
        C.cupti_add_session(session)
        KernelTimer._users += 1
        return None

    def set_enabled(self, on: bool) -> None:
        if self._session is not None:
            _native().cupti_set_enabled(on)

    def flush(self, forced: bool) -> None:
        if self._session is not None:
            _native().cupti_flush(forced)

    def yield_to_profiler(self) -> None:
        """torch.profiler is about to take CUPTI: deliver what we have, let go."""
        if self._session is not None:
            _native().cupti_stop()
            self.yielded += 1

    def resume(self) -> None:
        """torch.profiler let CUPTI go: take it back, or say why not (its Kineto keeps
        the one subscriber for the rest of the process on most torch builds)."""
        if self._session is None:
            return
        why = _native().cupti_start(cupti_candidates(), BUFFER_BYTES, MAX_BUFFERS)
        if why and not self.refused:
            self.refused = str(why)

    def stop(self) -> None:
        if self._session is None:
            return
        C = _native()
        C.cupti_remove_session(self._session)
        KernelTimer._users -= 1
        if KernelTimer._users == 0:
            C.cupti_stop()

    def metadata(self) -> dict[str, Any]:
        st = dict(_native().cupti_stats())
        base = self._base

        def since(key: str) -> int:
            return int(st[key]) - int(base.get(key, 0))

        info: dict[str, Any] = {
            "library": str(st["library"]), "launches": since("launches"),
            "records": since("records"),
            "lost": since("cupti_dropped") + since("buffers_refused"),
            "buffers_refused": since("buffers_refused"), "graph_nodes": since("graph_nodes"),
            "names": [str(n) for n in st["names"]],
            "clock": [[int(c), int(u)] for c, u in st["clock_pairs"]][-64:],
            "yielded": self.yielded}
        if self.refused:
            info["not_resumed"] = self.refused
        return info
