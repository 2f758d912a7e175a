"""What a recording covers: the given models, or every module in the process.

Both scopes register modules with the one ``_C.ModuleCall`` (record/dispatch.py)
and name them; the recorder is the same for both (record/recorder.py).

:class:`ModelScope` (``hooktrace.trace(model)``): the modules of
``model.named_modules()``, named as there, registered when the block starts. A
module is claimed by one model scope at a time.

:class:`ProcessScope` (``hooktrace run``, ``HOOKTRACE=1``, ``global_trace()``):
every module called while it records, named lazily on its first call (issue
#10). Names are qualified under the *top-level* module, the outermost module
called (not called from inside another module's call). The *main* model's
names are exactly ``named_modules()``'s: the first top-level module with
submodules and trainable parameters called with grad enabled (so not a teacher
run under ``no_grad``, nor a loss), else the first with submodules, else the only
one. Every other top-level module (a loss, a teacher) is prefixed with its
class, ``CrossEntropyLoss``, ``Teacher.encoder.0``, a second live top-level
module of the same class being ``Teacher#2``. A module first called inside another's call but not found
among its children (created in ``forward``, or held elsewhere) is named
``parent.(Class)``. A module that dies keeps its row, and a new module with the
same name, class and top-level module reuses it (a model rebuilt each epoch
stays one row).

Streaming (``out=``, ``hooktrace run``): ``on_modules`` hands each new slot's name to
the stream writer before the slot is registered (so before any of its calls is
recorded), and restates every name when the main model changes (a teacher called first
loses its unprefixed names to the student).
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, NamedTuple

import torch
from torch import nn

__all__ = ["ModelScope", "ProcessScope", "Scope"]

# module -> (the scope recording it, its qualified name there, that model's class);
# weak so tracing never keeps a model alive.
_claimed_lock = threading.Lock()
_claimed: weakref.WeakKeyDictionary[nn.Module, tuple[Any, str, str]] = weakref.WeakKeyDictionary()

_WRAPPED_CALL_CODE = nn.Module._wrapped_call_impl.__code__
_CALL_IMPL_CODE = nn.Module._call_impl.__code__


class Scope:
    """The interface the recorder uses."""

    kind: str  # "model" or "process", recorded as info["scope"]

    def check(self) -> None:
        """Before anything is touched: raise if the scope cannot record now."""

    def attach(self, call: Any, session: Any) -> None:
        """Register the modules with ``call`` (a _C.ModuleCall) into ``session``."""
        raise NotImplementedError

    def detach(self, call: Any, session: Any) -> None:
        """Undo :meth:`attach` (idempotent)."""
        raise NotImplementedError

    def modules_table(self) -> list[tuple[str, str]]:
        """(qualified name, class name) per slot."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {}

    def flops_root(self) -> nn.Module | None:
        """The module whose calls FLOP counting starts from (None: not known yet)."""
        return None


