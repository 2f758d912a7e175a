"""Per-module summary against a straightforward per-group reference."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict

import numpy as np
import pytest
from conftest import build_events, build_trace, random_stream

from hooktrace._events import ENTER, EXIT, Clock
from hooktrace.summary import Summary, format_ns

CLOCK = Clock(ticks0=0, unix_ns0=1_700_000_000_000_000_000, ns_per_tick=1.37)


def reference_rows(trace) -> dict[str, dict]:
    s = trace.spans()
    groups: dict[int, list[int]] = defaultdict(list)
    for i, m in enumerate(s.module.tolist()):
        groups[m].append(i)
    out = {}
    for m, idx in groups.items():
        dur = (s.end_ns[idx] - s.start_ns[idx]).astype(np.int64)
        out[trace.modules[m][0]] = {
            "calls": len(idx),
            "total_ns": int(dur.sum()),
            "self_ns": int(s.self_ns[idx].sum()),
            "mean_ns": float(dur.mean()),
            "p50_ns": float(np.percentile(dur, 50)),
            "p99_ns": float(np.percentile(dur, 99)),
        }
    return out


@pytest.mark.parametrize("seed", range(10))
def test_numbers_match_reference(seed):
    trace = build_trace(random_stream(seed, calls_per_thread=200, p_node=0), clock=CLOCK)
    rows = trace.summary().rows
    ref = reference_rows(trace)
    assert len(rows) == len(ref)
    for row in rows:
        expected = ref[row["module"]]
        for key in ("calls", "total_ns", "self_ns"):
            assert row[key] == expected[key], key
        for key in ("mean_ns", "p50_ns", "p99_ns"):
            assert row[key] == pytest.approx(expected[key], rel=1e-12), key
    totals = [r["total_ns"] for r in rows]
    assert totals == sorted(totals, reverse=True)


def test_self_time_excludes_children():
    # GIVEN root 0..100 with children 10..30 and 40..70
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 10), (1, EXIT, 1, 30),
                       (1, ENTER, 1, 40), (1, EXIT, 1, 70), (1, EXIT, 0, 100)])
    rows = {r["module"]: r for r in build_trace(ev).summary().rows}
    assert rows[""]["total_ns"] == 100 and rows[""]["self_ns"] == 50
    assert rows["layer.1"]["calls"] == 2 and rows["layer.1"]["self_ns"] == 50
    assert rows["layer.1"]["p50_ns"] == 25.0


def test_text_table_is_aligned_and_top_limits_rows():
    trace = build_trace(random_stream(1), clock=CLOCK)
    summary = trace.summary()
    lines = str(summary).splitlines()
    assert lines[0].split() == ["module", "type", "phase", "calls", "total", "self", "mean", "p50",
                                "p99"]
    table = [line for line in lines if not line.startswith(("note:", "..."))]
    assert len(table) == len(summary.rows) + 1
    # right-aligned numeric columns: every table line ends at the same column
    assert len({len(line) for line in table}) == 1
    short = summary.to_text(top=2).splitlines()
    assert len(short) >= 3 and short[3].startswith("... ")


def test_footer_whenever_something_was_lost():
    clean = build_events([(1, ENTER, 0, 0), (1, EXIT, 0, 10)])
    assert "note:" not in str(build_trace(clean).summary())
    for info in ({"dropped_events": 1}, {"overwritten_events": 2}):
        text = str(build_trace(clean, **info).summary())
        assert text.splitlines()[-1].startswith("note:")
    orphan = build_events([(1, EXIT, 0, 0), (1, ENTER, 0, 1), (1, EXIT, 0, 10)])
    assert "1 orphan exits" in str(build_trace(orphan).summary())
    unfinished = build_events([(1, ENTER, 0, 0)])
    assert "1 unfinished spans" in str(build_trace(unfinished).summary())


def test_csv_and_json_forms_carry_the_rows():
    summary = build_trace(random_stream(5), clock=CLOCK, dropped_events=4).summary()
    parsed = list(csv.DictReader(io.StringIO(summary.to_csv())))
    assert [r["module"] for r in parsed] == [r["module"] for r in summary.rows]
    assert [int(r["total_ns"]) for r in parsed] == [r["total_ns"] for r in summary.rows]
    doc = json.loads(summary.to_json())
    assert doc["rows"] == summary.rows
    assert doc["counts"]["dropped_events"] == 4


def test_empty_trace_summary():
    summary = build_trace(build_events([]), []).summary()
    assert summary.rows == []
    assert str(summary).splitlines()[0].startswith("module")


@pytest.mark.parametrize(("ns", "text"), [(0, "0 ns"), (999, "999 ns"), (1_500, "1.50 µs"),
                                          (25_000, "25.0 µs"), (250_000, "250 µs"),
                                          (3_210_000, "3.21 ms"), (7.5e9, "7.50 s")])
def test_format_ns(ns, text):
    assert format_ns(ns) == text


def test_summary_type():
    assert isinstance(build_trace(build_events([])).summary(), Summary)


def test_huge_duration_spread_uses_the_fallback_sort():
    ev = build_events([(1, ENTER, 1, 0), (1, EXIT, 1, 2**62), (1, ENTER, 1, 2**62),
                       (1, EXIT, 1, 2**62 + 3), (1, ENTER, 2, 2**62 + 5),
                       (1, EXIT, 2, 2**62 + 6)])
    trace = build_trace(ev, clock=Clock(0, 0, 1.0))
    ref = reference_rows(trace)
    for row in trace.summary().rows:
        assert row["total_ns"] == ref[row["module"]]["total_ns"]
        assert row["p50_ns"] == pytest.approx(ref[row["module"]]["p50_ns"])
