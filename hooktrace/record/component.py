"""One recording feature, one component (issue #27).

A :class:`~hooktrace.record.recorder.Recorder` records module calls (its scope and the
native hot path) and composes the components its options enable; each feature
(backward, memory, shapes, numerics, FLOPs, kernel marks, profiler ranges) is a
:class:`Component` in its own file under ``hooktrace/record/``, and the recorder holds
no branch on any of them. The recorder calls, in the components' order:

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

None of these is on the hot path: a module call runs native code only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hooktrace.record.options import RecordOptions

__all__ = ["Component"]


class Component:
    """A recording feature; every method but :meth:`enabled` does nothing by default."""

    # Whether it drains the session's events as it goes (aggregate=): the recorder's
    # result then holds the events not drained yet, not every event recorded.
    drains = False

    @classmethod
    def enabled(cls, options: RecordOptions) -> bool:
        """Whether these options turn the feature on."""
        return True

    @classmethod
    def check(cls, options: RecordOptions) -> None:
        """Raises the one-line error for options this feature refuses together."""

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

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
