"""Perfetto protobuf export: the Chrome export's slices, rows and args, and the filters."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import backward_trace, build_trace, random_stream
from pftrace_decode import chrome_slices, decode

from hooktrace._events import Clock
from hooktrace.analysis._filters import FilterError, Filters, parse_steps, select_spans
from hooktrace.cli import main
from hooktrace.exporters.chrome import write_chrome
from hooktrace.exporters.perfetto import write_perfetto
from hooktrace.reading import CAT_BACKWARD

CLOCK = Clock(ticks0=5, unix_ns0=1_700_000_000_123_456_789, ns_per_tick=0.913)


def pftrace(trace, **kw) -> bytes:
    buf = io.BytesIO()
    result = write_perfetto(trace, buf, **kw)
    assert result["not_nested"] == 0
    return buf.getvalue()


def chrome(trace, **kw) -> bytes:
    buf = io.BytesIO()
    write_chrome(trace, buf, **kw)
    return buf.getvalue()


def traces():
    yield "forward, 3 threads, damaged", build_trace(random_stream(2), clock=CLOCK)
    for seed in range(4):
        yield f"backward {seed}", backward_trace(seed)


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("case", range(5))
def test_slices_rows_and_args_match_the_chrome_export(case, nodes):
    # GIVEN a run (multi-thread forward with lost events, or interleaving backward)
    _, trace = list(traces())[case]
    # WHEN exported both ways
    got = decode(pftrace(trace, nodes=nodes))
    want = chrome_slices(chrome(trace, nodes=nodes))
    # THEN the same slices: row name, name, category, exact ns, args
    assert want and sorted(got["slices"]) == sorted(want)


def test_timestamps_are_absolute_integer_ns():
    trace = build_trace(random_stream(3), clock=CLOCK)
    spans = trace.spans()
    got = decode(pftrace(trace))["slices"]
    assert sorted((s[3], s[4]) for s in got) == sorted(
        zip(spans.start_ns.tolist(), spans.end_ns.tolist()))
    assert min(s[3] for s in got) > 1_700_000_000 * 10**9


def test_tracks_thread_descriptors_and_named_child_tracks():
    trace = backward_trace(1)
    doc = json.loads(chrome(trace, nodes=True))
    got = decode(pftrace(trace, nodes=True))
    tracks = got["tracks"]
    threads = {u: d for u, d in tracks.items() if "tid" in d}
    children = {u: d for u, d in tracks.items() if "tid" not in d and not d.get("process")}
    # one thread track per OS thread, real tids, the Chrome rows' names
    chrome_threads = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "M"
                      and e["name"] == "thread_name"} - {t["tid"] for t in doc["hooktrace"]["tracks"]}
    assert sorted(d["tid"] for d in threads.values()) == sorted(chrome_threads)
    assert all(d["ordering"] == 3 for d in threads.values())  # EXPLICIT
    # one named child track per hooktrace row, under its own thread, ranked 1, 2, ...
    assert len(children) == len(doc["hooktrace"]["tracks"])
    for d in children.values():
        parent = threads[d["parent"]]
        assert d["name"].startswith(parent["name"] + " ")
    ranks: dict[int, list[int]] = {}
    for d in children.values():
        ranks.setdefault(d["parent"], []).append(d["rank"])
    assert all(sorted(r) == list(range(1, len(r) + 1)) for r in ranks.values())
    # one packet sequence per track with slices, plus the descriptors' own
    assert got["sequences"] == len({s[0] for s in got["slices"]})


def test_info_event_carries_the_loss_counts():
    trace = build_trace(random_stream(4), clock=CLOCK, dropped_events=17, overwritten_events=3)
    got = decode(pftrace(trace))
    info = got["info"]
    assert info["dropped_events"] == 17 and info["overwritten_events"] == 3
    assert info["orphan_exits"] == trace.spans().orphan_exits
    assert info["_track"] == 1 and got["tracks"][1].get("process")
    assert info["_ts"] == min(s[3] for s in got["slices"])


def test_small_chunks_give_the_same_bytes():
    trace = backward_trace(2)
    chunks: list[bytes] = []

    class Sink:
        def write(self, b: bytes) -> None:
            chunks.append(b)

    write_perfetto(trace, Sink(), nodes=True, chunk_bytes=64)
    assert len(chunks) > 10 and b"".join(chunks) == pftrace(trace, nodes=True)


# -- filters ----------------------------------------------------------------------

def test_max_depth_keeps_depth_0_to_n_in_both_formats():
    trace = backward_trace(3)
    spans = trace.spans()
    for n in (0, 1):
        f = Filters(max_depth=n)
        got = decode(pftrace(trace, filters=f, nodes=True))["slices"]
        assert sorted(got) == sorted(chrome_slices(chrome(trace, filters=f, nodes=True)))
        span_slices = [s for s in got if s[2] in ("hooktrace.forward", "hooktrace.backward",
                                                  "hooktrace.recompute")]
        assert len(span_slices) == int(np.count_nonzero(spans.depth <= n))
        assert len(span_slices) < len(spans)


def test_time_window_clips_crossing_spans_and_drops_the_rest():
    trace = build_trace(random_stream(5), clock=CLOCK)
    spans = trace.spans()
    origin = int(spans.start_ns.min())
    t0, t1 = sorted(np.percentile(spans.start_ns - origin, [30, 60]).astype(int).tolist())
    f = Filters(start=t0 / 1e9, end=t1 / 1e9)
    lo, hi = origin + round(t0 / 1e9 * 1e9), origin + round(t1 / 1e9 * 1e9)
    got = decode(pftrace(trace, filters=f))
    assert sorted(got["slices"]) == sorted(chrome_slices(chrome(trace, filters=f)))
    inside = (np.minimum(spans.end_ns, hi) > np.maximum(spans.start_ns, lo)) | (
        (spans.end_ns == spans.start_ns) & (spans.start_ns >= lo) & (spans.start_ns <= hi))
    crossing = inside & ((spans.start_ns < lo) | (spans.end_ns > hi))
    assert 0 < len(got["slices"]) == int(inside.sum()) < len(spans)
    assert all(lo <= s[3] <= s[4] <= hi for s in got["slices"])
    clipped = [s for s in got["slices"] if ("clipped", True) in s[5]]
    assert len(clipped) == int(crossing.sum()) > 0
    assert got["info"]["cut"] == "<nested>"


def test_steps_come_from_step_bounds_and_a_run_without_steps_is_refused():
    trace = build_trace(random_stream(6), clock=CLOCK)
    with pytest.raises(FilterError, match="no step marks"):
        select_spans(trace, steps=(1, 2))
    spans = trace.spans()
    lo, hi = int(np.median(spans.start_ns)), int(spans.end_ns.max())
    calls: list[tuple[int, int]] = []

    def step_bounds(a: int, b: int) -> tuple[int, int]:
        calls.append((a, b))
        return lo, hi

    trace.step_bounds = step_bounds  # what the step recorder will provide
    got = decode(pftrace(trace, filters=Filters(steps=(2, 4))))["slices"]
    assert calls and calls[0] == (2, 4)
    assert got and all(lo <= s[3] and s[4] <= hi for s in got)
    assert len(got) == int(np.count_nonzero(select_spans(trace, steps=(2, 4))))


def test_backward_spans_filter_by_their_forward_calls_depth():
    trace = backward_trace(0)
    spans = trace.spans()
    keep = select_spans(trace, max_depth=0)
    backward = spans.cat == CAT_BACKWARD
    assert np.array_equal(keep[backward], spans.depth[backward] == 0)


@pytest.mark.parametrize("text,why", [("3:1", "0 <= A <= B"), ("x", "A:B or A"),
                                      ("-1:2", "0 <= A <= B")])
def test_bad_step_ranges_are_one_line_errors(text, why):
    with pytest.raises(FilterError, match=why):
        parse_steps(text)


def test_bad_windows_are_refused():
    with pytest.raises(FilterError, match="after start"):
        Filters(start=2.0, end=1.0)
    with pytest.raises(FilterError, match=">= 0"):
        Filters(max_depth=-1)


# -- command line -------------------------------------------------------------------

def test_cli_picks_the_format_by_extension_and_filters(tmp_path: Path, capsys):
    trace = build_trace(random_stream(7), clock=CLOCK)
    run = tmp_path / "run.htrace"
    trace.save(run)
    for name in ("t.pftrace", "t.perfetto-trace"):
        assert main(["export", str(run), "-o", str(tmp_path / name), "--max-depth", "0"]) == 0
        got = decode((tmp_path / name).read_bytes())["slices"]
        assert len(got) == int(np.count_nonzero(trace.spans().depth == 0))
    assert "spans of" in capsys.readouterr().out
    assert main(["export", str(run), "-o", str(tmp_path / "t.json"), "--start", "0"]) == 0
    assert json.loads((tmp_path / "t.json").read_text())["hooktrace"]["cut"]["filters"] == {
        "start": 0.0}


def test_cli_steps_on_a_run_without_steps_is_one_line(tmp_path: Path, capsys):
    run = tmp_path / "run.htrace"
    build_trace(random_stream(8), clock=CLOCK).save(run)
    out = tmp_path / "t.pftrace"
    assert main(["export", str(run), "-o", str(out), "--steps", "1:2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no step marks" in err and not out.exists()


def test_cli_warns_once_when_json_gets_too_big(tmp_path: Path, capsys, monkeypatch):
    from hooktrace.commands import export

    run = tmp_path / "run.htrace"
    build_trace(random_stream(9), clock=CLOCK).save(run)
    monkeypatch.setattr(export, "JSON_WARN_BYTES", 100)
    assert main(["export", str(run), "-o", str(tmp_path / "t.json")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning" in err and ".pftrace" in err
    assert main(["export", str(run), "-o", str(tmp_path / "t.pftrace")]) == 0
    assert capsys.readouterr().err == ""
