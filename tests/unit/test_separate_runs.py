"""Rank-set discovery tells the ranks of one run from separate runs (issue #26 part 3):
``rankset.separate_runs``, which summary, merge-ranks and export of a folder go through."""

from __future__ import annotations

import pytest

from hooktrace.rankset import RankFile, RankSet, RankSetError, separate_runs


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
