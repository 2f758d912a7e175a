"""The profiler merge's old home: it moved down to :mod:`hooktrace.exporters.merged`
(issue #27: an output, written next to the other exporters, so ``exporters/`` and
this module no longer import each other). ``from hooktrace.merge import
merge_traces`` keeps working: its public names are the same objects here.
"""

from __future__ import annotations

from typing import Any

# every public name of exporters/merged.py (its __all__)
from hooktrace.exporters.merged import *  # noqa: F403
from hooktrace.exporters.merged import __all__ as __all__

_MOVED_TO_PROFILING = frozenset({"profile", "Profile", "merged_trace_handler",
                                 "MergedTraceHandler"})


def __getattr__(name: str) -> Any:
    # profile() records, so it moved up to the recording layer (issue #16).
    if name in _MOVED_TO_PROFILING:
        raise AttributeError(f"hooktrace.merge.{name} moved to hooktrace.record.profiling.{name} "
                             "(hooktrace.profile is unchanged)")
    raise AttributeError(f"module 'hooktrace.merge' has no attribute {name!r}")
