"""Many ranks (issue #11) on synthetic rank files: straggler math, clock offsets applied
in merges, missing and truncated ranks, process ids, file names and metadata checks."""

from __future__ import annotations

import json
import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import build_trace, events_from

from hooktrace._events import ENTER, EXIT, FLAG_NO_GRAD, STEP, Clock
from hooktrace.cli import main
from hooktrace.record.distributed import (
    ClockOffset,
    clock_offset_summary,
    default_output_name,
    injected_offset_ns,
    rank_info,
)
from hooktrace.exporters.ranks import merge_ranks
from hooktrace.analysis.rankset import RankSet, RankSetError
from hooktrace.reading import TraceData, load
from hooktrace.analysis.stragglers import _median_of_others, analyze
from hooktrace.format import TraceFileError

T0 = 1_790_000_000 * 10**9  # a Unix time in ns
MODULES = [("", "Net"), ("a", "Linear"), ("b", "Linear")]
STEP_NS = 200_000
A_NS, B_NS = 20_000, 30_000


def rank_trace(rank: int, world: int = 4, *, steps: int = 3, slow: dict[int, int] | None = None,
               wait: dict[int, int] | None = None, offset_ns: int = 0, pid: int | None = None,
               host: str = "h", eval_a: dict[int, int] | None = None) -> TraceData:
    """Rank ``rank``: per step the root calls a then b; ``slow`` = {step: extra ns of a},
    ``wait`` = {step: ns waited after the root's call, as in a collective}, ``eval_a`` =
    {step: ns of an eval call of a (grad off) after the root's call}. Its clock reads
    ``offset_ns`` ahead of rank 0's (and its metadata says so)."""
    rows: list[tuple[int, int, int, int, int]] = []  # (kind, id, t, seq, flags)
    for k in range(steps):
        t = k * STEP_NS + offset_ns
        extra = (slow or {}).get(k, 0)
        rows += [(ENTER, 0, t + 1000, 0, 0), (ENTER, 1, t + 2000, 0, 0),
                 (EXIT, 1, t + 2000 + A_NS + extra, 0, 0), (ENTER, 2, t + 30_000 + extra, 0, 0),
                 (EXIT, 2, t + 30_000 + extra + B_NS, 0, 0), (EXIT, 0, t + 70_000 + extra, 0, 0)]
        if k in (eval_a or {}):
            rows += [(ENTER, 1, t + 75_000 + extra, 0, FLAG_NO_GRAD),
                     (EXIT, 1, t + 75_000 + extra + (eval_a or {})[k], 0, 0)]
            extra += (eval_a or {})[k]
        rows.append((STEP, 0, t + 90_000 + extra + (wait or {}).get(k, 0), k, 0))
    ev = events_from(rows, ("kind", "id", "t", "seq", "flags"), tid=7)
    info = {"pid": pid if pid is not None else 1000 + rank, "hostname": host,
            "dropped_events": 0, "overwritten_events": 0, "rank": rank, "world_size": world,
            "backend": "gloo", "start_unix_ns": T0 + offset_ns,
            "stop_unix_ns": T0 + offset_ns + steps * STEP_NS + 50_000,
            "thread_names": {"7": "MainThread"}}
    if offset_ns or rank == 0:
        info.update(clock_offset_ns=offset_ns, clock_offset_uncertainty_ns=100)
    return build_trace(ev, MODULES, clock=Clock(0, T0, 1.0), cls=TraceData, **info)


@pytest.fixture
def rank_dir(tmp_path: Path) -> Path:
    """4 ranks; rank 2's module a is 50 µs slow at step 1 (the others wait for it at the
    step's end); rank 3's clock is 7 µs ahead."""
    for r in range(4):
        t = rank_trace(r, slow={1: 50_000} if r == 2 else None,
                       wait=None if r == 2 else {1: 50_000}, offset_ns=7_000 if r == 3 else 0)
        path = Path(default_output_name(f"{tmp_path}/", r))
        path.parent.mkdir(parents=True)
        t.save(path)
    return tmp_path


