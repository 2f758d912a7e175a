"""Span building (C++) against a straightforward pure-Python reference."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from conftest import IDENTITY_CLOCK, build_events, garbage_stream, random_stream

from hooktrace._events import ENTER, EXIT, FLAG_ERROR, NODE_BEGIN, NODE_END, Clock
from hooktrace.reading import SPAN_ERROR, SPAN_UNFINISHED, Spans

FIELDS = ("start_ns", "end_ns", "self_ns", "parent", "module", "tid", "depth", "call", "flags",
          "cat")


def reference_spans(events: np.ndarray, clock: Clock) -> dict:
    """The span rules written as plainly as possible (one Python object per event)."""
    t_ns = clock.to_unix_ns(events["t"]).tolist()
    by_tid: dict[int, list[int]] = defaultdict(list)
    for i, tid in enumerate(events["tid"].tolist()):
        by_tid[tid].append(i)
    spans: list[dict] = []
    orphans = unfinished = nodes = 0
    for tid in sorted(by_tid):
        stack: list[list[int]] = []  # [span index, sum of children's durations]

        def close(end: int, flag: int) -> None:
            nonlocal unfinished
            idx, child_sum = stack.pop()
            s = spans[idx]
            s["end_ns"] = end
            s["self_ns"] = end - s["start_ns"] - child_sum
            s["flags"] |= flag
            if flag & SPAN_UNFINISHED:
                unfinished += 1
            if stack:
                stack[-1][1] += end - s["start_ns"]

        last_t = 0
        for i in by_tid[tid]:
            kind, mod, flags, t = (int(events["kind"][i]), int(events["id"][i]),
                                   int(events["flags"][i]), t_ns[i])
            last_t = t
            if kind == ENTER:
                spans.append(dict(start_ns=t, end_ns=t, self_ns=0,
                                  parent=stack[-1][0] if stack else -1, module=mod, tid=tid,
                                  depth=len(stack), call=0, flags=0, cat=0))
                stack.append([len(spans) - 1, 0])
            elif kind == EXIT:
                match = [k for k, (idx, _) in enumerate(stack) if spans[idx]["module"] == mod]
                if not match:
                    orphans += 1
                    continue
                while len(stack) > match[-1] + 1:
                    close(t, SPAN_UNFINISHED)
                close(t, SPAN_ERROR if flags & FLAG_ERROR else 0)
            elif kind in (NODE_BEGIN, NODE_END):
                nodes += 1
        while stack:
            close(last_t, SPAN_UNFINISHED)
    per_module: dict[int, list[int]] = defaultdict(list)
    for k, s in enumerate(spans):
        per_module[s["module"]].append(k)
    for ks in per_module.values():
        for rank, k in enumerate(sorted(ks, key=lambda k: (spans[k]["start_ns"], k))):
            spans[k]["call"] = rank
    return {
        "spans": spans,
        "orphan_exits": orphans,
        "unfinished": unfinished,
        "node_events": nodes,
        "threads": sorted(by_tid),
    }


def assert_same(spans: Spans, ref: dict) -> None:
    assert len(spans) == len(ref["spans"])
    for field in FIELDS:
        expected = [s[field] for s in ref["spans"]]
        assert getattr(spans, field).tolist() == expected, field
    assert spans.orphan_exits == ref["orphan_exits"]
    assert spans.unfinished == ref["unfinished"]
    assert spans.node_events == ref["node_events"]
    assert spans.threads.tolist() == ref["threads"]


def test_nested_calls_give_depth_parent_and_self_time():
    # GIVEN root(0) calling a(1) twice, the second call calling b(2)
    ev = build_events([
        (7, ENTER, 0, 100),
        (7, ENTER, 1, 110), (7, EXIT, 1, 130),
        (7, ENTER, 1, 140), (7, ENTER, 2, 150), (7, EXIT, 2, 155), (7, EXIT, 1, 170),
        (7, EXIT, 0, 200),
    ])
    # WHEN spans are built
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    # THEN they come in pre-order with the expected tree and times
    assert s.module.tolist() == [0, 1, 1, 2]
    assert s.parent.tolist() == [-1, 0, 0, 2]
    assert s.depth.tolist() == [0, 1, 1, 2]
    assert s.start_ns.tolist() == [100, 110, 140, 150]
    assert s.end_ns.tolist() == [200, 130, 170, 155]
    assert s.self_ns.tolist() == [100 - 20 - 30, 20, 30 - 5, 5]
    assert s.call.tolist() == [0, 0, 1, 0]
    assert s.flags.tolist() == [0, 0, 0, 0]
    assert (s.orphan_exits, s.unfinished) == (0, 0)


def test_orphan_exit_at_ring_buffer_start_is_counted_without_span():
    ev = build_events([(1, EXIT, 3, 5), (1, ENTER, 0, 10), (1, EXIT, 0, 20), (1, EXIT, 0, 30)])
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert len(s) == 1
    assert s.orphan_exits == 2


def test_exit_deeper_in_stack_closes_frames_above_as_unfinished():
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 10), (1, ENTER, 2, 20), (1, EXIT, 0, 50)])
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert s.end_ns.tolist() == [50, 50, 50]
    assert s.flags.tolist() == [0, SPAN_UNFINISHED, SPAN_UNFINISHED]
    assert s.unfinished == 2


def test_frames_open_at_end_end_at_last_timestamp_of_their_thread():
    ev = build_events([(1, ENTER, 0, 0), (2, ENTER, 0, 5), (1, ENTER, 1, 10), (2, EXIT, 0, 99),
                       (1, NODE_BEGIN, 0, 40)])
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert s.tid.tolist() == [1, 1, 2]
    assert s.end_ns.tolist() == [40, 40, 99]
    assert s.flags.tolist() == [SPAN_UNFINISHED, SPAN_UNFINISHED, 0]
    assert s.unfinished == 2
    assert s.node_events == 1


def test_error_flag_on_exit_marks_span():
    ev = build_events([(1, ENTER, 0, 0), (1, EXIT, 0, 5, FLAG_ERROR)])
    assert Spans.from_events(ev, IDENTITY_CLOCK).flags.tolist() == [SPAN_ERROR]


def test_call_index_orders_calls_by_start_across_threads():
    # GIVEN module 1 called on two threads, the recorded order differing from start order
    ev = build_events([
        (9, ENTER, 1, 30), (9, EXIT, 1, 31),
        (3, ENTER, 1, 50), (3, EXIT, 1, 51),
        (9, ENTER, 1, 10), (9, EXIT, 1, 11),  # clock went backwards on thread 9
        (3, ENTER, 1, 20), (3, EXIT, 1, 21),
    ])
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    # THEN call follows start time, whatever the thread
    by_start = sorted(zip(s.start_ns.tolist(), s.call.tolist()))
    assert [c for _, c in by_start] == [0, 1, 2, 3]


def test_clock_conversion_is_applied():
    clock = Clock(ticks0=1000, unix_ns0=1_700_000_000_000_000_000, ns_per_tick=0.5)
    ev = build_events([(1, ENTER, 0, 1000), (1, EXIT, 0, 1010)])
    s = Spans.from_events(ev, clock)
    assert s.start_ns.tolist() == [1_700_000_000_000_000_000]
    assert s.end_ns.tolist() == [1_700_000_000_000_000_005]


def test_empty_stream():
    s = Spans.from_events(build_events([]), IDENTITY_CLOCK)
    assert len(s) == 0 and s.threads.tolist() == [] and s.orphan_exits == 0


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_on_damaged_multithread_streams(seed):
    ev = random_stream(seed)
    clock = Clock(ticks0=17, unix_ns0=1_700_000_000_123_456_789, ns_per_tick=0.731)
    assert_same(Spans.from_events(ev, clock), reference_spans(ev, clock))


@pytest.mark.parametrize("seed", range(20))
def test_matches_reference_on_garbage_streams(seed):
    ev = garbage_stream(seed)
    assert_same(Spans.from_events(ev, IDENTITY_CLOCK), reference_spans(ev, IDENTITY_CLOCK))


def test_matches_reference_on_deep_recursion_with_lost_exits():
    # one module recursing 500 deep, every 7th EXIT lost
    rows = [(1, ENTER, 0, i) for i in range(500)]
    rows += [(1, EXIT, 0, 1000 + i) for i in range(500) if i % 7]
    ev = build_events(rows)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK))
    assert s.unfinished == 500 // 7 + 1


def test_undamaged_streams_have_no_anomalies():
    ev = random_stream(3, p_lose_exit=0, p_lose_enter=0, p_stray_exit=0, cut_front=False)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert (s.orphan_exits, s.unfinished) == (0, 0)
    # every span lies inside its parent and self time is never negative
    has_parent = s.parent >= 0
    p = s.parent[has_parent]
    assert np.all(s.start_ns[has_parent] >= s.start_ns[p])
    assert np.all(s.end_ns[has_parent] <= s.end_ns[p])
    assert np.all(s.self_ns >= 0)


def test_non_contiguous_events_are_accepted():
    ev = random_stream(5)
    strided = np.concatenate([ev, ev])[::2]
    assert_same(Spans.from_events(strided, IDENTITY_CLOCK),
                reference_spans(np.ascontiguousarray(strided), IDENTITY_CLOCK))


def test_sparse_module_ids_match_reference():
    # ids far beyond the number of spans (only possible without file validation)
    ev = random_stream(9, n_modules=4)
    ev["id"] = np.array([0, 2**32 - 1, 1 << 20, 77], np.uint32)[ev["id"] % 4]
    assert_same(Spans.from_events(ev, IDENTITY_CLOCK), reference_spans(ev, IDENTITY_CLOCK))
