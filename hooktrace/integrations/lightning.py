"""Lightning ``Callback`` (needs ``pip install hooktrace[lightning]``).

Example::

    from hooktrace.integrations.lightning import HooktraceCallback
    trainer = lightning.Trainer(max_steps=100, callbacks=[HooktraceCallback("traces/")])
    trainer.fit(module, loader)   # writes traces/hooktrace-<host>_<pid>_rank<R>.htrace

Tracing starts at ``on_fit_start`` (the LightningModule and every submodule,
forward and backward, validation included), a step ends when the trainer's
``global_step`` advances (checked at ``on_train_batch_end``: one per optimizer
step, so accumulated batches are one step), and every rank writes its file at
``on_fit_end``, or at ``on_exception`` when training fails.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.callbacks import Callback

from hooktrace.integrations import TraceSession, weighted_means
from hooktrace.record import DEFAULT_CAPACITY

__all__ = ["HooktraceCallback"]


class HooktraceCallback(Callback):  # type: ignore[misc]
    """Trace the LightningModule for the whole of ``trainer.fit()``.

    Args:
        output: the .htrace file or folder (default ``hooktrace-<host>_<pid>_rank<R>.htrace``).
        chrome: also write Chrome trace JSON there.
        backward: as for :func:`hooktrace.trace`.
        capacity: as for :func:`hooktrace.trace`.
        **options: any other option of :func:`hooktrace.trace` (``memory=``, ``flops=``,
            ``gpu=``, ...; ``aggregate=``/``detail=``: per-step aggregates and the detail
            policy, docs/weeks.md).
        summary: print the per-module table to stderr at the end (rank 0).
        logs: with ``aggregate``, log ``hooktrace/fwd_ms/<module>``,
            ``hooktrace/bwd_ms/<module>`` and ``hooktrace/step_ms`` to every logger of the
            trainer (``trainer.loggers``): each window's value once, at its last step
            (``<name>_step``, with ``log_on_step``), and per training epoch its mean per
            step (``<name>_epoch``, with ``log_on_epoch``; the window open at the
            epoch's end is closed there, so each epoch has its own point); the plain
            name when only one of the two is on. The ``log_top`` modules by forward time
            among ``log_include`` (fnmatch patterns), chosen after the warm-up window.

    The validation Lightning runs after the last training step is aggregated too, as
    one more step (its rows are eval rows; it is not logged as a training step).
    """

    def __init__(self, output: str | os.PathLike[str] | None = None, *,
                 chrome: str | os.PathLike[str] | None = None, backward: bool = True,
                 capacity: int = DEFAULT_CAPACITY, summary: bool = False,
                 logs: bool = False, log_top: int = 10, log_include: Any = None,
                 log_on_step: bool = True, log_on_epoch: bool = True,
                 **options: Any) -> None:
        self.session = TraceSession(output, chrome=chrome, backward=backward, capacity=capacity,
                                    summary=summary, **options)
        if logs:
            self.session.log_scalars(log_top, log_include)
        self.log_on_step, self.log_on_epoch = log_on_step, log_on_epoch
        self._global_step = 0
        self._marks = 0  # the steps marked in the trace (its step numbers: 0, 1, ...)
        self._log_step: dict[int, int] = {}  # a trace step -> the trainer's logging step
        self._epoch: list[tuple[int, dict[str, float]]] = []  # this epoch's windows
        self._validated = False  # a validation ran since the last step mark

    @property
    def written(self) -> list[str]:
        """The files written at the end of fit()."""
        return self.session.written

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = int(trainer.global_step)
        self.session.start(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if int(trainer.global_step) != self._global_step:
            self._global_step = int(trainer.global_step)
            self._mark(_logging_step(trainer))
        self._log(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self._validated = True

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session.scalars is None:
            return
        self.session.close_window()  # the epoch's last window ends with it
        self._log(trainer, force=True)
        if self.log_on_epoch and self._epoch:
            metrics = {self._name(name, "_epoch"): mean
                       for name, mean in weighted_means(self._epoch).items()}
            step = self._log_step.get(self._marks - 1, _logging_step(trainer))
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
        self._epoch = []

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self._validated and self.session.record.aggregate is not None:
            # the validation after the last training step: aggregated as a step of its own
            # (issue #47: never aggregated), not logged as a training step
            self._mark(_logging_step(trainer))
            self.session.close_window()
            self.session.take_pending(force=True)
        self.session.finish(rank=int(trainer.global_rank), world_size=int(trainer.world_size))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(rank=int(trainer.global_rank), world_size=int(trainer.world_size))

    def _mark(self, log_step: int) -> None:
        self._log_step[self._marks] = log_step
        self._marks += 1
        self._validated = False
        self.session.step()

    def _name(self, name: str, suffix: str) -> str:
        """Lightning's own naming: ``_step``/``_epoch`` when both are logged."""
        return name + suffix if self.log_on_step and self.log_on_epoch else name

    def _log(self, trainer: Any, *, force: bool = False) -> None:
        """Each window's scalars, once, at the logging step of its last step (to every
        logger of the trainer: pl_module.log would repeat a window's value at every
        later step of the epoch, issue #47)."""
        for last, steps, values in self.session.take_pending(force=force):
            self._epoch.append((steps, values))
            if not self.log_on_step or not values:
                continue
            metrics = {self._name(name, "_step"): v for name, v in values.items()}
            step = self._log_step.get(last, _logging_step(trainer))
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)


def _logging_step(trainer: Any) -> int:
    """The step Lightning logs the current batch's metrics at (its count of batches that
    stepped an optimizer, before this one's: global_step - 1 with one optimizer)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(loop, "_batches_that_stepped", None)
    return int(stepped) if isinstance(stepped, int) else max(0, int(trainer.global_step) - 1)
