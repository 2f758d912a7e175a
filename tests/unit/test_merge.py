"""Merge and attribution on synthetic profiler traces (no torch.profiler run)."""

from __future__ import annotations

import decimal
import gzip
import io
import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import build_trace, events_from

from hooktrace.format import _kineto
from hooktrace._events import ENTER, EXIT, Clock
from hooktrace.format._kineto import ProfilerTraceError, us_to_ns
from hooktrace.format._profiler_events import NODE_PREFIX, collect
from hooktrace.cli import main
from hooktrace.merge import (
    MergeError,
    assign_lanes,
    attribute,
    crossing,
    merge_traces,
)
from hooktrace.reading import CAT_BACKWARD, Spans, TraceData
from trace_rows import load_json, our_rows, rows_of, strict_nesting_violations

PID = 4242
TID = 77
BASE = 1_790_000_000_000_000_000  # kineto-like: a whole second, weeks before the run
T0 = BASE + 4_000_000_000_000_000  # the run's first span, in Unix ns


# -- helpers -----------------------------------------------------------------


def us(ns: int) -> str:
    """Unix ns -> kineto's ts text (µs since BASE, three decimals)."""
    rel = ns - BASE
    return f"{rel // 1000}.{rel % 1000:03d}"


def x(name: str, start: int, end: int, *, tid: Any = TID, pid: Any = PID, cat: str = "cpu_op",
      **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(start),
            "dur": f"{(end - start) // 1000}.{(end - start) % 1000:03d}", "args": args}


def profiler_json(events: list[dict[str, Any]], *, window: tuple[int, int] | None = None,
                  base: int | None = BASE, tail_key: bool = True) -> bytes:
    """Kineto's layout: header keys, pretty traceEvents, a key after the array.

    Numbers given as text (ts/dur) are written raw, as kineto prints them.
    """
    evs = list(events)
    if window is not None:
        evs.append(x("PyTorch Profiler (0)", *window, pid="Spans", tid="PyTorch Profiler",
                     cat="Trace"))
    evs.insert(0, {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID,
                   "args": {"name": "thread 77 (python)"}})

    def dump(e: dict[str, Any]) -> str:
        text = json.dumps(e, indent=2, ensure_ascii=False)
        for key in ("ts", "dur"):
            if key in e and isinstance(e[key], str):
                text = text.replace(f'"{key}": "{e[key]}"', f'"{key}": {e[key]}')
        return text

    head = '{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n'
    if base is not None:
        head += f'  "baseTimeNanoseconds": {base},\n'
    body = ",\n".join(dump(e) for e in evs)
    tail = '\n  ],"traceName": "synthetic.json" }' if tail_key else "\n  ]}"
    return (head + '  "traceEvents": [\n' + body + tail).encode()


def make_run(calls: list[tuple[int, int, int, int]], modules: list[tuple[str, str]], *,
             tid: int = TID, seqs: list[int] | None = None, rf_tid: int = 1,
             backward: list[tuple[int, int, int]] = ()) -> TraceData:
    """A run from (module, enter_ns, exit_ns, depth) calls, given in pre-order.

    ``seqs``: sequence number at each ENTER/EXIT event in recorded order.
    ``backward``: (module, start, end) backward spans to add (cat 1), as the
    backward branch's reader will produce them.
    """
    rows: list[tuple[int, int, int]] = []  # (t, kind, module) recorded order
    stack: list[tuple[int, int]] = []
    for mod, t_in, t_out, _depth in calls:
        while stack and stack[-1][1] <= t_in:
            m, t = stack.pop()
            rows.append((t, EXIT, m))
        rows.append((t_in, ENTER, mod))
        stack.append((mod, t_out))
    while stack:
        m, t = stack.pop()
        rows.append((t, EXIT, m))
    ev = events_from([(t - T0, kind, mod, seqs[i] if seqs is not None else 0)
                      for i, (t, kind, mod) in enumerate(rows)],
                     ("t", "kind", "id", "seq"), tid=tid, rf_tid=rf_tid)
    run = build_trace(ev, modules, clock=Clock(0, T0, 1.0), cls=TraceData, pid=PID,
                      hostname="testhost")
    if backward:
        run._spans = with_backward(run.spans(), backward, tid)
    return run


def with_backward(s: Spans, backward: list[tuple[int, int, int]], tid: int) -> Spans:
    """``s`` plus backward spans (cat 1): what the backward branch adds to Spans."""
    k = len(backward)
    arrays = {name: getattr(s, name) for name in
              ("start_ns", "end_ns", "self_ns", "parent", "module", "tid", "depth", "call",
               "flags", "cat")}
    extra = {
        "start_ns": np.array([b[1] for b in backward], np.int64),
        "end_ns": np.array([b[2] for b in backward], np.int64),
        "self_ns": np.array([b[2] - b[1] for b in backward], np.int64),
        "parent": np.full(k, -1, np.int64),
        "module": np.array([b[0] for b in backward], np.uint32),
        "tid": np.full(k, tid, np.uint32),
        "depth": np.zeros(k, np.uint32),
        "call": np.arange(k, dtype=np.uint32),
        "flags": np.zeros(k, np.uint8),
        "cat": np.full(k, CAT_BACKWARD, np.uint8),
    }
    merged = {n: np.concatenate([arrays[n], extra[n]]).astype(arrays[n].dtype) for n in arrays}
    return Spans(merged, threads=s.threads, orphan_exits=0, unfinished=0)


