"""Recording: the ``trace`` context manager that instruments a model.

Example::

    import torch, hooktrace
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.randn(2, 4))
    print(tr.summary())
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hooktrace import _C
from hooktrace._events import EVENT_DTYPE, Clock
from hooktrace.reading import TraceData

Mode = Literal["auto", "wrap", "hooks"]
Policy = Literal["drop", "ring"]

# 8 Mi events x 32 B = 256 MiB at most, allocated lazily 128 KiB at a time:
# ~40 training steps of a 100k-module-call model before anything is dropped.
DEFAULT_CAPACITY = 8 * 1024 * 1024

_traced_lock = threading.Lock()
# module -> (the Trace instrumenting it, its qualified name there, that model's class);
# weak so tracing never keeps a model alive.
_traced: weakref.WeakKeyDictionary[nn.Module, tuple[Trace, str, str]] = weakref.WeakKeyDictionary()


def _inert_hook(*args: Any, **kwargs: Any) -> None:
    """What a hook becomes in a deep copy or pickle of a module traced with hooks."""
    return None


@dataclass
class _Installed:
    """What was done to one module, so ``__exit__`` can undo exactly that."""

    module: weakref.ref[nn.Module]
    mechanism: Literal["wrap", "hooks"]
    wrapper: weakref.ref[Any] | None = None
    attr: str = "forward"  # the instance attribute replaced by the wrapper
    # Whether the instance had its own `attr`; if so the wrapper wraps exactly it.
    had_own: bool = False
    handles: tuple[Any, ...] = ()


class Trace(TraceData):
    """A recording of one model's module calls; read it after the ``with`` block.

    Created by :func:`trace`. Inside the block every submodule's forward is
    recorded; on exit (exception or not) all instrumentation is removed and the
    events become readable with the :class:`~hooktrace.reading.TraceData`
    methods (``summary()``, ``export_chrome()``, ``save()``, ``spans()``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        mode: Mode = "auto",
        capacity: int = DEFAULT_CAPACITY,
        policy: Policy = "drop",
        backward: bool = True,
        emit_profiler: bool = False,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"hooktrace.trace expects a torch.nn.Module, got {type(model).__name__}")
        if mode not in ("auto", "wrap", "hooks"):
            raise ValueError(f"mode must be 'auto', 'wrap' or 'hooks', got {mode!r}")
        if policy not in ("drop", "ring"):
            raise ValueError(f"policy must be 'drop' or 'ring', got {policy!r}")
        if capacity <= 0:
            raise ValueError(f"capacity must be a positive number of events, got {capacity}")
        self._model_ref = weakref.ref(model)
        self._mode: Literal["wrap", "hooks"] = "hooks" if mode == "hooks" else "wrap"
        self._capacity = int(capacity)
        self._policy = policy
        self._backward = bool(backward)
        self._emit_profiler = bool(emit_profiler)
        self._session: Any = None
        self._installed: list[_Installed] = []
        self._state: Literal["new", "recording", "done"] = "new"

    # -- context manager ---------------------------------------------------

    def __enter__(self) -> Trace:
        if self._state != "new":
            raise RuntimeError("a hooktrace.Trace can be entered only once; call hooktrace.trace() again")
        model = self._model_ref()
        if model is None:
            raise RuntimeError("the traced model no longer exists")
        named, compiled = _instrumentable(model)
        if compiled:
            warnings.warn(
                "hooktrace: compiled with torch.compile: "
                + ", ".join(repr(n or type(model).__name__) for n in compiled)
                + "; each is recorded as one span and the modules inside compiled regions are "
                "not traced. Trace the uncompiled model for per-module spans.",
                UserWarning,
                stacklevel=2,
            )
        modules = [(name, type(m).__name__) for name, m in named]
        with _traced_lock:
            for name, m in named:
                if m in _traced:
                    _, owner_name, owner_type = _traced[m]
                    where = f"module {owner_name!r} of " if owner_name else ""
                    what = f"its submodule {name!r}" if name else type(model).__name__
                    raise RuntimeError(
                        f"hooktrace: {type(model).__name__} is already being traced: {what} is "
                        f"{where}the {owner_type} instrumented by another active "
                        "hooktrace.trace(); exit that trace first"
                    )
            for name, m in named:
                _traced[m] = (self, name, type(model).__name__)
        self._modules_table = modules
        self._start_unix_ns = time.time_ns()
        self._session = _C.Session(self._capacity, self._policy)
        if self._emit_profiler:
            # Qualified under the root's class: a bare "0" (a Sequential's child) says
            # nothing in the profiler's trace, "Sequential.0" does.
            root = type(model).__name__
            self._session.set_emit_names([f"{root}.{name}" if name else root
                                          for name, _ in modules])
        self._session.start()
        self._state = "recording"
        try:
            if self._backward:
                _C.add_backward_session(self._session)
            for slot, (_, m) in enumerate(named):
                self._installed.append(self._install(m, slot))
        except BaseException:
            self._finish()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish()

    # -- instrumentation ---------------------------------------------------

    def _install(self, m: nn.Module, slot: int) -> _Installed:
        # nn.Module.compile() routes calls through the instance's _compiled_call_impl,
        # whose compiled frame includes forward: wrap the entry point outside it.
        attr = "_compiled_call_impl" if _is_module_compiled(m) else "forward"
        if self._mode == "wrap" or attr != "forward":
            had_own = attr in m.__dict__
            wrapper = _C.ForwardWrapper(self._session, slot, getattr(m, attr))
            m.__dict__[attr] = wrapper
            return _Installed(
                weakref.ref(m), "wrap", wrapper=weakref.ref(wrapper), attr=attr, had_own=had_own
            )
        pre = m.register_forward_pre_hook(_C.ForwardPreHook(self._session, slot))
        post = m.register_forward_hook(
            _C.ForwardHook(self._session, slot), prepend=True, always_call=True
        )
        return _Installed(weakref.ref(m), "hooks", handles=(pre, post))

    def _uninstall(self, inst: _Installed) -> None:
        for h in inst.handles:
            h.remove()
        m = inst.module()
        if m is None or inst.mechanism != "wrap":
            return
        wrapper: Any = inst.wrapper() if inst.wrapper is not None else None
        if wrapper is None or m.__dict__.get(inst.attr) is not wrapper:
            # (a dead wrapper means the module's attribute no longer holds it)
            warnings.warn(
                f"hooktrace: {type(m).__name__}.{inst.attr} was replaced by other code while traced; "
                "leaving the replacement in place (it calls the inactive hooktrace wrapper)",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        if inst.had_own:  # the wrapper wraps exactly the instance's previous value
            m.__dict__[inst.attr] = getattr(wrapper, "__wrapped__")
        else:
            del m.__dict__[inst.attr]

    def _finish(self) -> None:
        if self._state != "recording":
            return
        self._state = "done"
        session = self._session
        session.stop()
        if self._backward:
            _C.remove_backward_session(session)
        errors: list[BaseException] = []
        for inst in reversed(self._installed):
            try:
                self._uninstall(inst)
            except Exception as e:  # keep undoing the rest; report after
                errors.append(e)
        self._installed.clear()
        with _traced_lock:
            for key, (owner, _, _) in list(_traced.items()):
                if owner is self:
                    del _traced[key]
        events, clock, info = self._collect(session, stop_unix_ns=time.time_ns())
        self._session = None  # frees the chunks once no wrapper is referenced
        TraceData.__init__(self, events, self._modules_table, _C.node_names(), clock, info)
        if errors:
            raise RuntimeError(f"hooktrace: failed to remove instrumentation: {errors[0]!r}") from errors[0]

    def _collect(self, session: Any, stop_unix_ns: int) -> tuple[np.ndarray, Clock, dict[str, Any]]:
        """The session's events so far, its clock, and the run's metadata."""
        stats = session.stats()
        events = np.empty(stats["events"], dtype=EVENT_DTYPE)
        events = events[: session.copy_events(events)]
        ticks0, unix_ns0, ns_per_tick = session.clock()
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "torch_version": torch.__version__,
            "hooktrace_version": _version(),
            "mode": self._mode,
            "backward": self._backward,
            "emit_profiler": self._emit_profiler,
            "policy": self._policy,
            "capacity": int(session.capacity),
            "dropped_events": int(stats["dropped"]),
            "overwritten_events": int(stats["overwritten"]),
            "start_unix_ns": self._start_unix_ns,
            "stop_unix_ns": stop_unix_ns,
            "thread_names": {str(t.native_id): t.name for t in threading.enumerate()},
        }
        return events, Clock(int(ticks0), int(unix_ns0), float(ns_per_tick)), info

    def snapshot(self) -> TraceData:
        """The events recorded so far, readable while recording goes on.

        A copy: recording continues into the trace unchanged. Spans still open
        now are marked unfinished in it. After the block, the trace itself.

        Example::

            with hooktrace.trace(model) as tr:
                model(x)
                print(tr.snapshot().summary())
        """
        if self._state == "done":
            return self
        if self._state != "recording":
            raise RuntimeError("hooktrace: this trace has not started; enter its with block first")
        events, clock, info = self._collect(self._session, stop_unix_ns=time.time_ns())
        return TraceData(events, self._modules_table, _C.node_names(), clock, info)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set yet: the data attributes that
        # TraceData.__init__ sets when the block exits.
        if name in _DATA_ATTRS:
            state = self.__dict__.get("_state", "new")
            raise RuntimeError(
                f"hooktrace: the trace is {'still recording' if state == 'recording' else 'not started'}"
                f" ({name} is not available yet): read it after the with block, or use "
                "trace.snapshot() for the events so far")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        state = self.__dict__.get("_state", "new")
        if state == "done":
            return TraceData.__repr__(self)
        model = self._model_ref()
        what = type(model).__name__ if model is not None else "a deleted model"
        return f"<Trace of {what}: {'recording' if state == 'recording' else 'not started'}>"


