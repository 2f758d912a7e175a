"""FLOPs per module (``trace(model, flops=True)``) and achieved TFLOP/s.

**Counting.** ``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of
every aten op and attributes them to the modules on the stack (inclusive: a
block's count includes its children's). It costs a Python dispatch per op
(11-28x a plain step on benchmarks/flops.py's MLP), so it runs on one root call per
distinct input signature (shapes, dtypes, devices, ``requires_grad`` of the
tensor arguments, the other arguments' values, ``model.training``, grad mode):
the first time a signature is seen, the counter is entered just before that
root call and left at the next root call, step mark or the end of the block,
whichever comes first, so that the call's backward pass is counted too; the
forward counts are read when the root call returns, the backward counts are
the rest (ops outside every module, the loss's and the optimizer's, count
for no module). Every later call with the same signature has the same
counts and runs uninstrumented.

**Timing.** The counted calls run slower, so they are left out of TFLOP/s:
``tflops`` = the module's FLOPs over its time, summed over the root calls that
were *not* counted. Their spans stay in every time column (they did run).

**Recorded** in ``info["flops"]``: ``signatures`` (per signature, ``forward``
and ``backward``: module qualified name -> FLOPs of one root call), ``calls``
(the signature index of each root call, in order) and ``counted`` (the root
calls that ran under the counter).

Example::

    with hooktrace.trace(model, flops=True) as tr:
        for x in batches:
            model(x).sum().backward()
    print(tr.summary().to_text(wide=True))   # flops, bwd_flops, tflops, bwd_tflops
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.errors import HooktraceError

if TYPE_CHECKING:
    from torch import nn

    from hooktrace.reading import Spans

__all__ = ["FlopRecorder", "PEAK_TFLOPS", "flop_columns", "peak_tflops_for"]

# Dense BF16/FP16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data
# sheets, for MFU when no --peak-tflops is given; matched by substring of
# torch.cuda.get_device_name(), longest first.
PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 989.0,
    "A100": 312.0, "A10G": 70.0, "L40S": 362.0, "L4": 121.0, "V100": 125.0, "T4": 65.0,
    "RTX 4090": 165.0, "RTX 3090": 71.0, "MI300X": 1307.0, "MI250X": 383.0,
}


def peak_tflops_for(device_name: str | None) -> float | None:
    """The table's peak for a CUDA device name, or None (CPUs and unknown devices)."""
    if not device_name:
        return None
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_TFLOPS[key]
    return None


def _signature(model: nn.Module, args: Any, kwargs: Any) -> tuple[Any, ...]:
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((args, kwargs))
    sig: list[Any] = [str(spec), model.training, torch.is_grad_enabled()]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            sig.append((tuple(x.shape), x.dtype, x.device, x.requires_grad))
        elif isinstance(x, (int, float, bool, str, type(None))):
            sig.append(x)
        else:
            sig.append(type(x).__qualname__)
    return tuple(sig)