def test_median_of_others_matches_a_python_reference() -> None:
    rng = np.random.default_rng(0)
    for n_rank in (1, 2, 3, 4, 7):
        v = rng.integers(0, 50, (n_rank, 9)).astype(float)
        v[rng.random(v.shape) < 0.2] = np.nan
        got = _median_of_others(v)
        for i in range(n_rank):
            for c in range(v.shape[1]):
                others = [v[j, c] for j in range(n_rank) if j != i and not np.isnan(v[j, c])]
                want = float(np.median(others)) if others and not np.isnan(v[i, c]) else np.nan
                assert (np.isnan(want) and np.isnan(got[i, c])) or got[i, c] == want, (i, c)


def test_straggler_is_named_with_module_phase_and_step_not_its_ancestors(rank_dir: Path) -> None:
    report = analyze([rank_dir], min_excess_ns=10_000)
    assert [(s["rank"], s["module"], s["phase"], s["step"]) for s in report.stragglers] == [
        (2, "a", "fwd", 1)]  # the root is slow too, but a explains it: left out
    s = report.stragglers[0]
    assert s["time_ns"] == A_NS + 50_000 and s["others_median_ns"] == A_NS
    assert s["excess_ns"] == 50_000 and s["ratio"] == pytest.approx(3.5)
    # the others spent 50 µs more outside every module span in that step: the wait
    assert s["wait_source"] == "spans" and s["others_wait_ns"] == 50_000
    row = next(r for r in report.rows if r["module"] == "a" and r["phase"] == "fwd")
    assert row["median_ns"] == A_NS and row["slowest_rank"] == 2
    assert row["slowest_ns"] == pytest.approx(A_NS + 50_000 / 3)  # time per step
    per = [r for r in report.per_step if r["module"] == "a" and r["step"] == 1]
    assert per[0]["slowest_rank"] == 2 and per[0]["excess_ns"] == 50_000
    text = report.to_text()
    assert "stragglers" in text and "+50.0 µs" in text


