"""Formatting at the bottom of the package: durations, counts and byte sizes as a
person reads them, a flight-recorder dump's one-line-per-thread account, and the
line that says where to open a trace.

Nothing here imports hooktrace: the summary, the diff, the exporters, the report
and the commands all format through these.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["OPEN_HINT", "csv_text", "describe_dump", "format_bytes", "format_count", "format_ns",
           "open_hint"]

def open_hint(what: str) -> str:
    """Where to open a trace ``what`` names (an export or a merge: never a .htrace)."""
    return f"open {what} at https://ui.perfetto.dev (Open trace file) or in chrome://tracing (Load)"


OPEN_HINT = open_hint("it")


def format_ns(ns: float) -> str:
    """Human-readable duration.

    Example:
        >>> format_ns(850), format_ns(12_345), format_ns(4_560_000), format_ns(2.5e9)
        ('850 ns', '12.3 µs', '4.56 ms', '2.50 s')
    """
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    for scale, unit in ((1e3, "µs"), (1e6, "ms")):
        if a < scale * 1e3:
            v = ns / scale
            digits = 2 if abs(v) < 10 else 1 if abs(v) < 100 else 0
            return f"{v:.{digits}f} {unit}"
    return f"{ns / 1e9:.2f} s"


def format_count(value: float, unit: str) -> str:
    """``1.23 GFLOP``-style: SI prefixes, three significant digits."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def format_bytes(n: float) -> str:
    """Human-readable byte count (binary units, signed).

    Example:
        >>> format_bytes(512), format_bytes(98304), format_bytes(-3 * 2**20), format_bytes(0)
        ('512 B', '96.0 KiB', '-3.00 MiB', '0 B')
    """
    a = abs(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= scale:
            v = n / scale
            digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
            return f"{v:.{digits}f} {unit}"
    return f"{n:.0f} B"


def describe_dump(info: dict[str, Any]) -> list[str]:
    """One line per thread of a dump's ``info["dump"]``: where it was."""
    d = info.get("dump")
    if not isinstance(d, dict):
        return []
    step = d.get("step")
    where = f", step {step}" if isinstance(step, int) else ""
    lines = []
    if d.get("error_in"):
        lines.append(f"{d.get('exception', 'an exception')} raised inside "
                     f"{d['error_in']} forward{where}")
    for t in d.get("threads", []):
        if not isinstance(t, dict) or not t.get("open"):
            continue
        lines.append(f"{t.get('name')} is inside {t['open'][-1]} forward{where}, for "
                     f"{t.get('since_ns', 0) / 1e9:.1f} s")
    if not lines:
        lines.append(f"no thread is inside a traced module call{where}")
    return lines


def csv_text(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """CSV text of ``rows`` (dicts) with a header of ``columns``; None is blank."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()