class ModelScope(Scope):
    kind = "model"

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"hooktrace.trace expects a torch.nn.Module, got {type(model).__name__}")
        self._model_ref = weakref.ref(model)
        self._root = type(model).__name__
        self._members: list[tuple[int, weakref.ref[nn.Module]]] = []
        self._table: list[tuple[str, str]] = []
        self._refs: list[weakref.ref[nn.Module]] = []

    def model_or_none(self) -> nn.Module | None:
        """The traced model, or None once it was deleted."""
        return self._model_ref()

    def model(self) -> nn.Module:
        model = self._model_ref()
        if model is None:
            raise RuntimeError("the traced model no longer exists")
        return model

    def check(self) -> None:
        model = self.model()
        named = _named_modules(model)
        with _claimed_lock:
            for row in named:
                for m in row.members:
                    if m in _claimed:
                        _, owner_name, owner_type = _claimed[m]
                        where = f"module {owner_name!r} of " if owner_name else ""
                        what = f"its submodule {row.name!r}" if row.name else type(model).__name__
                        raise RuntimeError(
                            f"hooktrace: {type(model).__name__} is already being traced: {what} "
                            f"is {where}the {owner_type} instrumented by another active "
                            "hooktrace.trace(); exit that trace first")
            for row in named:
                for m in row.members:
                    _claimed[m] = (self, row.name, type(model).__name__)
        self._table = [(row.name, row.cls) for row in named]
        members = [(slot, m) for slot, row in enumerate(named) for m in row.members]
        # A module torch.compile() wrapped before now (outside the model) runs through
        # its wrapper, which calls the module's code directly: record the wrapper's call.
        wrappers = _compiled_wrappers({m for _, m in members})
        members += [(slot, w) for slot, m in members for w in wrappers.get(m, ())]
        self._members = [(slot, weakref.ref(m)) for slot, m in members]
        # Regions compiled before now keep their code (no recompile), so their kernels
        # carry no marks: one span each. Those compiled from now on are marked.
        compiled = [self._table[slot][0] for slot, m in members
                    if (_is_compiled(m) or m in wrappers) and _has_compiled_code(m)]
        self._compiled_before = list(dict.fromkeys(compiled))
        if compiled:
            names = ", ".join(repr(n or "<root>") for n in self._compiled_before)
            warnings.warn(
                f"hooktrace: {names} compiled before the trace: recorded as one span each "
                "(the code is not recompiled); to see the modules inside, compile inside "
                "hooktrace.trace() or under hooktrace run", UserWarning, stacklevel=4)

    def info(self) -> dict[str, Any]:
        before = getattr(self, "_compiled_before", [])
        return {"compiled_before_trace": list(before)} if before else {}

    def emit_names(self) -> list[str]:
        # Qualified under the root's class: a bare "0" (a Sequential's child) says
        # nothing in the profiler's trace, "Sequential.0" does.
        return [f"{self._root}.{name}" if name else self._root for name, _ in self._table]

    def attach(self, call: Any, session: Any) -> None:
        self._attached: tuple[Any, Any] | None = (call, session)
        for slot, ref in self._members:
            m = ref()
            if m is None:
                continue
            # A module that dies while traced: its address may be reused by a new object.
            self._refs.append(weakref.ref(m, functools.partial(_forget, call, id(m))))
            call.register_model(m, session, slot)

    def adopt(self, wrapper: nn.Module, name: str) -> None:
        """``wrapper``, a torch.compile() wrapper made while recording, runs the module
        named ``name`` inside its compiled code: record its calls in that module's slot."""
        attached = getattr(self, "_attached", None)
        slot = next((i for i, (n, _) in enumerate(self._table) if n == name), -1)
        if attached is None or slot < 0:
            return
        call, session = attached
        self._refs.append(weakref.ref(wrapper, functools.partial(_forget, call, id(wrapper))))
        call.register_model(wrapper, session, slot)

    def detach(self, call: Any, session: Any) -> None:
        if getattr(self, "_attached", None) is not None:
            self._say_unrecorded()
        self._attached = None
        call.release(session)
        self._refs.clear()  # dropped without their callbacks running
        with _claimed_lock:
            for key, (owner, _, _) in list(_claimed.items()):
                if owner is self:
                    del _claimed[key]

    def modules_table(self) -> list[tuple[str, str]]:
        return list(self._table)

    def flops_root(self) -> nn.Module | None:
        return self._model_ref()

    def _say_unrecorded(self) -> None:
        """A warning naming the submodules added to the model inside the block: the
        modules are registered when it starts, so their calls went unrecorded and their
        time into their parent's self time (issue #35: it happened silently)."""
        model = self._model_ref()
        if model is None:
            return
        try:
            recorded = {id(m) for _, ref in self._members if (m := ref()) is not None}
            added = [row.name for row in _named_modules(model)
                     if not any(id(m) in recorded for m in row.members)]
        except Exception:  # (never the end of a teardown)
            return
        if added:
            names = ", ".join(repr(n) for n in added[:5]) + (
                f" and {len(added) - 5} more" if len(added) > 5 else "")
            warnings.warn(f"hooktrace: {names} added to the model inside the trace: not "
                          "recorded (their time is in their parent's self time); add "
                          "submodules before hooktrace.trace() starts", UserWarning,
                          stacklevel=2)


