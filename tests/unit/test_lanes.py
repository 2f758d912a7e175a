"""_C.assign_lanes against a pure-Python reference of the greedy rule in csrc/lanes.h."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from hooktrace import _C


def reference_lanes(start: list[int], end: list[int], group: list[int],
                    prefer: list[int] | None = None) -> list[int]:
    """Visit by (group, start, -end, index); the preferred interval's lane is
    tried first (same group, already placed), then the first lane that fits."""
    n = len(start)
    order = sorted(range(n), key=lambda i: (group[i], start[i], -max(start[i], end[i]), i))
    lane: list[int | None] = [None] * n
    stacks: dict[int, list[list[int]]] = defaultdict(list)
    for i in order:
        s, e = start[i], max(start[i], end[i])
        lanes = stacks[group[i]]

        def fits(k: int) -> bool:
            stack = lanes[k]
            while stack and stack[-1] <= s:
                stack.pop()
            return not stack or stack[-1] >= e

        p = prefer[i] if prefer is not None else -1
        if 0 <= p < n and group[p] == group[i] and lane[p] is not None and fits(lane[p]):
            k = lane[p]
        else:
            k = next((k for k in range(len(lanes)) if fits(k)), len(lanes))
            if k == len(lanes):
                lanes.append([])
        lanes[k].append(e)
        lane[i] = k
    return [k for k in lane if k is not None]


def random_intervals(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 200, n).astype(np.int64)  # small range: many ties
    end = start + rng.integers(0, 60, n)
    group = rng.integers(0, 4, n).astype(np.uint32)
    return start, end, group


def assert_lanes_nest(start: np.ndarray, end: np.ndarray, group: np.ndarray,
                      lane: np.ndarray) -> None:
    rows: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for s, e, g, k in zip(start.tolist(), end.tolist(), group.tolist(), lane.tolist()):
        rows[(g, k)].append((s, max(s, e)))
    for ivs in rows.values():
        for i, (a0, a1) in enumerate(ivs):
            for b0, b1 in ivs[i + 1 :]:
                disjoint = a1 <= b0 or b1 <= a0
                nested = (a0 <= b0 and b1 <= a1) or (b0 <= a0 and a1 <= b1)
                assert disjoint or nested, ((a0, a1), (b0, b1))


@pytest.mark.parametrize("seed", range(20))
def test_matches_reference_and_every_lane_nests(seed):
    # GIVEN random overlapping intervals in a few interleaved groups
    start, end, group = random_intervals(seed, 300)
    # WHEN lanes are assigned
    lane = _C.assign_lanes(start, end, group)
    # THEN they are the reference's, and each (group, lane) row nests strictly
    assert lane.dtype == np.uint32
    assert lane.tolist() == reference_lanes(start.tolist(), end.tolist(), group.tolist())
    assert_lanes_nest(start, end, group, lane)


@pytest.mark.parametrize("seed", range(20))
def test_prefer_hint_matches_reference_and_still_nests(seed):
    start, end, group = random_intervals(seed, 300)
    rng = np.random.default_rng(seed + 100)
    prefer = np.where(rng.random(300) < 0.7, rng.integers(-1, 300, 300), -1).astype(np.int64)
    lane = _C.assign_lanes(start, end, group, prefer)
    assert lane.tolist() == reference_lanes(start.tolist(), end.tolist(), group.tolist(),
                                            prefer.tolist())
    assert_lanes_nest(start, end, group, lane)


def test_prefer_keeps_a_child_under_its_parent():
    # siblings [0,10) and [5,15) overlap; the child [6,8) of the second fits
    # inside the first too, but is drawn in its own parent's lane
    start = np.array([0, 5, 6], np.int64)
    end = np.array([10, 15, 8], np.int64)
    group = np.zeros(3, np.uint32)
    assert _C.assign_lanes(start, end, group).tolist() == [0, 1, 0]
    assert _C.assign_lanes(start, end, group, np.array([-1, -1, 1])).tolist() == [0, 1, 1]


def test_already_sorted_input_takes_the_same_lanes():
    start, end, group = random_intervals(99, 500)
    order = np.lexsort((-end, start, group))
    lane = _C.assign_lanes(start[order], end[order], group[order])
    assert lane.tolist() == _C.assign_lanes(start, end, group)[order].tolist()


def test_nested_and_disjoint_intervals_share_lane_zero():
    start = np.array([0, 1, 2, 10, 10, 10], np.int64)
    end = np.array([9, 5, 3, 20, 20, 10], np.int64)
    assert _C.assign_lanes(start, end, np.zeros(6, np.uint32)).tolist() == [0] * 6


def test_partial_overlaps_open_new_lanes_and_reuse_them():
    # [0,10) and [5,15) overlap without nesting; [12,14) fits lane 0 again
    # (its [0,10) has ended) though [5,15) is still open in lane 1.
    start = np.array([0, 5, 12, 6], np.int64)
    end = np.array([10, 15, 14, 12], np.int64)
    assert _C.assign_lanes(start, end, np.zeros(4, np.uint32)).tolist() == [0, 1, 0, 1]


def test_groups_are_independent():
    start = np.array([0, 5, 0, 5], np.int64)
    end = np.array([10, 15, 10, 15], np.int64)
    assert _C.assign_lanes(start, end, np.array([1, 1, 2, 2], np.uint32)).tolist() == [0, 1, 0, 1]


def test_end_before_start_counts_as_empty():
    start = np.array([0, 5], np.int64)
    end = np.array([10, 3], np.int64)
    assert _C.assign_lanes(start, end, np.zeros(2, np.uint32)).tolist() == [0, 0]


def test_empty_and_mismatched_inputs():
    empty = np.zeros(0, np.int64)
    assert _C.assign_lanes(empty, empty, np.zeros(0, np.uint32)).tolist() == []
    with pytest.raises(ValueError, match="one length"):
        _C.assign_lanes(np.zeros(2, np.int64), np.zeros(3, np.int64), np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="prefer"):
        _C.assign_lanes(np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2, np.uint32),
                        np.zeros(1, np.int64))
