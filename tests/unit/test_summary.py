"""Per-module summary against a straightforward per-group reference."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from conftest import NODE_NAMES, backward_trace, build_events, build_trace, events_from, random_stream

from hooktrace._events import ENTER, EXIT, Clock
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, CAT_RECOMPUTE
from hooktrace.analysis.summary import UNATTRIBUTED, Summary, format_ns

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
    assert list(parsed[0]) == ["module", "type", "mode", "timing", "fused", "calls", "total_ns", "self_ns", "mean_ns",
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
                                          (3_210_000, "3.21 ms"), (7.5e9, "7.50 s"),
                                          # rounding to the next unit, or to one digit
                                          # fewer (issue #47: "1000 µs")
                                          (999_955, "1.00 ms"), (999.7, "1.00 µs"),
                                          (9_996, "10.0 µs"), (99_960, "100 µs"),
                                          (999_999_999, "1.00 s"), (-999_955, "-1.00 ms"),
                                          (9.996e6, "10.0 ms"), (-850, "-850 ns")])
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


def _colliding_run(n: int = 12):
    """A run whose modules' names differ only in a layer index in their middle, each
    called once with grad off (an [eval] row) and once in training."""
    from hooktrace._events import FLAG_NO_GRAD

    modules = [("", "GPT2LMHeadModel")] + [
        (f"transformer.h.{i}.attn.resid_dropout", "Dropout") for i in range(n)]
    rows, t = [], 0
    for flags in (0, FLAG_NO_GRAD):
        rows.append((1, ENTER, 0, t, flags))
        for m in range(1, n + 1):
            rows += [(1, ENTER, m, t + 1, flags), (1, EXIT, m, t + 2 + m)]
            t += 10 + m
        rows.append((1, EXIT, 0, t))
        t += 10
    return build_trace(build_events(rows), modules, clock=CLOCK)


@pytest.mark.parametrize("width", [60, 80, 120])
def test_cut_names_stay_distinct_and_keep_the_differing_index(width):
    # GIVEN names that the usual middle cut makes equal ("transfo…n.resid_dropout [eval]")
    summary = _colliding_run().summary()
    for extra in ({}, {"memory": True}, {"flops": True}):
        lines = summary.to_text(width=width, **extra).splitlines()[1:len(summary.rows) + 1]
        cells = [line[:line.index("  ")] for line in lines]
        # THEN no two rows read the same, and each keeps its layer index and leaf
        assert len(set(cells)) == len(cells), cells
        for cell, row in zip(cells, summary.rows):
            if row["module"]:
                index = row["module"].split(".")[2]
                assert re.search(rf"[.…]{index}[.…]", cell), cell
                assert "resid_dropout" in cell or "…" in cell.split(".")[-1], cell


def test_cli_summary_uses_the_terminal_width(tmp_path, monkeypatch, capsys):
    from hooktrace.cli import main

    run = tmp_path / "run.htrace"
    _colliding_run().save(run)
    widths = {}
    for columns in ("60", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["summary", str(run)]) == 0
        out = capsys.readouterr().out.splitlines()
        table = out[1:26]
        widths[columns] = max(len(line) for line in table)
        cells = [line[:line.index("  ")] for line in table]
        assert len(set(cells)) == len(cells)
    # COLUMNS=60: names cut (as far as each stays its own); COLUMNS=200: room for them whole
    assert widths["60"] < widths["200"] <= 200
    assert "transformer.h.11.attn.resid_dropout [eval]" in "\n".join(out)


def test_footer_explains_only_the_columns_shown():
    # GIVEN a run with backward, steps, and notes about memory and numerics columns
    summary = backward_trace(3).summary()
    summary.counts.update(steps=4, step_p50_ns=1000, step_p99_ns=2000)
    summary.notes += ["memory (cpu): mem_net = bytes a call leaves allocated (mean over calls)",
                      "numerics: absmax/rms/nonfinite of each call's output"]
    narrow = summary.to_text().splitlines()
    foot = narrow[narrow.index("sorted by forward total + backward total, descending"):]
    # THEN the narrow table's footer has no word on step_p50, memory or numerics columns
    assert not any("step_p50" in line or "memory (" in line or "numerics:" in line
                   for line in foot), foot
    assert "4 complete steps: p50 1.00 µs, p99 2.00 µs per step" in foot
    assert any(line.startswith("bwd_total: ") for line in foot)
    # and one line per explanation: sort order, steps, bwd_total, unattributed nodes
    assert len(foot) <= 4, foot
    # a table without backward columns does not explain them
    fwd_only = Summary(summary.rows, summary.counts, columns=summary.columns)
    assert "bwd_total:" not in fwd_only.footer(["module", "calls", "total_ns"])
    # the whole footer (every column) still has them
    assert "step_p50/step_p99" in summary.footer()


def test_a_cut_name_is_told_apart_from_the_rows_top_leaves_out():
    # GIVEN --top 3 of names that differ only in their layer index
    summary = _colliding_run().summary()
    lines = summary.to_text(top=3, width=60).splitlines()[1:4]
    # THEN each shown name keeps its index, though no other shown row shares its leaf
    for line, row in zip(lines, summary.rows[:3]):
        if row["module"]:
            assert re.search(rf"[.…]{row['module'].split('.')[2]}[.…]", line), line


def _row(module: str, timing: str, calls: int, bwd_calls: int) -> dict:
    t, b = 1000 * calls, 2000 * bwd_calls
    return {"module": module, "type": "M", "mode": "train", "timing": timing,
            "calls": calls, "total_ns": t, "self_ns": t, "mean_ns": t / max(calls, 1),
            "p50_ns": t, "p99_ns": t, "bwd_calls": bwd_calls, "bwd_total_ns": b,
            "bwd_self_ns": b, "bwd_p50_ns": b, "bwd_p99_ns": b, "bwd_fwd_ratio": None,
            "recompute_calls": 0, "recompute_total_ns": 0, "step_p50_ns": None,
            "step_p99_ns": None}


def test_a_module_fused_away_in_a_phase_says_fused_not_zero_calls_and_0_ns():
    # GIVEN kernel rows inside a compiled root: blk.act ran no forward kernel of its
    # own (fused into blk's), blk.drop no backward kernel, while blk ran both
    rows = [_row("", "measured", 3, 3), _row("blk", "kernels", 3, 3),
            _row("blk.act", "kernels", 0, 3), _row("blk.drop", "kernels", 3, 0)]
    text = Summary(rows, {}).to_text(wide=True)
    lines = {line.split()[0]: line for line in text.splitlines()[1:5]}
    # THEN those phases say "fused" instead of calls 0 and 0 ns, and the footer says why
    act, drop = lines["blk.act"], lines["blk.drop"]
    assert act.split()[3] == "fused" and "0 ns" not in act, act
    assert "fused" in drop and "0 ns" not in drop, drop
    assert "fused" not in lines["blk"]
    assert any(line.startswith("fused: no kernel of its own") for line in text.splitlines())


def test_no_backward_at_all_is_not_called_fused():
    # an inference run: no module ran backward, so no row's backward was fused away
    rows = [_row("", "measured", 3, 0), _row("blk", "kernels", 3, 0)]
    text = Summary(rows, {}).to_text(wide=True)
    assert "fused" not in text


def _three_steps(**info):
    # root 0 -> 1000 (the compile 100 -> 900 inside it), mark; 1010 -> 1100, mark;
    # 1110 -> 1200, mark: step 0 compiled, steps 1 and 2 did not
    from hooktrace._events import STEP

    ev = build_events([(1, ENTER, 0, 0), (1, EXIT, 0, 1000), (1, STEP, 0, 1000),
                       (1, ENTER, 0, 1010), (1, EXIT, 0, 1100), (1, STEP, 0, 1100),
                       (1, ENTER, 0, 1110), (1, EXIT, 0, 1200), (1, STEP, 0, 1200)])
    return build_trace(ev, [("", "Net")], **info)


def test_compile_steps_are_left_out_and_compile_time_is_a_row_of_its_own():
    from hooktrace.analysis.summary import COMPILE_ROW, StepTable

    trace = _three_steps(compiles=[[100, 900, 1, "dynamo"]])
    s = trace.summary()
    assert s.counts["steps"] == 2 and s.counts["compile_steps"] == 1
    assert s.counts["step_p99_ns"] == 100  # the 1000 ns compile step is not in it
    rows = {r["module"]: r for r in s.rows}
    assert rows[COMPILE_ROW]["total_ns"] == 800 and rows[COMPILE_ROW]["calls"] == 1
    assert rows[""]["total_ns"] == 1180 and rows[""]["self_ns"] == 380  # 1180 - 800
    assert rows[""]["step_p50_ns"] == 90  # steps 1 and 2 only
    assert "1 compile steps left out" in s.footer()
    t = StepTable.from_trace(trace)
    assert [r["compile"] for r in t.rows] == [True, False, False]
    assert t.to_text().splitlines()[1].split()[0].endswith("c")  # the first step


def test_a_file_without_compile_metadata_or_with_bad_entries_loads_as_before():
    from hooktrace.reading import compile_intervals
    from hooktrace.analysis.summary import COMPILE_ROW

    plain = _three_steps().summary()
    bad = _three_steps(compiles=[["x", 1, 1], [900, 100, 1], 7, [True, 2, 1]]).summary()
    for s in (plain, bad):
        assert s.counts["steps"] == 3 and s.counts["compile_steps"] == 0
        assert all(r["module"] != COMPILE_ROW for r in s.rows)
    assert compile_intervals({}).shape == (0, 3)
    assert compile_intervals({"compiles": "nonsense"}).shape == (0, 3)


def test_memory_notes_of_a_cuda_device_fit_120_columns() -> None:
    """issue #26: on a GPU the summary's CUDA memory note ran past 120 columns."""
    from hooktrace.reading import TraceData

    # each event with its CPU and CUDA sample: (kind, t, seq, id)
    ev = events_from([(ENTER, 10, 0, 0), (6, 10, 100, 100), (7, 10, 512, 512),
                      (EXIT, 30, 0, 0), (6, 30, 400, 900), (7, 30, 1024, 1024)],
                     ("kind", "t", "seq", "id"))
    trace = build_trace(ev, [("", "Net")], clock=Clock(0, 0, 1.0), cls=TraceData, pid=1,
                        hostname="h", memory={"devices": ["cpu", "cuda:123"]})
    s = Summary.from_trace(trace)
    notes = [n for n in s.notes if n.startswith("memory (cuda:123)")]
    assert notes and "cuda_mem_net" in notes[0]
    for text in (str(s), s.to_text(memory=True)):
        assert max(len(line) for line in text.splitlines()) <= 120