class ProcessScope(Scope):
    kind = "process"

    def __init__(self) -> None:
        # The module table, grown by _resolve: per slot (top-level index, name under
        # it, class name); the top-level modules' class-based names and weak refs.
        self._slots: list[tuple[int, str, str]] = []
        self._slot_of: dict[tuple[int, str, str], int] = {}
        self._roots: list[str] = []
        self._root_refs: list[weakref.ref[nn.Module]] = []
        # per top-level module: (has submodules, trainable and first called with grad)
        self._root_traits: list[tuple[bool, bool]] = []
        self._refs: dict[int, weakref.ref[nn.Module]] = {}
        self._skipped: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # call.skip()ped
        self._lock = threading.Lock()
        self._call: Any = None
        self._session: Any = None
        self._call_codes: frozenset[CodeType] = frozenset({_WRAPPED_CALL_CODE, _CALL_IMPL_CODE})
        self._recording = False
        # Called with each new slot's emitted name (emit_profiler), and with each new
        # top-level module (FLOP counting starts from the first).
        self.on_new_slot: Callable[[int, str], None] | None = None
        self.on_new_root: Callable[[nn.Module], None] | None = None
        # Called with (first, entries) whenever modules_table() grows or earlier names
        # change (the stream's MODULES blocks): a new slot's entry before the slot is
        # registered, so before any of its calls is recorded.
        self.on_modules: Callable[[int, list[tuple[str, str]]], None] | None = None

    def attach(self, call: Any, session: Any) -> None:
        self._call, self._session = call, session
        # the frames that mark an open module call, for _resolve: _C.ModuleCall runs
        # _call_impl itself (or, for a class it cannot, the wrapped __call__)
        self._call_codes = frozenset({
            getattr(call.__wrapped__, "__code__", _WRAPPED_CALL_CODE),
            getattr(getattr(nn.Module, "_call_impl", None), "__code__", _CALL_IMPL_CODE)})
        self._recording = True
        call.set_global(session, self._resolve)

    def detach(self, call: Any, session: Any) -> None:
        self._recording = False
        if self._call is not None:
            call.clear_global()
        self._refs.clear()
        self._call = None

    def info(self) -> dict[str, Any]:
        main = self._main_root()
        return {"top_level_modules": list(self._roots),
                "main_module": self._roots[main] if main is not None else None}

    def _main_root(self) -> int | None:
        """The top-level module named without a prefix (see the module docstring)."""
        if len(self._roots) == 1:
            return 0
        for wanted in ((True, True), (True, False)):
            for i, traits in enumerate(self._root_traits):
                if traits[0] and (traits[1] or not wanted[1]):
                    return i
        return None

    def flops_root(self) -> nn.Module | None:
        return self._root_refs[0]() if self._root_refs else None

    # -- the rare path: a module's first call -------------------------------------

    def _resolve(self, module: Any) -> int:
        """Called by _C.ModuleCall for an instance it has no slot for; returns its slot.

        Registers the module (and its unregistered submodules) so that its next
        calls never come here.
        """
        if not isinstance(module, nn.Module) or not self._recording:
            return -1
        call = self._call
        open_modules = _open_modules(sys._getframe(1), self._call_codes)
        with self._lock:
            slot = call.lookup(module)  # another thread may have registered it
            if slot >= 0:
                return int(slot)
            outer = next((m for m in open_modules if m not in self._skipped), None)
            if outer is not None and outer is not module and call.lookup(outer) < 0:
                # The outermost open call began before recording did (hooktrace attach
                # lands mid-step, a recording begun inside a forward): name its tree
                # first, so its modules keep named_modules()' names (not "Linear#2").
                self._top_level(outer, sys._getframe(1))
                slot = call.lookup(module)
                if slot >= 0:
                    return int(slot)
            # Usually the innermost open call is the module's parent: look at the direct
            # children of the open modules, innermost first (a full search of a large
            # model on every call of a module made in forward would not be rare).
            for parent in reversed(open_modules):
                pslot = call.lookup(parent)
                if pslot < 0:
                    continue
                root, prefix, _ = self._slots[pslot]
                for name, child in vars(parent).get("_modules", {}).items():
                    if child is module:
                        return self._register_tree(module, root, _join(prefix, name))
            if open_modules:
                pslot = call.lookup(open_modules[-1])
                if pslot >= 0:
                    root, prefix, _ = self._slots[pslot]
                    return self._register_tree(
                        module, root, _join(prefix, f"({type(module).__name__})"))
                return self._register_tree(module, self._new_root(module), "")
            return self._top_level(module, sys._getframe(1))

    def _top_level(self, module: nn.Module, frame: FrameType | None) -> int:
        """Registers a module called outside every module call: in the tree of a
        method's ``self`` that holds it (_by_owner), else as a new top-level module."""
        owned = self._by_owner(module, frame)
        if owned is not None:
            return owned
        return self._register_tree(module, self._new_root(module), "")

    def _by_owner(self, module: nn.Module, frame: FrameType | None) -> int | None:
        """A module called outside every module call, by a method of a module that holds
        it (a LightningModule's ``training_step`` calling ``self.encoder(x)``, issue #38:
        rows read ``0``, ``Sequential#2.2``): named in the tree of the outermost such
        ``self`` on the stack, as ``named_modules()`` of it names it. None when no frame's
        ``self`` holds it."""
        owner: nn.Module | None = None
        path = ""
        for _ in range(_OWNER_FRAMES):
            if frame is None:
                break
            code = frame.f_code
            # only methods' frames: reading f_locals keeps a snapshot of a frame's locals
            # alive in it, and a script's own frames (its model, its recorder, its
            # tensors) must not be held by hooktrace (test_a_dropped_recorder_is_freed)
            if code not in self._call_codes and code.co_argcount \
                    and code.co_varnames[0] == "self":
                candidate = frame.f_locals.get("self")
                if isinstance(candidate, nn.Module) and candidate is not module:
                    found = _path_in(candidate, module)
                    if found is not None:
                        owner, path = candidate, found
            frame = frame.f_back
        if owner is None:
            return None
        call = self._call
        oslot = call.lookup(owner)
        if oslot >= 0:  # the owner is known (called before): under its name
            root, prefix, _ = self._slots[oslot]
            return self._register_tree(module, root, _join(prefix, path))
        self._register_tree(owner, self._new_root(owner), "")
        slot = call.lookup(module)
        return int(slot) if slot >= 0 else None

    def _new_root(self, module: nn.Module) -> int:
        """The top-level index for a new top-level module: its class name, or the first
        ``Class#k`` whose previous module is gone (so rebuilding a model reuses its rows)."""
        optimized = _optimized_module_type()
        named: nn.Module = (module._orig_mod  # type: ignore[assignment]
                            if optimized and isinstance(module, optimized) else module)
        base = type(named).__name__
        k = 1
        while True:
            name = base if k == 1 else f"{base}#{k}"
            try:
                index = self._roots.index(name)
            except ValueError:
                main = self._main_root()
                self._roots.append(name)
                self._root_refs.append(weakref.ref(module))
                self._root_traits.append(_root_traits(named))
                if self.on_modules is not None and self._slots and self._main_root() != main:
                    # the main model changed: the names of the slots so far change
                    self.on_modules(0, self.modules_table())
                if self.on_new_root is not None:
                    self.on_new_root(module)
                return len(self._roots) - 1
            if self._root_refs[index]() is None:
                self._root_refs[index] = weakref.ref(module)
                return index
            k += 1

    def _register_tree(self, module: nn.Module, root: int, prefix: str) -> int:
        """Slots for ``module`` and its submodules not registered yet; returns the module's
        (-1 for a torch.compile() wrapper whose module's call is the span)."""
        call = self._call
        mine = -1
        for row in _named_modules(module):
            for m in row.skipped:
                call.skip(m)
                self._skipped.add(m)
            if row.members[0] is not module and call.lookup(row.members[0]) >= 0:
                continue  # already known (shared, or registered under another name)
            key = (root, _join(prefix, row.name), row.cls)
            slot = self._slot_of.get(key)
            if slot is None:
                slot = self._slot_of[key] = len(self._slots)
                self._slots.append(key)
                if self.on_new_slot is not None:
                    self.on_new_slot(slot, self._qualified(root, key[1]))
                if self.on_modules is not None:
                    self.on_modules(slot, [(self._qualified(root, key[1]), row.cls)])
            for m in row.members:
                try:
                    ref = weakref.ref(m, functools.partial(_forget, call, id(m)))
                except TypeError:  # no weak references: cannot know when it dies, so no cache
                    if m is module:
                        return slot
                    continue
                self._refs[id(m)] = ref
                call.register(m, slot)
                if m is module:
                    mine = slot
        return mine

    def modules_table(self) -> list[tuple[str, str]]:
        """(qualified name, class name) per slot, named as the module docstring says."""
        main = self._main_root()
        return [(rel if root == main else _join(self._roots[root], rel), typ)
                for root, rel, typ in self._slots]

    def _qualified(self, root: int, rel: str) -> str:
        return rel if root == self._main_root() else _join(self._roots[root], rel)