MODULES = [("", "Net"), ("fc", "Linear"), ("act", "ReLU")]
# Net [0, 100 µs] > fc [10, 40] , act [50, 60]
CALLS = [(0, T0, T0 + 100_000, 0), (1, T0 + 10_000, T0 + 40_000, 1),
         (2, T0 + 50_000, T0 + 60_000, 1)]
WINDOW = (T0 - 1_000_000, T0 + 1_000_000)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return p


# -- times and the streaming reader ------------------------------------------


def test_us_to_ns_is_exact_where_float_is_not() -> None:
    # 4398046511103.999 µs: a float64 there is only good to ~1 ns
    assert us_to_ns("4398046511103.999") == 4398046511103999
    assert us_to_ns("12") == 12_000 and us_to_ns(12) == 12_000
    assert us_to_ns("0.5") == 500 and us_to_ns("-1.25") == -1250
    assert us_to_ns("1.5e3") == 1_500_000 and us_to_ns("0.0001") == 0


@pytest.mark.parametrize("read_bytes", [7, 64, 4 << 20])
def test_scan_copies_bytes_through_exactly(read_bytes: int, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    # GIVEN a kineto-style trace with odd characters, read in blocks of any size
    events = [x(f"aten::op\u00e9 \\\"{i}\"", T0 + i, T0 + i + 5, k=[1, 2.5, None])
              for i in range(40)]
    src = profiler_json(events, window=WINDOW)
    monkeypatch.setattr(_kineto, "READ_BYTES", read_bytes)
    seen: list[Any] = []
    out = io.BytesIO()
    # WHEN it is scanned with nothing inserted
    top = _kineto.scan(io.BytesIO(src), "t.json", seen.append, out=out)
    # THEN the output is the input, byte for byte, and every event was seen once
    assert out.getvalue() == src
    assert len(seen) == 42 and top["traceName"] == "synthetic.json"
    assert seen[1]["name"].encode("latin-1").decode("utf-8") == "aten::op\u00e9 \\\"0\""


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (b'{"traceEvents": [\n  {"ph": "X",, "ts": 1}\n]}', "line 2 column 14 (byte 31)"),
        (b'{"traceEvents": [\n  {"ph": "i"}\n  {"ph": "i"}]}', "line 3 column 3 (byte 34)"),
        (b'{"traceEvents": [\n  {"ph": "X", "ts": 1', "line 2 column 22 (byte 39)"),
        (b'{"a": 1}\n{"b": 2}', "line 2 column 1 (byte 9)"),
        (b"", "line 1 column 1 (byte 0)"),
    ],
)
def test_malformed_json_names_file_and_position(text: bytes, where: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kineto, "READ_BYTES", 5)  # errors found across block boundaries
    with pytest.raises(ProfilerTraceError) as info:
        collect(io.BytesIO(text), "prof.json", pid=PID)
    assert str(info.value).startswith("prof.json: malformed profiler trace JSON at " + where)


def test_not_a_trace_object() -> None:
    with pytest.raises(ProfilerTraceError, match="bare JSON array"):
        collect(io.BytesIO(b'[{"ph": "X"}]'), "a.json", pid=PID)
    with pytest.raises(ProfilerTraceError, match="no 'traceEvents' array"):
        collect(io.BytesIO(b'{"schemaVersion": 1}'), "a.json", pid=PID)


def test_malformed_line_in_a_large_file(tmp_path: Path) -> None:
    # GIVEN a multi-MB trace damaged on a known line
    events = [x("aten::mm", T0 + 10 * i, T0 + 10 * i + 5) for i in range(20_000)]
    src = profiler_json(events, window=WINDOW)
    lines = src.split(b"\n")
    k = len(lines) - 40
    lines[k] = lines[k].replace(b'"ph": "X"', b'"ph": X"')
    col = lines[k].index(b'X"') + 1
    path = write(tmp_path, "big.json.gz", b"\n".join(lines))
    # THEN the error gives that line and column, of the decompressed JSON
    with pytest.raises(ProfilerTraceError, match=rf"big.json.gz: .* at line {k + 1} column {col} "):
        merge_traces(make_run(CALLS, MODULES), path, tmp_path / "out.json")
    assert not list(tmp_path.glob("*out.json*"))  # nothing left behind


