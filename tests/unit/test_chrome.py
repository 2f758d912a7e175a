"""Chrome trace export: valid JSON, exact times, strict nesting, metadata, gzip."""

from __future__ import annotations

import gzip
import io
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import build_events, build_trace, random_stream

from hooktrace import __version__
from hooktrace._events import ENTER, EXIT, FLAG_ERROR, Clock
from hooktrace.exporters.chrome import write_chrome
from hooktrace.format import FORMAT_VERSION

CLOCK = Clock(ticks0=5, unix_ns0=1_700_000_000_123_456_789, ns_per_tick=0.913)


def parse(data: bytes) -> dict:
    return json.loads(data, parse_float=Decimal)


def export_bytes(trace, chunk_bytes: int = 1 << 20) -> bytes:
    buf = io.BytesIO()
    write_chrome(trace, buf, chunk_bytes=chunk_bytes)
    return buf.getvalue()


def x_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def to_ns(us: Decimal) -> int:
    ns = us * 1000
    assert ns == int(ns), us
    return int(ns)


def test_times_are_exact_integer_ns_relative_to_base():
    # GIVEN a damaged multi-thread trace on a realistic Unix clock
    trace = build_trace(random_stream(2), clock=CLOCK)
    spans = trace.spans()
    # WHEN exported
    doc = parse(export_bytes(trace))
    xs = x_events(doc)
    base = doc["baseTimeNanoseconds"]
    # THEN every span appears once, in span order, with ts/dur exact to the ns
    assert len(xs) == len(spans)
    assert base % 1000 == 0 and base <= int(spans.start_ns.min()) < base + 1000
    for i, e in enumerate(xs):
        assert base + to_ns(e["ts"]) == spans.start_ns[i]
        assert to_ns(e["dur"]) == spans.end_ns[i] - spans.start_ns[i]
        assert e["tid"] == spans.tid[i] and e["pid"] == 4242
        assert e["args"]["call"] == spans.call[i]


def test_number_format_is_int_dot_three_digits():
    ev = build_events([(1, ENTER, 0, 1_000_000), (1, ENTER, 1, 1_000_007),
                       (1, EXIT, 1, 1_001_007), (1, EXIT, 0, 3_000_000)])
    text = export_bytes(build_trace(ev)).decode()
    assert '"ts":0.000,"dur":2000.000' in text
    assert '"ts":0.007,"dur":1.000' in text


def test_spans_nest_strictly_per_thread():
    trace = build_trace(random_stream(4, n_threads=4, p_node=0), clock=CLOCK)
    xs = x_events(parse(export_bytes(trace)))
    per_tid: dict[int, list[tuple[Decimal, Decimal]]] = defaultdict(list)
    for e in xs:
        per_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    # any two intervals of one thread are either nested or disjoint
    for intervals in per_tid.values():
        intervals.sort(key=lambda iv: (iv[0], -iv[1]))
        for i, (a_start, a_end) in enumerate(intervals):
            for b_start, b_end in intervals[i + 1 :]:
                assert a_start <= b_start
                assert b_end <= a_end or a_end <= b_start, ((a_start, a_end), (b_start, b_end))
    # and via the parent links: each child interval lies inside its parent's
    spans = trace.spans()
    for i, p in enumerate(spans.parent.tolist()):
        if p >= 0:
            assert xs[p]["ts"] <= xs[i]["ts"]
            assert xs[i]["ts"] + xs[i]["dur"] <= xs[p]["ts"] + xs[p]["dur"]


def test_metadata_events_and_hooktrace_block():
    # GIVEN two threads, one of them named, and anomalies of every kind
    ev = build_events([(1, EXIT, 0, 1), (1, ENTER, 0, 2), (2, ENTER, 1, 3), (2, EXIT, 1, 4)])
    trace = build_trace(ev, dropped_events=7, overwritten_events=9,
                        thread_names={"2": "worker"})
    doc = parse(export_bytes(trace))
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert meta[0] == {"ph": "M", "name": "process_name", "pid": 4242, "tid": 0,
                       "args": {"name": "hooktrace testhost pid 4242"}}
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads == {1: "thread 1", 2: "worker"}
    assert doc["displayTimeUnit"] == "ns"
    assert doc["hooktrace"] == {"version": __version__, "format_version": FORMAT_VERSION,
                                "dropped_events": 7, "overwritten_events": 9,
                                "orphan_exits": 1, "unfinished_spans": 1,
                                "backward_spans": 0, "autograd_nodes": 0,
                                "unattributed_nodes": 0, "unattributed_ns": 0, "steps": 0,
                                "tracks": []}
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in meta
                  if e["name"] == "thread_sort_index"}
    assert sort_index == {1: 64, 2: 128}  # thread T: T * 64, its tracks below it


def test_names_args_and_flags():
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 1), (1, EXIT, 1, 2, FLAG_ERROR),
                       (1, ENTER, 2, 3)])
    modules = [("", "Net"), ("enc.0", "Linear"), ("odd", "Drop")]
    xs = x_events(parse(export_bytes(build_trace(ev, modules))))
    assert [(e["name"], e["cat"]) for e in xs] == [("Net", "hooktrace.forward"),
                                                   ("enc.0", "hooktrace.forward"),
                                                   ("odd", "hooktrace.forward")]
    assert xs[0]["args"] == {"module": "", "type": "Net", "call": 0, "unfinished": True}
    assert xs[1]["args"] == {"module": "enc.0", "type": "Linear", "call": 0, "error": True}
    assert xs[2]["args"] == {"module": "odd", "type": "Drop", "call": 0, "unfinished": True}


@pytest.mark.parametrize("name", ['quo"te', "back\\slash", "new\nline\ttab\x01\x1f",
                                  "ünïcødé ☃ 𝔘", "</script>", "\u2028sep"])
def test_names_are_json_escaped(name):
    ev = build_events([(1, ENTER, 1, 0), (1, EXIT, 1, 1)])
    data = export_bytes(build_trace(ev, [("", "Net"), (name, name + "Type")]))
    (x,) = x_events(json.loads(data.decode("utf-8")))
    assert x["name"] == name and x["args"]["module"] == name
    assert x["args"]["type"] == name + "Type"


def test_small_chunks_give_identical_output_in_many_writes():
    trace = build_trace(random_stream(6), clock=CLOCK)
    writes: list[int] = []

    class Recorder(io.BytesIO):
        def write(self, b) -> int:  # type: ignore[override]
            writes.append(len(b))
            return super().write(b)

    rec = Recorder()
    write_chrome(trace, rec, chunk_bytes=256)
    assert rec.getvalue() == export_bytes(trace)
    assert len(writes) > 10 and max(writes) < 256 + 1024


def test_export_plain_and_gzip_files(tmp_path: Path):
    trace = build_trace(random_stream(8), clock=CLOCK)
    trace.export_chrome(tmp_path / "t.json")
    trace.export_chrome(tmp_path / "t.json.gz")
    plain = (tmp_path / "t.json").read_bytes()
    assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    with gzip.open(tmp_path / "t.json.gz", "rb") as f:
        assert f.read() == plain
    with open(tmp_path / "t.json") as f:
        assert len(x_events(json.load(f))) == len(trace.spans())


def test_empty_trace_is_valid_json():
    doc = parse(export_bytes(build_trace(build_events([]), [])))
    assert x_events(doc) == []
    assert doc["hooktrace"]["unfinished_spans"] == 0