def _root_traits(module: nn.Module) -> tuple[bool, bool]:
    """(has submodules, has trainable parameters and is called with grad enabled)."""
    children = bool(vars(module).get("_modules"))
    try:
        trainable = torch.is_grad_enabled() and any(
            p.requires_grad for p in module.parameters())
    except Exception:  # a module whose parameters() fails: named, not chosen
        trainable = False
    return children, trainable


def _optimized_module_type() -> type | None:
    # No import: importing torch._dynamo takes ~1.5 s; an OptimizedModule exists only
    # once it was imported.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def _is_compiled(m: nn.Module) -> bool:
    """A torch.compile() wrapper, or a module whose ``.compile()`` was called."""
    optimized = _optimized_module_type()
    return (optimized is not None and isinstance(m, optimized)) or \
        m.__dict__.get("_compiled_call_impl") is not None


def _has_compiled_code(m: nn.Module) -> bool:
    """Whether Dynamo already compiled the forward of ``m`` (or of the module a
    torch.compile() wrapper wraps): its code object has cache entries."""
    inner = m.__dict__.get("_modules", {}).get("_orig_mod", m)
    codes = [getattr(getattr(type(inner), "forward", None), "__code__", None)]
    # torch.compile() of a torch.nn class compiles the frame its wrapper calls
    frame = getattr(m.__dict__.get("forward"), "_torchdynamo_orig_callable", None)
    codes.append(getattr(frame, "__code__", None))
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
        return any(code is not None and len(_debug_get_cache_entry_list(code)) > 0
                   for code in codes)
    except Exception:  # an API this torch lacks: say so, as if compiled
        return True


