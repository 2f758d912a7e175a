"""The one containment index (issue #48, SpanIndex in hooktrace/_span_tables.py): each edge rule that
the seven earlier variants decided differently, stated once and pinned here."""

from __future__ import annotations

import numpy as np
from conftest import IDENTITY_CLOCK, build_events

from hooktrace._events import ENTER, EXIT
from hooktrace._span_tables import thread_module
from hooktrace.reading import (SPAN_UNFINISHED, RunOrder, Spans, TraceData, compile_parents,
                               forward_span_before)


def _spans(rows: list[tuple[int, int, int, int]]) -> Spans:
    return Spans.from_events(build_events(rows), IDENTITY_CLOCK)


def _q(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


# tid 1: 0 [0, 100] holds 1 [10, 40] holds 2 [20, 20] (zero length); 3 [40, 60]
NEST = [(1, ENTER, 0, 0), (1, ENTER, 1, 10), (1, ENTER, 2, 20), (1, EXIT, 2, 20),
        (1, EXIT, 1, 40), (1, ENTER, 3, 40), (1, EXIT, 3, 60), (1, EXIT, 0, 100)]


def test_a_time_at_a_spans_start_or_end_is_that_spans() -> None:
    s = _spans(NEST)
    got = s.index().innermost(_q(1, 1, 1, 1), _q(10, 39, 100, 101))
    assert s.module[got[:3]].tolist() == [1, 1, 0] and got[3] == -1


def test_at_a_boundary_shared_by_two_siblings_the_later_starting_one_wins() -> None:
    s = _spans(NEST)  # 1 ends at 40 where 3 starts: both hold 40
    assert s.module[s.index().innermost(_q(1), _q(40))].tolist() == [3]


def test_a_zero_length_span_holds_its_one_instant_and_nothing_else() -> None:
    s = _spans(NEST)
    got = s.index().innermost(_q(1, 1), _q(20, 21))
    assert s.module[got].tolist() == [2, 1]


def test_an_interval_is_held_by_the_innermost_span_holding_both_ends() -> None:
    s = _spans(NEST)
    got = s.index().innermost(_q(1, 1, 1, 1), _q(10, 30, 40, 0), _q(40, 50, 60, 100))
    assert s.module[got].tolist() == [1, 0, 3, 0]
    assert s.index().innermost(_q(1), _q(0), _q(101)).tolist() == [-1]


def test_another_threads_spans_hold_nothing() -> None:
    s = _spans(NEST)
    assert s.index().innermost(_q(2, 0), _q(50, 50)).tolist() == [-1, -1]


def test_an_open_span_holds_up_to_its_last_known_time_only() -> None:
    # 1 never exits: it ends at the thread's last event (60), unfinished
    s = _spans([(1, ENTER, 0, 0), (1, ENTER, 1, 10), (1, EXIT, 0, 60)])
    one = int(np.flatnonzero(s.module == 1)[0])
    assert s.flags[one] & SPAN_UNFINISHED
    got = s.index().innermost(_q(1, 1), _q(int(s.end_ns[one]), int(s.end_ns[one]) + 1))
    assert got[0] == one and got[1] != one


def test_equal_starts_go_to_the_later_row() -> None:
    # parent and child enter at the same instant: the child (deeper, later) holds it
    s = _spans([(1, ENTER, 0, 5), (1, ENTER, 1, 5), (1, EXIT, 1, 9), (1, EXIT, 0, 9)])
    assert s.module[s.index().innermost(_q(1, 1), _q(5, 9))].tolist() == [1, 1]


def test_compile_parents_is_the_innermost_span_holding_the_compile() -> None:
    s = _spans(NEST)
    rows = np.array([[11, 39, 1], [40, 60, 1], [30, 50, 1], [30, 50, 2]], np.int64)
    got = compile_parents(s, rows)
    assert got[:3].tolist() == [1, 3, 0] and got[3] == -1


def test_a_mark_after_a_recursive_calls_inner_exit_finds_the_outer_call() -> None:
    # module 0 calls itself: the outer call holds 50, after the inner one ended at 40
    s = _spans([(1, ENTER, 0, 0), (1, ENTER, 0, 10), (1, EXIT, 0, 40), (1, EXIT, 0, 60)])
    got = s.index().of_module(_q(0, 0, 0), _q(20, 50, 61), "forward")
    assert s.start_ns[got[:2]].tolist() == [10, 0] and got[2] == -1


def test_the_call_ended_at_or_before_a_time_is_the_latest_to_end() -> None:
    # tid 1: module 1 ends at 40, module 3 at 60; an exit's own instant counts
    trace = TraceData(build_events(NEST), [("", "A"), ("b", "B"), ("c", "C"), ("d", "D")],
                      [], IDENTITY_CLOCK, {"pid": 1, "hostname": "h", "dropped_events": 0,
                                           "overwritten_events": 0})
    s = trace.spans()
    got = forward_span_before(trace, _q(1, 1, 1, 1, 2), _q(1, 1, 3, 3, 1),
                              _q(39, 40, 60, 59, 99))
    assert got[[0, 3, 4]].tolist() == [-1, -1, -1]
    assert s.module[got[1:3]].tolist() == [1, 3] and s.end_ns[got[1:3]].tolist() == [40, 60]


def test_run_order_ties_last_and_next() -> None:
    order = RunOrder(_q(1, 1, 1, 2), _q(5, 5, 9, 5), keep=np.array([True, True, True, False]))
    last, nxt = order.latest(_q(1, 1, 1, 2), _q(4, 5, 9, 5))
    assert last.tolist() == [-1, 1, 2, -1]  # equal keys: the later row; row 3 not kept
    assert nxt.tolist() == [0, 2, -1, -1]


def test_run_order_groups_by_thread_and_module() -> None:
    order = RunOrder(thread_module(_q(7, 7, 2**32 - 1), _q(0, 1, 0)), _q(1, 2, 3))
    last, _ = order.latest(thread_module(_q(7, 7, 2**32 - 1, 8), _q(1, 0, 0, 0)), _q(5, 5, 5, 5))
    assert last.tolist() == [1, 0, 2, -1]
