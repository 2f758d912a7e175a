"""Number types for command-line options: a float option takes finite numbers only.

``float("nan")`` and ``float("inf")`` parse, and a NaN compares false with every
bound, so ``--threshold nan`` would pass a ``< 0`` check and switch a comparison off
silently. :func:`finite_float` (argparse ``type=``) refuses them as a one-line usage
error; each option still checks its own range.

Example:
    >>> finite_float("0.5"), finite_float("1e3")
    (0.5, 1000.0)
    >>> finite_float("nan")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a finite number, got 'nan'
"""

from __future__ import annotations

import argparse
import math

__all__ = ["finite_float"]


def finite_float(text: str) -> float:
    """``text`` as a finite float; ``argparse.ArgumentTypeError`` otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
