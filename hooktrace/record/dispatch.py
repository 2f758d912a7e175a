"""The one place that replaces ``nn.Module.__call__`` (issue #16).

While any recorder is active (``hooktrace.trace()``, ``hooktrace run``,
``global_trace()``), ``nn.Module.__call__`` is one process-wide
``_C.ModuleCall`` (csrc/module_call.h): every module call reaches it, and it
records the calls of the modules that the active scopes registered. When the
last recorder ends, the class attribute is restored exactly.

torch.compile must not see it. Dynamo decides how to trace a module call by
comparing ``type(m).__call__`` with the ``nn.Module.__call__`` it saw when it was
imported (``torch/_dynamo/variables/nn_module.py``: ``mod.__call__.__func__ is
unpatched_nn_module_call``); anything else is traced as an opaque callable and
graph-breaks. So while Dynamo compiles (its compile-start/-end callbacks,
``torch/_dynamo/callback.py``) the original ``__call__`` is put back, and if
Dynamo is first imported while ours is in place, its saved "unpatched" value is
corrected to the original. Dynamo then traces exactly what it would untraced:
the same graphs, the same guards, no graph break, no extra recompile, and the
compiled code runs inside the span of the module whose call entered it.
Module calls made by other threads while a compile runs are not recorded (the
swap is process-wide). A compile that starts while a recorder is active also
marks the kernels it generates (record/kernels.py), so the reader can attribute
their time to the modules inside the region.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import time
import types
import warnings
from typing import Any

from torch import nn

import hooktrace._C as _C
from hooktrace.record import kernels

__all__ = ["acquire", "release", "installed"]

_lock = threading.RLock()
_call: Any = None  # the _C.ModuleCall, kept across recordings (compiled wrappers may hold it)
_original: Any = None  # the nn.Module.__call__ it replaced
_holders: set[int] = set()  # id() of each recorder holding it
_swapped = False  # a compile is running with the original put back


def installed() -> Any:
    """The ModuleCall in place as ``nn.Module.__call__``, or None."""
    return _call if _holders else None


def acquire(holder: object) -> Any:
    """Puts the ModuleCall in place (first holder) and returns it."""
    global _call, _original
    with _lock:
        if not _holders:
            current = nn.Module.__dict__["__call__"]
            if _call is None or _call.__wrapped__ is not current:
                _call = _C.ModuleCall(current)
            _original = current
            _watch_dynamo()
            nn.Module.__call__ = _call  # type: ignore[method-assign]
        _holders.add(id(holder))
        return _call


def release(holder: object) -> None:
    """``holder`` is done; the last one gone, the original ``nn.Module.__call__`` is
    back. Idempotent: a teardown step cut short by a Ctrl-C is simply run again."""
    with _lock:
        if id(holder) not in _holders:
            return
        _holders.discard(id(holder))
        if _holders:
            return
        current = nn.Module.__dict__.get("__call__")
        if current is _call or (_swapped and current is _original):
            nn.Module.__call__ = _original  # type: ignore[method-assign]
        else:
            warnings.warn(
                "hooktrace: nn.Module.__call__ was replaced by other code while recording; "
                "leaving the replacement in place (it calls the stopped recorder)",
                RuntimeWarning, stacklevel=3)


# -- torch.compile -------------------------------------------------------------------

_dynamo_hooked = False


# Compiles seen while recording (issue #26): [start Unix ns, end Unix ns, OS thread id,
# what compiled ("dynamo", "lazy_backward"...)], outermost only, for info["compiles"]
# (summary: compile steps, the <torch.compile> row). Python, at compile start/end only.
_compiles: list[list[Any]] = []
_compile_open: list[Any] = []  # the outermost compile running now, and its depth


def compiles_since(start_unix_ns: int) -> list[list[Any]]:
    """The compiles that ended at or after ``start_unix_ns`` (a recording's start)."""
    with _lock:
        return [list(c) for c in _compiles if c[1] >= start_unix_ns]


def _trigger(args: Any) -> str:
    trigger = getattr(args, "callback_trigger", None)
    return str(getattr(trigger, "name", trigger or "dynamo")).lower()


def _on_compile_start(args: Any = None) -> None:
    # (args: Dynamo's CallbackArgs; torch 2.5's callback handler passes none)
    global _swapped
    _C.set_compiling(True)  # AOTAutograd's fake backward is not the program's
    with _lock:
        if _compile_open:
            _compile_open[1] += 1
        elif _holders:
            _compile_open[:] = [[time.time_ns(), 0, threading.get_native_id(),
                                 _trigger(args)], 1]
        if _holders:
            kernels.compile_started()  # mark the kernels of what this compile makes
        if _holders and nn.Module.__dict__.get("__call__") is _call:
            nn.Module.__call__ = _original  # type: ignore[method-assign]
            _swapped = True


def _on_compile_end(_args: Any = None) -> None:
    global _swapped
    _C.set_compiling(False)
    kernels.compile_ended()
    with _lock:
        if _compile_open:
            _compile_open[1] -= 1
            if _compile_open[1] <= 0:
                done = _compile_open[0]
                done[1] = time.time_ns()
                _compiles.append(done)
                _compile_open.clear()
        if _swapped:
            _swapped = False
            if _holders and nn.Module.__dict__.get("__call__") is _original:
                nn.Module.__call__ = _call  # type: ignore[method-assign]


def _hook_dynamo() -> None:
    """Dynamo is imported: make sure our callbacks are registered, and that the
    ``__call__`` it takes for nn.Module's own is the original."""
    global _dynamo_hooked
    with _lock:
        utils = sys.modules.get("torch._dynamo.utils")
        nn_module = sys.modules.get("torch._dynamo.variables.nn_module")
        for mod in (utils, nn_module):
            saved = getattr(mod, "unpatched_nn_module_call", None)
            if isinstance(saved, _C.ModuleCall):
                mod.unpatched_nn_module_call = saved.__wrapped__  # type: ignore[union-attr]
        _hook_optimized_module()
        callback = sys.modules.get("torch._dynamo.callback")
        if callback is None:
            return
        handler = callback.callback_handler
        _register(handler)
        if not _dynamo_hooked:
            # torch._dynamo.reset() clears every callback (callback_handler.clear()):
            # a reset between two compiles inside one recording must not let the second
            # compile see our __call__ (7 graph breaks on a 3-block model).
            original_clear = handler.clear

            def clear() -> None:
                original_clear()
                _register(handler)

            handler.clear = clear
            _dynamo_hooked = True


_optimized_hooked = False


def _hook_optimized_module() -> None:
    """A ``torch.compile(module)`` wrapper made while recording is shown to the scopes.

    For a module of a ``torch.nn`` class (``nn.Sequential``...), the wrapper compiles a
    frame that calls the module (``external_utils.wrap_inline``): the module's own call
    is inside the compiled code and never reaches the recorder. The scope then records
    the wrapper's call as the module's (scopes.adopt_wrapper), as it does for a
    wrapper made before the trace. Costs nothing to a wrapper made while nothing
    records."""
    global _optimized_hooked
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if _optimized_hooked or optimized is None:
        return
    original_init = optimized.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        from hooktrace.record import scopes

        scopes.note_wrapper(self)  # a weak reference: trace() finds it without a heap walk
        if _holders:
            scopes.adopt_wrapper(self)

    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    optimized.__init__ = __init__
    _optimized_hooked = True
    from hooktrace.record import scopes

    # No torch.compile() yet, so no wrapper predates the hook: Dynamo's backend cache
    # holds no compiler (torch.compiler.disable, used at import by transformers, adds a
    # None). Not seen: a compile undone by torch._dynamo.reset() before now, whose
    # wrapper is then missed (its calls record nothing, as a wrapper's inner code).
    backends = getattr(eval_frame, "cached_backends", None)
    scopes.wrappers_watched(isinstance(backends, dict)
                            and all(b is None for b in backends.values()))


def _register(handler: Any) -> None:
    if _on_compile_start not in handler.start_callbacks:
        handler.register_start_callback(_on_compile_start)
    if _on_compile_end not in handler.end_callbacks:
        handler.register_end_callback(_on_compile_end)


class _DynamoImportWatcher(importlib.abc.MetaPathFinder):
    """Runs :func:`_hook_dynamo` right after ``torch._dynamo`` is imported. Importing
    it eagerly would cost every run ~1.5 s; this costs nothing until it happens."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch._dynamo":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader)
        return spec


class _HookedLoader(importlib.abc.Loader):
    """torch._dynamo's own loader, calling :func:`_hook_dynamo` once it has run; the
    module keeps its real loader."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        if _watcher in sys.meta_path:
            sys.meta_path.remove(_watcher)
        with _lock:
            if _holders:
                _hook_dynamo()
            else:  # nothing records: only the wrapper registry (the rest at acquire)
                _hook_optimized_module()


_watcher = _DynamoImportWatcher()


def watch_compiled_wrappers() -> None:
    """From now on every torch.compile() wrapper made is noted (scopes.note_wrapper):
    the OptimizedModule hook now if Dynamo is imported, else right after it is."""
    with _lock:
        if "torch._dynamo.eval_frame" in sys.modules:
            _hook_optimized_module()
        elif _watcher not in sys.meta_path:
            sys.meta_path.insert(0, _watcher)


def _watch_dynamo() -> None:
    if "torch._dynamo.callback" in sys.modules:  # also re-registers after a reset
        _hook_dynamo()
    elif _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)


# At import (the first trace() or global_trace()), so that wrappers made afterwards, even
# before the first recording, are in the registry.
watch_compiled_wrappers()
