"""Moved: the recorder is :mod:`hooktrace.record` (issue #16). Kept for imports."""

from hooktrace.record.recorder import GlobalTrace, global_trace  # noqa: F401

__all__ = ["GlobalTrace", "global_trace"]