@pytest.mark.parametrize("read_bytes", [1, 2, 3, 5, 4 << 20])
def test_utf8_is_checked_across_read_blocks(read_bytes: int, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    # GIVEN names with 2-, 3- and 4-byte characters, cut anywhere by the read blocks
    monkeypatch.setattr(_kineto, "READ_BYTES", read_bytes)
    good = profiler_json([x("aten::\u00e9\u20ac\U0001f600", T0, T0 + 5)], window=WINDOW)
    out = io.BytesIO()
    _kineto.scan(io.BytesIO(good), "p.json", lambda e: None, out=out)
    assert out.getvalue() == good
    # WHEN one byte is not UTF-8 (a lone continuation byte, a cut sequence, a surrogate)
    for bad in (b"\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xff"):
        src = good.replace("\u20ac".encode(), bad, 1)
        at = src.index(bad)
        # THEN the error gives its byte offset, however the blocks fall
        with pytest.raises(ProfilerTraceError, match=rf"^p.json: malformed profiler trace JSON "
                           rf"at line \d+ column \d+ \(byte {at}\): invalid UTF-8"):
            _kineto.scan(io.BytesIO(src), "p.json", lambda e: None)
    # (a sequence cut by the end of the file, in a string left open)
    with pytest.raises(ProfilerTraceError, match=r"\(byte 7\): invalid UTF-8"):
        _kineto.scan(io.BytesIO(b'{"a": "\xc3'), "p.json", lambda e: None)


@pytest.mark.parametrize(
    ("event", "fragment"),
    [
        ('{"ph": "X", "ts": "12", "dur": 1}', "'ts' is '12', expected a number of microseconds"),
        ('{"ph": "X", "dur": 1}', "an 'X' event without 'ts'"),
        ('{"ph": "X", "ts": 1, "dur": 1e400}', "'dur' is 1e400, expected a number"),
        ('{"ph": "X", "ts": 1, "tid": 18446744073709551616}', "'tid' is 18446744073709551616, "
         "expected an integer that fits 64 bits"),
        ('{"ph": "X", "ts": 1, "pid": null}', "'pid' is None, expected an integer or a string"),
        ('{"ph": "s", "cat": "ac2g", "ts": 1, "id": {"a": 1}}', "flow 'id' is {'a': 1}"),
        (f'{{"ph": "X", "ts": 1, "pid": {PID}, "tid": 1, "cat": "cuda_runtime", '
         '"args": {"correlation": -9223372036854775809}}',
         "args 'correlation' is -9223372036854775809"),
        ('{"ph": "X", "ts": NaN}', "contains NaN, which is not JSON"),
        ("7", "is 7, expected an event object"),
    ],
)
def test_unusable_event_values_name_the_event_and_key(event: str, fragment: str) -> None:
    src = ('{"baseTimeNanoseconds": 5,\n"traceEvents": [{"ph": "i", "ts": 0},\n  ' + event
           + "]}").encode()
    with pytest.raises(ProfilerTraceError) as info:
        collect(io.BytesIO(src), "p.json", pid=PID)
    msg = str(info.value)
    assert fragment in msg and "line 3 column 3 (byte 67)" in msg, msg
    assert msg.startswith("p.json: traceEvents[1] at ") or "NaN" in msg, msg


@pytest.mark.parametrize(
    ("base", "ts", "fragment"),
    [
        ("-1", "1", "'baseTimeNanoseconds' is -1, expected an integer number of Unix nanoseconds"),
        (str(2**62), "1", "is 4611686018427387904, expected an integer"),
        ("1e30", "1", "'baseTimeNanoseconds' is 1e30, expected an integer"),
        ("1000", "-2.000", "traceEvents[0] is at -2000 ns from baseTimeNanoseconds 1000, before "
         "1970"),
        (str(2**62 - 1), str(2**62 // 1000), "traceEvents[0] ends 4611686018428387000 ns after"),
    ],
)
def test_times_must_be_unix_times_that_fit_64_bits(base: str, ts: str, fragment: str) -> None:
    src = (f'{{"baseTimeNanoseconds": {base}, '
           f'"traceEvents": [{{"ph": "X", "ts": {ts}, "dur": 1000}}]}}')
    with pytest.raises(ProfilerTraceError, match=re.escape(fragment)):
        collect(io.BytesIO(src.encode()), "p.json", pid=PID)


def test_merge_refuses_a_base_less_trace_before_1970(tmp_path: Path) -> None:
    # no baseTimeNanoseconds: ts are Unix µs, and this one is negative
    src = profiler_json([x("aten::mm", T0 + 1, T0 + 2)], window=WINDOW, base=None)
    src = src.replace(b'"traceEvents": [', b'"traceEvents": [{"ph": "i", "ts": -5},', 1)
    prof = write(tmp_path, "p.json", src)
    with pytest.raises(ProfilerTraceError, match=r"traceEvents\[0\] is at -5000 Unix ns, before"):
        merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    data = gzip.compress(profiler_json([x("aten::mm", T0, T0 + 5)], window=WINDOW))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProfilerTraceError, match="cut.json.gz: "):
        merge_traces(make_run(CALLS, MODULES), path, tmp_path / "out.json")


# -- merge -------------------------------------------------------------------


def perfetto_ns(ts: str) -> int:
    """What Perfetto's JSON importer makes of a fractional ``ts``/``dur`` (µs text):
    ``llround(strtod(text) * 1000.0)`` (json_trace_tokenizer.cc, CoerceToTs)."""
    d = decimal.Decimal(float(ts) * 1000.0)
    return int(d.to_integral_value(rounding=decimal.ROUND_HALF_UP))


_TS = re.compile(rb'"ts": ?-?[0-9.]+')


@pytest.mark.parametrize(("src_name", "out_name"), [("p.json", "m.json"),
                                                   ("p.json.gz", "m.json.gz")])
def test_merge_keeps_every_profiler_event_at_its_exact_time(tmp_path: Path, src_name: str,
                                                            out_name: str) -> None:
    # GIVEN a multi-MB profiler trace whose ops lie inside the run's spans
    events = []
    for i in range(30_000):
        s = T0 + 10_000 + i  # inside fc
        events.append(x("aten::add", s, s + 1, **{"External id": i, "Sequence number": i}))
    src = profiler_json(events, window=WINDOW)
    assert len(src) > 5_000_000
    prof = write(tmp_path, src_name, src)
    # WHEN merged (gzip in and out where named so)
    result = merge_traces(make_run(CALLS, MODULES), prof, tmp_path / out_name)
    out = (tmp_path / out_name).read_bytes()
    if out_name.endswith(".gz"):
        assert out[:2] == b"\x1f\x8b"
        out = gzip.decompress(out)
    # THEN the profiler's bytes are all there, in order, but for the ts numbers
    close = src.rindex(b"]")
    base_key = re.compile(rb'"baseTimeNanoseconds": ?[0-9]+')

    def normal(b: bytes) -> bytes:
        return base_key.sub(b"B", _TS.sub(b'"ts":_', b))

    assert normal(out).startswith(normal(src[:close]))
    doc = json.loads(out, parse_float=str)
    original = json.loads(src, parse_float=str)["traceEvents"]
    merged = doc["traceEvents"][: len(original)]
    base = doc["baseTimeNanoseconds"]
    for before, after in zip(original, merged):
        assert {k: v for k, v in before.items() if k != "ts"} == {
            k: v for k, v in after.items() if k != "ts"}
        # ... each at exactly the same Unix nanosecond, on the new base
        if "ts" in before:
            assert base + us_to_ns(after["ts"]) == BASE + us_to_ns(before["ts"])
    # ... and the new base is close enough that Perfetto reads every ts exactly
    assert base < T0 and T0 - base < 10**12
    assert doc["hooktrace"]["profiler_base_ns"] == BASE and result.base_ns == base
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            assert perfetto_ns(e["ts"]) == us_to_ns(e["ts"])
    ours = doc["traceEvents"][len(original):]
    assert {e["name"] for e in ours if e["ph"] == "X"} == {"Net", "fc", "act"}
    assert result.shared == 3 and result.profiler_events == len(original)
    assert doc["hooktrace"]["shared"] == 3


def test_child_ending_with_its_parent_stays_inside_it_in_perfetto(tmp_path: Path) -> None:
    # GIVEN kineto-scale times (~4.4e12 µs after the base) where Perfetto's double
    # rounding of the original ts would push a child's end 1 ns past its parent's
    # (the reproducer of issue #7: transformer.h.1.mlp / .c_fc)
    base = 1_790_857_026_000_000_000
    parent = (4_464_124_264_359_747, 4_464_124_267_977_698)  # ns after base
    child = (4_464_124_267_800_277, 4_464_124_267_977_698)
    assert (perfetto_ns(f"{child[0] // 1000}.{child[0] % 1000:03d}")
            + perfetto_ns(f"{(child[1] - child[0]) / 1000:.3f}")) > (
        perfetto_ns(f"{parent[0] // 1000}.{parent[0] % 1000:03d}")
        + perfetto_ns(f"{(parent[1] - parent[0]) / 1000:.3f}"))
    t0 = base + parent[0] - 1000
    ev = events_from([(ENTER, 0, base + parent[0] - t0), (ENTER, 1, base + child[0] - t0),
                      (EXIT, 1, base + child[1] - t0), (EXIT, 0, base + parent[1] - t0)],
                     ("kind", "id", "t"), tid=TID)
    run = build_trace(ev, [("", "Net"), ("fc", "Linear")], clock=Clock(0, t0, 1.0),
                      cls=TraceData, pid=PID, hostname="h")
    prof_events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": TID,
                    "ts": f"{child[0] // 1000 + 1}.000", "dur": 1}]
    src = json.dumps({"baseTimeNanoseconds": base, "traceEvents": prof_events}).encode()
    src = src.replace(b'"ts": "', b'"ts": ').replace(b'.000"', b".000")
    prof = write(tmp_path, "p.json", src)
    # WHEN merged
    merge_traces(run, prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    # THEN Perfetto's reading of every slice is the exact nanosecond, so the child
    # ends exactly with its parent instead of 1 ns after it
    xs = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    end = {n: perfetto_ns(e["ts"]) + perfetto_ns(e["dur"]) for n, e in xs.items()}
    assert end["fc"] == end["Net"]
    for e in xs.values():
        assert perfetto_ns(e["ts"]) == us_to_ns(e["ts"])


def test_profiler_started_long_before_the_run_is_rebased_without_negative_times(
        tmp_path: Path) -> None:
    # GIVEN a profiler event 10 minutes before the run (beyond the base margin)
    early = T0 - 600 * 10**9
    events = [x("aten::mm", early, early + 1000), x("aten::mm", T0 + 11_000, T0 + 12_000)]
    prof = write(tmp_path, "p.json", profiler_json(events, window=(early, WINDOW[1])))
    merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    # THEN every ts is >= 0 (Perfetto drops negative ones) and times are unchanged
    base = doc["baseTimeNanoseconds"]
    starts = sorted(base + us_to_ns(e["ts"]) for e in doc["traceEvents"]
                    if e["ph"] == "X" and e["cat"] == "cpu_op")
    assert min(us_to_ns(e["ts"]) for e in doc["traceEvents"] if "ts" in e) >= 0
    assert starts == [early, T0 + 11_000]


def test_trace_without_a_base_gets_one(tmp_path: Path) -> None:
    # GIVEN an old-style trace: absolute Unix µs, no baseTimeNanoseconds
    src = profiler_json([x("aten::mm", T0 + 11_000, T0 + 12_000)], window=WINDOW, base=None,
                        tail_key=False)
    src = re.sub(rb'"ts": ([0-9]+)\.([0-9]{3})',
                 lambda m: b'"ts": ' + str(int(m[1]) + BASE // 1000).encode() + b"." + m[2], src)
    prof = write(tmp_path, "p.json", src)
    merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    base = doc["baseTimeNanoseconds"]
    mm = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm"][0]
    assert base + us_to_ns(mm["ts"]) == T0 + 11_000 and us_to_ns(mm["ts"]) < 10**15


def test_span_times_are_exact_on_the_merged_base(tmp_path: Path) -> None:
    prof = write(tmp_path, "p.json", profiler_json([x("aten::mm", T0 + 11_001, T0 + 12_002)],
                                                   window=WINDOW))
    merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    fc = [e for e in doc["traceEvents"] if e.get("name") == "fc"][0]
    assert doc["baseTimeNanoseconds"] + us_to_ns(fc["ts"]) == T0 + 10_000
    assert fc["dur"] == "30.000"
    assert (fc["pid"], fc["tid"]) == (PID, TID)
    assert fc["cat"] == "hooktrace.forward" and fc["args"]["type"] == "Linear"


def track_tids(doc: dict[str, Any], kind: str) -> list[int]:
    return [t["tid"] for t in doc["hooktrace"]["tracks"] if t["kind"] == kind]


def test_crossing_span_moves_to_adjacent_track(tmp_path: Path) -> None:
    # GIVEN a profiler slice crossing the end of fc (e.g. a user annotation)
    events = [x("aten::mm", T0 + 11_000, T0 + 12_000),
              x("my_region", T0 + 30_000, T0 + 45_000, cat="user_annotation")]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    r = merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    rows = rows_of(doc)
    # THEN fc goes to the track "thread 77 forward"; Net and act stay on the thread row
    assert (r.shared, r.adjacent) == (2, 1)
    (adjacent,) = track_tids(doc, "forward")
    assert [e["name"] for _, _, e in rows[(PID, adjacent)]] == ["fc"]
    assert {e["name"] for _, _, e in rows[(PID, TID)] if e["cat"].startswith("hooktrace")} == {
        "Net", "act"}
    names = {(e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert names[adjacent] == f"thread {TID} forward" and adjacent > TID
    # and every row we write or share nests strictly
    for row in our_rows(doc):
        assert strict_nesting_violations(rows[row]) == []


def test_spans_are_clipped_to_the_profiler_window(tmp_path: Path) -> None:
    # GIVEN a window that starts inside fc and ends before act
    window = (T0 + 20_000, T0 + 45_000)
    prof = write(tmp_path, "p.json", profiler_json([x("aten::mm", T0 + 21_000, T0 + 22_000)],
                                                   window=window))
    r = merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    got = {e["name"]: (us_to_ns(e["ts"]) + doc["baseTimeNanoseconds"], us_to_ns(e["dur"]))
           for e in doc["traceEvents"] if str(e.get("cat")).startswith("hooktrace")}
    assert got == {"Net": (T0 + 20_000, 25_000), "fc": (T0 + 20_000, 20_000)}
    assert (r.clipped, r.outside_window) == (2, 1)


def test_backward_spans_go_to_lanes_never_the_thread_row(tmp_path: Path) -> None:
    # GIVEN backward spans overlapping without nesting, as per-module backward can
    backward = [(1, T0 + 200_000, T0 + 300_000), (2, T0 + 250_000, T0 + 350_000),
                (0, T0 + 190_000, T0 + 400_000)]
    run = make_run(CALLS, MODULES, backward=backward)
    events = [x(NODE_PREFIX + "AddmmBackward0", T0 + 210_000, T0 + 220_000)]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    r = merge_traces(run, prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    rows = rows_of(doc)
    bwd_rows = {(e["pid"], e["tid"]) for e in doc["traceEvents"]
                if e.get("cat") == "hooktrace.backward"}
    # THEN they use two lanes next to the thread, and never its row
    assert (r.backward, r.lanes) == (3, 2)
    lanes = track_tids(doc, "backward")
    assert bwd_rows == {(PID, t) for t in lanes} and len(lanes) == 2 and min(lanes) > TID
    for row in our_rows(doc):
        assert strict_nesting_violations(rows[row]) == []


def test_unrelated_trace_is_refused(tmp_path: Path) -> None:
    later = (T0 + 10**12, T0 + 10**12 + 10**9)  # 1000 s after the run
    prof = write(tmp_path, "other.json",
                 profiler_json([x("aten::mm", later[0] + 1, later[0] + 2)], window=later))
    with pytest.raises(MergeError, match=r"other.json: the profiler trace \(.* UTC\) does not "
                                         r"overlap the run \(.*\): it was recorded by another run"):
        merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    assert not list(tmp_path.glob("*m.json*"))


def test_trace_of_another_process_is_refused(tmp_path: Path) -> None:
    prof = write(tmp_path, "p.json", profiler_json(
        [x("aten::mm", T0 + 1, T0 + 2, pid=PID + 1, tid=PID + 1)], window=WINDOW))
    with pytest.raises(MergeError, match=rf"process \[{PID + 1}\] but the run is of pid {PID}"):
        merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")


def test_base_time_after_the_events_is_found(tmp_path: Path) -> None:
    src = profiler_json([x("aten::mm", T0 + 11_000, T0 + 12_000)], window=WINDOW, base=None,
                        tail_key=False)
    src = src[: src.rindex(b"}")] + f', "baseTimeNanoseconds": {BASE}}}'.encode()
    prof = write(tmp_path, "p.json", src)
    merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    doc = load_json(tmp_path / "m.json")
    fc = [e for e in doc["traceEvents"] if e.get("name") == "fc"][0]
    assert doc["baseTimeNanoseconds"] + us_to_ns(fc["ts"]) == T0 + 10_000


def test_already_merged_trace_is_refused(tmp_path: Path) -> None:
    prof = write(tmp_path, "p.json", profiler_json([x("aten::mm", T0 + 1, T0 + 2)],
                                                   window=WINDOW))
    merge_traces(make_run(CALLS, MODULES), prof, tmp_path / "m.json")
    with pytest.raises(MergeError, match="written by hooktrace"):
        merge_traces(make_run(CALLS, MODULES), tmp_path / "m.json", tmp_path / "m2.json")


def test_cli_merge_and_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    run = tmp_path / "run.htrace"
    make_run(CALLS, MODULES).save(run)
    prof = write(tmp_path, "p.json.gz", profiler_json([x("aten::mm", T0 + 1, T0 + 2)],
                                                      window=WINDOW))
    assert main(["merge", str(run), str(prof), "-o", str(tmp_path / "m.json.gz")]) == 0
    assert "3 forward spans" in capsys.readouterr().out
    bad = write(tmp_path, "bad.json", b'{"traceEvents": [}')
    assert main(["merge", str(run), str(bad), "-o", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hooktrace: error: ") and "bad.json" in err
    assert "line 1 column 18" in err
    far = (T0 + 10**12, T0 + 10**12 + 5)
    other = write(tmp_path, "o.json", profiler_json([x("aten::mm", *far)], window=far))
    assert main(["summary", str(run), "--profiler", str(other)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not overlap" in err


# -- nesting helpers vs references -------------------------------------------


def test_crossing_matches_brute_force() -> None:
    rng = random.Random(3)
    for _ in range(200):
        a = np.array([rng.randrange(0, 50) for _ in range(rng.randrange(0, 12))], np.int64)
        b = a + np.array([rng.randrange(0, 20) for _ in range(len(a))], np.int64)
        s = np.array([rng.randrange(0, 50) for _ in range(8)], np.int64)
        e = s + np.array([rng.randrange(0, 20) for _ in range(8)], np.int64)
        want = [any(ai < si < bi < ei or si < ai < ei < bi for ai, bi in zip(a, b))
                for si, ei in zip(s, e)]
        assert crossing(s, e, a, b).tolist() == want


def test_assign_lanes_nests_every_lane() -> None:
    rng = random.Random(5)
    start = np.array([rng.randrange(0, 1000) for _ in range(300)], np.int64)
    end = start + np.array([rng.randrange(0, 200) for _ in range(300)], np.int64)
    group = np.array([rng.randrange(0, 3) for _ in range(300)], np.int64)
    lanes = assign_lanes(start, end, group)
    for g in range(3):
        for lane in set(lanes[group == g].tolist()):
            m = (group == g) & (lanes == lane)
            slices = list(zip(start[m].tolist(), end[m].tolist(), range(int(m.sum()))))
            assert strict_nesting_violations(slices) == []
    assert lanes.max() < 30  # greedy stays far from one lane per span


# -- attribution ---------------------------------------------------------------


def test_forward_ops_by_innermost_span_with_self_and_total(tmp_path: Path) -> None:
    events = [
        x("aten::linear", T0 + 11_000, T0 + 30_000),  # in fc, 19 µs, 10 µs of it addmm
        x("aten::addmm", T0 + 12_000, T0 + 22_000),
        x("aten::relu", T0 + 51_000, T0 + 55_000),  # in act
        x("aten::empty", T0 + 45_000, T0 + 46_000),  # in Net only
        x("aten::zeros", T0 + 200_000, T0 + 201_000),  # outside every span
    ]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    t = attribute(make_run(CALLS, MODULES), prof)
    fc, act, net = t.row("fc"), t.row("act"), t.row("")
    assert fc is not None and act is not None and net is not None
    assert (fc["ops"], fc["cpu_self_ns"], fc["cpu_total_ns"]) == (2, 19_000, 19_000)
    assert fc["top_ops"] == [["aten::linear", 19_000]]
    assert (act["cpu_self_ns"], net["cpu_self_ns"], net["cpu_total_ns"]) == (4_000, 1_000, 24_000)
    assert t.row("<unattributed>", "other")["cpu_self_ns"] == 1_000  # type: ignore[index]  # outside every call: "other", not forward
    assert t.counts["attributed_ops"] == 4 and t.counts["cpu_ops"] == 5
    text = t.to_text()
    assert "fc" in text and "aten::linear 19.0 µs" in text
    assert t.to_csv().splitlines()[0].startswith("module,type,phase,ops,cpu_total_ns")
    assert json.loads(t.to_json())["rows"][0]["module"] == ""


def test_backward_nodes_by_sequence_number(tmp_path: Path) -> None:
    # GIVEN forward events whose sequence numbers say: fc created nodes 10..11,
    # act node 12 (events in recorded order: Net>, fc>, <fc, act>, <act, <Net)
    run = make_run(CALLS, MODULES, seqs=[10, 10, 12, 12, 13, 13], rf_tid=3)
    node = NODE_PREFIX
    events = [
        x(node + "ReluBackward0", T0 + 300_000, T0 + 310_000,
          **{"Sequence number": 12, "Fwd thread id": 3}),
        x("aten::threshold_backward", T0 + 301_000, T0 + 305_000),
        x(node + "AddmmBackward0", T0 + 320_000, T0 + 340_000,
          **{"Sequence number": 11, "Fwd thread id": 3}),
        x("aten::mm", T0 + 321_000, T0 + 330_000),
        x(node + "torch::autograd::AccumulateGrad", T0 + 350_000, T0 + 351_000),
    ]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    t = attribute(run, prof)
    fc, act = t.row("fc", "backward"), t.row("act", "backward")
    assert fc is not None and act is not None
    assert fc["ops"] == 2 and fc["cpu_self_ns"] == 20_000
    assert fc["top_ops"] == [[node + "AddmmBackward0", 20_000]]
    assert act["ops"] == 2 and act["cpu_total_ns"] == 10_000
    assert t.row("", "backward")["cpu_total_ns"] == 30_000  # type: ignore[index]
    assert t.row("<unattributed>", "backward")["ops"] == 1  # type: ignore[index]
    assert t.counts["backward_by_sequence"] == 2


def test_backward_nodes_fall_back_to_backward_spans(tmp_path: Path) -> None:
    # GIVEN a sequence number no recorded forward owns, but hooktrace backward
    # spans around the node
    run = make_run(CALLS, MODULES, backward=[(1, T0 + 300_000, T0 + 400_000),
                                             (0, T0 + 290_000, T0 + 500_000)])
    events = [x(NODE_PREFIX + "AddmmBackward0", T0 + 320_000, T0 + 340_000,
                **{"Sequence number": 10**6, "Fwd thread id": 99})]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    t = attribute(run, prof)
    assert t.row("fc", "backward")["cpu_self_ns"] == 20_000  # type: ignore[index]
    assert t.counts["backward_by_time"] == 1


def test_nodes_without_sequence_number_are_unattributed_as_in_the_plain_summary(
        tmp_path: Path) -> None:
    # GIVEN AccumulateGrad (no sequence number) inside a module's backward span
    run = make_run(CALLS, MODULES, backward=[(1, T0 + 300_000, T0 + 400_000)])
    events = [x(NODE_PREFIX + "torch::autograd::AccumulateGrad", T0 + 320_000, T0 + 340_000)]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    t = attribute(run, prof)
    # THEN it is unattributed, as hooktrace's own backward attribution leaves it
    assert t.row("fc", "backward") is None
    assert t.row("<unattributed>", "backward")["cpu_self_ns"] == 20_000  # type: ignore[index]
    assert t.counts["backward_by_time"] == 0


def test_gpu_kernels_by_correlation_and_by_flow(tmp_path: Path) -> None:
    # GIVEN two launches in fc: one kernel linked by correlation, one by ac2g flow only
    events = [
        x("aten::addmm", T0 + 11_000, T0 + 30_000),
        x("cudaLaunchKernel", T0 + 12_000, T0 + 13_000, cat="cuda_runtime", correlation=41),
        x("cudaLaunchKernel", T0 + 20_000, T0 + 21_000, cat="cuda_runtime"),
        x("sgemm_kernel", T0 + 14_000, T0 + 64_000, pid=0, tid=7, cat="kernel", correlation=41),
        x("relu_kernel", T0 + 70_000, T0 + 77_000, pid=0, tid=7, cat="kernel"),
        {"ph": "s", "id": 99, "pid": PID, "tid": TID, "ts": us(T0 + 20_000), "cat": "ac2g",
         "name": "ac2g"},
        {"ph": "f", "id": 99, "pid": 0, "tid": 7, "ts": us(T0 + 70_000), "cat": "ac2g",
         "name": "ac2g", "bp": "e"},
        x("orphan_kernel", T0 + 80_000, T0 + 81_000, pid=0, tid=7, cat="kernel"),
    ]
    prof = write(tmp_path, "p.json", profiler_json(events, window=WINDOW))
    t = attribute(make_run(CALLS, MODULES), prof)
    fc = t.row("fc")
    assert fc is not None and fc["gpu_self_ns"] == 57_000 and fc["gpu_total_ns"] == 57_000
    assert t.row("")["gpu_total_ns"] == 57_000  # type: ignore[index]
    assert t.counts["gpu_activities"] == 3 and t.counts["attributed_gpu"] == 2
    assert "gpu total" in t.to_text()


def test_ops_outside_every_module_call_are_optimizer_or_other_not_forward():
    import io


    from hooktrace._events import Clock
    from hooktrace.format._profiler_events import collect
    from hooktrace.analysis.attribution import attribute_events
    from hooktrace.reading import TraceData

    # GIVEN a module call (1-9 us), the loss after it and an optimizer step after that
    ev = events_from([(1, 1000), (2, 9000)], ("kind", "t"), tid=7)
    run = build_trace(ev, [("fc", "Linear")], clock=Clock(0, 0, 1.0), cls=TraceData, pid=7,
                      hostname="h")
    src = (b'{"baseTimeNanoseconds": 0, "traceEvents": ['
           b'{"ph":"X","cat":"cpu_op","name":"aten::linear","pid":7,"tid":7,"ts":2,"dur":5},'
           b'{"ph":"X","cat":"cpu_op","name":"aten::mse_loss","pid":7,"tid":7,"ts":10,"dur":2},'
           b'{"ph":"X","cat":"user_annotation","name":"Optimizer.step#SGD.step","pid":7,'
           b'"tid":7,"ts":20,"dur":10},'
           b'{"ph":"X","cat":"cpu_op","name":"aten::add_","pid":7,"tid":7,"ts":21,"dur":3},'
           b'{"ph":"X","cat":"cpu_op","name":"aten::add_","pid":7,"tid":7,"ts":25,"dur":3}]}')
    table = attribute_events(run, collect(io.BytesIO(src), "p.json", pid=7))
    rows = {(r["module"], r["phase"]): r for r in table.rows}
    # THEN only the module's op is forward; the step's ops are "optimizer", the loss "other"
    assert set(rows) == {("fc", "forward"), ("<unattributed>", "optimizer"),
                         ("<unattributed>", "other")}
    assert rows[("<unattributed>", "optimizer")]["ops"] == 2
    assert rows[("<unattributed>", "optimizer")]["cpu_self_ns"] == 6000
    assert rows[("<unattributed>", "other")]["top_ops"] == [["aten::mse_loss", 2000]]
    assert [r["phase"] for r in table.rows] == ["forward", "optimizer", "other"]
    assert "optimizer: ops outside every module call" in table.to_text()
