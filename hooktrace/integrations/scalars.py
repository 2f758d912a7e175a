"""Aggregates into the user's experiment logger (issue #31).

Each step's aggregate rows (``trace(..., aggregate=DIR)``, record/aggregate.py) become
a few named scalars::

    hooktrace/step_ms                       the step's wall time
    hooktrace/fwd_ms/transformer.h.3.attn   the module's forward time per step
    hooktrace/bwd_ms/transformer.h.3.attn   its backward time per step

(the mean over the steps of an ``aggregate_interval`` window, logged once, at its last
step);

for the ``top`` modules by forward time among those whose name matches one of
``include`` (fnmatch patterns; default: every module), chosen once, then fixed, so a
1000-module model gives ``top`` steady curves, not a flood. They are chosen from the
windows after the run's first (issue #47: the first window is the warm-up, where layer 0
and lazy initialisation dominate), so the first window is logged when the second ends (or
when a trainer logs, from what it has); a module whose time is almost all one of its
submodules' (a wrapper: ``lora.Linear`` around its ``base_layer``) is left out for that
submodule, its curve being the same.

:func:`log_to` sends them to a ``torch.utils.tensorboard.SummaryWriter`` (or anything
with ``add_scalar(tag, value, step)``); the Lightning and HF callbacks log them through
their trainer (``logs=True``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Scalars", "log_to"]

PREFIX = "hooktrace"
# A module with a submodule holding at least this share of its forward time is a
# wrapper: the two would draw one curve, the submodule's is kept
WRAPPER_SHARE = 0.95


@dataclass
class _Window:
    step: int  # its last step
    steps: int
    step_ms: float | None  # per step
    fwd: dict[str, float]  # per module, per step
    bwd: dict[str, float]


class Scalars:
    """Windows' rows -> ``{name: value}`` per window (see the module docstring):
    :meth:`add` each window's rows, :meth:`take` what is ready to log."""

    def __init__(self, top: int = 10, include: Sequence[str] | str | None = None,
                 prefix: str = PREFIX) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise ValueError(f"top must be a number of modules >= 0, got {top!r}")
        if isinstance(include, str):
            include = [include]
        if include is not None and (not isinstance(include, (list, tuple, set, frozenset))
                                    or not all(isinstance(p, str) for p in include)):
            raise TypeError(f"include must be fnmatch patterns (str, or a list of str), got "
                            f"{type(include).__name__} {include!r:.60}")
        self.top, self.include, self.prefix = top, list(include or []), prefix
        self.modules: list[str] | None = None  # fixed once chosen
        self._held: list[_Window] = []  # windows added, not taken yet

    def _wanted(self, module: str) -> bool:
        return not self.include or any(fnmatch.fnmatchcase(module, p) for p in self.include)

    def add(self, step: int, rows: dict[str, list[Any]]) -> None:
        """A window's rows (``log(step, rows)`` of ``trace.add_logger``: ``step`` its last
        step); per step: a row covers rows["steps"] steps (aggregate_interval)."""
        fwd: dict[str, float] = {}
        bwd: dict[str, float] = {}
        step_ms, steps = None, 1
        keep = (set(self.modules) if self.modules is not None else None)
        for module, mode, total_ms, n in zip(rows["module"], rows["mode"], rows["total_ms"],
                                             rows["steps"], strict=True):
            total = float(total_ms) / max(1, n)
            if mode == "step":
                step_ms, steps = total, max(1, int(n))
            elif mode in ("forward", "backward") and (
                    module in keep if keep is not None else self._wanted(module)):
                (fwd if mode == "forward" else bwd)[module] = total
        self._held.append(_Window(step, steps, step_ms, fwd, bwd))

    def take(self, *, force: bool = False) -> list[tuple[int, int, dict[str, float]]]:
        """Each window added and not taken yet, oldest first, as (its last step, its
        steps, ``{name: value}``), once the modules are chosen: when a window after the
        run's first is there, or now with ``force`` (a trainer logging); [] before."""
        if self.modules is None:
            if not self._held or not (force or len(self._held) > 1):
                return []
            self._choose()
        out = []
        for w in self._held:
            values: dict[str, float] = {}
            if w.step_ms is not None:
                values[f"{self.prefix}/step_ms"] = w.step_ms
            for m in self.modules or ():
                if m in w.fwd:
                    values[f"{self.prefix}/fwd_ms/{m}"] = w.fwd[m]
                if m in w.bwd:
                    values[f"{self.prefix}/bwd_ms/{m}"] = w.bwd[m]
            out.append((w.step, w.steps, values))
        self._held = []
        return out

    def _choose(self) -> None:
        """The ``top`` modules by forward time over the held windows, the run's first
        (the warm-up) left out when others are there; wrappers left out."""
        windows = self._held[1:] if len(self._held) > 1 else self._held
        total: dict[str, float] = {}
        for w in windows:
            for m, ms in w.fwd.items():
                total[m] = total.get(m, 0.0) + ms * w.steps
        kept = [m for m in total if not _wrapper(m, total)]
        self.modules = sorted(kept, key=lambda m: -total[m])[: self.top]


def _wrapper(module: str, total: dict[str, float]) -> bool:
    """Whether one of ``module``'s submodules holds nearly all its time (the root's name
    in the rows is ``<root>``: every other module is below it)."""
    prefix = "" if module == "<root>" else module + "."
    return total[module] > 0 and any(
        m != module and m.startswith(prefix) and t >= WRAPPER_SHARE * total[module]
        for m, t in total.items())


def log_to(writer: Any, trace: Any = None, *, top: int = 10,
           include: Sequence[str] | str | None = None, prefix: str = PREFIX) -> Scalars:
    """Log each step's scalars to ``writer`` (``add_scalar(tag, value, global_step)``:
    a ``torch.utils.tensorboard.SummaryWriter``), from ``trace`` (a ``hooktrace.trace``
    or ``global_trace`` recording with ``aggregate=``; default: the process's global
    trace, ``hooktrace run --aggregate``; when there is none, the script runs without
    hooktrace and nothing is logged). Returns the :class:`Scalars` (its ``modules``:
    the modules logged, once chosen). Each window is logged once, at its last step; the
    first when the second ends (a run of a single window logs nothing)."""
    add_scalar = getattr(writer, "add_scalar", None)
    if not callable(add_scalar):
        raise TypeError(f"hooktrace.log_to: expected a writer with add_scalar(tag, value, "
                        f"step) (a SummaryWriter), got {type(writer).__name__}")
    if trace is None:
        from hooktrace.record.recorder import process_recorder

        trace = process_recorder()
    scalars = Scalars(top, include, prefix)
    if trace is None:
        # the script run without hooktrace (python train.py rather than hooktrace run
        # --aggregate): nothing to log, and the line can stay in (issue #38: it raised)
        return scalars

    def log(step: int, rows: dict[str, list[Any]]) -> None:
        scalars.add(step, rows)
        for last, _, values in scalars.take():  # each window once, at its last step
            for name, value in values.items():
                add_scalar(name, value, last)

    trace.add_logger(log)
    return scalars
