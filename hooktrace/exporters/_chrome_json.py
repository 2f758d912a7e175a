"""Chrome trace JSON text, shared by every writer of Chrome JSON (the Chrome
exporter, the profiler merge and the rank merge): one home for the number and
value spellings, so the three files agree to the character.

Not an exporter: it writes no file and imports no exporter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["SkipFirstComma", "dumps", "micros"]


def dumps(value: Any) -> str:
    """Compact JSON text of ``value`` (no spaces, non-ASCII kept as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def micros(ns: int) -> str:
    """Exact ``<us>.<3 digits>`` text of integer nanoseconds (as csrc/chrome_writer
    does), negative values included: ``micros(-1500) == "-1.500"``.

    >>> micros(1500), micros(-1500), micros(-1), micros(0)
    ('1.500', '-1.500', '-0.001', '0.000')
    """
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


class SkipFirstComma:
    """Writes ``,\\n{event}`` items as elements of a JSON array: drops the first one's
    leading ',' (``skip=False``: the array has elements already, drop none)."""

    def __init__(self, write: Callable[[bytes], Any], skip: bool = True) -> None:
        self._write, self._skip = write, skip

    def __call__(self, data: bytes) -> None:
        if self._skip and data:
            if data.startswith(b","):
                data = data[1:]
            self._skip = False
        self._write(data)