def _calls_through(wrapper: nn.Module, call_type: type) -> bool:
    """Whether a torch.compile() wrapper calls its module through ``nn.Module.__call__``
    as it was when it was made being ``call_type`` (it was made while recording)."""
    forward = wrapper.__dict__.get("_forward", wrapper.__dict__.get("forward"))
    inner = getattr(forward, "_torchdynamo_orig_callable", None)
    return isinstance(getattr(inner, "__func__", None), call_type)


class Named(NamedTuple):
    """One row of the module table and the objects whose calls it records."""

    name: str
    cls: str
    members: list[nn.Module]  # the module; with a torch.compile() wrapper, that too
    skipped: list[nn.Module]  # a wrapper made while recording: its module's call is the span


def _named_modules(model: nn.Module) -> list[Named]:
    """``named_modules()`` with torch.compile()'s wrappers transparent: an
    ``OptimizedModule`` and the module it wraps are one row, named and classed as the
    module, and the ``_orig_mod`` component is dropped from every name below it.

    Which of the two records the span: a wrapper made before recording calls its
    module's code directly (it holds the original ``nn.Module.__call__``), so its own
    call is recorded; one made while recording calls the module through the recorder,
    so the module's call is, and the wrapper's is skipped (else one call would be two
    nested spans)."""
    import hooktrace._C as _C

    optimized = _optimized_module_type()
    out: list[Named] = []
    seen: set[int] = set()

    def walk(m: nn.Module, name: str) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        if optimized is not None and isinstance(m, optimized):
            inner: nn.Module = m._orig_mod  # type: ignore[assignment]
            seen.add(id(inner))
            if _calls_through(m, _C.ModuleCall):
                out.append(Named(name, type(inner).__name__, [inner], [m]))
            else:
                out.append(Named(name, type(inner).__name__, [m, inner], []))
            m = inner
        else:
            out.append(Named(name, type(m).__name__, [m], []))
        # vars(): a module whose nn.Module.__init__ never ran has no _modules (it is
        # recorded as a leaf; its call fails as it would untraced)
        for child_name, child in vars(m).get("_modules", {}).items():
            if child is not None:
                walk(child, f"{name}.{child_name}" if name else child_name)

    walk(model, "")
    return out


