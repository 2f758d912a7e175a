"""Aggregates into the user's experiment logger (issue #31).

Each step's aggregate rows (``trace(..., aggregate=DIR)``, record/aggregate.py) become
a few named scalars::

    hooktrace/step_ms                       the step's wall time
    hooktrace/fwd_ms/transformer.h.3.attn   the module's forward time per step
    hooktrace/bwd_ms/transformer.h.3.attn   its backward time per step

(the mean over the steps of an ``aggregate_interval`` window, logged at its last step);

for the ``top`` modules by forward time (chosen at the first step logged, then fixed, so
a 1000-module model gives ``top`` steady curves, not a flood), among those whose name
matches one of ``include`` (fnmatch patterns; default: every module).

:func:`log_to` sends them to a ``torch.utils.tensorboard.SummaryWriter`` (or anything
with ``add_scalar(tag, value, step)``); the Lightning and HF callbacks log them through
their trainer (``logs=True``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

__all__ = ["Scalars", "log_to"]

PREFIX = "hooktrace"


class Scalars:
    """Step rows -> ``{name: value}`` (see the module docstring)."""

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
        self.modules: list[str] | None = None  # fixed at the first step

    def _wanted(self, module: str) -> bool:
        return not self.include or any(fnmatch.fnmatchcase(module, p) for p in self.include)

    def __call__(self, step: int, rows: dict[str, list[Any]]) -> dict[str, float]:
        fwd: dict[str, float] = {}
        bwd: dict[str, float] = {}
        out: dict[str, float] = {}
        # per step: a row covers rows["steps"] steps (aggregate_interval)
        for module, mode, total_ms, steps in zip(rows["module"], rows["mode"],
                                                 rows["total_ms"], rows["steps"], strict=True):
            total = total_ms / max(1, steps)
            if mode == "step":
                out[f"{self.prefix}/step_ms"] = float(total)
            elif mode == "forward":
                fwd[module] = float(total)
            elif mode == "backward":
                bwd[module] = float(total)
        if self.modules is None:
            candidates = [m for m in fwd if self._wanted(m)]
            self.modules = sorted(candidates, key=lambda m: -fwd[m])[: self.top]
        for m in self.modules:
            if m in fwd:
                out[f"{self.prefix}/fwd_ms/{m}"] = fwd[m]
            if m in bwd:
                out[f"{self.prefix}/bwd_ms/{m}"] = bwd[m]
        return out


def log_to(writer: Any, trace: Any = None, *, top: int = 10,
           include: Sequence[str] | str | None = None, prefix: str = PREFIX) -> Scalars:
    """Log each step's scalars to ``writer`` (``add_scalar(tag, value, global_step)``:
    a ``torch.utils.tensorboard.SummaryWriter``), from ``trace`` (a ``hooktrace.trace``
    or ``global_trace`` recording with ``aggregate=``; default: the process's global
    trace, ``hooktrace run --aggregate``; when there is none, the script runs without
    hooktrace and nothing is logged). Returns the :class:`Scalars` (its ``modules``:
    the modules logged, once the first step is)."""
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
        for name, value in scalars(step, rows).items():
            add_scalar(name, value, step)

    trace.add_logger(log)
    return scalars
