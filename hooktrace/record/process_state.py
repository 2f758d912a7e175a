"""The process-wide recording state (issue #27): what ``hooktrace run`` /
``HOOKTRACE=1`` and the flight recorder keep for the whole process, in one place.

``STATE`` is the one registry; flight.py, launch.py and _autostart.py read and write
its attributes (no module of theirs holds mutable state or rebinds a global).
``STATE.lock`` guards ``active`` and ``dumps_written``, which any thread may touch
(a dump from a watchdog thread, a trace started on another thread); the others are
set and read on the main thread only (start, SIGTERM, atexit).

Imports nothing of hooktrace: ``hooktrace-autostart.pth`` reaches it at interpreter
startup.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["STATE", "ProcessState"]


class ProcessState:
    """One process's recording singletons."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # flight recorder: the recording traces hooktrace.dump() covers, and the
        # number of dumps written so far (dumps are numbered per process)
        self.active: list[Any] = []
        self.dumps_written = 0
        # hooktrace run --profile: its torch.profiler while it runs
        self.profiler: Any = None
        # the SIGTERM handler launch.start() installed, while it is installed
        self.sigterm_handler: Any = None
        # HOOKTRACE=1: the running global trace, if this process was started traced
        self.autostart_trace: Any = None
        # hooktrace attach: the attachment recording in this process, until it detached
        # (hooktrace.record.attach_agent)
        self.attachment: Any = None
        # hooktrace run --aggregate (or HOOKTRACE=1): the process-wide trace's aggregate
        # component while it records (hooktrace.record.aggregate: a second aggregate=
        # trace is refused, a trainer callback's uses it)
        self.aggregating: Any = None

    def next_dump_number(self) -> int:
        """The number of the next dump of this process (0, 1, ...)."""
        with self.lock:
            n = self.dumps_written
            self.dumps_written += 1
            return n


STATE = ProcessState()