class FlopRecorder:
    """Counts FLOPs on the root's first call of each input signature (see the module
    docstring); hooks on the root only, removed by :meth:`stop`."""

    def __init__(self, model: nn.Module) -> None:
        self._model = weakref.ref(model)
        self._root_name = type(model).__name__
        self._sigs: dict[tuple[Any, ...], int] = {}
        self.signatures: list[dict[str, dict[str, int]]] = []
        self.calls: list[int] = []
        self.counted: list[int] = []
        self._counter: Any = None  # the FlopCounterMode while one is open
        self._forward: dict[str, int] = {}
        self._handles: list[Any] = []

    def start(self) -> None:
        model = self._model()
        assert model is not None
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post, always_call=True),
        ]

    def stop(self) -> None:
        """Idempotent: removes the hooks and closes an open count."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.close()

    def _pre(self, model: nn.Module, args: Any, kwargs: Any) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        self.close()  # a count still open (no backward came) ends at the next root call
        sig = _signature(model, args, kwargs)
        index = self._sigs.get(sig)
        if index is None:
            index = self._sigs[sig] = len(self.signatures)
            self.signatures.append({"forward": {}, "backward": {}})
            counter = FlopCounterMode(display=False)
            counter.__enter__()
            # FlopCounterMode's module tracker enters modules from a global forward
            # pre-hook registered in __enter__; this call's global hooks were already
            # taken when our (module) pre-hook runs, so enter the root by hand as that
            # hook would have: otherwise the root is missing and every submodule is
            # named by its class alone instead of its path.
            counter.mod_tracker._fw_pre_hook(model, args)
            self._counter = counter
            self.counted.append(len(self.calls))
        self.calls.append(index)

    def _post(self, model: nn.Module, args: Any, output: Any) -> None:
        counter = self._counter
        if counter is None:
            return
        self._forward = _totals(counter.get_flop_counts())
        if not _may_need_grad(output):
            self.close()  # no backward can follow: stop the slow dispatch now
        # Otherwise the mode stays until the next root call, step or exit: it is a
        # thread-local dispatch mode, left on the thread that entered it, never from
        # an autograd engine callback (which may run on another thread).

    def on_step(self) -> None:
        self.close()

    def close(self) -> None:
        counter = self._counter
        if counter is None:
            return
        self._counter = None
        counter.__exit__(None, None, None)
        total = _totals(counter.get_flop_counts())
        forward = self._forward
        self._forward = {}
        sig = self.signatures[self.calls[self.counted[-1]]]
        for key, flops in total.items():
            name = self._module_name(key)
            if name is None:
                continue
            fwd = forward.get(key, 0)
            if fwd:
                sig["forward"][name] = fwd
            if flops - fwd:
                sig["backward"][name] = flops - fwd

    def _module_name(self, key: str) -> str | None:
        """FlopCounterMode's key (``Root.blocks.0``) as a qualified name (``blocks.0``);
        None for ``Global`` (ops outside every module: the loss, the optimizer)."""
        if key == self._root_name:
            return ""
        if key.startswith(self._root_name + "."):
            return key[len(self._root_name) + 1:]
        return None

    def to_info(self) -> dict[str, Any]:
        return {"signatures": self.signatures, "calls": self.calls, "counted": self.counted}


def _may_need_grad(output: Any, depth: int = 0) -> bool:
    """Whether a backward pass can follow a root call that returned ``output``: a tensor
    in it requires grad (looking through pytrees and dataclasses), or it holds an
    object that cannot be looked into (then the count stays open, to be safe)."""
    import dataclasses

    import torch
    from torch.utils._pytree import tree_flatten

    for x in tree_flatten(output)[0]:
        if isinstance(x, torch.Tensor):
            if x.requires_grad:
                return True
        elif dataclasses.is_dataclass(x) and not isinstance(x, type) and depth < 8:
            if _may_need_grad([getattr(x, f.name) for f in dataclasses.fields(x)], depth + 1):
                return True
        elif not isinstance(x, (int, float, complex, bool, str, bytes, type(None))):
            return True
    return False


def _totals(counts: Mapping[str, Mapping[Any, int]]) -> dict[str, int]:
    return {k: int(sum(v.values())) for k, v in counts.items()}


class FlopInfoError(HooktraceError):
    """info["flops"] of a trace file is not what a recorder writes."""


def _parse(info: Any) -> tuple[list[dict[str, dict[str, int]]], list[int], set[int]]:
    def bad(what: str) -> FlopInfoError:
        return FlopInfoError(f'info["flops"]: {what}; the file was not written by '
                             "hooktrace.trace(flops=True)")

    if not isinstance(info, dict):
        raise bad("not an object")
    sigs, calls, counted = info.get("signatures"), info.get("calls"), info.get("counted")
    if not isinstance(sigs, list) or not isinstance(calls, list) or not isinstance(counted,
                                                                                 list):
        raise bad("signatures, calls and counted must be lists")
    for s in sigs:
        if not (isinstance(s, dict) and all(
                isinstance(s.get(p), dict) and all(isinstance(k, str) and isinstance(v, int)
                                                   for k, v in s[p].items())
                for p in ("forward", "backward"))):
            raise bad("each signature maps forward/backward to {module: int}")
    if not all(isinstance(c, int) and 0 <= c < len(sigs) for c in calls):
        raise bad("calls must be signature indices")
    if not all(isinstance(c, int) for c in counted):
        raise bad("counted must be root call numbers")
    return sigs, calls, set(counted)


def _root_call(spans: Spans) -> np.ndarray:
    """Per span: the ``call`` number of the root module's (slot 0) call it belongs to,
    -1 when its outermost ancestor is not a root call (or it is a recompute span)."""
    from hooktrace.reading import CAT_RECOMPUTE

    anc = np.arange(len(spans))
    parent = spans.parent
    for _ in range(int(spans.depth.max(initial=0)) + 1):
        up = parent[anc]
        has = up >= 0
        if not has.any():
            break
        anc = np.where(has, up, anc)
    out = np.where(spans.module[anc] == 0, spans.call[anc].astype(np.int64), -1)
    out[spans.cat == CAT_RECOMPUTE] = -1
    return out


def flop_columns(info: Any, spans: Spans, modules: Sequence[tuple[str, str]],
                 peak_tflops: float | None) -> dict[str, dict[str, float | None]]:
    """Per module name: ``flops`` / ``bwd_flops`` (mean per call, all calls),
    ``tflops`` / ``bwd_tflops`` (over the calls not counted) and ``mfu``
    ((forward + backward FLOPs) / time / ``peak_tflops``)."""
    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD

    sigs, calls, counted = _parse(info)
    if not len(spans):
        return {}
    root_call = _root_call(spans)
    known = (root_call >= 0) & (root_call < len(calls))
    sig_of_call = np.asarray(calls, np.int64)
    measured_call = np.ones(len(calls), bool)
    measured_call[[c for c in counted if 0 <= c < len(calls)]] = False
    out: dict[str, dict[str, float | None]] = {}
    dur = spans.duration_ns
    for phase, cat, prefix in (("forward", CAT_FORWARD, ""), ("backward", CAT_BACKWARD, "bwd_")):
        sel = known & (spans.cat == cat)
        for m in np.unique(spans.module[sel]).tolist():
            name = modules[m][0] if m < len(modules) else f"<module {m}>"
            mine = sel & (spans.module == m)
            rc = root_call[mine]
            # FLOPs of one root call, per root call this module ran in
            per_root = np.array([s[phase].get(name, 0) for s in sigs], np.float64)
            roots = np.unique(rc)
            flops_all = float(per_root[sig_of_call[roots]].sum())
            measured_roots = roots[measured_call[roots]]
            flops_measured = float(per_root[sig_of_call[measured_roots]].sum())
            time_measured = float(dur[mine][measured_call[rc]].sum())
            row = out.setdefault(name, {})
            row[f"{prefix}flops"] = flops_all / int(mine.sum())
            row[f"{prefix}tflops"] = (flops_measured / time_measured / 1e3
                                      if time_measured > 0 and flops_measured > 0 else None)
            row[f"_{prefix}fl"] = flops_measured
            row[f"_{prefix}ns"] = time_measured
    for row in out.values():
        fl = row.pop("_fl", 0.0) or 0.0
        bfl = row.pop("_bwd_fl", 0.0) or 0.0
        ns = (row.pop("_ns", 0.0) or 0.0) + (row.pop("_bwd_ns", 0.0) or 0.0)
        row["mfu"] = ((fl + bfl) / ns / 1e3 / peak_tflops
                      if peak_tflops and ns > 0 and fl + bfl > 0 else None)
    return out
