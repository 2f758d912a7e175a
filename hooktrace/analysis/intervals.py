"""Interval arithmetic shared by the straggler tables and the ``steps`` table (no
pyarrow: :mod:`hooktrace.analysis.stragglers` imports it)."""

from __future__ import annotations

import numpy as np

__all__ = ["union_per_step"]


def union_per_step(start: np.ndarray, end: np.ndarray, step_start: np.ndarray,
                   step_end: np.ndarray) -> np.ndarray:
    """Per step: the length of the union of the intervals, clipped to the step.

    Example:
        >>> import numpy as np
        >>> union_per_step(np.array([0, 5, 20]), np.array([10, 12, 25]),
        ...                np.array([0, 15]), np.array([15, 30])).tolist()
        [12, 5]
    """
    covered = np.zeros(len(step_start), np.int64)
    if not len(start) or not len(step_start):
        return covered
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]  # a segment starts past everything before
    seg_start = s[new]
    seg_end = np.maximum.reduceat(e, np.flatnonzero(new))
    for i in range(len(step_start)):  # steps are few; segments are sliced by searchsorted
        a, b = int(step_start[i]), int(step_end[i])
        lo = np.searchsorted(seg_end, a, "right")
        hi = np.searchsorted(seg_start, b, "left")
        if hi > lo:
            covered[i] = int((np.minimum(seg_end[lo:hi], b) - np.maximum(seg_start[lo:hi], a))
                             .clip(0).sum())
    return covered