def test_eval_calls_are_rows_and_stragglers_of_their_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN rank 2's a slow in training at step 1, and an eval call of a (a validation
    # pass, grad off) on rank 2 at step 1 and on rank 0 at step 2, each 40 µs
    eval_a = {2: {1: 40_000}, 0: {2: 40_000}}
    for r in range(4):
        t = rank_trace(r, slow={1: 50_000} if r == 2 else None, eval_a=eval_a.get(r))
        path = Path(default_output_name(f"{tmp_path}/", r))
        path.parent.mkdir(parents=True, exist_ok=True)
        t.save(path)
    report = analyze([tmp_path], min_excess_ns=10_000)
    # THEN the training straggler keeps its own figure (pooled: 110 µs, and rank 0 a
    # straggler at step 2); eval calls, on one rank each, are no straggler
    assert [(s["rank"], s["module"], s["mode"], s["phase"], s["step"], s["time_ns"],
             s["others_median_ns"]) for s in report.stragglers] == [
        (2, "a", "train", "fwd", 1, A_NS + 50_000, A_NS)]
    train = next(r for r in report.rows if (r["module"], r["mode"], r["phase"]) == (
        "a", "train", "fwd"))
    assert train["ranks"] == 4 and train["median_ns"] == A_NS
    assert train["slowest_rank"] == 2 and train["slowest_ns"] == pytest.approx(A_NS + 50_000 / 3)
    evals = next(r for r in report.rows if (r["module"], r["mode"]) == ("a", "eval"))
    assert evals["ranks"] == 2 and evals["phase"] == "fwd"
    assert {(r["module"], r["mode"], r["step"]) for r in report.per_step
            if r["mode"] == "eval"} == {("a", "eval", 1), ("a", "eval", 2)}
    assert all(r["mode"] == "train" for r in report.rows if r["module"] != "a")
    text = report.to_text()
    assert "a [eval]" in text and "[eval]: the calls made with grad off" in text
    assert main(["summary", str(tmp_path), "--json", "--min-excess-ms", "0.01"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(s["module"], s["mode"]) for s in doc["stragglers"]] == [("a", "train")]
    assert {r["mode"] for r in doc["rows"]} == {"train", "eval"}


def test_straggler_threshold_and_json_cli(rank_dir: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    assert main(["summary", str(rank_dir), "--json", "--min-excess-ms", "0.01"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["rank"] for s in doc["stragglers"]] == [2]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    # a threshold above 3.5x the median leaves no straggler
    assert main(["summary", str(rank_dir), "--json", "--min-excess-ms", "0.01",
                 "--threshold", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["stragglers"] == []


def test_clock_offset_is_subtracted_in_the_merged_timeline(rank_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.json"
    result = merge_ranks([rank_dir], out)
    doc = json.loads(out.read_text())
    base = doc["baseTimeNanoseconds"]
    assert base == result.base_ns and base % 10**9 == 0
    assert [e["rank"] for e in doc["hooktrace"]["ranks"]] == [0, 1, 2, 3]
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1000 + r: f"rank {r} · h:{1000 + r}" for r in range(4)}
    order = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert order == {1000 + r: r for r in range(4)}

    def first(pid: int, name: str) -> float:
        return min(e["ts"] for e in doc["traceEvents"]
                   if e["ph"] == "X" and e["pid"] == pid and e["name"] == name)

    # rank 3 recorded everything 7 µs late on its own clock: aligned, it is with rank 0
    for name in ("Net", "a", "step 1"):
        assert first(1003, name) == first(1000, name), name
    assert first(1000, "Net") * 1000 == T0 + 1000 - base


def test_missing_and_truncated_rank_files_are_named_and_the_others_merge(
        rank_dir: Path, tmp_path: Path) -> None:
    # GIVEN rank 1's file truncated and rank 3's file gone
    r1 = rank_dir / "rank1" / "trace.htrace"
    data = r1.read_bytes()
    r1.write_bytes(data[: len(data) - 40])
    (rank_dir / "rank3" / "trace.htrace").unlink()
    # WHEN merging and summarizing
    out = tmp_path / "all.json.gz"
    with pytest.warns(RuntimeWarning) as caught:
        result = merge_ranks([rank_dir], out)
    # THEN each problem is one line naming the file or rank, and ranks 0 and 2 are written
    text = [str(w.message) for w in caught]
    assert any(str(r1) in t and "truncated" in t for t in text), text
    assert any("ranks 1, 3 of world size 4" in t for t in text), text
    assert [e["rank"] for e in result.ranks] == [0, 2]
    with pytest.warns(RuntimeWarning):
        report = analyze([rank_dir], min_excess_ns=10_000)
    assert [r["rank"] for r in report.ranks] == [0, 2]
    assert any(str(r1) in p for p in report.problems)
    # an explicit file that does not exist is named too
    with pytest.warns(RuntimeWarning, match="nothing.htrace: no such file"):
        merge_ranks([rank_dir / "rank0" / "trace.htrace", tmp_path / "nothing.htrace"],
                    tmp_path / "one.json")


def test_no_readable_rank_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.htrace"
    bad.write_bytes(b"HTRACE\0\0" + b"\0" * 10)
    with pytest.raises(RankSetError, match="rank0.htrace"):
        RankSet.scan([bad], warn=False)
    assert main(["merge-ranks", str(tmp_path), "-o", str(tmp_path / "x.json")]) == 1
    assert not (tmp_path / "x.json").exists()


def test_ranks_sharing_a_pid_on_two_hosts_get_distinct_processes(tmp_path: Path) -> None:
    for r, host in enumerate(("node1", "node2")):
        rank_trace(r, 2, pid=4242, host=host).save(tmp_path / f"run.rank{r}.htrace")
    rs = RankSet.scan([tmp_path], warn=False)
    assert [f.pid for f in rs.files] == [4242, 4242]
    assert len({f.out_pid for f in rs.files}) == 2
    out = tmp_path / "all.json"
    merge_ranks([tmp_path], out)
    doc = json.loads(out.read_text())
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert pids == {f.out_pid for f in rs.files}


def test_workers_read_ranks_in_other_processes(rank_dir: Path) -> None:
    # the process-pool path (4 files: one worker each, here 2 workers)
    report = analyze([rank_dir], min_excess_ns=10_000, workers=2)
    assert [(s["rank"], s["module"]) for s in report.stragglers] == [(2, "a")]


def test_default_output_names_never_collide_across_ranks(tmp_path: Path) -> None:
    names = {default_output_name(tmp_path / "run", r) for r in range(64)}
    names |= {default_output_name(f"{tmp_path}/", r) for r in range(64)}
    assert len(names) == 128
    assert default_output_name("run.htrace", 5) == "run.rank5.htrace"
    assert default_output_name(f"{tmp_path}/", 5) == f"{tmp_path}/rank5/trace.htrace"


def test_rank_info_from_the_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_info() == {"rank": 5, "world_size": 8, "local_rank": 1, "rank_source": "env"}
    monkeypatch.setenv("HOOKTRACE_TEST_CLOCK_OFFSET_NS", "5:-300,1:7")
    assert injected_offset_ns(5) == -300 and injected_offset_ns(2) == 0
    monkeypatch.setenv("HOOKTRACE_TEST_CLOCK_OFFSET_NS", "five:1")
    with pytest.raises(ValueError, match="rank:ns pairs"):
        injected_offset_ns(5)
    monkeypatch.delenv("RANK")
    assert rank_info() == {}


def test_offsets_combine_into_a_hull_that_covers_drift() -> None:
    rng = random.Random(1)
    for _ in range(100):
        ms = [ClockOffset(rng.randrange(-10**6, 10**6), rng.randrange(0, 10**4), 0, 8, 1, 1)
              for _ in range(rng.randrange(1, 4))]
        s = clock_offset_summary(ms)
        for m in ms:  # every measurement's interval lies inside the combined one
            assert s["clock_offset_ns"] - s["clock_offset_uncertainty_ns"] <= (
                m.offset_ns - m.uncertainty_ns)
            assert m.offset_ns + m.uncertainty_ns <= (
                s["clock_offset_ns"] + s["clock_offset_uncertainty_ns"])


@pytest.mark.parametrize("key,value,expected", [
    ("rank", "3", "an int in"), ("world_size", 0, "an int in"),
    ("clock_offset_uncertainty_ns", -1, "an int in"),
    ("clock_sync", [{"offset_ns": 1}], "a list of clock measurements"),
])
def test_reader_checks_the_rank_keys(tmp_path: Path, key: str, value: object,
                                     expected: str) -> None:
    t = rank_trace(0)
    t.info[key] = value
    t.save(tmp_path / "r.htrace")
    with pytest.raises(TraceFileError, match=f'"{key}": expected {expected}'):
        load(tmp_path / "r.htrace")


def test_reader_refuses_a_rank_outside_the_world(tmp_path: Path) -> None:
    rank_trace(4, world=4).save(tmp_path / "r.htrace")
    with pytest.raises(TraceFileError, match="rank below world_size 4, found 4"):
        load(tmp_path / "r.htrace")


def test_export_of_a_directory_is_the_ranks_merge(rank_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "e.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["export", str(rank_dir), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["hooktrace"]["ranks"]) == 4
    assert os.path.getsize(out) > 0


def test_a_rank_slow_outside_modules_is_named_not_the_rank_that_waited(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN 2 ranks where rank 1 spends 50 µs outside every module before the root's
    # forward at step 1 (data loading), and rank 0 waits those 50 µs for it in a
    # collective inside the root's forward (DDP's first steps broadcast there): both
    # leave the root's forward together (issue #38: the waiter was named)
    for r in range(2):
        rows: list[tuple[int, int, int, int, int]] = []
        for k in range(3):
            t = k * STEP_NS
            pre = 50_000 if (r, k) == (1, 1) else 0
            wait = 50_000 if (r, k) == (0, 1) else 0
            rows += [(ENTER, 0, t + 1000 + pre, 0, 0), (ENTER, 1, t + 2000 + pre, 0, 0),
                     (EXIT, 1, t + 2000 + pre + A_NS, 0, 0), (ENTER, 2, t + 30_000 + pre, 0, 0),
                     (EXIT, 2, t + 30_000 + pre + B_NS, 0, 0),
                     (EXIT, 0, t + 70_000 + pre + wait, 0, 0), (STEP, 0, t + 190_000, k, 0)]
        ev = events_from(rows, ("kind", "id", "t", "seq", "flags"), tid=7)
        info = {"pid": 1000 + r, "hostname": "h", "dropped_events": 0, "overwritten_events": 0,
                "rank": r, "world_size": 2, "backend": "gloo", "start_unix_ns": T0,
                "stop_unix_ns": T0 + 3 * STEP_NS, "thread_names": {"7": "MainThread"},
                "clock_offset_ns": 0, "clock_offset_uncertainty_ns": 100}
        path = Path(default_output_name(f"{tmp_path}/", r))
        path.parent.mkdir(parents=True)
        build_trace(ev, MODULES, clock=Clock(0, T0, 1.0), cls=TraceData, **info).save(path)
    report = analyze([tmp_path], min_excess_ns=10_000)
    # THEN rank 1 is named, at the place it spent the time; rank 0 is not
    assert [(s["rank"], s["module"], s["phase"], s["before"], s["step"])
            for s in report.stragglers] == [(1, None, "outside", "<root> fwd", 1)]
    s = report.stragglers[0]
    assert s["time_ns"] == 61_000 and s["excess_ns"] == 50_000  # from the step-0 mark
    assert s["others_wait_ns"] == 50_000 and s["wait_source"] == "spans"
    assert main(["summary", str(tmp_path), "--min-excess-ms", "0.01"]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.startswith("1 ") and "(outside modules)" in ln]
    # the verdict for rank 1 there (slow in 1 of its 3 steps: noise), then the step's row
    assert lines[0].split() == ["1", "(outside", "modules)", "before", "<root>", "fwd", "1/3",
                                "steps", "+50.0", "µs", "noise"]
    assert lines[1].split()[:7] == ["1", "(outside", "modules)", "before", "<root>", "fwd", "1"]


def test_the_straggler_table_says_how_it_attributes(rank_dir: Path) -> None:
    text = analyze([rank_dir], min_excess_ns=10_000).to_text()
    assert "by a module's self time or the time outside modules; a rank that waited there " \
           "for another is not named" in text.replace("\n", " ")




def test_a_persistent_straggler_is_told_from_noise(tmp_path: Path) -> None:
    # GIVEN 4 ranks over 10 steps: rank 1's module a is 50 µs slow in every step, rank 3's
    # in step 4 only (a preempted step); the others wait for them at the step's end
    for r in range(4):
        slow = ({k: 50_000 for k in range(10)} if r == 1 else {4: 50_000} if r == 3
                else None)
        wait = {k: 50_000 for k in range(10) if not (slow or {}).get(k)}
        t = rank_trace(r, steps=10, slow=slow, wait=wait)
        path = Path(default_output_name(f"{tmp_path}/", r))
        path.parent.mkdir(parents=True)
        t.save(path)
    report = analyze([tmp_path], min_excess_ns=10_000)
    # THEN the verdict per (rank, module) says rank 1's is persistent, rank 3's noise
    verdicts = {(d["rank"], d["module"], d["phase"]): d for d in report.verdicts}
    assert (verdicts[(1, "a", "fwd")]["slow_steps"], verdicts[(1, "a", "fwd")]["steps"],
            verdicts[(1, "a", "fwd")]["verdict"]) == (10, 10, "persistent")
    assert (verdicts[(3, "a", "fwd")]["slow_steps"], verdicts[(3, "a", "fwd")]["steps"],
            verdicts[(3, "a", "fwd")]["verdict"]) == (1, 10, "noise")
    assert report.verdicts[0]["rank"] == 1  # persistent first
    assert json.loads(report.to_json())["verdicts"][0]["verdict"] == "persistent"
    # THEN the text says it in words
    text = report.to_text()
    assert "persistent stragglers: rank 1 a fwd slow in 10/10 steps" in text
    assert "noise: 1 places slow in under 50% of their steps" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("3 ") and "noise" in ln)
    assert row.split()[:4] == ["3", "a", "fwd", "1/10"]
