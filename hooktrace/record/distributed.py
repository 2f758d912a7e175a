"""Many ranks (issue #11): which rank a trace is, clock alignment across ranks, and
where each rank writes its file. The public face of :mod:`hooktrace.record.ranks`
(which documents the measurement); the measurements taken are recorder state and
live there (issue #27).

Example::

    from hooktrace.record.distributed import align_clocks, default_output_name
    with hooktrace.trace(model) as tr:
        align_clocks()                 # collective: every rank calls it (start)
        train()
        align_clocks()                 # ... and at the end
    tr.save(default_output_name("traces/run"))
"""

from __future__ import annotations

from hooktrace.record.ranks import (
    DEFAULT_ROUNDS,
    TEST_OFFSET_ENV,
    ClockOffset,
    align_clocks,
    apply_test_clock_offset,
    clock_offset_summary,
    default_output_name,
    estimate_clock_offset,
    injected_offset_ns,
    rank_info,
)

__all__ = [
    "DEFAULT_ROUNDS",
    "TEST_OFFSET_ENV",
    "ClockOffset",
    "align_clocks",
    "apply_test_clock_offset",
    "clock_offset_summary",
    "default_output_name",
    "estimate_clock_offset",
    "injected_offset_ns",
    "rank_info",
]