# Every torch.compile() wrapper (OptimizedModule) made in this process, held weakly:
# record/dispatch.py hooks OptimizedModule.__init__ as soon as Dynamo is imported (or
# when it is first imported, if it already was), so trace() finds the wrappers of its
# modules in O(wrappers), not by walking the heap (issue #31: 73 ms on a GPT-2 process).
_wrappers_lock = threading.Lock()
_wrappers: weakref.WeakSet[nn.Module] = weakref.WeakSet()
# False while a wrapper made before the hook may exist (torch.compile() ran before
# hooktrace was imported): the first trace() then walks the heap once, and never again.
_wrappers_complete = [False]


def note_wrapper(wrapper: nn.Module) -> None:
    """A torch.compile() wrapper was just made (record/dispatch.py's hook)."""
    with _wrappers_lock:
        _wrappers.add(wrapper)


def wrappers_watched(complete: bool) -> None:
    """The hook is in place; ``complete``: no wrapper can have been made before it
    (Dynamo had compiled nothing yet: its backend cache was empty)."""
    with _wrappers_lock:
        if complete:
            _wrappers_complete[0] = True


def _compiled_wrappers(modules: set[nn.Module]) -> dict[nn.Module, list[nn.Module]]:
    """The torch.compile() wrappers (made before now, outside any recording) of these
    modules, from the registry the OptimizedModule hook fills. Only when torch.compile()
    ran before hooktrace could watch it is the heap walked (~0.1 s per 400k objects),
    once per process."""
    optimized = _optimized_module_type()
    if optimized is None:
        return {}
    import hooktrace._C as _C

    # (the hook is in place since record/dispatch.py was imported, with the recorder)
    with _wrappers_lock:
        if not _wrappers_complete[0]:
            for obj in gc.get_objects():
                if issubclass(type(obj), optimized):
                    _wrappers.add(obj)
            _wrappers_complete[0] = True
        wrappers = list(_wrappers)
    found: dict[nn.Module, list[nn.Module]] = {}
    for obj in wrappers:
        if not _calls_through(obj, _C.ModuleCall):
            inner = obj.__dict__.get("_modules", {}).get("_orig_mod")
            if inner in modules:
                found.setdefault(inner, []).append(obj)
    return found


def adopt_wrapper(wrapper: nn.Module) -> None:
    """A torch.compile() wrapper was just made while recording (record/dispatch.py). If
    it does not call its module through the recorder (a ``torch.nn`` class: the
    module's call is compiled in), a model scope tracing the module records the
    wrapper's calls as the module's. (A process scope finds such a wrapper on its
    first call: _named_modules.)"""
    import hooktrace._C as _C

    inner = wrapper.__dict__.get("_modules", {}).get("_orig_mod")
    if inner is None or _calls_through(wrapper, _C.ModuleCall):
        return
    with _claimed_lock:
        owner = _claimed.get(inner)
    if owner is not None and isinstance(owner[0], ModelScope):
        owner[0].adopt(wrapper, owner[1])


def _forget(call: Any, address: int, _ref: Any) -> None:
    """A weak reference's callback: the module at ``address`` died. Runs before its
    memory is freed, so no new module at the same address can be looked up in between."""
    call.forget(address)


def _open_modules(frame: FrameType | None, call_codes: frozenset[CodeType]) -> list[nn.Module]:
    """The modules whose calls are open on this thread, outermost first: the ``self`` of
    each running ``_call_impl`` or ``_wrapped_call_impl`` frame (once per call)."""
    found: list[nn.Module] = []
    while frame is not None:
        if frame.f_code in call_codes:
            m = frame.f_locals.get("self")
            if isinstance(m, nn.Module) and not (found and found[-1] is m):
                found.append(m)
        frame = frame.f_back
    found.reverse()
    return found


# Frames looked at for a module's owner on a top-level module's first call (a trainer's
# stack is ~20 deep from its fit() to training_step)
_OWNER_FRAMES = 64


def _path_in(owner: nn.Module, module: nn.Module) -> str | None:
    """``module``'s name in ``owner.named_modules()`` (its wrappers transparent), or None."""
    try:
        rows = _named_modules(owner)
    except Exception:  # a module whose tree cannot be walked: not an owner
        return None
    return next((row.name for row in rows if row.name and any(m is module for m in row.members)),
                None)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name
