"""`hooktrace diff` on rank directories and schedule windows (issue #12 item 3), with
synthetic rank and window files written as the recorder writes them; bad inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_trace, events_from

from hooktrace._events import ENTER, EXIT, STEP, Clock
from hooktrace.cli import main
from hooktrace.analysis.diff import Diff, DiffInputError, compare, compare_paths, compare_ranks
from hooktrace.record.distributed import default_output_name
from hooktrace.reading import TraceData, load

REPO = Path(__file__).resolve().parents[2]
T0 = 1_790_000_000 * 10**9  # a Unix time in ns
STEP_NS = 100_000
MODULES = [("", "Net"), ("a", "Linear"), ("b", "Linear")]


def trace(*, b_ns: int | list[int] = 30_000, steps: int = 4, first_step: int = 0,
          rank: int | None = None, world: int | None = None, pid: int = 1000,
          window: bool = False, start: int = T0, modules: list[tuple[str, str]] = MODULES,
          marks: bool = True) -> TraceData:
    """Per step: root{a (20 µs), b (``b_ns``, or ``b_ns[k]`` at step k)}, then a mark
    numbered as the recorder numbers it (none with ``marks=False``: a run without
    steps); rank and window metadata as the recorder writes them."""
    rows: list[tuple[int, int, int, int]] = []  # kind, id, t, seq
    t = first_step * STEP_NS  # ticks: ns after start
    for k in range(steps):
        b = b_ns[k] if isinstance(b_ns, list) else b_ns
        rows += [(ENTER, 0, t + 1000, 0), (ENTER, 1, t + 2000, 0), (EXIT, 1, t + 22_000, 0),
                 (ENTER, 2, t + 23_000, 0), (EXIT, 2, t + 23_000 + b, 0),
                 (EXIT, 0, t + 24_000 + b, 0)]
        if marks:
            rows.append((STEP, 0, t + 25_000 + b, first_step + k))
        t += 25_000 + b
    ev = events_from(rows, ("kind", "id", "t", "seq"), tid=7, rf_tid=7)
    info: dict = {"pid": pid, "hostname": "h", "dropped_events": 0, "overwritten_events": 0,
                  "start_unix_ns": start,
                  "stop_unix_ns": start + (first_step + steps + 1) * STEP_NS * 10}
    if rank is not None:
        info.update(rank=rank, world_size=world, rank_source="env")
    if window:
        info["window"] = {"first_step": first_step, "last_step": first_step + steps - 1,
                          "complete": True}
    return build_trace(ev, modules, clock=Clock(0, start, 1.0), cls=TraceData, **info)


def rank_dir(root: Path, world: int = 4, *, slow: dict[int, int] | None = None,
             ranks: list[int] | None = None, pid0: int = 1000, marks: bool = True) -> Path:
    """One run's rank files as default_output_name("DIR/") names them; ``slow`` =
    {rank: b's time in ns} (default 30 µs); ``marks=False``: without steps."""
    for r in ranks if ranks is not None else range(world):
        path = Path(default_output_name(f"{root}/", r))
        path.parent.mkdir(parents=True, exist_ok=True)
        trace(b_ns=(slow or {}).get(r, 30_000), rank=r, world=world, pid=pid0 + r,
              marks=marks).save(path)
    return root


def window_dir(root: Path, b_ns: list[list[int]], *, rank: int | None = None,
               world: int | None = None, pid: int = 1000) -> Path:
    """One process's windows of 2 steps each, 2 steps apart, named as window_handler
    names them; window i's b takes ``b_ns[i][k]`` at its step k."""
    root.mkdir(parents=True, exist_ok=True)
    for i, per_step in enumerate(b_ns):
        first = 1 + 3 * i
        w = trace(b_ns=per_step, steps=len(per_step), first_step=first, rank=rank,
                  world=world, pid=pid, window=True)
        stem = f"h_{pid}" + (f"_rank{rank}" if rank is not None else "")
        w.save(root / f"{stem}.{first + len(per_step) - 1}.htrace")
    return root


def row(d: Diff, module: str, phase: str = "forward") -> dict:
    return next(r for r in d.rows if (r["module"], r["phase"]) == (module, phase))


# -- rank directories ---------------------------------------------------------------


def test_a_rank_dir_against_itself_shows_no_change(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    a = rank_dir(tmp_path / "a")
    d = compare_paths(str(a), str(a), workers=1)
    assert d.ranks == [0, 1, 2, 3] and not d.ranks_only_a and not d.ranks_only_b
    assert len(d.rows) == 3 and all(r["per_step_change_ns"] == 0 for r in d.rows)
    assert all(r["n_ranks"] == 4 and r["median_per_step_change_ns"] == 0 for r in d.rows)
    assert d.step is not None and d.step["per_step_change_pct"] == 0
    assert d.failures(0.0, min_share=0.0) == [] and not d.notes
    assert main(["diff", str(a), str(a), "--fail-above", "0", "--min-share", "0", "--workers", "1"]) == 0
    assert d.sources is not None and d.sources[0]["kind"] == "ranks"


def test_the_slowed_module_and_rank_come_first_and_fail_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN rank 2's b three times slower in B, every other rank and module unchanged
    a = rank_dir(tmp_path / "a")
    b = rank_dir(tmp_path / "b", slow={2: 90_000}, pid0=2000)
    d = compare_paths(str(a), str(b), workers=1)
    # THEN b on rank 2 leads (not the root, whose total grew as much), median over ranks 0
    top = d.rows[0]
    assert (top["module"], top["phase"], top["rank"]) == ("b", "forward", 2)
    assert top["per_step_change_ns"] == 60_000 and top["p50_change_pct"] == pytest.approx(200)
    assert top["n_ranks"] == 4 and top["median_per_step_change_ns"] == 0
    assert row(d, "a")["per_step_change_ns"] == 0
    assert d.step is not None and d.step["rank"] == 2
    assert d.by_rank[0].rows[0]["per_step_change_ns"] == 0  # each rank's own comparison
    failed = d.failures(50.0)
    assert failed[0].startswith("<step> step on rank 2: +")
    assert "b forward on rank 2: +200.0%" in failed
    assert not any(f.startswith("a ") for f in failed)
    assert d.failures(250.0) == []
    # the CLI: table with a rank column, verdict on stderr naming the rank, --json
    assert main(["diff", str(a), str(b), "--fail-above", "50"]) == 1
    out, err = capsys.readouterr()
    assert "b forward on rank 2: +200.0%" in err
    first = out.splitlines()[2].split()  # header, step, then the first module row
    assert first[:3] == ["b", "forward", "2"]
    assert "4 ranks of world size 4" in out
    assert main(["diff", str(a), str(b), "--fail-above", "50", "--json", "--workers", "1"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"] == [0, 1, 2, 3] and doc["rows"][0]["rank"] == 2
    assert "b forward on rank 2: +200.0%" in doc["failed"]
    assert doc["sources"]["b"]["kind"] == "ranks" and doc["sources"]["b"]["world_size"] == 4


def test_two_ranks_slowed_the_gate_names_the_worst_and_counts(tmp_path: Path) -> None:
    a = rank_dir(tmp_path / "a")
    b = rank_dir(tmp_path / "b", slow={1: 60_000, 3: 90_000}, pid0=2000)
    d = compare_paths(str(a), str(b), workers=1)
    assert d.rows[0]["rank"] == 3 and row(d, "b")["median_per_step_change_ns"] == 15_000
    assert "b forward on rank 3: +200.0% (2 of 4 ranks above 50%)" in d.failures(50.0)


def test_ranks_and_modules_in_one_run_only_are_listed(tmp_path: Path) -> None:
    a = rank_dir(tmp_path / "a")
    b = rank_dir(tmp_path / "b", ranks=[0, 1, 2], pid0=2000)  # rank 3's file is missing
    renamed = [("", "Net"), ("a", "Linear"), ("b2", "Linear")]
    p = Path(default_output_name(f"{tmp_path / 'b'}/", 1))
    trace(rank=1, world=4, pid=2001, modules=renamed).save(p)
    d = compare_paths(str(a), str(b), workers=1)
    assert d.ranks == [0, 1, 2] and d.ranks_only_a == [3] and d.ranks_only_b == []
    assert d.only_a == [("b", "forward")] and d.only_b == [("b2", "forward")]
    text = d.to_text()
    assert "ranks only in A: 3" in text
    assert "only in A: b forward (rank 1)" in text and "only in B: b2 forward (rank 1)" in text
    assert any("no file for rank 3 of world size 4" in n for n in d.notes)
    doc = json.loads(d.to_json())
    assert doc["only_a"] == [{"module": "b", "phase": "forward", "ranks": [1]}]
    assert doc["ranks_only_a"] == [3]


def test_rank_dirs_with_steps_and_without_compare_whole_runs_with_a_note(
        tmp_path: Path) -> None:
    # GIVEN the same 4 steps of work on each rank, recorded with step marks (A) and
    # without (B)
    a = rank_dir(tmp_path / "a")
    b = rank_dir(tmp_path / "b", pid0=2000, marks=False)
    # THEN every rank compares whole runs (not A per step against B per run: b +300%),
    # no change anywhere, and a note says so; from files and from Python alike
    runs = {side: {r: load(p) for r, p in enumerate(sorted((tmp_path / side).rglob("*.htrace")))}
            for side in ("a", "b")}
    for d in (compare_paths(str(a), str(b), workers=1),
              compare_ranks(runs["a"], runs["b"], names=(str(a), str(b)))):
        assert d.ranks == [0, 1, 2, 3] and not d.per_step and d.step is None
        assert row(d, "b")["calls_a"] == row(d, "b")["calls_b"] == 4
        assert all(r["per_step_change_ns"] == 0 for r in d.rows), d.rows
        assert d.failures(50.0, min_share=0.0) == []
        assert [n for n in d.notes if "compared per run" in n] == [
            f"{a} has 4 complete steps on rank 0 and the other run none (and 3 more ranks): "
            "every rank is compared per run (whole runs); compare runs of the same length"]


def test_a_one_rank_dir_compares_with_a_file(tmp_path: Path) -> None:
    one = rank_dir(tmp_path / "one", world=1)
    f = tmp_path / "f.htrace"
    trace(b_ns=60_000).save(f)
    d = compare_paths(str(one), str(f), workers=1)
    assert d.ranks is None and row(d, "b")["per_step_change_ns"] == 30_000


# -- windows ----------------------------------------------------------------------


def test_windows_are_pooled_over_every_call_and_step(tmp_path: Path) -> None:
    # window 0: 3 steps with b = 1 µs; windows 1 and 2: one step each with b = 9 µs.
    # Pooled over the 5 calls and 5 steps, b's p50 is 1 µs (a median of the windows'
    # medians would say 9 µs, their mean 6.3 µs).
    w = window_dir(tmp_path / "w", [[1000] * 3, [9000], [9000]])
    base = tmp_path / "base.htrace"
    trace(b_ns=1000, steps=5).save(base)
    d = compare_paths(str(base), str(w), workers=1)
    b = row(d, "b")
    assert b["p50_b_ns"] == 1000 and b["per_step_b_ns"] == 1000 and b["calls_b"] == 1
    assert d.step is not None and d.step["per_step_change_ns"] == 0
    assert d.sources is not None and d.sources[1]["kind"] == "windows"
    assert d.sources[1]["windows"] == [[1, 3], [4, 4], [7, 7]]
    assert "3 windows pooled, steps 1-3, 4, 7" in d.to_text()
    # the same as pooling the traces in memory
    pooled = compare(load(base), [load(p) for p in sorted(w.glob("*.htrace"))])
    assert row(pooled, "b")["p50_b_ns"] == 1000
    # the pool is exact: an even count takes the middle two (1, 1, 1, 9, 9, 9 -> 5 µs)
    w2 = window_dir(tmp_path / "w2", [[1000] * 3, [9000] * 3])
    assert row(compare_paths(str(base), str(w2), workers=1), "b")["p50_b_ns"] == 5000


def test_one_window_is_picked_with_colon_n(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    w = window_dir(tmp_path / "w", [[30_000] * 2, [30_000] * 2, [90_000] * 2])
    d = compare_paths(f"{w}:0", f"{w}:-1", workers=1)
    assert d.rows[0]["module"] == "b" and d.rows[0]["per_step_change_ns"] == 60_000
    assert d.sources is not None and d.sources[1]["windows"] == [[7, 8]]
    assert "window 2 of 3, steps 7-8" in d.to_text()
    same = compare_paths(f"{w}:1", f"{w}:0", workers=1)
    assert all(r["per_step_change_ns"] == 0 for r in same.rows)
    assert main(["diff", f"{w}:0", f"{w}:2", "--fail-above", "100"]) == 1
    assert "b forward: +200.0%" in capsys.readouterr().err
    assert main(["diff", f"{w}:0", f"{w}:1", "--fail-above", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["failed"] == [] and doc["sources"]["a"]["window"] == 0


def test_rank_windows_pooled_per_rank_and_picked(tmp_path: Path) -> None:
    # two ranks writing windows into one directory, as window_handler(DIR) does
    a, b = tmp_path / "a", tmp_path / "b"
    for r in (0, 1):
        window_dir(a, [[30_000] * 2] * 3, rank=r, world=2, pid=100 + r)
        slow = 90_000 if r == 1 else 30_000
        window_dir(b, [[30_000] * 2, [slow] * 2, [slow] * 2], rank=r, world=2, pid=200 + r)
    d = compare_paths(str(a), str(b), workers=1)
    assert d.ranks == [0, 1] and d.rows[0]["rank"] == 1 and d.rows[0]["module"] == "b"
    # pooled: b took 90 µs in 4 of rank 1's 6 steps, so its median step did
    assert d.rows[0]["per_step_change_ns"] == 60_000 and d.rows[0]["p50_b_ns"] == 90_000
    assert d.rows[0]["median_per_step_change_ns"] == 30_000  # (0 + 60 µs) / 2
    assert "2 ranks of world size 2, 3 windows each pooled" in d.to_text()
    first = compare_paths(f"{a}:0", f"{b}:0", workers=1)
    assert all(r["per_step_change_ns"] == 0 for r in first.rows) and not first.failures(0.0)
    last = compare_paths(f"{a}:-1", f"{b}:-1", workers=1)
    assert (last.rows[0]["module"], last.rows[0]["rank"]) == ("b", 1)
    assert last.rows[0]["per_step_change_ns"] == 60_000
    assert "b forward on rank 1: +200.0%" in last.failures(50.0)
    assert "window -1 of each" in last.to_text()


# -- bad inputs -------------------------------------------------------------------


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (diff arguments, what the one-line error must say)."""
    good = rank_dir(tmp_path / "good")
    (tmp_path / "empty").mkdir()
    mixed = rank_dir(tmp_path / "mixed", ranks=[0, 1])  # rank 1 again, from another run
    trace(rank=1, world=4, pid=5555).save(mixed / "old.rank1.htrace")
    sizes = rank_dir(tmp_path / "sizes", world=2)
    trace(rank=2, world=4, pid=1002).save(sizes / "x.rank2.htrace")
    plain = rank_dir(tmp_path / "plain", world=2)
    trace(pid=77).save(plain / "single.htrace")
    killed = rank_dir(tmp_path / "killed", world=2, ranks=[0])
    cut = trace(pid=1001)  # a killed rank's stream: loads, but has no footer, so no rank
    cut.info["cut"] = "rank1.htrace: recording cut at byte 4096 (truncated block)"
    cut.save(killed / "rank1.htrace")
    late = rank_dir(tmp_path / "late", world=2, ranks=[0])
    trace(rank=1, world=2, pid=1001, start=T0 + 3600 * 10**9).save(late / "rank1.htrace")
    corrupt = rank_dir(tmp_path / "corrupt", world=2)
    target = Path(default_output_name(f"{corrupt}/", 1))
    target.write_bytes(target.read_bytes()[:100])
    single = tmp_path / "single.htrace"
    trace().save(single)
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copy(single, twice / "a.htrace")
    shutil.copy(single, twice / "b.htrace")
    w = window_dir(tmp_path / "w", [[30_000] * 2] * 2)
    copy = window_dir(tmp_path / "copy", [[30_000] * 2] * 2)
    shutil.copy(copy / "h_1000.5.htrace", copy / "h_1000.5 (copy).htrace")
    two = tmp_path / "two"
    two.mkdir()
    trace(pid=1).save(two / "p1.htrace")
    trace(pid=2).save(two / "p2.htrace")
    return {
        "empty": ([str(good), str(tmp_path / "empty")],
                  [f"{tmp_path / 'empty'}: a directory with no .htrace file"]),
        "missing": ([str(tmp_path / "nope"), str(good)], [f"{tmp_path / 'nope'}: no such"]),
        "mixed_runs": ([str(mixed), str(good)], [str(mixed), "2 processes wrote rank 1",
                                                 "old.rank1.htrace"]),
        "world_sizes": ([str(good), str(sizes)], [str(sizes), "world size", "x.rank2.htrace"]),
        "with_and_without_rank": ([str(plain), str(good)], [str(plain), "single.htrace",
                                                            "without"]),
        "killed_rank": ([str(good), str(killed)], [str(killed), "rank1.htrace",
                                                   "cut before its footer"]),
        "not_at_the_same_time": ([str(good), str(late)], [str(late), "rank1.htrace",
                                                          "different runs"]),
        "corrupt_file": ([str(good), str(corrupt)], [str(target)]),
        "file_vs_rank_dir": ([str(single), str(good)], [str(single), str(good), "4 ranks"]),
        "two_traces_of_one_process": ([str(twice), str(single)], [str(twice), "a.htrace",
                                                                 "b.htrace"]),
        "two_processes": ([str(two), str(single)], [str(two), "2 processes"]),
        "overlapping_windows": ([str(copy), str(w)], [str(copy), "(copy)", "overlapping"]),
        "window_out_of_range": ([f"{w}:2", str(w)], [f"{w}:2", "2 windows", "no window 2"]),
        "window_of_a_plain_run": ([f"{good}:0", str(good)], [f"{good}:0", "not one"]),
    }


def test_each_bad_input_is_one_error_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for name, (args, wanted) in bad_inputs(tmp_path).items():
        assert main(["diff", *args, "--workers", "1"]) == 1, name
        err = capsys.readouterr().err
        assert err.startswith("hooktrace: error: ") and err.count("\n") == 1, (name, err)
        for w in wanted:
            assert w in err, (name, w, err)
        if name not in ("empty", "missing"):
            with pytest.raises(DiffInputError):
                compare_paths(*args, workers=1)


def test_bad_inputs_through_python_m_hooktrace(tmp_path: Path) -> None:
    # The cases named in issue #12 in real processes (~2 s of start-up each, so not all
    # of them: the test above runs every case through the same main())
    cases = bad_inputs(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]))
    names = ("empty", "mixed_runs", "corrupt_file", "file_vs_rank_dir", "window_out_of_range")
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "hooktrace", "diff", *cases[name][0], "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        for name in names}
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, (name, out, err)
        assert "Traceback" not in err and err.count("\n") == 1, (name, err)
        assert all(w in err for w in cases[name][1]), (name, err)


@pytest.mark.parametrize("layout", ["ranks", "rank windows"])
def test_a_parquet_export_diffs_as_its_files(tmp_path: Path, layout: str) -> None:
    """Issue #29: ``hooktrace diff OUT_A/ OUT_B/`` of the Parquet exports of two rank
    directories (``hooktrace export DIR -o OUT/``; DuckDB over the datasets) gives the
    diff of the directories themselves (the inputs' names aside), windows pooled alike."""
    pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")
    a, b = tmp_path / "a", tmp_path / "b"
    if layout == "ranks":
        rank_dir(a)
        rank_dir(b, slow={2: 90_000})
    else:
        for r in (0, 1):
            window_dir(a, [[30_000] * 2] * 3, rank=r, world=2, pid=100 + r)
            slow = 90_000 if r == 1 else 30_000
            window_dir(b, [[30_000] * 2, [slow] * 2, [slow] * 2], rank=r, world=2, pid=200 + r)
    for d in (a, b):
        assert main(["export", str(d), "-o", f"{d}_pq/"]) == 0

    from hooktrace.data.paths import compare_paths as compare_any  # (DuckDB for an export)

    def doc(x: str, y: str) -> dict:
        out = json.loads(compare_any(x, y, workers=1).to_json())
        for k in ("a", "b"):
            out.pop(k)
            out["sources"][k].pop("path")
        return out

    files = doc(str(a), str(b))
    assert doc(f"{a}_pq", f"{b}_pq") == files
    assert doc(f"{a}_pq", str(b)) == files  # (one side of each kind)
    assert files["rows"][0]["module"] == "b" and files["rows"][0]["per_step_change_ns"] > 0
    if layout == "rank windows":
        assert doc(f"{a}_pq:0", f"{b}_pq:-1") == doc(f"{a}:0", f"{b}:-1")
