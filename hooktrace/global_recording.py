"""Global recording: every ``nn.Module`` call in the process, for ``hooktrace run``.

Example::

    import torch, hooktrace
    with hooktrace.global_trace() as tr:      # no model to name: all of them
        student, teacher = Net(), Net()
        (student(x) - teacher(x)).pow(2).sum().backward()
    print(tr.summary())                        # rows "Net.fc", "Net#2.fc", ...

How (issue #10): ``nn.Module.__call__`` is replaced for the duration by one
compiled callable (``_C.GlobalCall``, csrc/global_forward.h) that records the
call and calls the original. A module's first call takes a rare path into
:meth:`GlobalTrace._resolve`, which gives it (and its whole subtree) slots and
names; later calls are a table lookup in C++. Costs are in benchmarks/RESULTS.md.

Names: qualified names under the *top-level* module, the outermost module called
(not called from inside another module's call). With one top-level module they
are exactly ``named_modules()``'s; with several (a model and its loss, a teacher
and a student) each is prefixed with its top-level module's class, ``Student.encoder.0``,
a second live top-level module of the same class being ``Student#2``. A module
first called inside another's call but not found among its children (created in
``forward``, or held elsewhere) is named ``parent.(Class)``. The table grows as
modules appear and is written at the end; a module that dies keeps its row, and a
new module with the same name, class and top-level module reuses it (a model
rebuilt each epoch stays one row).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import threading
import time
import warnings
import weakref
from types import CodeType, FrameType, TracebackType
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hooktrace import _C
from hooktrace._events import EVENT_DTYPE, Clock
from hooktrace._windows import StepMarks
from hooktrace.distributed import rank_info
from hooktrace.flight import FlightRecorder
from hooktrace.reading import TraceData
from hooktrace.recording import DEFAULT_CAPACITY, Policy, _check_capacity, _SigintDeferred, _version

__all__ = ["GlobalTrace", "global_trace"]

_WRAPPED_CALL_CODE = nn.Module._wrapped_call_impl.__code__

# The one global recording of this process (nn.Module.__call__ can be replaced once).
_active_lock = threading.Lock()
_active: GlobalTrace | None = None


class GlobalTrace(StepMarks, FlightRecorder, TraceData):
    """``hooktrace.global_trace()``: record every module call in the process in a ``with`` block.

    Modules created inside the block (and in functions, threads, libraries) are
    recorded from their first call; nothing has to be passed in. On exit the class
    attribute is restored exactly and the trace is readable like
    ``hooktrace.trace``'s (``summary()``, ``save()``, ``export_chrome()``).
    One at a time per process.

    Args:
        capacity, policy, backward, steps, dump_on, dump_dir, hang_timeout, dump_signal,
            schedule, on_window: as for :class:`hooktrace.Trace` (the flight recorder:
            ``policy="ring"`` with ``dump_on=("exception", "signal", "hang")``; windows:
            ``schedule=torch.profiler.schedule(...)``).

    Example::

        with hooktrace.global_trace(backward=False) as tr:
            model(x)
        tr.save("run.htrace")
    """

    def __init__(
        self,
        *,
        capacity: int = DEFAULT_CAPACITY,
        policy: Policy = "drop",
        backward: bool = True,
        steps: Literal["optimizer"] | None = "optimizer",
        dump_on: str | Sequence[str] | None = None,
        dump_dir: str | os.PathLike[str] = "hooktrace-dumps",
        hang_timeout: float = 300.0,
        dump_signal: int = signal.SIGUSR1,
        schedule: Callable[[int], Any] | None = None,
        on_window: Callable[[TraceData], Any] | None = None,
        memory: bool = False,
    ) -> None:
        if not isinstance(policy, str) or policy not in ("drop", "ring"):
            raise ValueError(f"policy must be 'drop' or 'ring'; got {policy!r}")
        if not isinstance(backward, (bool, np.bool_)):
            raise TypeError(f"backward must be True or False, got {type(backward).__name__} {backward!r}")
        self._init_steps(steps)
        self._capacity = _check_capacity(capacity)
        self._init_flight_recorder(dump_on, dump_dir, hang_timeout, dump_signal)
        self._init_windows(schedule, on_window, policy)
        self._policy: Policy = policy
        self._backward = bool(backward)
        if not isinstance(memory, (bool, np.bool_)):
            raise TypeError(f"memory must be True or False, got {type(memory).__name__} {memory!r}")
        self._memory = bool(memory)
        self._memory_info: dict[str, Any] | None = None
        self._session: Any = None
        self._call: Any = None  # the _C.GlobalCall installed as nn.Module.__call__
        self._original_call: Any = None
        self._state: Literal["new", "recording", "done"] = "new"
        # The module table, grown by _resolve: per slot (top-level index, name under
        # it, class name); the top-level modules' class-based names and weak refs.
        self._slots: list[tuple[int, str, str]] = []
        self._slot_of: dict[tuple[int, str, str], int] = {}
        self._roots: list[str] = []
        self._root_refs: list[weakref.ref[nn.Module]] = []
        self._refs: dict[int, weakref.ref[nn.Module]] = {}
        self._resolve_lock = threading.Lock()

    # -- context manager ---------------------------------------------------

    def __enter__(self) -> GlobalTrace:
        global _active
        if self._state != "new":
            raise RuntimeError("a hooktrace.GlobalTrace can be entered only once; make another")
        self._check_flight_recorder_thread()
        original = nn.Module.__dict__["__call__"]
        session = _C.Session(self._capacity, self._policy)
        if self._memory:
            from hooktrace.memory import enable

            self._memory_info = enable(session)
        call = _C.GlobalCall(session, original, self._resolve)
        with _SigintDeferred() as sigint:
            with _active_lock:
                if _active is not None:
                    raise RuntimeError("hooktrace: a global trace is already recording in this "
                                       "process (hooktrace run, HOOKTRACE=1 or global_trace()); "
                                       "exit it first")
                _active = self
            try:
                self._session, self._call, self._original_call = session, call, original
                # the frames that mark an open module call, for _resolve
                self._call_code = getattr(original, "__code__", _WRAPPED_CALL_CODE)
                self._start_unix_ns = time.time_ns()
                if self._schedule is not None:
                    session.enable_collection()
                self._state = "recording"  # from here on, _finish undoes what was done
                session.start()
                if self._schedule is not None:
                    self._enter_step(0)
                if self._backward:
                    _C.add_backward_session(session)
                self._start_steps()
                # Every subclass that does not define its own __call__ now finds this one.
                nn.Module.__call__ = call  # type: ignore[method-assign]
                self._start_flight_recorder()
                sigint.raise_pending()
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
        self._dump_on_exception(exc)
        self._finish()

    # -- steps and windows: hooktrace._windows.StepMarks ------------------

    # -- the rare path: a module's first call --------------------------------

    def _resolve(self, module: Any) -> int:
        """Called by _C.GlobalCall for an instance it has no slot for; returns its slot.

        Registers the module (and its unregistered submodules) so that its next
        calls never come here.
        """
        if not isinstance(module, nn.Module) or self._state != "recording":
            return -1
        open_modules = _open_modules(sys._getframe(1), self._call_code)
        with self._resolve_lock:
            slot = self._call.lookup(module)  # another thread may have registered it
            if slot >= 0:
                return int(slot)
            # Usually the innermost open call is the module's parent: look at the direct
            # children of the open modules, innermost first (a full search of a large
            # model on every call of a module made in forward would not be rare).
            for parent in reversed(open_modules):
                pslot = self._call.lookup(parent)
                if pslot < 0:
                    continue
                root, prefix, _ = self._slots[pslot]
                for name, child in parent._modules.items():
                    if child is module:
                        return self._register_tree(module, root, _join(prefix, name))
            if open_modules:
                pslot = self._call.lookup(open_modules[-1])
                if pslot >= 0:
                    root, prefix, _ = self._slots[pslot]
                    return self._register_tree(
                        module, root, _join(prefix, f"({type(module).__name__})"))
            return self._register_tree(module, self._new_root(module), "")

    def _new_root(self, module: nn.Module) -> int:
        """The top-level index for a new top-level module: its class name, or the first
        ``Class#k`` whose previous module is gone (so rebuilding a model reuses its rows)."""
        base = type(module).__name__
        k = 1
        while True:
            name = base if k == 1 else f"{base}#{k}"
            try:
                index = self._roots.index(name)
            except ValueError:
                self._roots.append(name)
                self._root_refs.append(weakref.ref(module))
                return len(self._roots) - 1
            if self._root_refs[index]() is None:
                self._root_refs[index] = weakref.ref(module)
                return index
            k += 1

    def _register_tree(self, module: nn.Module, root: int, prefix: str) -> int:
        """Slots for ``module`` and its submodules not registered yet; returns the module's."""
        mine = -1
        for name, m in module.named_modules():
            if m is not module and self._call.lookup(m) >= 0:
                continue  # already known (shared, or registered under another name)
            key = (root, _join(prefix, name), type(m).__name__)
            slot = self._slot_of.get(key)
            if slot is None:
                slot = self._slot_of[key] = len(self._slots)
                self._slots.append(key)
            try:
                ref = weakref.ref(m, functools.partial(self._forget_ref, id(m)))
            except TypeError:  # no weak references: cannot know when it dies, so no cache
                if m is module:
                    return slot
                continue
            self._refs[id(m)] = ref
            self._call.register(m, slot)
            if m is module:
                mine = slot
        return mine

    def _forget_ref(self, address: int, _ref: Any) -> None:
        """The weak reference's callback: the module at ``address`` died."""
        self._forget(address)

    def _forget(self, address: int) -> None:
        # Runs before the module's memory is freed, so no new module at the same
        # address can be looked up in between.
        self._refs.pop(address, None)
        if self._call is not None:
            self._call.forget(address)

    def modules_table(self) -> list[tuple[str, str]]:
        """(qualified name, class name) per slot, named as the module docstring says."""
        several = len(self._roots) > 1
        return [((_join(self._roots[root], rel) if several else rel), typ)
                for root, rel, typ in self._slots]

    # -- teardown and reading ------------------------------------------------

    def _teardown(self) -> list[BaseException]:
        session, call, original = self._session, self._call, self._original_call

        def restore() -> None:
            current = nn.Module.__dict__.get("__call__")
            if current is call:
                nn.Module.__call__ = original  # type: ignore[method-assign]
            elif current is not original:
                warnings.warn(
                    "hooktrace: nn.Module.__call__ was replaced by other code during the global "
                    "trace; leaving the replacement in place (it calls the stopped recorder)",
                    RuntimeWarning, stacklevel=4)

        steps: list[Any] = [self._stop_flight_recorder, session.stop, restore]
        if self._optimizer_hook is not None:
            steps.append(self._optimizer_hook.remove)
        if self._backward:
            steps.append(lambda: _C.remove_backward_session(session))
        errors: list[BaseException] = []
        for step in steps:
            for _ in range(2):  # every step is idempotent: one cut short is redone
                try:
                    step()
                    break
                except KeyboardInterrupt as e:
                    errors.append(e)
                except Exception as e:
                    errors.append(e)
                    break
        return errors

    def _finish(self) -> None:
        global _active
        if self._state != "recording":
            with _active_lock:
                if _active is self:
                    _active = None
            return
        self._state = "done"
        errors: list[BaseException] = []
        try:
            with _SigintDeferred():
                errors = self._teardown()
        finally:
            if self._schedule is not None:  # the windows went to on_window; the last too
                last = self._final_window(self._step)
                events, clock, info = last.events, last.clock, last.info
            else:
                events, clock, info = self._collect(stop_unix_ns=time.time_ns())
            modules = self.modules_table()
            self._refs.clear()  # dropped without their callbacks running
            self._session = self._call = None
            with _active_lock:
                _active = None
            TraceData.__init__(self, events, modules, _C.node_names(), clock, info)
        interrupt = next((e for e in errors if not isinstance(e, Exception)), None)
        if interrupt is not None:
            raise interrupt
        if errors:
            raise RuntimeError(f"hooktrace: failed to end the global trace: {errors[0]!r}") from errors[0]

    def _collect(self, stop_unix_ns: int, *, with_events: bool = True
                 ) -> tuple[np.ndarray, Clock, dict[str, Any]]:
        session = self._session
        stats = session.stats()
        events = np.empty(stats["events"] if with_events else 0, dtype=EVENT_DTYPE)
        events = events[: session.copy_events(events)] if with_events else events
        ticks0, unix_ns0, ns_per_tick = session.clock()
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "torch_version": torch.__version__,
            "hooktrace_version": _version(),
            "mode": "global",
            "backward": self._backward,
            "emit_profiler": False,
            "policy": self._policy,
            "capacity": int(session.capacity),
            "dropped_events": int(stats["dropped"]),
            "overwritten_events": int(stats["overwritten"]),
            "start_unix_ns": self._start_unix_ns,
            "stop_unix_ns": stop_unix_ns,
            **({"memory": self._memory_info} if self._memory_info is not None else {}),
            "thread_names": {str(t.native_id): t.name for t in threading.enumerate()},
            "top_level_modules": list(self._roots),
        }
        # rank, world size and clock offsets, as trace() records them (issue #11)
        info.update(rank_info(self._start_unix_ns, stop_unix_ns))
        return events, Clock(int(ticks0), int(unix_ns0), float(ns_per_tick)), info

    def _window_meta(self) -> tuple[Clock, dict[str, Any]]:
        _, clock, info = self._collect(stop_unix_ns=time.time_ns(), with_events=False)
        return clock, info

    def _window_modules(self) -> list[tuple[str, str]]:
        return self.modules_table()

    def snapshot(self) -> TraceData:
        """The events and modules recorded so far (a copy; recording goes on)."""
        if self._state == "done":
            return self
        if self._state != "recording":
            raise RuntimeError("hooktrace: this global trace has not started; enter it first")
        events, clock, info = self._collect(stop_unix_ns=time.time_ns())
        return TraceData(events, self.modules_table(), _C.node_names(), clock, info)

    def __getattr__(self, name: str) -> Any:
        if name in ("events", "modules", "node_names", "clock", "info", "_spans", "_steps"):
            raise RuntimeError(
                f"hooktrace: the global trace is {self.__dict__.get('_state', 'new')} ({name} is "
                "not available yet): read it after the with block, or use snapshot()")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        if self.__dict__.get("_state") == "done":
            return TraceData.__repr__(self)
        return f"<GlobalTrace: {self.__dict__.get('_state', 'new')}, {len(self._slots)} modules>"


def _open_modules(frame: FrameType | None, call_code: CodeType) -> list[nn.Module]:
    """The modules whose calls are open on this thread, outermost first: the ``self`` of
    each running ``nn.Module.__call__`` (``_wrapped_call_impl``) frame."""
    found: list[nn.Module] = []
    while frame is not None:
        if frame.f_code is call_code:
            m = frame.f_locals.get("self")
            if isinstance(m, nn.Module):
                found.append(m)
        frame = frame.f_back
    found.reverse()
    return found


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


# Lower-case entry point, as hooktrace.trace.
global_trace = GlobalTrace
