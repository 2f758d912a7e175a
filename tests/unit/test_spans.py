"""Span building (C++) against a straightforward pure-Python reference."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pytest
from conftest import IDENTITY_CLOCK, build_events, events_from, garbage_stream, random_stream

from hooktrace._events import ENTER, EXIT, FLAG_ERROR, NODE_BEGIN, NODE_END, Clock
from hooktrace import _C
from hooktrace.reading import (
    CAT_BACKWARD,
    CAT_FORWARD,
    CAT_RECOMPUTE,
    SPAN_ERROR,
    SPAN_UNFINISHED,
    Spans,
)

FIELDS = ("start_ns", "end_ns", "self_ns", "parent", "module", "tid", "depth", "call", "flags",
          "cat")


NO_SEQ = 2**64 - 1
NODE_FIELDS = ("start_ns", "end_ns", "self_ns", "seq", "name", "tid", "pass", "span")


def reference_spans(events: np.ndarray, clock: Clock, post_hook_names: Sequence[int] = ()
                    ) -> dict:
    """The span rules written as plainly as possible (one Python object per event).

    Forward/recompute spans by pairing ENTER/EXIT per thread; autograd nodes by
    pairing NODE_BEGIN/NODE_END by sequence number; then backward spans from the
    nodes (rules in csrc/backward_spans.h).
    """
    t_ns = clock.to_unix_ns(events["t"]).tolist()
    by_tid: dict[int, list[int]] = defaultdict(list)
    for i, tid in enumerate(events["tid"].tolist()):
        by_tid[tid].append(i)
    spans: list[dict] = []
    nodes: list[dict] = []
    orphans = unfinished = n_node_events = 0
    for tid in sorted(by_tid):
        stack: list[list[int]] = []  # [span index, sum of children's durations]
        node_stack: list[list[int]] = []  # [node index, sum of nested nodes' durations]

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

        def close_node(end: int, task: int, lost: bool) -> None:
            nonlocal unfinished
            idx, child_sum = node_stack.pop()
            nd = nodes[idx]
            nd["end_ns"] = end
            nd["self_ns"] = end - nd["start_ns"] - child_sum
            nd["task"] = task
            unfinished += lost
            if node_stack:
                node_stack[-1][1] += end - nd["start_ns"]

        last_t = 0
        for i in by_tid[tid]:
            kind, mod, flags, t = (int(events["kind"][i]), int(events["id"][i]),
                                   int(events["flags"][i]), t_ns[i])
            seq, rf_tid = int(events["seq"][i]), int(events["rf_tid"][i])
            last_t = t
            if kind == ENTER:
                spans.append(dict(start_ns=t, end_ns=t, self_ns=0,
                                  parent=stack[-1][0] if stack else -1, module=mod, tid=tid,
                                  depth=len(stack), call=0, flags=0,
                                  cat=CAT_RECOMPUTE if node_stack else CAT_FORWARD,
                                  seq_enter=seq, seq_exit=seq, rf_tid=rf_tid))
                stack.append([len(spans) - 1, 0])
            elif kind == EXIT:
                match = [k for k, (idx, _) in enumerate(stack) if spans[idx]["module"] == mod]
                if not match:
                    orphans += 1
                    continue
                while len(stack) > match[-1] + 1:
                    close(t, SPAN_UNFINISHED)
                spans[stack[-1][0]]["seq_exit"] = seq
                close(t, SPAN_ERROR if flags & FLAG_ERROR else 0)
            elif kind == NODE_BEGIN:
                n_node_events += 1
                nodes.append(dict(start_ns=t, end_ns=t, self_ns=0, seq=seq, name=mod, tid=tid,
                                  fwd=rf_tid, parent=node_stack[-1][0] if node_stack else -1,
                                  task=2**32 - 1))
                node_stack.append([len(nodes) - 1, 0])
            elif kind == NODE_END:
                n_node_events += 1
                match = [k for k, (idx, _) in enumerate(node_stack) if nodes[idx]["seq"] == seq]
                if not match:
                    orphans += 1
                    continue
                while len(node_stack) > match[-1] + 1:
                    close_node(t, 2**32 - 1, True)
                close_node(t, mod, False)
        while stack:
            close(last_t, SPAN_UNFINISHED)
        while node_stack:
            close_node(last_t, 2**32 - 1, True)

    # call: rank among the module's forward spans by (start, index)
    per_module: dict[int, list[int]] = defaultdict(list)
    for k, s in enumerate(spans):
        if s["cat"] == CAT_FORWARD:
            per_module[s["module"]].append(k)
    for ks in per_module.values():
        for rank, k in enumerate(sorted(ks, key=lambda k: (spans[k]["start_ns"], k))):
            spans[k]["call"] = rank
    # a recompute stands for the latest earlier forward call of its module
    owner = {k: k for k, s in enumerate(spans) if s["cat"] == CAT_FORWARD}
    for r, s in enumerate(spans):
        if s["cat"] != CAT_RECOMPUTE:
            continue
        before = [k for k in per_module.get(s["module"], [])
                  if (spans[k]["start_ns"], k) < (s["start_ns"], r)]
        if before:
            f = max(before, key=lambda k: (spans[k]["start_ns"], k))
            owner[r] = f
            s["call"] = spans[f]["call"]
        else:
            s["call"] = 2**32 - 1

    # pass: the graph task of the outermost node on the node's thread
    for nd in nodes:
        root = nd
        while root["parent"] >= 0:
            root = nodes[root["parent"]]
        nd["pass"] = root["task"]

    # extents, hooks included: the gap before an outermost node (same thread, same pass)
    # goes to that node (its pre-hooks), or to the previous node when that one's name
    # is in post_hook_names (its post-hooks)
    for nd in nodes:
        nd["from"], nd["to"] = nd["start_ns"], nd["end_ns"]
    outer = sorted((k for k, nd in enumerate(nodes) if nd["parent"] < 0),
                   key=lambda k: (nodes[k]["tid"], nodes[k]["pass"], nodes[k]["start_ns"], k))
    for prev, cur in zip(outer, outer[1:]):
        a, b = nodes[prev], nodes[cur]
        if a["tid"] == b["tid"] and a["pass"] == b["pass"] and a["end_ns"] <= b["start_ns"]:
            if a["name"] in post_hook_names:
                a["to"] = b["start_ns"]
            else:
                b["from"] = a["end_ns"]

    # attribution: the innermost call on the forward thread whose range holds the seq
    n_calls = len(spans)
    bwd: dict[tuple[int, int], dict] = {}
    for nd in nodes:
        nd["key"] = None
        if nd["seq"] == NO_SEQ:
            continue
        holders = [k for k in range(n_calls)
                   if spans[k]["rf_tid"] == nd["fwd"]
                   and spans[k]["seq_enter"] <= nd["seq"] < spans[k]["seq_exit"]]
        if not holders:
            continue
        # equal ranges (a forward that only calls a child): the later call is the inner one
        call = max(holders, key=lambda k: (spans[k]["seq_enter"], -spans[k]["seq_exit"], k))
        if call not in owner:
            continue
        o = owner[call]
        a = o
        while a >= 0:
            b = bwd.setdefault((a, nd["pass"]), dict(start=None, end=None, self=0, tid=0))
            if b["start"] is None or nd["from"] < b["start"]:
                b["start"], b["tid"] = nd["from"], nd["tid"]
            b["end"] = nd["to"] if b["end"] is None else max(b["end"], nd["to"])
            if a == o:
                b["self"] += nd["self_ns"]
            a = spans[a]["parent"]
        nd["key"] = (o, nd["pass"])

    keys = sorted(bwd, key=lambda k: (bwd[k]["tid"], bwd[k]["start"], -bwd[k]["end"],
                                      spans[k[0]]["depth"], k))
    index = {k: n_calls + j for j, k in enumerate(keys)}
    for (f, p) in keys:
        b = bwd[(f, p)]
        fp = spans[f]["parent"]
        spans.append(dict(start_ns=b["start"], end_ns=b["end"], self_ns=b["self"],
                          parent=index.get((fp, p), -1) if fp >= 0 else -1,
                          module=spans[f]["module"], tid=b["tid"], depth=spans[f]["depth"],
                          call=spans[f]["call"], flags=0, cat=CAT_BACKWARD))
    for nd in nodes:
        nd["span"] = index[nd["key"]] if nd["key"] is not None else -1
    return {
        "spans": spans,
        "nodes": nodes,
        "orphan_exits": orphans,
        "unfinished": unfinished,
        "node_events": n_node_events,
        "threads": sorted(by_tid),
    }


def assert_same(spans: Spans, ref: dict, raw: dict | None = None) -> None:
    assert len(spans) == len(ref["spans"])
    for field in FIELDS:
        expected = [s[field] for s in ref["spans"]]
        assert getattr(spans, field).tolist() == expected, field
    assert spans.orphan_exits == ref["orphan_exits"]
    assert spans.unfinished == ref["unfinished"]
    assert spans.node_events == ref["node_events"]
    assert spans.threads.tolist() == ref["threads"]
    if raw is not None:
        for field in NODE_FIELDS:
            assert raw["node_" + field].tolist() == [nd[field] for nd in ref["nodes"]], field


def raw_spans(events: np.ndarray, clock: Clock) -> dict:
    events = np.ascontiguousarray(events)
    return _C.build_spans(events, np.ascontiguousarray(clock.to_unix_ns(events["t"])))


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
    assert s.unfinished == 3  # two calls and the autograd node, none with an end
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
    ev = random_stream(seed, p_node=0.05)
    clock = Clock(ticks0=17, unix_ns0=1_700_000_000_123_456_789, ns_per_tick=0.731)
    assert_same(Spans.from_events(ev, clock), reference_spans(ev, clock), raw_spans(ev, clock))


@pytest.mark.parametrize("seed", range(20))
def test_matches_reference_on_garbage_streams(seed):
    ev = garbage_stream(seed)
    assert_same(Spans.from_events(ev, IDENTITY_CLOCK), reference_spans(ev, IDENTITY_CLOCK),
                raw_spans(ev, IDENTITY_CLOCK))


def test_matches_reference_on_deep_recursion_with_lost_exits():
    # one module recursing 500 deep, every 7th EXIT lost
    rows = [(1, ENTER, 0, i) for i in range(500)]
    rows += [(1, EXIT, 0, 1000 + i) for i in range(500) if i % 7]
    ev = build_events(rows)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK))
    assert s.unfinished == 500 // 7 + 1


def test_undamaged_streams_have_no_anomalies():
    ev = random_stream(3, p_lose_exit=0, p_lose_enter=0, p_stray_exit=0, p_node=0,
                       cut_front=False)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert (s.orphan_exits, s.unfinished) == (0, 0)
    # every span lies inside its parent and self time is never negative
    has_parent = s.parent >= 0
    p = s.parent[has_parent]
    assert np.all(s.start_ns[has_parent] >= s.start_ns[p])
    assert np.all(s.end_ns[has_parent] <= s.end_ns[p])
    assert np.all(s.self_ns >= 0)


def test_non_contiguous_events_are_accepted():
    ev = random_stream(5, p_node=0.05)
    strided = np.concatenate([ev, ev])[::2]
    assert_same(Spans.from_events(strided, IDENTITY_CLOCK),
                reference_spans(np.ascontiguousarray(strided), IDENTITY_CLOCK))


def test_sparse_module_ids_match_reference():
    # ids far beyond the number of spans (only possible without file validation)
    ev = random_stream(9, n_modules=4)
    ev["id"] = np.array([0, 2**32 - 1, 1 << 20, 77], np.uint32)[ev["id"] % 4]
    assert_same(Spans.from_events(ev, IDENTITY_CLOCK), reference_spans(ev, IDENTITY_CLOCK))


def fb_events(rows: list[tuple]) -> np.ndarray:
    """Events from (tid, kind, id, t, seq[, rf_tid]) rows; rf_tid defaults to 1."""
    return events_from([(*row[:5], row[5] if len(row) > 5 else 1) for row in rows],
                       ("tid", "kind", "id", "t", "seq", "rf_tid"))


def test_backward_nodes_are_attributed_by_sequence_number_on_the_forward_thread():
    # GIVEN root(0) -> a(1), b(2) on thread 7 whose nodes got seq 10..14,
    # then a backward on thread 9 (the engine's thread) in graph task 5
    rows = [
        (7, ENTER, 0, 100, 10), (7, ENTER, 1, 110, 10), (7, EXIT, 1, 120, 12),
        (7, ENTER, 2, 130, 12), (7, EXIT, 2, 140, 14), (7, EXIT, 0, 150, 15),
        (9, NODE_BEGIN, 0, 200, 15), (9, NODE_END, 5, 210, 15),         # loss: outside modules
        (9, NODE_BEGIN, 1, 210, 13), (9, NODE_END, 5, 230, 13),         # b
        (9, NODE_BEGIN, 2, 230, NO_SEQ), (9, NODE_END, 5, 232, NO_SEQ),  # AccumulateGrad
        (9, NODE_BEGIN, 1, 240, 11), (9, NODE_END, 5, 250, 11),         # a
        (9, NODE_BEGIN, 1, 250, 10), (9, NODE_END, 5, 270, 10),         # a
    ]
    ev = fb_events(rows)
    # WHEN spans are built
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    raw = raw_spans(ev, IDENTITY_CLOCK)
    # THEN each module call gets one backward span linked by module and call
    bwd = np.flatnonzero(s.cat == CAT_BACKWARD)
    got = {int(s.module[i]): (int(s.start_ns[i]), int(s.end_ns[i]), int(s.self_ns[i]),
                              int(s.tid[i]), int(s.call[i])) for i in bwd}
    # (a's span reaches back over the gap before its first node, where the engine runs
    # that node's pre-hooks: from AccumulateGrad's end, 232)
    assert got == {0: (210, 270, 0, 9, 0), 1: (232, 270, 30, 9, 0), 2: (210, 230, 20, 9, 0)}
    root_bwd = [i for i in bwd if s.module[i] == 0][0]
    assert all(s.parent[i] == root_bwd for i in bwd if s.module[i] != 0)
    # and the loss and AccumulateGrad are kept, unattributed
    assert raw["node_span"].tolist()[0] == -1 and raw["node_span"].tolist()[2] == -1
    assert raw["node_pass"].tolist() == [5] * 5
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK), raw)


def test_the_gap_after_a_backward_hook_node_is_its_modules():
    # GIVEN module 1's BackwardHookFunctionBackward node (name 3), whose post-hooks run
    # register_full_backward_hook's hooks, then module 0's node after a 20 ns gap
    rows = [
        (7, ENTER, 0, 100, 10), (7, ENTER, 1, 110, 11), (7, EXIT, 1, 120, 12),
        (7, EXIT, 0, 150, 13),
        (9, NODE_BEGIN, 3, 200, 11), (9, NODE_END, 5, 210, 11),   # module 1's hook node
        (9, NODE_BEGIN, 4, 230, 10), (9, NODE_END, 5, 240, 10),   # module 0's node
    ]
    ev = fb_events(rows)
    names = ["A", "B", "C", "BackwardHookFunctionBackward", "AddmmBackward0"]
    # WHEN spans are built knowing the node names
    s = Spans.from_events(ev, IDENTITY_CLOCK, names)
    bwd = np.flatnonzero(s.cat == CAT_BACKWARD)
    got = {int(s.module[i]): (int(s.start_ns[i]), int(s.end_ns[i]), int(s.self_ns[i]))
           for i in bwd}
    # THEN the gap is module 1's (extent only; self stays the node's own)
    assert got == {0: (200, 240, 10), 1: (200, 230, 10)}
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK, [3]))
    # and without the names it is module 0's (the pre-hooks of its node)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    got = {int(s.module[i]): (int(s.start_ns[i]), int(s.end_ns[i])) for i in
           np.flatnonzero(s.cat == CAT_BACKWARD)}
    assert got == {0: (200, 240), 1: (200, 210)}
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK))


def test_passes_over_one_forward_are_separate_spans():
    # retain_graph=True: the same node runs in graph tasks 1 and 2
    rows = [(1, ENTER, 0, 0, 0), (1, EXIT, 0, 10, 1),
            (1, NODE_BEGIN, 0, 20, 0), (1, NODE_END, 1, 30, 0),
            (1, NODE_BEGIN, 0, 40, 0), (1, NODE_END, 2, 55, 0)]
    s = Spans.from_events(fb_events(rows), IDENTITY_CLOCK)
    bwd = s.cat == CAT_BACKWARD
    assert s.start_ns[bwd].tolist() == [20, 40] and s.end_ns[bwd].tolist() == [30, 55]
    assert s.call[bwd].tolist() == [0, 0]


def test_forward_inside_a_node_is_a_recompute_of_the_latest_call():
    # GIVEN two forward calls of module 1 (checkpointed inside root 0) ...
    rows = [
        (1, ENTER, 0, 0, 0), (1, ENTER, 1, 1, 0), (1, EXIT, 1, 2, 0), (1, EXIT, 0, 3, 1),
        (1, ENTER, 0, 10, 1), (1, ENTER, 1, 11, 1), (1, EXIT, 1, 12, 1), (1, EXIT, 0, 13, 2),
        # ... a backward node of root call 1 recomputes module 1, creating seq 2..3,
        (1, NODE_BEGIN, 0, 20, 1),
        (1, ENTER, 1, 21, 2), (1, EXIT, 1, 25, 4),
        (1, NODE_BEGIN, 1, 26, 3), (1, NODE_END, 8, 28, 3),  # reentrant backward (task 8)
        (1, NODE_END, 7, 30, 1),
    ]
    ev = fb_events(rows)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    raw = raw_spans(ev, IDENTITY_CLOCK)
    # THEN the re-run is a recompute standing for module 1's call 1, not a third call
    rec = np.flatnonzero(s.cat == CAT_RECOMPUTE)
    assert len(rec) == 1 and s.module[rec[0]] == 1 and s.call[rec[0]] == 1
    assert sorted(s.call[(s.cat == CAT_FORWARD) & (s.module == 1)].tolist()) == [0, 1]
    # and its node counts for module 1 call 1 in the outer pass (task 7)
    bwd = np.flatnonzero(s.cat == CAT_BACKWARD)
    got = {(int(s.module[i]), int(s.call[i])): (int(s.start_ns[i]), int(s.end_ns[i]))
           for i in bwd}
    assert got == {(0, 1): (20, 30), (1, 1): (26, 28)}
    assert raw["node_pass"].tolist() == [7, 7]
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK), raw)


def test_attribution_uses_the_forward_thread_not_just_the_sequence_number():
    # two threads whose sequence numbers overlap (each thread counts its own)
    rows = [(1, ENTER, 0, 0, 5, 11), (1, EXIT, 0, 10, 8, 11),
            (2, ENTER, 1, 0, 5, 22), (2, EXIT, 1, 10, 8, 22),
            (3, NODE_BEGIN, 0, 20, 6, 22), (3, NODE_END, 1, 25, 6, 22),
            (3, NODE_BEGIN, 0, 30, 6, 11), (3, NODE_END, 1, 35, 6, 11)]
    s = Spans.from_events(fb_events(rows), IDENTITY_CLOCK)
    bwd = np.flatnonzero(s.cat == CAT_BACKWARD)
    # (module 0's node starts after module 1's on thread 3: the gap 25-30 is its hooks')
    assert {int(s.module[i]): int(s.start_ns[i]) for i in bwd} == {1: 20, 0: 25}


def test_equal_sequence_ranges_go_to_the_inner_call():
    # GIVEN a wrapper (0) whose forward only calls a child (1): both ranges are [3, 5)
    rows = [(1, ENTER, 0, 0, 3), (1, ENTER, 1, 1, 3), (1, EXIT, 1, 2, 5), (1, EXIT, 0, 3, 5),
            (1, NODE_BEGIN, 0, 10, 4), (1, NODE_END, 1, 12, 4)]
    ev = fb_events(rows)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    raw = raw_spans(ev, IDENTITY_CLOCK)
    # THEN the node is the child's own time, and the wrapper's backward span only encloses it
    bwd = np.flatnonzero(s.cat == CAT_BACKWARD)
    assert {int(s.module[i]): int(s.self_ns[i]) for i in bwd} == {0: 0, 1: 2}
    assert int(s.module[raw["node_span"][0]]) == 1
    assert_same(s, reference_spans(ev, IDENTITY_CLOCK), raw)


def deep_chain(depth: int) -> np.ndarray:
    """``depth`` nested calls; on the way out each creates one autograd node, so
    call k's sequence range [0, depth - k) holds every range below it; then one
    backward pass (graph task 1) runs the nodes newest first, 10 ns each."""
    rows = [(1, ENTER, k % 50, k, 0) for k in range(depth)]
    rows += [(1, EXIT, k % 50, depth + (depth - 1 - k), depth - k)
             for k in range(depth - 1, -1, -1)]
    t0 = 2 * depth
    for j, seq in enumerate(range(depth - 1, -1, -1)):  # node seq j belongs to call depth-1-j
        rows += [(1, NODE_BEGIN, 0, t0 + 10 * j, seq), (1, NODE_END, 1, t0 + 10 * j + 10, seq)]
    return fb_events(rows)


def test_deep_chain_matches_reference():
    ev = deep_chain(300)
    assert_same(Spans.from_events(ev, IDENTITY_CLOCK), reference_spans(ev, IDENTITY_CLOCK),
                raw_spans(ev, IDENTITY_CLOCK))


def test_twenty_thousand_nested_calls_are_attributed_each_to_its_own_call():
    # issue #8: attribution used to cost O(depth) per node (seconds at this depth);
    # the time is measured by benchmarks/attribution.py, here only the result
    depth = 20_000
    ev = deep_chain(depth)
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    raw = raw_spans(ev, IDENTITY_CLOCK)
    fwd = np.flatnonzero(s.cat == CAT_FORWARD)
    bwd = np.flatnonzero(s.cat == CAT_BACKWARD)
    assert len(fwd) == len(bwd) == depth and (s.orphan_exits, s.unfinished) == (0, 0)
    # forward span k is call k at depth k; its backward span starts with its own node
    # (call 0's runs first) and ends with the last node, the deepest call's
    assert s.depth[fwd].tolist() == list(range(depth))
    by_depth = bwd[np.argsort(s.depth[bwd])]
    t0 = 2 * depth
    assert s.start_ns[by_depth].tolist() == [t0 + 10 * k for k in range(depth)]
    assert np.all(s.end_ns[by_depth] == t0 + 10 * depth)
    assert np.all(s.self_ns[by_depth] == 10)
    assert s.parent[by_depth[0]] == -1 and s.parent[by_depth[1:]].tolist() == by_depth[:-1].tolist()
    # every node is attributed to its own call's span, in one pass
    assert raw["node_span"].tolist() == by_depth.tolist()
    assert set(raw["node_pass"].tolist()) == {1}


def test_twenty_thousand_orphan_exits_are_counted():
    depth = 20_000
    rows = [(1, ENTER, 0, k) for k in range(depth)]
    rows += [(1, EXIT, 1, depth + k) for k in range(depth)]  # module 1 was never entered
    rows += [(1, NODE_BEGIN, 0, 2 * depth + k) for k in range(depth)]
    rows += [(1, NODE_END, 0, 3 * depth + k) for k in range(depth)]  # seq never begun
    ev = build_events(rows)
    ev["seq"][-depth:] += 10 * depth
    s = Spans.from_events(ev, IDENTITY_CLOCK)
    assert s.orphan_exits == 2 * depth and s.unfinished == 2 * depth and len(s) == depth
    assert np.all(s.end_ns == 4 * depth - 1)
