"""Hugging Face ``transformers.Trainer`` callback (needs ``pip install hooktrace[hf]``).

Example::

    from hooktrace.integrations.hf import HooktraceCallback
    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[HooktraceCallback("traces/run.htrace")])
    trainer.train()        # writes traces/run.htrace (run_rank<R>.htrace per rank)

Tracing starts at ``on_train_begin`` (the trainer's model, every submodule,
forward and backward), a step ends at each ``on_step_end`` (one per optimizer
step, so gradient accumulation's micro-batches are one step), and the file is
written at ``on_train_end`` by every process, named with ``args.process_index``.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from hooktrace.integrations import TraceSession
from hooktrace.record import DEFAULT_CAPACITY

__all__ = ["HooktraceCallback"]


class HooktraceCallback(TrainerCallback):  # type: ignore[misc]
    """Trace the trainer's model for the whole of ``trainer.train()``.

    Args:
        output: the .htrace file or folder (default ``hooktrace-<host>_<pid>_rank<R>.htrace``).
        chrome: also write Chrome trace JSON there.
        backward: as for :func:`hooktrace.trace`.
        capacity: as for :func:`hooktrace.trace`.
        **options: any other option of :func:`hooktrace.trace` (``memory=``, ``flops=``, ...).
        summary: print the per-module table to stderr at the end (rank 0).
    """

    def __init__(self, output: str | os.PathLike[str] | None = None, *,
                 chrome: str | os.PathLike[str] | None = None,
                 backward: bool = True, capacity: int = DEFAULT_CAPACITY,
                 summary: bool = False, **options: Any) -> None:
        self.session = TraceSession(output, chrome=chrome, backward=backward, capacity=capacity,
                                    summary=summary, **options)

    @property
    def written(self) -> list[str]:
        """The files written at the end of training."""
        return self.session.written

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("hooktrace: the Trainer passed no model to on_train_begin")
        self.session.start(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.finish(rank=int(args.process_index), world_size=int(args.world_size))
