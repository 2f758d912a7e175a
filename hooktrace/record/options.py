"""Every recording option in one validated object (issue #27): :class:`RecordOptions`.

``trace()``, ``global_trace()``, ``hooktrace run``, ``HOOKTRACE=1`` and the trainer
callbacks all build one; it checks each option once, when it is made, with the same
one-line errors everywhere (before anything is touched: a bad argument never leaves a
model half-instrumented). Options that components refuse together (e.g.
``dump_on="nonfinite"`` without ``numerics``) are checked by the components
(:mod:`hooktrace.record.component`) when the recorder is made.

No option is written here: each is declared by the component it belongs to
(``OPTIONS``, record/component.py), the recording's own by record/core_options.py, and
:class:`RecordOptions` is a frozen dataclass with one field per declared option, built
from the registry (record/registry.py) by :func:`refresh`, once at import.
:data:`OPTION_HELP` holds each option's one-line help (``hooktrace run``'s argparse
help reads the declarations, the trainer callbacks their names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hooktrace.record import registry
from hooktrace.record.component import Declares, Option
from hooktrace.record.core_options import (
    DEFAULT_CAPACITY,
    MAX_CAPACITY,
    STREAM_CAPACITY,
    check_capacity,
)

if TYPE_CHECKING:
    from hooktrace.record.aggregate import DetailPolicy

__all__ = ["DEFAULT_CAPACITY", "MAX_CAPACITY", "OPTION_HELP", "RecordOptions",
           "STREAM_CAPACITY", "check_capacity", "refresh"]

# One line of help per option, as declared (refresh() fills it).
OPTION_HELP: dict[str, str] = {}


class RecordOptions:
    """Every option of a recording, checked once when made (``__post_init__``): see
    :class:`hooktrace.record.Recorder` for what each does, and each component's
    ``OPTIONS`` for its own. A frozen dataclass: ``options.memory``,
    ``dataclasses.replace(options, out=...)`` (or :meth:`replace`). ``capacity`` is
    resolved (its default depends on ``out``), ``dump_on`` is a frozenset, ``out`` a str.
    """

    # The fields are the declared options: refresh() makes them at import. For mypy,
    # what each holds once checked, in declaration order (a unit test keeps this list
    # equal to the declared options: tests/unit/test_record_options.py).
    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

        def __init__(self, **options: Any) -> None: ...

        capacity: int
        policy: Literal["drop", "ring"]
        steps: Literal["optimizer"] | None
        dump_on: frozenset[str]
        dump_dir: str
        hang_timeout: float
        dump_signal: int
        out: str | None
        max_disk: int | None
        schedule: Callable[[int], Any] | None
        on_window: Callable[[Any], Any] | None
        memory: bool
        emit_profiler: bool
        backward: bool
        numerics: bool
        numerics_every: int
        shapes: bool
        flops: bool
        gpu: bool
        gpu_mode: str
        gpu_every: int
        aggregate: str | None
        detail: DetailPolicy
        aggregate_interval: float
        aggregate_part_interval: float

    _declarers: ClassVar[tuple[type[Declares], ...]] = ()
    _options: ClassVar[tuple[Option, ...]] = ()

    @classmethod
    def declared(cls) -> tuple[Option, ...]:
        """The declared options, in order: the core's, then each component's."""
        return cls._options

    @classmethod
    def declarers(cls) -> tuple[type[Declares], ...]:
        """What declared them: the core's options (record/core_options.py), then each
        component's (record/registry.py)."""
        return cls._declarers

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> RecordOptions:
        """The options of ``trace(model, **kwargs)``; an unknown name is a TypeError."""
        names = {o.name for o in cls._options}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"hooktrace: unknown option {unknown[0]!r}; the options are "
                            f"{', '.join(sorted(names))}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> RecordOptions:
        """These options with some changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        values = {o.name: o.checked(getattr(self, o.name)) for o in self._options}
        for declarer in self._declarers:
            declarer.resolve(values)
        for name, value in values.items():
            object.__setattr__(self, name, value)


# What dataclass() adds to a class; removed before it makes the class again.
_GENERATED = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__",
              "__match_args__", "__dataclass_fields__", "__dataclass_params__")


def refresh() -> None:
    """Makes :class:`RecordOptions`'s fields (and :data:`OPTION_HELP`) the options the
    registry's declarers declare now, in place (every module holding the class sees
    them). Done once at import; again only where the registry changed (a test adding a
    toy component). Raises ValueError for an option declared twice."""
    declarers = registry.declarers()
    options: list[Option] = []
    owner: dict[str, str] = {}
    for declarer in declarers:
        for option in declarer.OPTIONS:
            if option.name in owner:
                raise ValueError(f"option {option.name!r} is declared by {owner[option.name]} "
                                 f"and {declarer.__name__}")
            owner[option.name] = declarer.__name__
            options.append(option)
    cls = RecordOptions
    for name in [*_GENERATED, *(o.name for o in cls._options)]:
        if name in cls.__dict__:
            delattr(cls, name)
    cls.__annotations__ = {o.name: o.annotation for o in options}
    for o in options:
        setattr(cls, o.name, dataclasses.field(default=o.default, compare=o.compare))
    cls._declarers = declarers
    cls._options = tuple(options)
    dataclasses.dataclass(frozen=True)(cls)
    OPTION_HELP.clear()
    OPTION_HELP.update({o.name: o.help for o in options})


refresh()