# What TraceData.__init__ sets: read before the block ends, they raise one clear error.
_DATA_ATTRS = frozenset({"events", "modules", "node_names", "clock", "info", "_spans"})


def _is_module_compiled(m: nn.Module) -> bool:
    return m.__dict__.get("_compiled_call_impl") is not None


def _is_compiled(m: nn.Module) -> bool:
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(m, OptimizedModule) or _is_module_compiled(m)


def _instrumentable(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[str]]:
    """The modules to instrument, and the compiled ones among them.

    Dynamo cannot trace into compiled callables: instrumenting a module inside a
    compiled region would graph-break there. A compiled module is instrumented at
    its boundary only and its descendants are left alone.
    """
    named: list[tuple[str, nn.Module]] = []
    compiled: list[str] = []
    for name, m in model.named_modules():
        if any(name.startswith(c + ".") or (c == "" and name) for c in compiled):
            continue
        named.append((name, m))
        if _is_compiled(m):
            compiled.append(name)
    return named, compiled


def _version() -> str:
    from hooktrace import __version__

    return __version__


def trace(
    model: nn.Module,
    *,
    mode: Mode = "auto",
    capacity: int = DEFAULT_CAPACITY,
    policy: Policy = "drop",
    backward: bool = True,
    emit_profiler: bool = False,
) -> Trace:
    """Trace every submodule's forward calls of ``model`` inside a ``with`` block.

    Args:
        model: the root module; every module of ``model.named_modules()`` is traced.
        mode: ``"wrap"`` replaces each instance's ``forward`` with a transparent compiled
            wrapper (the fastest; ``"auto"`` picks it); ``"hooks"`` registers compiled
            forward pre/post hooks instead.
        capacity: maximum number of events held (32 bytes each).
        policy: when full, ``"drop"`` keeps the oldest events and counts the rest as
            dropped; ``"ring"`` keeps the newest (flight recorder) and counts the
            overwritten ones.
        backward: also record autograd nodes, which the reader turns into
            per-module backward spans (``"cat": "backward"``).
        emit_profiler: also open a ``torch.profiler`` user-scope range per module call
            (from C++), so module names show in the profiler's own trace, TensorBoard
            and HTA. Costs nothing measurable while no profiler runs.

    Example::

        with hooktrace.trace(model) as tr:
            model(x)
        tr.export_chrome("trace.json")
    """
    return Trace(
        model,
        mode=mode,
        capacity=capacity,
        policy=policy,
        backward=backward,
        emit_profiler=emit_profiler,
    )
