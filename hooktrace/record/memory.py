"""Memory per module call, the recording half (issue #27: one component per feature):
turning the native core's memory sampling on for a session (:func:`enable`), the run's
``info["memory"]`` block (:func:`finish`), and :class:`MemoryComponent`
(``trace(model, memory=True)``). Reading the samples: :mod:`hooktrace.analysis.memory`."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from hooktrace.record.component import Component, Option

if TYPE_CHECKING:
    from torch import nn

    import hooktrace._C as _C

__all__ = ["MemoryComponent", "cuda_allocations", "enable", "finish"]


def _cuda_device(model: nn.Module | None) -> int:
    """The CUDA device to sample, -1 for none. A model's: the device of its first CUDA
    parameter or buffer; else the current device when the process already uses CUDA
    (inputs moved there, offloading hooks); else none, and CUDA is not initialized for
    a CPU model. A process scope (``hooktrace run``): the current device, since the
    script has not run yet (:func:`finish` drops it when the run allocated nothing there)."""
    import torch

    if not torch.cuda.is_available():
        return -1
    if model is not None:
        for t in itertools.chain(model.parameters(), model.buffers()):
            if t.is_cuda:
                return t.device.index if t.device.index is not None else 0
        if not torch.cuda.is_initialized():
            return -1
    return torch.cuda.current_device()


def enable(session: _C.Session, model: nn.Module | None = None) -> dict[str, object]:
    """Turn memory sampling on for a ``_C.Session`` not yet started; returns the run's
    ``info["memory"]`` block. CUDA is sampled on the device :func:`_cuda_device` picks for
    ``model`` (None: a process scope). Raises :class:`~hooktrace.errors.HooktraceError`
    when it cannot be set up."""
    import torch

    from hooktrace.errors import HooktraceError

    cuda = _cuda_device(model)
    old_torch = cuda >= 0 and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 9)
    if old_torch:  # no c10::DeviceAllocator to read (csrc/memory.cpp): CPU only
        cuda = -1
    try:
        session.set_memory(True, cuda)
    except RuntimeError as e:
        raise HooktraceError(f"memory=True: {e}") from None
    devices = ["cpu"] + ([f"cuda:{cuda}"] if cuda >= 0 else [])
    return {"devices": devices,
            "cpu": "bytes allocated through hooktrace's counting CPU allocator while "
                   "recording (tensors allocated before the trace are not subtracted "
                   "when freed)",
            **({"cuda": "the caching allocator's allocated bytes and high-water mark"}
               if cuda >= 0 else {}),
            **({"cuda": "not sampled: reading it needs torch 2.9 or later"}
               if old_torch else {})}


def cuda_allocations(block: dict[str, object]) -> int:
    """How many allocations the caching allocator has made so far on the CUDA device
    ``enable``'s block lists; -1 when it lists none."""
    import torch

    cuda = [str(d) for d in block.get("devices", []) if str(d).startswith("cuda:")]  # type: ignore[attr-defined]
    if not cuda:
        return -1
    stats = torch.cuda.memory_stats(int(cuda[0].split(":")[1]))
    return int(stats.get("allocation.all.allocated", 0))


def finish(block: dict[str, object], allocations_before: int) -> dict[str, object]:
    """``enable``'s block as the run's ``info["memory"]`` so far: a CUDA device on which
    the run allocated nothing since ``allocations_before`` (:func:`cuda_allocations` at the
    start) is not listed, since the run did not use it (a CPU script under ``hooktrace
    run`` on a machine with a GPU)."""
    if allocations_before < 0 or cuda_allocations(block) != allocations_before:
        return block
    return {k: ([d for d in v if not str(d).startswith("cuda:")]  # type: ignore[attr-defined]
                if k == "devices" else v)
            for k, v in block.items() if k != "cuda"}



class MemoryComponent(Component):
    """``memory=True``: sampling on before the session starts; ``info["memory"]``."""

    OPTIONS = (
        Option("memory", False, "also record the bytes allocated at every module call and the "
               "peak inside it (CPU, and the current CUDA device when there is one)",
               cli="switch"),
    )

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self._block: dict[str, Any] | None = None
        self._cuda_allocations = -1  # the CUDA device's allocations when recording began

    def prepare(self, session: Any, scope: Any) -> None:
        self._block = enable(session, scope.model() if scope.kind == "model" else None)
        self._cuda_allocations = cuda_allocations(self._block)

    def run_info(self, info: dict[str, Any]) -> None:
        if self._block is not None:
            info["memory"] = self._block

    def metadata(self, info: dict[str, Any]) -> None:
        """As of now: without a CUDA device the run did not allocate on."""
        if self._block is not None:
            info["memory"] = finish(self._block, self._cuda_allocations)
