"""The profiler merge's old home: it moved down to :mod:`hooktrace.exporters.merged`
(issue #27: an output, written next to the other exporters, so ``exporters/`` and
this module no longer import each other). ``from hooktrace.merge import
merge_traces`` keeps working: its public names are the same objects here.
"""

from __future__ import annotations

from typing import Any

from hooktrace.exporters.merged import (
    BASE_MARGIN_NS,
    MergeError,
    MergeResult,
    ProfilerTraceError,
    RunLike,
    as_run,
    assign_lanes,
    attribute,
    check_compatible,
    crossing,
    merge_traces,
    place_spans,
    run_interval,
    write_spans,
)

__all__ = [
    "BASE_MARGIN_NS", "MergeError", "MergeResult", "ProfilerTraceError", "RunLike", "as_run",
    "assign_lanes", "attribute", "check_compatible", "crossing", "merge_traces", "place_spans",
    "run_interval", "write_spans",
]

_MOVED_TO_PROFILING = frozenset({"profile", "Profile", "merged_trace_handler",
                                 "MergedTraceHandler"})


def __getattr__(name: str) -> Any:
    # profile() records, so it moved up to the recording layer (issue #16).
    if name in _MOVED_TO_PROFILING:
        raise AttributeError(f"hooktrace.merge.{name} moved to hooktrace.record.profiling.{name} "
                             "(hooktrace.profile is unchanged)")
    raise AttributeError(f"module 'hooktrace.merge' has no attribute {name!r}")
