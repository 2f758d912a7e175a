"""Rank-set discovery tells the ranks of one run from separate runs (issue #26 part 3):
``rankset.separate_runs``, which summary, merge-ranks and export of a folder go through."""

from __future__ import annotations

import os
from typing import Any

import pytest

from hooktrace.analysis.rankset import RankFile, RankSet, RankSetError, separate_runs


def rank_file(path: str, rank: int | None, world: int | None = 2, *, pid: int = 1,
              start: int = 0, stop: int = 100, cut: bool = False) -> RankFile:
    return RankFile(path, rank, world if rank is not None else None, "h", pid, 0, 0, False,
                    start, stop, 10, cut=cut)


def test_the_ranks_of_one_run_pass() -> None:
    files = [rank_file("r0", 0, pid=1), rank_file("r1", 1, pid=2, start=50, stop=150)]
    assert separate_runs(files) is None
    # one process's schedule windows (files of one rank, or of no rank) are one run
    assert separate_runs([rank_file("w0", 0, pid=1), rank_file("w1", 0, pid=1)]) is None
    assert separate_runs([rank_file("a", None), rank_file("b", None)]) is None


@pytest.mark.parametrize("files, message", [
    ([rank_file("a", None, pid=1), rank_file("b", None, pid=2)],
     "a (by h:1) and b (by h:2) are traces of separate runs, not ranks of one"),
    ([rank_file("r0", 0, pid=1), rank_file("x", None, pid=2)],
     "r0 (rank 0) and x (no rank) are traces of separate runs"),
    ([rank_file("r0", 0, 2, pid=1), rank_file("r1", 1, 4, pid=2)],
     "r0 (world size 2) and r1 (world size 4) are ranks of separate runs"),
    ([rank_file("r0", 0, pid=1), rank_file("again", 0, pid=2)],
     "r0 (by h:1) and again (by h:2) are both rank 0"),
    ([rank_file("r0", 0, pid=1), rank_file("r1", 1, pid=2, start=200, stop=300)],
     "r0 stopped recording before r1 started"),
])
def test_separate_runs_are_named(files: list[RankFile], message: str) -> None:
    why = separate_runs(files)
    assert why is not None and message in why and "\n" not in why
    with pytest.raises(RankSetError, match="separate runs|both rank"):
        RankSet.from_results([f.path for f in files], files, [], warn=False)


def test_a_cut_stream_among_ranks_stays_a_problem_not_a_refusal() -> None:
    # a rank killed before its footer (which carries the rank) loads without one
    files = [rank_file("r0", 0, pid=1), rank_file("r1", None, pid=2, cut=True)]
    assert separate_runs(files) is None


def test_files_named_as_one_outputs_ranks_are_one_run() -> None:
    # RANK set without WORLD_SIZE: hooktrace run names out_rank<R>.htrace, but the
    # metadata holds no rank
    named = [rank_file("d/out_rank0.htrace", None, pid=1),
             rank_file("d/out_rank1.htrace", None, pid=2, start=500, stop=600)]
    assert separate_runs(named) is None
    for other in ("d/other_rank2.htrace", "e/out_rank2.htrace",
                  "d/out.htrace"):
        files = [named[0], rank_file(other, None, pid=3)]
        assert separate_runs(files) is not None, other


# -- one set of rules for rank sets and hooktrace diff (rankset.check_one_run) -----------

CASES = {
    "one_run": ([("r0", 0, 2, 1, 0, 100), ("r1", 1, 2, 2, 50, 150)], None),
    "rank_and_no_rank": ([("r0", 0, 2, 1, 0, 100), ("x", None, None, 2, 0, 100)],
                         "rank_and_no_rank"),
    "world_sizes": ([("r0", 0, 2, 1, 0, 100), ("r1", 1, 4, 2, 0, 100)], "world_sizes"),
    "rank_twice": ([("r0", 0, 2, 1, 0, 100), ("again", 0, 2, 2, 0, 100)], "processes"),
    "processes_without_rank": ([("a", None, None, 1, 0, 100), ("b", None, None, 2, 0, 100)],
                               "processes"),
    "not_at_the_same_time": ([("r0", 0, 2, 1, 0, 100), ("r1", 1, 2, 2, 200, 300)],
                             "not_at_the_same_time"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rank_sets_and_diff_refuse_the_same_inputs(case: str, tmp_path: Any) -> None:
    from hooktrace.analysis._diff_inputs import DiffInputError, group
    from hooktrace.analysis.rankset import check_one_run

    rows, kind = CASES[case]
    # (one description of a trace file, RankFile, for rank sets and diff alike: issue #37)
    ranks = [rank_file(str(tmp_path / p), r, w, pid=pid, start=a, stop=b)
             for p, r, w, pid, a, b in rows]
    metas = ranks
    found = check_one_run(ranks)
    assert (found.kind if found else None) == kind
    if kind is None:
        assert separate_runs(ranks) is None
        group(str(tmp_path), str(tmp_path), None, metas)  # (no error)
    else:
        why = separate_runs(ranks)
        assert why is not None and found is not None and found.a.path in why
        with pytest.raises(DiffInputError) as e:
            group(str(tmp_path), str(tmp_path), None, metas)
        assert os.path.basename(found.a.path) in str(e.value)
        assert os.path.basename(found.b.path) in str(e.value)


def test_one_ranks_windows_do_not_make_separate_runs() -> None:
    # schedule windows of two ranks: each window of rank 0 is not at the time of every
    # window of rank 1, but the ranks recorded at the same time (compared rank by rank,
    # as diff always did; separate_runs compared file by file and refused them)
    files = [rank_file("r0.5", 0, pid=1, start=0, stop=100),
             rank_file("r0.9", 0, pid=1, start=1000, stop=1100),
             rank_file("r1.5", 1, pid=2, start=50, stop=150),
             rank_file("r1.9", 1, pid=2, start=1050, stop=1150)]
    assert separate_runs(files) is None


def test_the_files_named_are_those_that_show_it() -> None:
    from hooktrace.analysis.rankset import check_one_run

    # rank 0 stopped at 400 (its last window), rank 1 started at 500
    files = [rank_file("r0.a", 0, pid=1, start=0, stop=100),
             rank_file("r0.b", 0, pid=1, start=300, stop=400),
             rank_file("r1.a", 1, pid=2, start=500, stop=600)]
    found = check_one_run(files)
    assert found is not None and found.kind == "not_at_the_same_time"
    assert (found.a.path, found.b.path, found.stop_ns, found.start_ns) == ("r0.b", "r1.a", 400, 500)
    assert "r0.b stopped recording before r1.a started" in (separate_runs(files) or "")
