"""Flight-recorder dumps: the open module calls and Python stacks of every thread,
written on an exception, a signal, a hang or the first non-finite value. The public
face of :mod:`hooktrace.record.flight` (which documents them): the dumps are taken
by the recorder, and their state lives in ``hooktrace/record/`` (issue #27).

Example::

    from hooktrace.flight import dump
    with hooktrace.trace(model, policy="ring"):
        ...
        dump("dumps/")                # writes the newest events and every stack
"""

from __future__ import annotations

from hooktrace.record.flight import (
    DUMP_REASONS,
    FlightRecorder,
    describe,
    dump,
    open_calls,
    write_dump,
)

__all__ = ["DUMP_REASONS", "FlightRecorder", "describe", "dump", "open_calls", "write_dump"]
