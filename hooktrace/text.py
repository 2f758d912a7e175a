"""Formatting at the bottom of the package: durations, counts and byte sizes as a
person reads them, a flight-recorder dump's one-line-per-thread account, and the
line that says where to open a trace.

Nothing here imports hooktrace: the summary, the diff, the exporters, the report
and the commands all format through these.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["OPEN_HINT", "align_columns", "csv_text", "describe_dump", "display_path", "format_bytes",
           "format_count", "format_ns", "open_hint", "shorten_middle"]

def display_path(path: str) -> str:
    r"""A file name as text that any UTF-8 output can hold: bytes of the name that are
    not UTF-8 (which Python keeps as lone surrogates) are written ``\xNN``.

    Example:
        >>> display_path("runs/r\udcff.htrace"), display_path("ok/é.htrace")
        ('runs/r\\xff.htrace', 'ok/é.htrace')
    """
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


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


def align_columns(table: Sequence[Sequence[str]], left: int) -> list[str]:
    """Lines of ``table`` (its first row the header) in aligned columns, two spaces
    apart: the first ``left`` columns flush left, the others flush right."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in table]


_MARKERS = re.compile(r"( \[[a-z]+\])+$")


def shorten_middle(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters: its start (up to a third,
    ending at a ``.`` when there is one) and as much of its end as fits, so the leaf
    module's name is never lost.

    Example:
        >>> shorten_middle("model.layers.11.self_attn.q_proj", 24)
        'model.….self_attn.q_proj'
        >>> shorten_middle("VeryLongModuleClassName", 12)
        'Ver…lassName'
        >>> shorten_middle("transformer.h.0.attn.c_attn [eval] [kernels]", 32)
        'tran…ttn.c_attn [eval] [kernels]'

    Markers at the end (`` [eval]``, `` [kernels]``) are kept whole.
    """
    if len(text) <= width:
        return text
    marks = _MARKERS.search(text)
    if marks is not None and marks.start() > 0 and width - len(marks.group()) >= 8:
        return shorten_middle(text[:marks.start()], width - len(marks.group())) + marks.group()
    if width < 4:
        return text[len(text) - width:]
    room = (width - 1) // 3
    dot = text.rfind(".", 0, room)
    head = text[:dot + 1] if dot >= 0 else text[:room]
    return head + "…" + text[len(text) - (width - 1 - len(head)):]