def test_self_time_has_one_definition() -> None:
    """Issue #37: a span's self time (a compiled region's from its kernels, less the
    compile time inside it) is derived in one place, hooktrace.analysis.kernels.span_self_ns,
    called by one table, hooktrace.analysis.calls.Calls, that summary, diff, the
    aggregates and the Parquet tables group instead of re-deriving it (summary and the
    tables had the compile carve-out, diff did not)."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "hooktrace"
    rederived = [str(p.relative_to(package)) for p in package.rglob("*.py")
                 if p.name != "kernels.py" and re.search(r"\.region_self_ns\b", p.read_text())]
    assert rederived == []
    users = {p.name for p in package.rglob("*.py") if "span_self_ns(" in p.read_text()}
    assert users == {"calls.py", "kernels.py"}
    tables = {p.name for p in package.rglob("*.py") if "Calls.from_" in p.read_text()}
    assert {"summary.py", "_diff_parts.py", "tables.py", "aggregates.py"} <= tables


def test_the_parquet_spans_self_column_is_the_summarys() -> None:
    """The spans table (what DuckDB and Spark group) carries the summary's self time:
    the root's 380 ns once the 800 ns compile inside it is the <torch.compile> row's."""
    pytest.importorskip("pyarrow")
    from hooktrace.data.tables import batches, Where

    trace = _three_steps(compiles=[[100, 900, 1, "dynamo"]])
    rows = [r for b in batches(trace, "spans", Where.of(trace)) for r in b.to_pylist()]
    root = [r for r in rows if r["module"] == "" and r["timing"] == "measured"]
    summary = {r["module"]: r for r in trace.summary().rows}[""]
    assert sum(r["self_ns"] for r in root) == summary["self_ns"] == 380


def test_the_root_is_empty_in_data_and_root_in_text():
    # one convention, documented in docs/getting-started.md#names (issue #38): "" where
    # the name is data (JSON, CSV, Parquet/SQL), as named_modules() has it; <root> in text
    summary = backward_trace(0).summary()
    assert "" in [r["module"] for r in json.loads(summary.to_json())["rows"]]
    assert "" in [r["module"] for r in csv.DictReader(io.StringIO(summary.to_csv()))]
    assert any(line.startswith("<root> ") for line in summary.to_text().splitlines())
    page = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
    if page.exists():  # (the floor's copy of the tree has no docs: checked in the main run)
        doc = page.read_text()
        assert "`<root>` in the text tables" in doc and "`\"\"` wherever the name is\ndata" in doc


UNET = [f"down_blocks.{b}.attentions.{a}.transformer_blocks.0{leaf}" for b in range(3)
        for a in range(2) for leaf in ("", ".attn1", ".attn1.to_q", ".ff.net.0.proj")]
LORA = [f"base_model.model.model.layers.{i}.self_attn.{p}_proj.{part}.default"
        for i in range(3) for p in "qv" for part in ("lora_A", "lora_B", "lora_dropout")]


def _reads_as(cell: str, names: Sequence[str]) -> list[str]:
    """The names a printed cell can be: itself, or those an elided cell (``head.….tail``:
    whole dotted parts left out, the markers after the name kept) fits."""
    if "…" not in cell:
        return [n for n in names if n == cell]
    head, tail = cell.split("…")
    assert head == "" or head.endswith("."), cell
    assert tail.startswith("."), cell
    return [n for n in names if n.startswith(head) and n.endswith(tail)
            and len(n) > len(head) + len(tail)]


@pytest.mark.parametrize("names", [UNET, LORA], ids=["unet", "lora"])
@pytest.mark.parametrize("width", [16, 30, 44, 60])
def test_shorten_distinct_prints_names_or_visible_cuts_of_one_name(names, width):
    # GIVEN the repro: a UNet's and a LoRA model's names, which differ in
    # indices and leaves in their middle (issue #47: down_blocks.0…0.attentions.0…0)
    from hooktrace.text import shorten_distinct

    texts = names + [n + " [eval]" for n in names]
    cut = shorten_distinct(texts, width)
    for text, c in zip(texts, cut):
        # THEN each is the name itself or a cut at its dots that fits it alone, keeping
        # its last part (the leaf, with its index) whole
        assert _reads_as(c, texts) == [text], (text, c)
        name = text.removesuffix(" [eval]")
        assert c.removesuffix(" [eval]").endswith("." + name.split(".")[-1]) or c == text
        if len(text) <= width:
            assert c == text
    assert len(set(cut)) == len(texts)


def _table_of(names: Sequence[str]) -> Summary:
    rows = [{"module": name, "type": "Linear", "mode": "train", "calls": 1, "total_ns": 1000 - i,
             "self_ns": 10, "mean_ns": 10.0, "p50_ns": 10.0, "p99_ns": 10.0, "bwd_calls": 0,
             "bwd_total_ns": 0, "bwd_self_ns": 0, "bwd_p50_ns": None, "bwd_p99_ns": None,
             "bwd_fwd_ratio": None, "recompute_calls": 0, "recompute_total_ns": 0,
             "step_p50_ns": None, "step_p99_ns": None} for i, name in enumerate(names)]
    return Summary(rows, {})


@pytest.mark.parametrize("width", [50, 60, 80])
def test_summary_cuts_names_only_visibly_and_says_how_to_see_them(width):
    from hooktrace.text import CUT_NOTE

    # GIVEN a table of names longer than its width leaves them
    summary = _table_of(UNET)
    lines = summary.to_text(width=width, top=10).splitlines()
    cells = [line.split()[0] for line in lines[1:11]]
    # THEN every shown cell is a name, or a visible cut that reads as that name only,
    # rows --top leaves out included
    for cell, row in zip(cells, summary.rows):
        assert _reads_as(cell, UNET) == [row["module"]], cell
    # THEN a footer says names were cut, and how to see them whole
    assert any("…" in c for c in cells) and lines[-1] == CUT_NOTE
    assert "… " not in CUT_NOTE[1:] and "--wide" in CUT_NOTE
    whole = summary.to_text(wide=True)
    assert "…" not in whole and all(n in whole for n in UNET)
    # and no such line when nothing was cut
    assert CUT_NOTE not in _table_of(["fc", "head"]).to_text(width=width)


@pytest.mark.parametrize("option", ["flops", "memory", "numerics"])
def test_asking_for_what_was_not_recorded_advises_how_this_run_was_recorded(
        option, tmp_path, capsys):
    from hooktrace.cli import main

    # GIVEN a run of the process (hooktrace run) and one of a model (trace(model))
    ev = build_events([(1, ENTER, 0, 0), (1, EXIT, 0, 10)])
    for scope in ("process", "model"):
        path = tmp_path / f"{scope}.htrace"
        build_trace(ev, [("", "Net")], scope=scope).save(path)
        assert main(["summary", str(path), f"--{option}"]) == 1
        err = capsys.readouterr().err.strip()
        # THEN the advice is one that works where the run was recorded (issue #47:
        # hooktrace run was told to use trace(model, flops=True))
        assert err.startswith(f"hooktrace: error: {path}: no ") and "\n" not in err
        if scope == "process":
            assert f"record with hooktrace run --{option}" in err and "trace(model" not in err
        else:
            assert f"hooktrace.trace(model, {option}=True)" in err
