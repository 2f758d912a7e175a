"""Chrome export of backward spans and autograd nodes (synthetic spans, issue #3)."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from conftest import NODE_NAMES, backward_trace, default_modules, trace_with_spans

from hooktrace.exporters.chrome import write_chrome
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, NO_PASS, Nodes, Spans


def export(trace, *, nodes: bool) -> dict:
    buf = io.BytesIO()
    write_chrome(trace, buf, nodes=nodes)
    return json.loads(buf.getvalue(), parse_float=Decimal)


def to_ns(us: Decimal) -> int:
    ns = us * 1000
    assert ns == int(ns), us
    return int(ns)


def row_names(doc: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def by_cat(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            assert e["cat"].startswith("hooktrace.")
            out[e["cat"].removeprefix("hooktrace.")].append(e)
    return out


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_every_row_nests_strictly(seed, nodes):
    # GIVEN interleaving backward spans, nested and cross-thread nodes, recompute
    doc = export(backward_trace(seed), nodes=nodes)
    # WHEN the X events are grouped by Chrome row
    rows: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            start = to_ns(e["ts"])
            rows[(e["pid"], e["tid"])].append((start, start + to_ns(e["dur"])))
    # THEN within every row any two intervals are disjoint or nested
    for intervals in rows.values():
        intervals.sort(key=lambda iv: (iv[0], -iv[1]))
        open_ends: list[int] = []
        for start, end in intervals:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], (start, end, open_ends)
            open_ends.append(end)


def test_backward_spans_sit_on_their_threads_backward_tracks():
    trace = backward_trace(1)
    spans = trace.spans()
    doc = export(trace, nodes=False)
    names = row_names(doc)
    cats = by_cat(doc)
    bwd = np.flatnonzero(spans.cat == CAT_BACKWARD)
    assert len(cats["backward"]) == len(bwd)
    direct = Counter(spans.nodes.span.tolist())
    base = doc["baseTimeNanoseconds"]
    # written in span order: forward and recompute first, then backward
    for i, e in zip(bwd.tolist(), cats["backward"]):
        name, type_name = trace.modules[spans.module[i]]
        assert e["name"] == (name or type_name)
        assert e["args"] == {"module": name, "type": type_name, "call": int(spans.call[i]),
                             "nodes": direct[i]}
        assert names[e["tid"]].startswith(f"thread {spans.tid[i]} backward")
        assert e["tid"] > max(spans.threads.tolist())
        assert base + to_ns(e["ts"]) == spans.start_ns[i]
        assert to_ns(e["dur"]) == spans.end_ns[i] - spans.start_ns[i]
    # forward and recompute stay on the OS thread's own row, without "nodes"
    for cat in ("forward", "recompute"):
        assert cats[cat]
        for e in cats[cat]:
            assert e["tid"] in spans.threads.tolist() and "nodes" not in e["args"]


@pytest.mark.parametrize("nodes", [False, True])
def test_unattributed_nodes_are_always_written(nodes):
    trace = backward_trace(2)
    spans = trace.spans()
    doc = export(trace, nodes=nodes)
    names = row_names(doc)
    loose = np.flatnonzero(spans.nodes.span < 0)
    events = by_cat(doc)["autograd_unattributed"]
    assert len(loose) > 0 and len(events) == len(loose) == spans.unattributed_nodes
    for i, e in zip(loose.tolist(), events):
        assert e["name"] == NODE_NAMES[spans.nodes.name[i]]
        assert names[e["tid"]].startswith(f"thread {spans.nodes.tid[i]} autograd (unattributed")
        assert e["args"]["module"] == "" and e["args"]["seq"] == spans.nodes.seq[i]
    block = doc["hooktrace"]
    assert block["unattributed_nodes"] == len(loose)
    assert block["unattributed_ns"] == int(spans.nodes.self_ns[loose].sum())
    assert block["autograd_nodes"] == len(spans.nodes)
    assert block["backward_spans"] == int(np.count_nonzero(spans.cat == CAT_BACKWARD))


def test_attributed_nodes_only_with_nodes_true():
    trace = backward_trace(3)
    spans = trace.spans()
    assert by_cat(export(trace, nodes=False))["autograd_node"] == []
    doc = export(trace, nodes=True)
    names = row_names(doc)
    attributed = np.flatnonzero(spans.nodes.span >= 0)
    events = by_cat(doc)["autograd_node"]
    assert len(events) == len(attributed) > 0
    for i, e in zip(attributed.tolist(), events):
        module = trace.modules[spans.module[spans.nodes.span[i]]][0]
        p = int(spans.nodes.pass_id[i])
        assert e["args"] == {"seq": int(spans.nodes.seq[i]), "module": module,
                             "pass": None if p == NO_PASS else p}
        assert names[e["tid"]].startswith(f"thread {spans.nodes.tid[i]} backward")


def test_tracks_are_named_numbered_and_sorted_below_their_thread():
    doc = export(backward_trace(4), nodes=True)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    names = row_names(doc)
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in meta
                  if e["name"] == "thread_sort_index"}
    assert set(sort_index) == set(names)
    tracks = doc["hooktrace"]["tracks"]
    os_tids = {101, 202}
    assert {t for t in names if t <= max(os_tids)} == os_tids
    # track tids are the smallest free ones: short numbers next to the thread names
    assert sorted(tr["tid"] for tr in tracks) == list(range(203, 203 + len(tracks)))
    for track in tracks:
        t, thread, kind, lane = track["tid"], track["thread"], track["kind"], track["lane"]
        expected = {
            ("backward", 0): f"thread {thread} backward",
            ("unattributed", 0): f"thread {thread} autograd (unattributed)",
        }.get((kind, lane), f"thread {thread} backward (overlap {lane})" if kind == "backward"
              else f"thread {thread} autograd (unattributed, overlap {lane})")
        assert names[t] == expected
    # display order: each OS thread, then its backward lanes, then its unattributed lanes
    in_order = sorted(names, key=sort_index.__getitem__)
    assert len(set(sort_index.values())) == len(sort_index)
    expected_order: list[int] = []
    for thread in sorted(os_tids):
        expected_order.append(thread)
        mine = [tr for tr in tracks if tr["thread"] == thread]
        mine.sort(key=lambda tr: (tr["kind"] != "backward", tr["lane"]))
        expected_order += [tr["tid"] for tr in mine]
    assert in_order == expected_order
    assert any(tr["lane"] > 0 for tr in tracks)  # the synthetic run does overlap


def small_spans(node_span: list[int], node_tid: list[int] | None = None) -> Spans:
    """Root forward call 0..10 on tid 7; backward root 20..60 with two
    overlapping children 22..40 and 30..50 (sibling interleaving); nodes at
    22..24, 30..33, 38..40, 48..50, 55..60 attributed as given."""
    n = len(node_span)
    spans = {
        "start_ns": np.array([0, 1, 20, 22, 30], np.int64),
        "end_ns": np.array([10, 9, 60, 40, 50], np.int64),
        "self_ns": np.array([2, 8, 5, 4, 5], np.int64),
        "parent": np.array([-1, 0, -1, 2, 2], np.int64),
        "module": np.array([0, 1, 0, 1, 1], np.uint32),
        "tid": np.array([7] * 5, np.uint32),
        "depth": np.array([0, 1, 0, 1, 1], np.uint32),
        "call": np.array([0, 0, 0, 0, 0], np.uint32),
        "flags": np.zeros(5, np.uint8),
        "cat": np.array([CAT_FORWARD, CAT_FORWARD] + [CAT_BACKWARD] * 3, np.uint8),
    }
    starts = [22, 30, 38, 48, 55][:n]
    ends = [24, 33, 40, 50, 60][:n]
    nodes = Nodes({
        "start_ns": np.array(starts, np.int64), "end_ns": np.array(ends, np.int64),
        "self_ns": np.array(ends, np.int64) - np.array(starts, np.int64),
        "seq": np.arange(n, dtype=np.uint64), "name": np.array([0, 1, 2, 9, 3][:n], np.uint32),
        "tid": np.array(node_tid or [7] * n, np.uint32),
        "pass_id": np.array([0, 0, 0, NO_PASS, 0][:n], np.uint32),
        "span": np.array(node_span, np.int64),
    })
    return Spans(spans, threads=np.array([7], np.uint32), orphan_exits=0, unfinished=0,
                 nodes=nodes)


def test_overlapping_siblings_get_an_overlap_lane():
    trace = trace_with_spans(small_spans([3, 4, 3, -1, 2]), default_modules(2), NODE_NAMES)
    doc = export(trace, nodes=True)
    names = row_names(doc)
    cats = by_cat(doc)
    assert [names[e["tid"]] for e in cats["backward"]] == [
        "thread 7 backward", "thread 7 backward", "thread 7 backward (overlap 1)"]
    # nodes 22..24 and 38..40 nest in the first child, 30..33 in the second, 55..60 in the root
    assert [names[e["tid"]] for e in cats["autograd_node"]] == [
        "thread 7 backward", "thread 7 backward (overlap 1)", "thread 7 backward",
        "thread 7 backward"]
    (loose,) = cats["autograd_unattributed"]
    assert names[loose["tid"]] == "thread 7 autograd (unattributed)"
    assert loose["name"] == "<node 9>" and loose["args"]["pass"] is None
    assert [e["args"]["nodes"] for e in cats["backward"]] == [1, 2, 1]


def test_node_on_a_thread_without_spans_gets_that_threads_tracks():
    trace = trace_with_spans(small_spans([-1], node_tid=[99]), default_modules(2), NODE_NAMES)
    doc = export(trace, nodes=False)
    names = row_names(doc)
    assert names[99] == "thread 99"
    (e,) = by_cat(doc)["autograd_unattributed"]
    assert names[e["tid"]] == "thread 99 autograd (unattributed)"


def test_user_thread_names_carry_over_to_tracks():
    trace = trace_with_spans(small_spans([3]), default_modules(2), NODE_NAMES,
                             thread_names={"7": "main"})
    assert set(row_names(export(trace, nodes=False)).values()) == {
        "main", "main backward", "main backward (overlap 1)"}


def test_export_chrome_nodes_flag_on_files(tmp_path: Path):
    trace = backward_trace(5)
    trace.export_chrome(tmp_path / "plain.json")
    trace.export_chrome(tmp_path / "nodes.json.gz", nodes=True)
    plain = json.loads((tmp_path / "plain.json").read_text())
    with gzip.open(tmp_path / "nodes.json.gz", "rt") as f:
        detailed = json.load(f)
    count = Counter(e["cat"] for e in detailed["traceEvents"] if e["ph"] == "X")
    assert count["hooktrace.autograd_node"] == (len(trace.spans().nodes)
                                                - trace.spans().unattributed_nodes)
    assert not any(e.get("cat") == "hooktrace.autograd_node" for e in plain["traceEvents"])
