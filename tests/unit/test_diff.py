"""hooktrace.analysis.diff and `hooktrace diff` on synthetic runs with step marks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import build_trace, events_from
from hooktrace._events import ENTER, EXIT, STEP
from hooktrace.cli import main
from hooktrace.analysis.diff import DiffInputError, compare
from hooktrace.reading import TraceData

MODULES = [("", "Net"), ("a", "Linear"), ("b", "Linear"), ("c", "ReLU")]


def run(steps: int = 4, a_ns: int = 1000, b_ns: int = 5000, c_calls: int = 1,
        modules: list[tuple[str, str]] = MODULES, jitter: int = 0) -> TraceData:
    """Per step: root{ a, b, c x c_calls } then a step mark; durations as given."""
    rows: list[tuple[int, int, int, int]] = []  # kind, id, t, seq
    t = 0
    for s in range(steps):
        rows.append((ENTER, 0, t, 0))
        t += 100
        for mod, d in ((1, a_ns + jitter * s), (2, b_ns)):
            rows += [(ENTER, mod, t, 0), (EXIT, mod, t + d, 0)]
            t += d + 10
        for _ in range(c_calls):
            rows += [(ENTER, 3, t, 0), (EXIT, 3, t + 200, 0)]
            t += 210
        rows.append((EXIT, 0, t, 0))
        t += 50
        rows.append((STEP, 0, t, s))
        t += 1
    ev = events_from(rows, ("kind", "id", "t", "seq"), tid=1, rf_tid=1)
    return build_trace(ev, modules)


def test_a_run_against_itself_shows_no_change() -> None:
    r = run(jitter=7)
    d = compare(r, r)
    assert d.per_step and len(d.rows) == 4 and not d.only_a and not d.only_b
    assert all(row["per_step_change_ns"] == 0 and row["p50_change_pct"] == 0 for row in d.rows)
    assert d.step is not None and d.step["per_step_change_pct"] == 0
    assert d.failures(0.0, min_share=0.0) == []


def test_the_slowed_module_comes_first_and_fails_the_gate() -> None:
    # GIVEN b three times slower, a unchanged
    d = compare(run(), run(b_ns=15000))
    # THEN b leads: the root's total grew as much, but only b's self time did
    assert (d.rows[0]["module"], d.rows[0]["phase"]) == ("b", "forward")
    assert d.rows[0]["self_per_step_change_ns"] == 10000
    assert (d.rows[1]["module"], d.rows[1]["per_step_change_ns"]) == ("", 10000)
    b = next(r for r in d.rows if r["module"] == "b")
    assert b["p50_a_ns"] == 5000 and b["p50_b_ns"] == 15000
    assert b["p50_change_pct"] == pytest.approx(200.0)
    assert b["per_step_change_ns"] == 10000
    a = next(r for r in d.rows if r["module"] == "a")
    assert a["per_step_change_ns"] == 0
    failed = d.failures(50.0)
    assert any(f.startswith("b forward: +200.0%") for f in failed)
    assert not any(f.startswith("a ") for f in failed)
    assert d.failures(250.0) == []


def test_a_slowed_leaf_sorts_above_an_unchanged_larger_module() -> None:
    d = compare(run(b_ns=50_000), run(a_ns=4000, b_ns=50_000))
    assert d.rows[0]["module"] == "a" and d.rows[0]["per_step_change_ns"] == 3000


def test_more_calls_count_as_slower_per_step() -> None:
    d = compare(run(), run(c_calls=3))
    c = next(r for r in d.rows if r["module"] == "c")
    assert (c["calls_a"], c["calls_b"]) == (1, 3)
    assert c["p50_change_pct"] == 0 and c["per_step_change_pct"] == pytest.approx(200.0)
    assert any(f.startswith("c forward") for f in d.failures(100.0, min_share=0.0))
    # c is 200 ns of a ~6.5 µs step: under the default 1% floor? no, 3%: still gated
    assert any(f.startswith("c forward") for f in d.failures(100.0))
    assert not any(f.startswith("c forward") for f in d.failures(100.0, min_share=5.0))


def test_modules_in_one_run_only_are_listed() -> None:
    renamed = [("", "Net"), ("a", "Linear"), ("b2", "Linear"), ("c", "ReLU")]
    d = compare(run(), run(modules=renamed))
    assert d.only_a == [("b", "forward")] and d.only_b == [("b2", "forward")]
    text = d.to_text()
    assert "only in A: b forward" in text and "only in B: b2 forward" in text


def test_without_steps_the_whole_run_is_compared() -> None:
    ev = run(steps=1).events
    ev = ev[ev["kind"] != STEP]
    a = build_trace(ev, MODULES)
    d = compare(a, a)
    assert not d.per_step and d.step is None and "per run" in d.to_text()


def test_cli_gate_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, slow = tmp_path / "a.htrace", tmp_path / "b.htrace"
    run().save(base)
    run(b_ns=15000).save(slow)
    assert main(["diff", str(base), str(base), "--fail-above", "5"]) == 0
    capsys.readouterr()
    assert main(["diff", str(base), str(slow), "--fail-above", "50", "--json"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["per_step"] and doc["step"]["per_step_change_ns"] == 10000
    assert any(f.startswith("b forward") for f in doc["failed"])
    assert "slower by more than 50%" in err and "b forward" in err
    assert main(["diff", str(base), str(slow)]) == 0  # no gate: no verdict
    capsys.readouterr()
    assert main(["diff", str(base), str(tmp_path / "missing.htrace")]) == 1
    assert "missing.htrace" in capsys.readouterr().err


def test_runs_recorded_under_different_span_definitions_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A file from before issue #16 (trace(): module hooks outside the span) against
    # one from now (the whole call): the hooks' time would read as a change.
    old, new = run(), run()
    old.info.pop("span_definition", None)
    old.info["mode"] = "wrap"
    new.info["span_definition"] = 2
    with pytest.raises(DiffInputError, match="define a module span differently"):
        compare(old, new)
    assert compare(new, new).rows  # same definition: compared
    a, b = tmp_path / "old.htrace", tmp_path / "new.htrace"
    old.save(a)
    new.save(b)
    assert main(["diff", str(a), str(b)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "1: forward only" in err and "2: the whole call" in err
    assert "Traceback" not in err
    # the windows of one run must agree too
    with pytest.raises(DiffInputError, match="different span definitions"):
        compare([old, new], [new])


def calls_run(steps: list[list[tuple[int, int]]],
              modules: list[tuple[str, str]] = MODULES) -> TraceData:
    """Per step: root{ the (module, duration ns) calls in order } then a step mark."""
    rows: list[tuple[int, int, int, int]] = []
    t = 0
    for s, calls in enumerate(steps):
        rows.append((ENTER, 0, t, 0))
        t += 100
        for mod, d in calls:
            rows += [(ENTER, mod, t, 0), (EXIT, mod, t + d, 0)]
            t += d + 10
        rows.append((EXIT, 0, t, 0))
        t += 50
        rows.append((STEP, 0, t, s))
        t += 1
    ev = events_from(rows, ("kind", "id", "t", "seq"), tid=1, rf_tid=1)
    return build_trace(ev, modules)


def _stall_runs(stall_in: str) -> tuple[TraceData, TraceData]:
    """Two steps of 40 calls of a (120 µs) and one of b (1 ms); b is 4 ms per call slower
    in B, and one call of a stalled for 84 ms in ``stall_in``."""
    def steps(b_ns: int, stall: bool) -> list[list[tuple[int, int]]]:
        out = []
        for s in range(2):
            calls = [(1, 84_000_000 if stall and s == 0 and i == 7 else 120_000)
                     for i in range(40)]
            out.append(calls + [(2, b_ns)])
        return out
    return (calls_run(steps(1_000_000, stall_in == "A")),
            calls_run(steps(5_000_000, stall_in == "B")))


def test_one_stalled_call_does_not_outrank_a_regression_of_every_call() -> None:
    # GIVEN a baseline with one 84 ms call of a (its median call: 120 µs), and b 4 ms
    # per call slower in B
    d = compare(*_stall_runs("A"))
    # (the stall moved a's median of 2 steps by 42 ms: the old sort put a first)
    a = next(r for r in d.rows if r["module"] == "a")
    assert abs(a["self_per_step_change_ns"]) > 40e6
    # THEN b, the real regression, ranks first, on the typical self time per step
    assert (d.rows[0]["module"], d.rows[0]["phase"]) == ("b", "forward")
    assert d.rows[0]["typical_self_change_ns"] == pytest.approx(4e6)
    assert a["typical_change_ns"] == 0 and a["within_noise"]
    assert not d.rows[0]["within_noise"]
    assert [f.split(":")[0] for f in d.failures(50.0)] == ["b forward"]


def test_a_stalled_call_in_b_does_not_fail_the_gate() -> None:
    # GIVEN b as slow as before in B, and one call of a stalled for 84 ms in B
    d = compare(*_stall_runs("B"))
    failed = d.failures(50.0)
    # THEN the gate names b (median call x calls: +400%), not a (median call unchanged),
    # though a's time per step (median of 2 steps) rose by > 40 ms
    a = next(r for r in d.rows if r["module"] == "a")
    assert a["per_step_change_pct"] > 50.0
    assert any(f.startswith("b forward: +400.0%") for f in failed), failed
    assert not any(f.startswith("a forward") for f in failed), failed


def test_changes_within_the_baselines_step_to_step_spread_are_marked_noise() -> None:
    # GIVEN a whose time per step varies by ~2 µs between A's steps, and moves 500 ns
    base = calls_run([[(1, 10_000 + 1000 * (s % 3)), (2, 5000)] for s in range(8)])
    moved = calls_run([[(1, 10_500 + 1000 * (s % 3)), (2, 5000)] for s in range(8)])
    d = compare(base, moved)
    a = next(r for r in d.rows if r["module"] == "a")
    # THEN the change is marked as noise, in the row and in the table
    assert a["typical_change_ns"] == 500 and a["noise_a_ns"] >= 1000 and a["within_noise"]
    line = next(x for x in d.to_text().splitlines() if x.startswith("a "))
    assert "noise" in line and "noise: a change no larger than A's" in d.to_text()


def test_the_gate_leaves_rows_marked_noise_out_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a +5% change of a within A's step-to-step spread (the table marks it noise;
    # issue #38: --fail-above failed on it)
    base = calls_run([[(1, 10_000 + 1000 * (s % 3)), (2, 5000)] for s in range(8)])
    moved = calls_run([[(1, 10_500 + 1000 * (s % 3)), (2, 5000)] for s in range(8)])
    d = compare(base, moved)
    # THEN the gate leaves it out by default, names it as left out, and gates it on request
    assert not any(f.startswith("a forward") for f in d.failures(2.0, min_share=0.0))
    assert "a forward" in [f.split(":")[0] for f in d.noise_left_out(2.0, min_share=0.0)]
    assert any(f.startswith("a forward") for f in d.failures(2.0, min_share=0.0,
                                                           include_noise=True))
    a, b = tmp_path / "a.htrace", tmp_path / "b.htrace"
    base.save(a)
    moved.save(b)
    # (3.5%: the step, +3.1%, under it; a, +4.5%, over it)
    gate = ["diff", str(a), str(b), "--fail-above", "3.5", "--min-share", "0"]
    assert main(gate) == 0
    err = capsys.readouterr().err
    assert "within the runs' own noise (a module: A's run-to-run spread; the step: the runs' " \
        "step-to-step spread), not gated (--fail-on-noise gates them): a forward" in err, err
    assert main([*gate, "--fail-on-noise"]) == 1
    assert "a forward" in capsys.readouterr().err


def test_cli_verdict_is_a_short_line_and_one_row_per_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, slow = tmp_path / "a.htrace", tmp_path / "b.htrace"
    run().save(base)
    run(a_ns=5000, b_ns=15000, c_calls=3).save(slow)
    assert main(["diff", str(base), str(slow), "--fail-above", "50"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("hooktrace: diff: ") and "slower by more than 50%" in err[0]
    assert len(err[0]) < 80
    assert {line.split(":")[0].strip() for line in err[1:]} >= {
        "a forward", "b forward", "c forward"}
    assert all(line.startswith("  ") and len(line) < 80 for line in err[1:])


def test_two_different_models_get_a_warning() -> None:
    other = [("", "ResNet"), ("conv1", "Conv2d"), ("layer1", "Sequential"), ("fc", "Linear")]
    d = compare(run(), run(modules=other))
    assert any(n.startswith("different models? A's model is Net, B's ResNet")
               for n in d.notes), d.notes
    assert "note: different models?" in d.to_text()
    same_class = [("", "Net"), ("x", "Linear"), ("y", "Linear"), ("z", "ReLU")]
    d = compare(run(), run(modules=same_class))
    assert any("only 1 of 7 module names are in both runs" in n for n in d.notes), d.notes
    assert not any(n.startswith("different models") for n in compare(run(), run()).notes)


def test_an_unchanged_row_is_not_called_noise() -> None:
    d = compare(run(), run(b_ns=15000))
    assert not any(r["within_noise"] for r in d.rows if r["per_step_change_ns"] == 0)
    assert "noise" not in d.to_text()


def test_two_runs_of_one_job_within_their_step_to_step_spread_do_not_fail_silently(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN two 3-step runs of one job whose steps vary as much as they differ: the
    # step's p50 is 18% apart (issue #47: --fail-above 10 failed with no word about noise)
    a = calls_run([[(1, 90_000)], [(1, 100_000)], [(1, 130_000)]])
    b = calls_run([[(1, 100_000)], [(1, 118_000)], [(1, 130_000)]])
    d = compare(a, b)
    assert d.step is not None and d.step["per_step_change_pct"] > 10
    # THEN the step row is within the runs' own noise: their step-to-step spread (their
    # range, under 4 steps)
    assert d.step["noise_a_ns"] == pytest.approx(40_000, abs=10) and d.step["within_noise"]
    assert "step noise: a change no larger than the runs' own step-to-step spread" \
        in d.to_text()
    pa, pb = tmp_path / "a.htrace", tmp_path / "b.htrace"
    a.save(pa)
    b.save(pb)
    # THEN the gate passes and says which changes it left out as noise
    assert main(["diff", str(pa), str(pb), "--fail-above", "10"]) == 0
    err = capsys.readouterr().err
    assert "within the runs' own noise" in err and "<step> step: +" in err, err
    # and --fail-on-noise gates them
    assert main(["diff", str(pa), str(pb), "--fail-above", "10", "--fail-on-noise"]) == 1
    capsys.readouterr()


def test_a_step_slower_beyond_the_runs_spread_fails_and_says_by_how_much(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = calls_run([[(1, 100_000)], [(1, 101_000)], [(1, 102_000)]])
    b = calls_run([[(1, 150_000)], [(1, 151_000)], [(1, 152_000)]])
    d = compare(a, b)
    assert not d.step["within_noise"]
    step = next(f for f in d.failures(10.0, min_share=0.0) if f.startswith("<step>"))
    assert step.endswith("(beyond the runs' step-to-step spread, 2.00 µs)"), step
    # a run of one step: its noise is unknown, and the line says so
    one = compare(calls_run([[(1, 100_000)]]), calls_run([[(1, 150_000)]]))
    step = next(f for f in one.failures(10.0, min_share=0.0) if f.startswith("<step>"))
    assert step.endswith("(a run has a single complete step: its step-to-step noise is "
                         "unknown)"), step
