"""The Perfetto check itself (tests/perfetto_check): what it must catch, on traces written
by hand, and that it passes hooktrace's own exports of a synthetic run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import backward_trace
from perfetto_check import TraceProcessor, check, trace_processor

from hooktrace.exporters.chrome import write_chrome
from hooktrace.exporters.perfetto import write_perfetto


@pytest.fixture(scope="module")
def tp() -> Iterator[TraceProcessor]:
    with trace_processor() as tp:
        yield tp


def write(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def x(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": "test", "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_nested_events_pass(tp, tmp_path):
    # GIVEN X events nested on one row, two rows, a fractional us and a shared start
    path = write(tmp_path / "ok.json", [
        x("outer", 0, 10), x("inner", 0, 2.5), x("late", 2.5, 7.5), x("leaf", 3.001, 1),
        x("other", 1, 20, tid=2), {"ph": "M", "name": "process_name", "pid": 7,
                                   "args": {"name": "proc"}}])
    [report] = check([path], tp)
    assert report.ok, report
    assert (report.x_events, report.slices) == (5, 5)
    assert report.categories == {"test"} and report.processes == {"proc"}
    assert tp.query("select max(depth) as d from slice") == [{"d": 2}]


def test_overlapping_events_are_an_import_error_and_a_missing_slice(tp, tmp_path):
    # GIVEN a second event that starts inside the first and ends after it
    path = write(tmp_path / "overlap.json", [x("a", 0, 10), x("b", 5, 10)])
    [report] = check([path], tp)
    # THEN Perfetto drops it, says so in its stats, and the comparison names it
    assert not report.ok
    assert report.import_errors == {"slice_drop_overlapping_complete_event": 1}
    assert len(report.differences) == 1 and "missing in Perfetto: 'b'" in report.differences[0]
    assert "FAIL" in str(report) and "'b'" in str(report)


def test_a_re_nested_event_fails_the_strict_comparison_alone(tp, tmp_path):
    # GIVEN a B/E slice around an X event: Perfetto nests the X event under it, with no
    # import error, though the JSON's X events put it at depth 0
    path = write(tmp_path / "renest.json", [
        {"ph": "B", "name": "open", "pid": 7, "tid": 1, "ts": 0}, x("a", 1, 2),
        {"ph": "E", "pid": 7, "tid": 1, "ts": 5}])
    [report] = check([path], tp)
    assert report.import_errors == {} and not report.ok
    assert report.differences == [
        "nested differently: 'a' [test] pid 7 tid 1 ts 1 dur 2: Perfetto depth 1 under "
        "'open', expected depth 0 under None"]


def test_a_malformed_file_does_not_load(tp, tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [{"ph": "X", "name": "a", ')
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01 not a trace")
    reports = check([cut, junk], tp)
    assert [r.ok for r in reports] == [False, False]
    assert "incomplete" in reports[0].load_error and "Unknown trace type" in reports[1].load_error


def test_hooktrace_exports_of_one_run_pass_in_both_formats(tp, tmp_path):
    trace = backward_trace(0)
    with open(tmp_path / "run.json", "wb") as f:
        write_chrome(trace, f, nodes=True)
    with open(tmp_path / "run.pftrace", "wb") as f:
        write_perfetto(trace, f, nodes=True)
    js, pb = check([tmp_path / "run.json", tmp_path / "run.pftrace"], tp)
    assert js.ok and pb.ok, f"{js}\n{pb}"
    assert js.x_events and pb.x_events is None  # only JSON is compared event by event
    # (the .pftrace also has its "hooktrace info" instant on the process track)
    assert pb.slices == js.slices + 1 and "hooktrace.backward" in pb.categories


def test_sql_errors_are_raised(tp):
    with pytest.raises(RuntimeError, match="no such column"):
        tp.query("select no_such_column from slice")
