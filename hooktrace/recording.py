"""Moved: the recorder is :mod:`hooktrace.record` (issue #16). Kept for imports."""

from hooktrace.record.recorder import (  # noqa: F401
    DEFAULT_CAPACITY,
    MAX_CAPACITY,
    STREAM_CAPACITY,
    Policy,
    Recorder,
    Trace,
    _check_capacity,
    _SigintDeferred,
    _version,
    trace,
    window_handler,
)
