"""Per-module call statistics of one run, computed with vectorized numpy.

Example:
    >>> import numpy as np
    >>> from hooktrace._events import EVENT_DTYPE, Clock
    >>> from hooktrace.reading import TraceData
    >>> ev = np.zeros(4, EVENT_DTYPE)
    >>> ev["kind"] = [1, 1, 2, 2]; ev["id"] = [0, 1, 1, 0]; ev["t"] = [0, 1000, 3000, 5000]
    >>> trace = TraceData(ev, [("", "Net"), ("fc", "Linear")], [], Clock(0, 0, 1.0),
    ...                   {"pid": 1, "hostname": "h", "dropped_events": 0,
    ...                    "overwritten_events": 0})
    >>> s = trace.summary()
    >>> [(r["module"], r["calls"], r["total_ns"], r["self_ns"]) for r in s.rows]
    [('', 1, 5000, 3000), ('fc', 1, 2000, 2000)]
    >>> print(s)  # doctest: +NORMALIZE_WHITESPACE
    module  type    phase   calls  total  self   mean   p50    p99
    <root>  Net     forward     1  5.00 µs  3.00 µs  5.00 µs  5.00 µs  5.00 µs
    fc      Linear  forward     1  2.00 µs  2.00 µs  2.00 µs  2.00 µs  2.00 µs
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.reading import CAT_NAMES, Spans

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

__all__ = ["Summary", "format_ns"]

_COLUMNS = ("module", "type", "phase", "calls", "total_ns", "self_ns", "mean_ns", "p50_ns",
            "p99_ns")


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


def _percentile_sorted(values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                       q: float) -> np.ndarray:
    """np.percentile's default (linear) per group of an already group-sorted array."""
    pos = q / 100.0 * (counts - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, counts - 1)
    frac = pos - lo
    v_lo = values[starts + lo].astype(np.float64)
    v_hi = values[starts + hi].astype(np.float64)
    return v_lo + (v_hi - v_lo) * frac


class Summary:
    """Per (module, phase) statistics: calls, total, self, mean, p50, p99 (in ns).

    Rows are sorted by total time, descending. ``str(summary)`` is an aligned
    table (``summary.to_text(top=10)`` for the first rows only), ``to_csv()`` and
    ``to_json()`` give the same rows as ``rows`` (a list of dicts) in those
    forms. A footer names lost or partial data (dropped / overwritten events,
    orphan exits, unfinished spans) whenever there is any.
    """

    def __init__(self, rows: list[dict[str, Any]], counts: dict[str, int]) -> None:
        self.rows = rows
        self.counts = counts

    @classmethod
    def from_trace(cls, trace: TraceData) -> Summary:
        spans = trace.spans()
        counts = {
            "dropped_events": trace.dropped_events,
            "overwritten_events": trace.overwritten_events,
            "orphan_exits": spans.orphan_exits,
            "unfinished_spans": spans.unfinished,
        }
        return cls(cls._rows(spans, trace.modules), counts)

    @staticmethod
    def _rows(spans: Spans, modules: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        if not len(spans):
            return []
        # Dense group id per (cat, module). Sorting it is a radix sort when it fits
        # 16 bits, and one sort of (group, duration) packed in an int64 gives the
        # per-group sorted durations for the percentiles: ~5x faster than
        # np.lexsort((dur, key)) on 5 M spans (1.5 s -> 0.3 s measured).
        n_mod = int(spans.module.max()) + 1
        g = spans.cat.astype(np.int64) * n_mod + spans.module.astype(np.int64)
        n_groups = int(g.max()) + 1
        dur = spans.duration_ns
        order = np.argsort(g.astype(np.uint16) if n_groups <= 1 << 16 else g, kind="stable")
        g_s = g[order]
        starts = np.flatnonzero(np.r_[True, g_s[1:] != g_s[:-1]])
        counts = np.diff(np.r_[starts, len(g_s)])
        total = np.add.reduceat(dur[order], starts)
        self_total = np.add.reduceat(spans.self_ns[order], starts)
        lo = int(dur.min())
        width = int(dur.max()) - lo + 1
        if n_groups * width < 1 << 62:
            dur_s = np.sort(g * width + (dur - lo)) - g_s * width + lo
        else:  # durations too spread out to pack next to the group id
            dur_s = dur[np.lexsort((dur, g))]
        p50 = _percentile_sorted(dur_s, starts, counts, 50)
        p99 = _percentile_sorted(dur_s, starts, counts, 99)
        group = g_s[starts]
        mod = group % n_mod
        cat = group // n_mod
        # Sort by total descending; stable on (cat, module) for equal totals.
        by_total = np.argsort(-total, kind="stable")
        rows = []
        for g in by_total.tolist():
            m = int(mod[g])
            name, type_name = modules[m] if m < len(modules) else (f"<module {m}>", "?")
            c = int(cat[g])
            rows.append({
                "module": name,
                "type": type_name,
                "phase": CAT_NAMES[c] if c < len(CAT_NAMES) else str(c),
                "calls": int(counts[g]),
                "total_ns": int(total[g]),
                "self_ns": int(self_total[g]),
                "mean_ns": float(total[g]) / int(counts[g]),
                "p50_ns": float(p50[g]),
                "p99_ns": float(p99[g]),
            })
        return rows

    def footer(self) -> str:
        """One line naming lost or partial data; ``""`` when there is none."""
        c = self.counts
        if not any(c.values()):
            return ""
        return (
            f"note: {c['dropped_events']} events dropped, {c['overwritten_events']} overwritten "
            f"(ring buffer), {c['orphan_exits']} orphan exits, {c['unfinished_spans']} "
            "unfinished spans - totals may be incomplete"
        )

    def to_text(self, top: int | None = None) -> str:
        """Aligned text table of the first ``top`` rows (all when None)."""
        rows = self.rows if top is None else self.rows[:top]
        header = ["module", "type", "phase", "calls", "total", "self", "mean", "p50", "p99"]
        table = [header] + [
            [
                r["module"] or "<root>",
                r["type"],
                r["phase"],
                str(r["calls"]),
                *(format_ns(r[k]) for k in ("total_ns", "self_ns", "mean_ns", "p50_ns",
                                            "p99_ns")),
            ]
            for r in rows
        ]
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        left = 3  # module, type, phase are left-aligned; numbers right-aligned
        lines = [
            "  ".join(
                cell.ljust(w) if i < left else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(line, widths))
            ).rstrip()
            for line in table
        ]
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more rows")
        foot = self.footer()
        if foot:
            lines.append(foot)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Summary {len(self.rows)} rows>"

    def to_csv(self) -> str:
        """CSV text with a header row; durations in ns."""
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(_COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        return out.getvalue()

    def to_json(self) -> str:
        """JSON text: ``{"rows": [...], "counts": {...}}``; durations in ns."""
        return json.dumps({"rows": self.rows, "counts": self.counts}, ensure_ascii=False)
