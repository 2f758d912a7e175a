"""TraceData: construction contract, caching, and load."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IDENTITY_CLOCK, build_events, build_trace, random_stream

from hooktrace._events import EVENT_DTYPE
from hooktrace.reading import TraceData, load
from hooktrace.tracefile import TraceFileError


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
    assert len(t.spans()) == 1 and t.summary().rows[0]["total_ns"] == 9


def test_load_raises_trace_file_error(tmp_path):
    bad = tmp_path / "bad.htrace"
    bad.write_bytes(b"HTRACE")
    with pytest.raises(TraceFileError, match="bad.htrace: offset 6: truncated header"):
        load(bad)


def test_repr_mentions_size():
    assert "0 events" in repr(build_trace(build_events([]), []))
