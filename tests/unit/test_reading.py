"""TraceData: construction contract, caching, and load."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IDENTITY_CLOCK, backward_spans, build_events, build_trace, random_stream

from hooktrace import _span_tables
from hooktrace._events import EVENT_DTYPE
from hooktrace.reading import NO_PASS, Nodes, Spans, TraceData
from hooktrace.result import load
from hooktrace.analysis.summary import Summary
from hooktrace.format import TraceFileError


def test_required_info_keys():
    with pytest.raises(ValueError, match="hostname"):
        TraceData(np.zeros(0, EVENT_DTYPE), [], [], IDENTITY_CLOCK,
                  {"pid": 1, "dropped_events": 0, "overwritten_events": 0})


def test_events_must_have_event_dtype():
    with pytest.raises(TypeError, match="EVENT_DTYPE"):
        build_trace(np.zeros(4, np.uint64), [])


def test_spans_are_cached():
    trace = build_trace(random_stream(0))
    assert trace.spans() is trace.spans()


def test_subclass_with_own_constructor():
    class Trace(TraceData):
        def __init__(self) -> None:
            super().__init__(build_events([(1, 1, 0, 0), (1, 2, 0, 9)]), [("", "Net")], [],
                             IDENTITY_CLOCK, {"pid": 1, "hostname": "h", "dropped_events": 0,
                                              "overwritten_events": 0})

    t = Trace()
    assert len(t.spans()) == 1 and Summary.from_trace(t).rows[0]["total_ns"] == 9


def test_load_raises_trace_file_error(tmp_path):
    bad = tmp_path / "bad.htrace"
    bad.write_bytes(b"HTRACE")
    with pytest.raises(TraceFileError, match="bad.htrace: offset 6: truncated header"):
        load(bad)


def test_repr_mentions_size():
    assert "0 events" in repr(build_trace(build_events([]), []))


def test_spans_without_nodes_get_empty_nodes():
    spans = build_trace(random_stream(1)).spans()
    assert len(spans.nodes) == 0 and spans.unattributed_nodes == 0
    assert spans.nodes.to_records().dtype.names == ("start_ns", "end_ns", "self_ns", "seq",
                                                     "name", "tid", "pass_id", "span")


def test_from_events_fills_nodes_from_build_spans(monkeypatch):
    # GIVEN a build_spans that also returns the node arrays (issue #3 layout)
    real = _span_tables._C.build_spans

    def with_nodes(events, t_ns, post_hook_names=()):
        out = dict(real(events, t_ns, post_hook_names))
        out.update(node_start_ns=np.array([5, 9], np.int64), node_end_ns=np.array([7, 12]),
                   node_self_ns=np.array([2, 3]), node_seq=np.array([4, 3], np.uint64),
                   node_name=np.array([1, 0], np.uint32), node_tid=np.array([1, 1], np.uint32),
                   node_pass=np.array([0, NO_PASS], np.uint32), node_span=np.array([0, -1]),
                   node_fwd_tid=np.array([1, 1], np.uint32))
        return out

    monkeypatch.setattr(_span_tables._C, "build_spans", with_nodes)
    # WHEN spans are built THEN Spans.nodes carries them
    spans = Spans.from_events(build_events([(1, 1, 0, 0), (1, 2, 0, 20)]), IDENTITY_CLOCK)
    assert spans.nodes.pass_id.tolist() == [0, NO_PASS]
    assert spans.nodes.span.tolist() == [0, -1] and spans.unattributed_nodes == 1
    assert "2 nodes" in repr(spans)


def test_nodes_are_validated():
    spans = backward_spans(0)
    arrays = {name: getattr(spans.nodes, name) for name in
              ("start_ns", "end_ns", "self_ns", "seq", "name", "tid", "pass_id", "span")}
    with pytest.raises(ValueError, match="Nodes.seq"):
        Nodes({**arrays, "seq": arrays["seq"].astype(np.int64)})
    bad = Nodes({**arrays, "span": np.full(len(spans.nodes), len(spans), np.int64)})
    with pytest.raises(ValueError, match="out of range"):
        Spans({n: getattr(spans, n) for n in ("start_ns", "end_ns", "self_ns", "parent",
                                              "module", "tid", "depth", "call", "flags", "cat")},
              threads=spans.threads, orphan_exits=0, unfinished=0, nodes=bad)
