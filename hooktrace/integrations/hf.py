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

from hooktrace.integrations import TraceSession, weighted_means
from hooktrace.record import DEFAULT_CAPACITY

__all__ = ["HooktraceCallback"]


class HooktraceCallback(TrainerCallback):  # type: ignore[misc]
    """Trace the trainer's model for the whole of ``trainer.train()``.

    Args:
        output: the .htrace file or folder (default ``hooktrace-<host>_<pid>_rank<R>.htrace``).
        chrome: also write Chrome trace JSON there.
        backward: as for :func:`hooktrace.trace`.
        capacity: as for :func:`hooktrace.trace`.
        **options: any other option of :func:`hooktrace.trace` (``memory=``, ``flops=``,
            ``gpu=``, ...; ``aggregate=``/``detail=``: per-step aggregates and the detail
            policy, docs/weeks.md).
        summary: print the per-module table to stderr at the end (rank 0).
        logs: with ``aggregate``, add ``hooktrace/fwd_ms/<module>``,
            ``hooktrace/bwd_ms/<module>`` and ``hooktrace/step_ms`` (their mean per step
            since the last log) to the Trainer's ``logs`` at each ``on_log``, so every
            ``report_to`` integration writes them; the ``log_top`` modules by forward time
            among ``log_include`` (fnmatch patterns), chosen at the first log from the
            windows after the first (the warm-up), wrappers of one submodule left out.
    """

    def __init__(self, output: str | os.PathLike[str] | None = None, *,
                 chrome: str | os.PathLike[str] | None = None,
                 backward: bool = True, capacity: int = DEFAULT_CAPACITY,
                 summary: bool = False, logs: bool = False, log_top: int = 10,
                 log_include: Any = None, **options: Any) -> None:
        self.session = TraceSession(output, chrome=chrome, backward=backward, capacity=capacity,
                                    summary=summary, **options)
        if logs:
            self.session.log_scalars(log_top, log_include)

    @property
    def written(self) -> list[str]:
        """The files written at the end of training."""
        return self.session.written

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("hooktrace: the Trainer passed no model to on_train_begin")
        self.session.start(model)
        if self.session.scalars is not None:
            _first_in_line(self)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        # The Trainer hands the same logs dict to every callback in turn, the report_to
        # integrations (TensorBoard, W&B, MLflow) included: this one comes first
        # (_first_in_line), so they write the scalars added here. The mean of each over
        # the steps since the last log, each window weighted by its steps; the modules
        # are chosen at the first log from the windows after the warm-up one (issue #47).
        if logs is None or any(k.startswith("eval_") for k in logs):
            return
        logs.update(weighted_means((steps, scalars) for _, steps, scalars
                                   in self.session.take_pending(force=True)))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.finish(rank=int(args.process_index), world_size=int(args.world_size))


def _first_in_line(callback: Any) -> None:
    """Move ``callback`` to the front of the Trainer's callbacks, so that its ``on_log``
    adds to ``logs`` before the report_to integrations read them (the Trainer puts the
    user's callbacks after its own). The handler is the caller of this event
    (``CallbackHandler.call_event``): the transformers API gives callbacks no other way
    to it. Moving an earlier entry is safe while it iterates (the next index is the
    same callback)."""
    import sys
    import warnings

    from transformers.trainer_callback import CallbackHandler

    frame = sys._getframe(2)
    while frame is not None and not isinstance(frame.f_locals.get("self"), CallbackHandler):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        warnings.warn("hooktrace: could not find the Trainer's callbacks: the per-step "
                      "scalars reach only the callbacks after this one", RuntimeWarning,
                      stacklevel=3)
        return
    callbacks = frame.f_locals["self"].callbacks
    if callbacks and callbacks[0] is not callback and callback in callbacks:
        callbacks.remove(callback)
        callbacks.insert(0, callback)
