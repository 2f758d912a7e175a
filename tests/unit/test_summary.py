"""Per-module summary against a straightforward per-group reference."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from conftest import NODE_NAMES, backward_trace, build_events, build_trace, random_stream

from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, Clock
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, CAT_RECOMPUTE
from hooktrace.summary import UNATTRIBUTED, Summary, format_ns

CLOCK = Clock(ticks0=0, unix_ns0=1_700_000_000_000_000_000, ns_per_tick=1.37)


def reference_rows(trace) -> dict[tuple[str, str], dict]:
    """Rows keyed by (module, type), computed one group at a time."""
    s = trace.spans()
    out: dict[tuple[str, str], dict] = {}

    def stats(idx: list[int], prefix: str) -> dict:
        if not idx:
            return {f"{prefix}calls": 0, f"{prefix}total_ns": 0, f"{prefix}self_ns": 0,
                    f"{prefix}p50_ns": None, f"{prefix}p99_ns": None}
        dur = (s.end_ns[idx] - s.start_ns[idx]).astype(np.int64)
        return {f"{prefix}calls": len(idx), f"{prefix}total_ns": int(dur.sum()),
                f"{prefix}self_ns": int(s.self_ns[idx].sum()),
                **({"mean_ns": dur.mean()} if not prefix else {}),
                f"{prefix}p50_ns": float(np.percentile(dur, 50)),
                f"{prefix}p99_ns": float(np.percentile(dur, 99))}

    for m in sorted(set(s.module.tolist())):
        of = {cat: [i for i in range(len(s)) if s.module[i] == m and s.cat[i] == cat]
              for cat in (CAT_FORWARD, CAT_BACKWARD, CAT_RECOMPUTE)}
        row = {**stats(of[CAT_FORWARD], ""), **stats(of[CAT_BACKWARD], "bwd_")}
        row["recompute_calls"] = len(of[CAT_RECOMPUTE])
        row["recompute_total_ns"] = int(sum(s.end_ns[i] - s.start_ns[i]
                                            for i in of[CAT_RECOMPUTE]))
        row["bwd_fwd_ratio"] = (row["bwd_total_ns"] / row["total_ns"]
                                if row["bwd_calls"] and row["total_ns"] else None)
        out[trace.modules[m]] = row
    nodes = s.nodes
    for k in sorted(set(nodes.name[nodes.span < 0].tolist())):
        self_ns = nodes.self_ns[(nodes.span < 0) & (nodes.name == k)]
        out[(UNATTRIBUTED, trace.node_names[k])] = {
            "calls": None, "total_ns": None, "self_ns": None, "bwd_calls": len(self_ns),
            "bwd_total_ns": int(self_ns.sum()), "bwd_self_ns": int(self_ns.sum()),
            "bwd_p50_ns": float(np.percentile(self_ns, 50)),
            "bwd_p99_ns": float(np.percentile(self_ns, 99)), "bwd_fwd_ratio": None,
            "recompute_calls": None}
    return out


def check_against_reference(trace) -> list[dict]:
    rows = trace.summary().rows
    ref = reference_rows(trace)
    assert len(rows) == len(ref)
    for row in rows:
        expected = ref[(row["module"], row["type"])]
        for key, value in expected.items():
            if isinstance(value, float):
                assert row[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert row[key] == value, key
    keys = [(r["total_ns"] or 0) + r["bwd_total_ns"] for r in rows]
    assert keys == sorted(keys, reverse=True)
    return rows


@pytest.mark.parametrize("seed", range(10))
def test_numbers_match_reference(seed):
    trace = build_trace(random_stream(seed, calls_per_thread=200), clock=CLOCK)
    rows = check_against_reference(trace)
    assert all(r["bwd_calls"] == 0 and r["bwd_fwd_ratio"] is None for r in rows)


@pytest.mark.parametrize("seed", range(10))
def test_backward_columns_match_reference(seed):
    # GIVEN forward, backward and recompute spans, and unattributed nodes
    trace = backward_trace(seed)
    # WHEN summarized THEN every column matches the per-group reference
    rows = check_against_reference(trace)
    assert any(r["bwd_fwd_ratio"] for r in rows)
    assert any(r["recompute_calls"] for r in rows)
    loose = [r for r in rows if r["module"] == UNATTRIBUTED]
    assert loose and {r["type"] for r in loose} <= set(NODE_NAMES)
    assert sum(r["bwd_total_ns"] for r in loose) == trace.summary().counts["unattributed_ns"]


def test_self_time_excludes_children():
    # GIVEN root 0..100 with children 10..30 and 40..70
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 10), (1, EXIT, 1, 30),
                       (1, ENTER, 1, 40), (1, EXIT, 1, 70), (1, EXIT, 0, 100)])
    rows = {r["module"]: r for r in build_trace(ev).summary().rows}
    assert rows[""]["total_ns"] == 100 and rows[""]["self_ns"] == 50
    assert rows["layer.1"]["calls"] == 2 and rows["layer.1"]["self_ns"] == 50
    assert rows["layer.1"]["p50_ns"] == 25.0


FOOTER = ("note:", "...", "sorted by", "bwd_total:")


def test_text_table_is_aligned_and_top_limits_rows():
    trace = build_trace(random_stream(1), clock=CLOCK)
    summary = trace.summary()
    lines = str(summary).splitlines()
    assert lines[0].split() == ["module", "type", "calls", "total", "self", "p50"]
    assert summary.to_text(wide=True).splitlines()[0].split() == [
        "module", "type", "calls", "total", "self", "mean", "p50", "p99"]
    table = [line for line in lines if not line.startswith(FOOTER)]
    assert len(table) == len(summary.rows) + 1
    # right-aligned numeric columns: every table line ends at the same column
    assert len({len(line) for line in table}) == 1
    short = summary.to_text(top=2).splitlines()
    assert len(short) >= 3 and short[3].startswith("... ")
    # the footer says how rows are sorted
    assert "sorted by forward total + backward total, descending" in lines


def test_text_table_with_backward_and_recompute():
    summary = backward_trace(3).summary()
    lines = summary.to_text(wide=True).splitlines()
    assert lines[0].split() == ["module", "type", "calls", "total", "self", "mean", "p50", "p99",
                                "bwd_calls", "bwd_total", "bwd_self", "bwd_p50", "bwd_p99",
                                "bwd/fwd", "recompute", "recompute_total"]
    assert str(summary).splitlines()[0].split() == [
        "module", "type", "calls", "total", "self", "p50", "bwd_total", "bwd_self", "bwd/fwd",
        "recompute"]
    assert any(line.startswith(UNATTRIBUTED) for line in lines)
    assert lines[-1].startswith("note: ") and "autograd nodes" in lines[-1]
    assert any(line.startswith("bwd_total: first to last autograd node") for line in lines)
    no_recompute = backward_trace(3, with_recompute=False).summary()
    assert "recompute" not in str(no_recompute).splitlines()[0]


def test_default_text_fits_120_columns_even_with_long_names():
    # GIVEN module names far longer than a terminal line
    rows = [{"module": "model.decoder.layers." + ".".join(["block"] * 20) + f".{i}",
             "type": "VeryLongModuleClassName" * 3, "calls": 10**6, "total_ns": 10**12,
             "self_ns": 10**11, "mean_ns": 1e6, "p50_ns": 1e6, "p99_ns": 2e6,
             "bwd_calls": 10**6, "bwd_total_ns": 2 * 10**12, "bwd_self_ns": 10**11,
             "bwd_p50_ns": 2e6, "bwd_p99_ns": 3e6, "bwd_fwd_ratio": 2.0,
             "recompute_calls": 0, "recompute_total_ns": 0, "step_p50_ns": None,
             "step_p99_ns": None} for i in range(3)]
    summary = Summary(rows, {})
    # THEN every line fits, names keep their (distinguishing) end, --wide has them whole
    lines = summary.to_text().splitlines()
    assert max(len(line) for line in lines) <= 120
    assert [line.split()[0][-2:] for line in lines[1:4]] == [".0", ".1", ".2"]
    assert rows[0]["module"] in summary.to_text(wide=True)


def test_footer_names_each_loss_by_its_cause():
    summary = Summary([], {"dropped_events": 5, "overwritten_events": 0, "orphan_exits": 0,
                           "unfinished_spans": 1})
    note = [line for line in summary.footer().splitlines() if line.startswith("note:")]
    assert note == ["note: 5 events dropped (buffer full), 1 unfinished spans - totals may be "
                    "incomplete"]
    assert "ring" not in summary.footer()


def test_top_applies_to_csv_and_json():
    summary = backward_trace(0).summary()
    assert len(list(csv.DictReader(io.StringIO(summary.to_csv(top=2))))) == 2
    assert len(json.loads(summary.to_json(top=3))["rows"]) == 3


def test_ratio_and_blank_columns():
    rows = {(r["module"], r["type"]): r for r in backward_trace(0).summary().rows}
    root = rows[("", "Net")]
    assert root["bwd_fwd_ratio"] == root["bwd_total_ns"] / root["total_ns"]
    loose = next(r for key, r in rows.items() if key[0] == UNATTRIBUTED)
    assert loose["calls"] is None and loose["mean_ns"] is None and loose["bwd_fwd_ratio"] is None
    parsed = list(csv.DictReader(io.StringIO(backward_trace(0).summary().to_csv())))
    row = next(r for r in parsed if r["module"] == UNATTRIBUTED)
    assert row["calls"] == "" and row["bwd_fwd_ratio"] == "" and int(row["bwd_total_ns"]) > 0


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
    assert list(parsed[0]) == ["module", "type", "mode", "timing", "calls", "total_ns", "self_ns", "mean_ns",
                               "p50_ns", "p99_ns", "bwd_calls", "bwd_total_ns", "bwd_self_ns",
                               "bwd_p50_ns", "bwd_p99_ns", "bwd_fwd_ratio", "recompute_calls",
                               "recompute_total_ns", "step_p50_ns", "step_p99_ns"]
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
        assert row["total_ns"] == ref[(row["module"], row["type"])]["total_ns"]
        assert row["p50_ns"] == pytest.approx(ref[(row["module"], row["type"])]["p50_ns"])


def test_long_names_are_cut_in_the_middle_keeping_start_and_leaf():
    from hooktrace.text import shorten_middle as _shorten

    name = "model.decoder.layers.11.self_attn.q_proj"
    cut = _shorten(name, 28)
    assert len(cut) == 28 and cut.startswith("model.") and cut.endswith("self_attn.q_proj")
    assert "…" in cut and _shorten(name, 80) == name
    assert _shorten("Sequential", 8) == "Se…ntial"  # a class name: its start and its end


def test_memory_notes_of_a_cuda_device_fit_120_columns() -> None:
    """issue #26: on a GPU the summary's CUDA memory note ran past 120 columns."""
    from hooktrace.reading import TraceData

    ev = np.zeros(6, EVENT_DTYPE)
    ev["kind"] = [ENTER, 6, 7, EXIT, 6, 7]  # each event with its CPU and CUDA sample
    ev["t"] = [10, 10, 10, 30, 30, 30]
    ev["seq"] = [0, 100, 512, 0, 400, 1024]
    ev["id"] = [0, 100, 512, 0, 900, 1024]
    trace = TraceData(ev, [("", "Net")], [], Clock(0, 0, 1.0),
                      {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0,
                       "memory": {"devices": ["cpu", "cuda:123"]}})
    s = Summary.from_trace(trace)
    notes = [n for n in s.notes if n.startswith("memory (cuda:123)")]
    assert notes and "cuda_mem_net" in notes[0]
    for text in (str(s), s.to_text(memory=True)):
        assert max(len(line) for line in text.splitlines()) <= 120
