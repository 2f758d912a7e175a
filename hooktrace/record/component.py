"""One recording feature, one component, declaring its own options (issue #27).

A :class:`~hooktrace.record.recorder.Recorder` records module calls (its scope and the
native hot path) and composes the components its options enable; each feature
(backward, memory, shapes, numerics, FLOPs, kernel marks, profiler ranges) is a
:class:`Component` in its own file under ``hooktrace/record/``, listed once in
``record/registry.py``'s ``COMPONENTS``, and the recorder holds no branch on any of
them. The recorder calls, in the components' order:

* ``check(options)`` (class-level, every component, when the recorder is made):
  refuses options it cannot take together, before anything is touched;
* ``prepare(session, scope)`` before the session starts (nothing to undo: a failure
  discards the session);
* ``install(session, scope)`` once recording has started; a component whose
  ``install`` returned is torn down, whatever happens next;
* ``before_step()`` / ``step(step_no)`` around each step mark (``step_no``: the new step);
* ``window_opened()`` and ``window_info(info)`` for a schedule's windows;
* at the end, ``flush()`` (before the session stops) then ``teardown()`` (after), in
  reverse order, each run even when another raises, exceptions and Ctrl-C included;
  both must be idempotent;
* ``run_info(info)`` (what describes the run: the stream's META, every read) and
  ``metadata(info)`` (as of now: every read, window cut and the stream's FOOTER).

None of these is on the hot path: a module call runs native code only. A component
holds its recorder through a weak proxy (``self.recorder``): a strong reference back
would make a cycle that keeps a dropped recorder's buffers until the cyclic GC runs.

Options
-------
Each component declares its options in ``OPTIONS``, next to its code: name, default,
one-line help, type (the annotation; by default the default's), the check that
normalises a value or raises the one-line error, the command-line form, and whether the
trainer callbacks take it. Everything else is built from the declarations:
:class:`~hooktrace.record.options.RecordOptions` (a field per option, checked once when
made, so ``trace(model, gpu=True)`` / ``global_trace(...)`` / ``options.gpu``),
``OPTION_HELP``, ``hooktrace run``'s flags and ``--help`` (and so ``HOOKTRACE_OPTIONS``),
the flag-named errors of ``hooktrace run`` (``--gpu-every must be ...``) and the keyword
arguments the trainer callbacks accept. The options of the recording itself (capacity,
policy, out, steps, schedule, dumps) are declared the same way in
``record/core_options.py``.

How to add an option
--------------------
1. In the component's own file, add an :class:`Option` to its ``OPTIONS`` tuple:
   ``Option(name, default, "one-line help", check=..., cli=...)``.

   * ``check(name, value) -> value``: returns the value to keep, or raises a
     ``TypeError``/``ValueError`` of one line starting with the option's name (``hooktrace
     run`` makes it the flag's: ``--gpu-every must be ...``). A ``bool`` option without
     one gets :func:`boolean` (``gpu must be True or False, got int 1``); helpers:
     :func:`positive_int`, :func:`one_of`.
   * ``cli``: the flag, or None for none: ``"switch"`` (``--gpu``; ``--no-NAME`` for an
     option on by default), ``"int"``/``"float"``/``"str"`` (``--gpu-every N``),
     ``Flag("choice", choices={word: value})`` or ``"list"`` (comma-separated), with
     ``Flag(..., flag="--ring", value="ring", metavar=...)`` for another spelling.
     ``flag_help``: the flag's help, where it must differ from ``help``.
   * ``callbacks=False`` keeps it from the trainer callbacks' keywords; ``type`` is the
     field's annotation (by default the default's type).
2. Read it in the component's methods as ``self.recorder.options.NAME`` (or
   ``options.NAME`` in ``enabled``/``check``). Rules over several options: ``check``
   (refused together, when the recorder is made), ``resolve`` (when the options are made;
   may fill in a value, as the capacity's default that depends on ``out``),
   ``from_flags`` (a flag implying another option: ``--dump-on nonfinite`` turns
   ``--numerics`` on).
3. A new feature also adds its class to ``COMPONENTS`` in ``record/registry.py`` (one
   line, in the order it must be installed).

Nothing else changes: no edit in options.py, launch.py or the integrations. Example, a
whole feature::

    # hooktrace/record/gpu_time.py
    from hooktrace.record.component import Component, Option, Options, positive_int

    class GpuTimeComponent(Component):
        OPTIONS = (
            Option("gpu", False, "also time each module call on the GPU",
                   cli="switch"),                                  # --gpu
            Option("gpu_every", 1, "with gpu, time steps 0, N, 2N, ... only",
                   check=positive_int("steps"), cli="int",         # --gpu-every N
                   flag_help="with --gpu, time steps 0, N, 2N, ... only"),
        )

        # on when its first option is (gpu=True): override enabled() for another rule

        def install(self, session, scope) -> None:
            import hooktrace._C as _C  # (inside: see below)
            every = self.recorder.options.gpu_every
            ...

    # hooktrace/record/registry.py
    COMPONENTS = (..., GpuTimeComponent)

Porting a component written before options were declared (its field, ``OPTION_HELP``
line and check added to record/options.py by hand, a flag to record/launch.py, a name to the
callbacks' list): those additions go and become its ``OPTIONS``, as above; its methods
do not change. Two more edits: annotate ``options`` with :data:`Options` (this
module's), not ``RecordOptions`` (record/options.py imports the components, so importing
it back, even under ``TYPE_CHECKING``, is the cycle tests/unit/test_architecture.py
refuses); and import ``hooktrace._C``/torch inside the methods, not at the module's top:
``hooktrace run --help`` builds the flags from the declarations without importing torch.

Tests: ``tests/unit/test_record_options.py`` proves that a toy component's options reach
``RecordOptions``, the run flags and ``--help``, ``HOOKTRACE_OPTIONS`` and the callbacks,
with the one-line errors, and that every option is declared exactly once;
``tests/integration/test_components.py`` records with one.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

__all__ = ["Component", "Declares", "Flag", "Option", "boolean", "folder", "one_of",
           "positive_int"]

# A RecordOptions (record/options.py, built from these declarations; that module
# imports the components, so they cannot import it back, even for typing).
Options = Any

FlagForm = Literal["switch", "int", "float", "choice", "list", "str"]


@dataclass(frozen=True)
class Flag:
    """How ``hooktrace run`` (and ``HOOKTRACE_OPTIONS``) spells an option.

    ``form``: ``"switch"`` (no value: gives ``value``, by default the opposite of a
    bool option's default, so an option on by default is ``--no-NAME``), ``"int"``,
    ``"float"`` (finite), ``"str"``, ``"choice"`` (``choices``: each word the flag takes
    and the option's value for it) or ``"list"`` (comma-separated words, a tuple).
    ``flag``: by default ``--NAME`` with dashes (``--no-NAME`` for a switch off).
    """

    form: FlagForm
    flag: str | None = None
    metavar: str | None = None
    choices: Mapping[str, Any] | None = None
    value: Any = None


@dataclass(frozen=True)
class Option:
    """One recording option, declared by the component it belongs to.

    ``check(name, value)`` returns the value to keep (normalised: ``np.bool_`` as
    ``bool``) or raises the one-line ``TypeError``/``ValueError`` (starting with the
    option's name); a ``bool`` option without one gets :func:`boolean`. ``cli``: its
    flag (a :class:`Flag`, or just its form: ``"switch"``, ``"int"``, ...), None for
    no flag; ``flag_help``: the flag's help where it differs from ``help`` (says the
    flags' names, say). ``callbacks``: whether the trainer callbacks
    (hooktrace/integrations) take it as a keyword. ``compare``: part of ``==``.
    """

    name: str
    default: Any
    help: str
    type: Any = None
    check: Callable[[str, Any], Any] | None = None
    cli: Flag | FlagForm | None = None
    flag_help: str | None = None
    callbacks: bool = True
    compare: bool = True

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise ValueError(f"option name {self.name!r}: not a public identifier")
        if not self.help or "\n" in self.help:
            raise ValueError(f"option {self.name!r}: its help must be one line")
        if isinstance(self.cli, str):
            object.__setattr__(self, "cli", Flag(self.cli))
        flag = self.flag
        if flag is not None and flag.form == "switch" and flag.value is None and not isinstance(
                self.default, bool):
            raise ValueError(f"option {self.name!r}: a switch of a non-bool option needs "
                             "Flag(value=...)")
        if flag is not None and flag.form == "choice" and not flag.choices:
            raise ValueError(f"option {self.name!r}: a choice needs Flag(choices={{...}})")

    @property
    def annotation(self) -> Any:
        """The field's type: as declared, else the default's type."""
        return self.type if self.type is not None else type(self.default)

    def checked(self, value: Any) -> Any:
        """``value`` as the options keep it, or the one-line error."""
        if self.check is not None:
            return self.check(self.name, value)
        if self.annotation is bool:
            return boolean(self.name, value)
        return value

    @property
    def flag(self) -> Flag | None:
        return self.cli if isinstance(self.cli, Flag) else None

    def metavar(self) -> str | None:
        """The flag's value in ``--help``: as declared, else N for an int, else NAME."""
        flag = self.flag
        if flag is None or flag.form in ("switch", "choice"):
            return None
        return flag.metavar or ("N" if flag.form == "int" else self.name.upper())

    def flag_name(self) -> str | None:
        """``--capacity``, ``--no-backward``, ``--ring``: the flag, if it has one."""
        flag = self.flag
        if flag is None:
            return None
        if flag.flag is not None:
            return flag.flag
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if flag.form == "switch" and self.default is True else f"--{dashed}"

    def switch_value(self) -> Any:
        """What a switch gives: its ``value``, else the opposite of a bool default."""
        flag = self.flag
        assert flag is not None and flag.form == "switch"
        return flag.value if flag.value is not None else not self.default


# -- checks (name, value) -> value, one line naming the option --------------------


def boolean(name: str, value: Any) -> bool:
    """True or False (numpy's bools too)."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def positive_int(unit: str) -> Callable[[str, Any], int]:
    """A check: an int >= 1 (not a bool, not a float), e.g. ``positive_int("steps")``."""

    def check(name: str, value: Any) -> int:
        import numpy as np

        if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
                or value < 1):
            raise ValueError(f"{name} must be a positive integer ({unit}), got {value!r}")
        return int(value)

    return check


def one_of(*choices: str) -> Callable[[str, Any], str]:
    """A check: one of these strings (a non-string is a TypeError)."""

    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            error = ValueError if isinstance(value, str) else TypeError
            raise error(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value

    return check


def folder(noun: str = "folder") -> Callable[[str, Any], Any]:
    """A check: a folder path (str or os.PathLike of str), not an existing file (its
    error names it a ``noun``); the value as given."""

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
            raise TypeError(f"{name} must be a folder path, got {type(value).__name__} "
                            f"{value!r:.60}")
        if os.path.exists(value) and not os.path.isdir(value):
            raise ValueError(f"{name} {os.fspath(value)!r} exists and is not a {noun}")
        return value

    return check


class Declares:
    """What declares recording options: a component, or the recording's own
    (record/core_options.py)."""

    OPTIONS: ClassVar[tuple[Option, ...]] = ()

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> None:
        """When the options are made, after each was checked: rules over several of
        them (raise the one-line error), and values that depend on others (set them)."""

    @classmethod
    def from_flags(cls, values: dict[str, Any]) -> None:
        """``hooktrace run``'s option values before they are checked: an option a flag
        implies is set here."""


class Component(Declares):
    """A recording feature; every method but :meth:`enabled` does nothing by default."""

    # Whether it drains the session's events as it goes (aggregate=): the recorder's
    # result then holds the events not drained yet, not every event recorded.
    drains = False

    @classmethod
    def enabled(cls, options: Options) -> bool:
        """Whether these options turn the feature on: by default its first option (its
        switch: ``memory=True``), or always when it declares none."""
        return not cls.OPTIONS or bool(getattr(options, cls.OPTIONS[0].name))

    @classmethod
    def check(cls, options: Options) -> None:
        """Raises the one-line error for options this feature refuses together."""

    def __init__(self, recorder: Any) -> None:
        # A weak proxy: the recorder holds its components, so a strong reference back
        # would make a cycle, and a dropped recorder (its session's buffers, up to
        # 256 MiB, with it) would live on until the cyclic GC ran; a later recording
        # then page-faults fresh buffers instead of reusing freed ones (~20-30 ns per
        # module call on the Identity chain, benchmarks/RESULTS.md #27).
        self.recorder = weakref.proxy(recorder)

    def prepare(self, session: Any, scope: Any) -> None:
        """Before the session starts."""

    def install(self, session: Any, scope: Any) -> None:
        """Once recording has started."""

    def before_step(self) -> None:
        """Before a step mark."""

    def step(self, step_no: int) -> None:
        """After a step mark: ``step_no`` is the step now recorded."""

    def window_opened(self) -> None:
        """A schedule's window starts recording."""

    def window_info(self, info: dict[str, Any]) -> None:
        """Its part of a window's info (after :meth:`metadata`)."""

    def flush(self) -> None:
        """At the end, before the session stops (idempotent)."""

    def teardown(self) -> None:
        """At the end, after the session stopped (idempotent)."""

    def run_info(self, info: dict[str, Any]) -> None:
        """Its part of what describes the run."""

    def metadata(self, info: dict[str, Any]) -> None:
        """Its part of the run's info as of now."""

    # Requests the recorder passes on (``trace.keep_step()``, ``trace.add_logger()``):
    # a component that serves one returns True; the recorder asks each in turn.

    def keep_next_step(self) -> bool:
        """Keep the next step's raw events, if this component keeps steps."""
        return False

    def take_logger(self, log: Callable[[int, dict[str, list[Any]]], None]) -> bool:
        """Call ``log(step, rows)`` after each step, if this component makes rows."""
        return False

    def close_window(self) -> bool:
        """Reduce the steps since the last rows to rows now (and hand them to the
        loggers), if this component makes rows."""
        return False
