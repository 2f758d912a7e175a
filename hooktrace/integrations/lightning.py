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

from hooktrace.integrations import TraceSession
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
        logs: with ``aggregate``, log each step's ``hooktrace/fwd_ms/<module>``,
            ``hooktrace/bwd_ms/<module>`` and ``hooktrace/step_ms`` through
            ``pl_module.log`` (every logger of the trainer), ``log_on_step`` /
            ``log_on_epoch`` as ``self.log``'s ``on_step``/``on_epoch``; the
            ``log_top`` modules by forward time among ``log_include`` (fnmatch patterns).
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
            self.session.step()
        pending, self.session.pending = self.session.pending, []
        for scalars in pending:  # through the LightningModule: every logger the trainer has
            for name, value in scalars.items():
                pl_module.log(name, value, on_step=self.log_on_step, on_epoch=self.log_on_epoch,
                              batch_size=1)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish(rank=int(trainer.global_rank), world_size=int(trainer.world_size))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(rank=int(trainer.global_rank), world_size=int(trainer.world_size))
