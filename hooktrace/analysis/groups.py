"""Grouped statistics of the analysis layer (issue #37): the one percentile function
every per-module table uses.

Example:
    >>> import numpy as np
    >>> values = np.array([1, 2, 3, 4, 10, 20])        # group 0: 1..4, group 1: 10, 20
    >>> starts, counts = np.array([0, 4]), np.array([4, 2])
    >>> group_percentile(values, starts, counts, 50).tolist()
    [2.5, 15.0]
    >>> [float(np.percentile(values[:4], 50)), float(np.percentile(values[4:], 50))]
    [2.5, 15.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["group_percentile"]


def group_percentile(values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                     q: float) -> np.ndarray:
    """``np.percentile(group, q)`` (its default, linear interpolation) of each group of
    ``values``, an array sorted by group and, within a group, by value; group ``i`` is
    ``values[starts[i] : starts[i] + counts[i]]`` (``counts`` > 0). float64."""
    pos = q / 100.0 * (counts - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    v_lo = values[starts + lo].astype(np.float64)
    v_hi = values[starts + hi].astype(np.float64)
    return v_lo + (v_hi - v_lo) * (pos - lo)
