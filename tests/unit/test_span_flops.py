"""FLOP args on exported spans (hooktrace.analysis.flops, "On the spans"), on synthetic runs.

The real-model checks (counts equal FlopCounterMode's, Perfetto's importer) are in
tests/integration/test_flops_args.py.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from conftest import backward_trace, build_events, build_trace
from pftrace_decode import chrome_slices, decode

from hooktrace._events import ENTER, EXIT
from hooktrace.analysis._filters import Filters
from hooktrace.exporters.chrome import write_chrome
from hooktrace.exporters.perfetto import write_perfetto
from hooktrace.analysis.flops import FlopInfoError, _root_call, span_flops
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, CAT_RECOMPUTE, SPAN_UNFINISHED

SPAN_CATS = ("hooktrace.forward", "hooktrace.backward", "hooktrace.recompute")


def flop_info(trace: Any, counted: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """Two signatures alternating over the root calls, odd counts (so splits have
    remainders), the first call of each counted."""
    names = [name for name, _ in trace.modules]
    spans = trace.spans()
    roots = int(((spans.module == 0) & (spans.cat == CAT_FORWARD)).sum())
    sigs = [{"forward": {n: 1_000_003 * (s + 1) + 7 * i for i, n in enumerate(names)},
             "backward": {n: 2_000_009 * (s + 1) + 5 * i for i, n in enumerate(names) if i != 2}}
            for s in range(2)]
    return {"signatures": sigs, "calls": [r % 2 for r in range(roots)],
            "counted": list(counted)}


def flops_trace(seed: int) -> Any:
    trace = backward_trace(seed)
    trace.info["flops"] = flop_info(trace)
    return trace


def chrome(trace: Any, **kw: Any) -> bytes:
    buf = io.BytesIO()
    write_chrome(trace, buf, **kw)
    return buf.getvalue()


def pftrace(trace: Any, **kw: Any) -> bytes:
    buf = io.BytesIO()
    assert write_perfetto(trace, buf, **kw)["not_nested"] == 0
    return buf.getvalue()


def span_events(data: bytes) -> list[dict[str, Any]]:
    return [e for e in json.loads(data)["traceEvents"]
            if e["ph"] == "X" and e["cat"] in SPAN_CATS]


@pytest.mark.parametrize("seed", range(4))
def test_each_module_s_spans_of_a_root_call_add_up_to_its_count(seed: int) -> None:
    # GIVEN a run with backward passes (several per root call), recompute spans, two
    # threads, and FLOP counts for two signatures
    trace = flops_trace(seed)
    info = trace.info["flops"]
    spans = trace.spans()
    f = span_flops(info, spans, trace.modules)
    root = _root_call(spans)
    # THEN per (root call, module, phase) the spans' FLOPs add up to the recorded count,
    # split as evenly as integers allow
    groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i in range(len(spans)):
        if spans.cat[i] == CAT_RECOMPUTE:
            assert f.flops[i] == -1 and np.isnan(f.tflops[i])
            continue
        groups[(int(root[i]), int(spans.module[i]), int(spans.cat[i]))].append(int(f.flops[i]))
    assert groups
    for (r, m, cat), values in groups.items():
        phase = "backward" if cat == CAT_BACKWARD else "forward"
        want = info["signatures"][info["calls"][r]][phase].get(trace.modules[m][0], 0)
        assert sum(values) == want and max(values) - min(values) <= (1 if want else 0)
    # the counted root calls' spans are flagged and have no TFLOP/s; the others' do
    counted = np.isin(root, info["counted"]) & (spans.cat != CAT_RECOMPUTE)
    assert (f.counted == counted).all() and np.isnan(f.tflops[counted]).all()
    timed = ~counted & (f.flops > 0) & (spans.duration_ns > 0) & (
        spans.flags & SPAN_UNFINISHED == 0)
    assert timed.any() and not np.isnan(f.tflops[timed]).any()
    np.testing.assert_allclose(f.tflops[timed],
                               f.flops[timed] / spans.duration_ns[timed] / 1e3, rtol=5e-4)


def test_a_module_called_three_times_gets_a_third_each_first_calls_first() -> None:
    # GIVEN root call 0 runs fc three times, root call 1 once (two signatures)
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 10), (1, EXIT, 1, 20),
                       (1, ENTER, 1, 30), (1, EXIT, 1, 40), (1, ENTER, 1, 50), (1, EXIT, 1, 60),
                       (1, EXIT, 0, 70), (1, ENTER, 0, 100), (1, ENTER, 1, 110),
                       (1, EXIT, 1, 120), (1, EXIT, 0, 130)])
    trace = build_trace(ev, [("", "Net"), ("fc", "Linear")])
    info = {"signatures": [{"forward": {"": 11, "fc": 10}, "backward": {}},
                           {"forward": {"": 4, "fc": 4}, "backward": {}}],
            "calls": [0, 1], "counted": [1]}
    f = span_flops(info, trace.spans(), trace.modules)
    # THEN 10 FLOPs split 4 + 3 + 3 in call order, and the counted call's spans flagged
    assert f.flops.tolist() == [11, 4, 3, 3, 4, 4]
    assert f.counted.tolist() == [False] * 4 + [True] * 2
    # (11 FLOPs in 70 ns = 0.157 GFLOP/s; 4 in 10 ns)
    assert f.tflops[:4].tolist() == [0.0001571, 0.0004, 0.0003, 0.0003]


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_json_and_pftrace_carry_the_same_flop_args(seed: int, nodes: bool) -> None:
    # GIVEN a run with FLOPs
    trace = flops_trace(seed)
    f = span_flops(trace.info["flops"], trace.spans(), trace.modules)
    # WHEN exported both ways
    data = chrome(trace, nodes=nodes)
    got = decode(pftrace(trace, nodes=nodes))["slices"]
    # THEN the same slices with the same args, tflops the same double
    assert sorted(got) == sorted(chrome_slices(data))
    # and the JSON's args are span_flops' values: flops everywhere but recompute spans
    events = span_events(data)
    spans = trace.spans()
    by_key: dict[tuple[str, str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_key[(e["cat"], e["args"]["module"], e["args"]["call"], round(e["ts"] * 1000))].append(
            e["args"])
    base = json.loads(data)["baseTimeNanoseconds"]
    for i in range(len(spans)):
        key = (SPAN_CATS[spans.cat[i]], trace.modules[spans.module[i]][0], int(spans.call[i]),
               int(spans.start_ns[i]) - base)
        args = by_key[key][0]
        assert args.get("flops", -1) == f.flops[i]
        assert args.get("flops_counted", False) == bool(f.counted[i])
        assert ("tflops" in args) == (not np.isnan(f.tflops[i]))
        if "tflops" in args:
            assert args["tflops"] == f.tflops[i]
    assert any("tflops" in e["args"] for e in events)
    assert any(e["args"].get("flops_counted") for e in events)


def test_clipped_spans_keep_the_whole_call_s_flops_and_tflops() -> None:
    # GIVEN a run with FLOPs, exported whole and cut to the middle third of its time
    trace = flops_trace(1)
    spans = trace.spans()
    t0, t1 = int(spans.start_ns.min()), int(spans.end_ns.max())
    third = (t1 - t0) / 3e9
    whole = {(e["cat"], e["args"]["module"], e["args"]["call"]): e["args"]
             for e in span_events(chrome(trace)) if e["cat"] != "hooktrace.backward"}
    cut = span_events(chrome(trace, filters=Filters(start=third, end=2 * third)))
    # THEN a span cut at the window's edge has the same FLOP args as the whole call's
    clipped = [e for e in cut if e["args"].get("clipped") and e["cat"] == "hooktrace.forward"]
    assert clipped
    for e in clipped:
        want = whole[(e["cat"], e["args"]["module"], e["args"]["call"])]
        assert {k: e["args"].get(k) for k in ("flops", "tflops", "flops_counted")} == {
            k: want.get(k) for k in ("flops", "tflops", "flops_counted")}
    # and the same in the .pftrace
    got = decode(pftrace(trace, filters=Filters(start=third, end=2 * third)))["slices"]
    assert sorted(got) == sorted(chrome_slices(chrome(trace, filters=Filters(
        start=third, end=2 * third))))


def test_a_run_without_flops_has_no_flop_args() -> None:
    trace = backward_trace(0)
    for args in ([e["args"] for e in span_events(chrome(trace, nodes=True))]
                 + [dict(s[5]) for s in decode(pftrace(trace, nodes=True))["slices"]]):
        assert not {"flops", "tflops", "flops_counted"} & set(args)
    # not even the argument names (the files are as before FLOP args existed)
    assert b"flops" not in chrome(trace, nodes=True) + pftrace(trace, nodes=True)


def test_an_unreadable_flops_block_fails_the_export_in_one_line() -> None:
    trace = backward_trace(0)
    trace.info["flops"] = {"signatures": [], "calls": [3], "counted": []}
    with pytest.raises(FlopInfoError, match="signature indices"):
        chrome(trace)
