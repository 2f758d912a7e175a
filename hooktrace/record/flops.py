"""FLOPs per module, the recording half (issue #27: one component per feature):
:class:`FlopRecorder` counts FLOPs with torch's ``FlopCounterMode`` on the root's first
call of each input signature, and :class:`FlopsComponent` plugs it into a recording
(``trace(model, flops=True)``). What the counts mean and how they are read:
:mod:`hooktrace.analysis.flops` (the analysis half)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hooktrace.record.component import Component, Option

if TYPE_CHECKING:
    from torch import nn

__all__ = ["FlopRecorder", "FlopsComponent"]


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

    def close(self) -> None:
        counter = self._counter
        if counter is None:
            return
        self._counter = None
        counter.__exit__(None, None, None)
        total = _totals(counter.get_flop_counts())
        forward, self._forward = self._forward, {}
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

    def to_info(self, first_call: int = 0) -> dict[str, Any]:
        """``info["flops"]`` of the root calls from ``first_call`` on (a schedule
        window's: its spans number them from 0), as copies."""
        return {"signatures": [{p: dict(s[p]) for p in s} for s in self.signatures],
                "calls": self.calls[first_call:],
                "counted": [c - first_call for c in self.counted if c >= first_call]}


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



class FlopsComponent(Component):
    """``flops=True``: a :class:`FlopRecorder` on the scope's root (in a process scope,
    the first top-level module called); ``info["flops"]`` (and ``device_name``)."""

    OPTIONS = (
        Option("flops", False, "also count FLOPs per module call (as trace(model, "
               "flops=True)): hooktrace summary --flops shows them", cli="switch"),
    )

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self.flop_recorder: FlopRecorder | None = None
        self._window_start = 0  # the root calls before this window

    def install(self, session: Any, scope: Any) -> None:
        root = scope.flops_root()
        if root is not None:
            self.flop_recorder = FlopRecorder(root)
            self.flop_recorder.start()
        elif scope.kind == "process":
            # FLOPs are counted from the first top-level module, once it is called.
            recorder = self.recorder

            def first_root(module: nn.Module) -> None:
                if self.flop_recorder is None and recorder.recording:
                    self.flop_recorder = FlopRecorder(module)
                    self.flop_recorder.start()

            scope.on_new_root = first_root

    def before_step(self) -> None:
        if self.flop_recorder is not None:
            self.flop_recorder.close()  # FlopCounterMode's slow dispatch ends here

    def window_opened(self) -> None:
        if self.flop_recorder is not None:
            self._window_start = len(self.flop_recorder.calls)

    def window_info(self, info: dict[str, Any]) -> None:
        if self.flop_recorder is not None:
            # A window's spans number its root calls from 0: its FLOP calls likewise
            info["flops"] = self.flop_recorder.to_info(first_call=self._window_start)

    def flush(self) -> None:
        if self.flop_recorder is not None:
            self.flop_recorder.stop()  # idempotent

    def metadata(self, info: dict[str, Any]) -> None:
        if self.flop_recorder is not None:
            import torch

            info["flops"] = self.flop_recorder.to_info()
            if torch.cuda.is_available():
                info["device_name"] = torch.cuda.get_device_name()
