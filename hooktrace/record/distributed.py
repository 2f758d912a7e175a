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

# every public name of record/ranks.py (its __all__)
from hooktrace.record.ranks import *  # noqa: F403
from hooktrace.record.ranks import __all__ as __all__
