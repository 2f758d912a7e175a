"""Recording: one recorder (record/recorder.py) over one native hot path
(record/dispatch.py, csrc/module_call.h), with two scopes (record/scopes.py), one
component per recording feature (record/component.py), the options checked once
(record/options.py). Around it, the rest of the recording side: ``hooktrace run`` and
``HOOKTRACE=1`` (record/launch.py), schedule windows (record/windows.py), flight-recorder
dumps (record/flight.py), many ranks (record/distributed.py over record/ranks.py), the
profiler merged in (record/profiling.py) and ``hooktrace attach`` (record/attach.py,
record/attach_agent.py in the target).

The names are imported on first use: ``hooktrace run --help`` reads the options' help
(record/options.py) without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hooktrace.record.options import RecordOptions
    from hooktrace.record.recorder import (
        DEFAULT_CAPACITY,
        GlobalTrace,
        Recorder,
        Trace,
        global_trace,
        trace,
        window_handler,
    )

__all__ = ["DEFAULT_CAPACITY", "GlobalTrace", "RecordOptions", "Recorder", "Trace",
           "global_trace", "trace", "window_handler"]


def __getattr__(name: str) -> Any:
    if name == "RecordOptions":
        from hooktrace.record.options import RecordOptions

        return RecordOptions
    if name in __all__:
        from hooktrace.record import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'hooktrace.record' has no attribute {name!r}")
