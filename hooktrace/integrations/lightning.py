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
        **options: any other option of :func:`hooktrace.trace` (``memory=``, ``flops=``, ...).
        summary: print the per-module table to stderr at the end (rank 0).
    """

    def __init__(self, output: str | os.PathLike[str] | None = None, *,
                 chrome: str | os.PathLike[str] | None = None, backward: bool = True,
                 capacity: int = DEFAULT_CAPACITY, summary: bool = False,
                 **options: Any) -> None:
        self.session = TraceSession(output, chrome=chrome, backward=backward, capacity=capacity,
                                    summary=summary, **options)
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

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish(rank=int(trainer.global_rank), world_size=int(trainer.world_size))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish(rank=int(trainer.global_rank), world_size=int(trainer.world_size))
