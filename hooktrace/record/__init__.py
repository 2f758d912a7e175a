"""Recording: one recorder (record/recorder.py) over one native hot path
(record/dispatch.py, csrc/module_call.h), with two scopes (record/scopes.py)."""

from hooktrace.record.recorder import (
    DEFAULT_CAPACITY,
    GlobalTrace,
    Recorder,
    Trace,
    global_trace,
    trace,
    window_handler,
)

__all__ = ["DEFAULT_CAPACITY", "GlobalTrace", "Recorder", "Trace", "global_trace", "trace",
           "window_handler"]
