"""What the user sees of device time (issue #28, item 2) on synthetic GpuSpans
(conftest.gpu_trace): the summary's GPU columns and order, FLOP/s and MFU from device
time, the launch-time line of a CUDA run without it and its absence on a CPU run."""

from __future__ import annotations

import csv
import io
import json

import pytest
from conftest import GPU_STEP_NS, GPU_T0, gpu_trace, set_gpu_spans

from hooktrace.analysis.device_time import LAUNCH_NOTE, kernel_label, timed_steps

# per module over the two synthetic steps (conftest.gpu_trace's docstring)
DEVICE = {  # gpu_calls, gpu_total, gpu_self, gpu_bwd_total, gpu_bwd_self
    "": (2, 1_200_000, 100_000, 680_000, 80_000),
    "fc1": (2, 800_000, 800_000, 400_000, 400_000),
    "fc2": (2, 200_000, 200_000, 200_000, 200_000),
    "attn": (2, 100_000, 100_000, 0, 0),
}
GPU_KEYS = ("gpu_calls", "gpu_total_ns", "gpu_self_ns", "gpu_bwd_total_ns", "gpu_bwd_self_ns")


def flop_info() -> dict:
    # one signature, both root calls measured (none counted under FlopCounterMode)
    return {"signatures": [{"forward": {"": 6_000_000_000, "fc1": 4_000_000_000,
                                        "fc2": 2_000_000_000},
                            "backward": {"": 12_000_000_000, "fc1": 8_000_000_000,
                                         "fc2": 4_000_000_000}}],
            "calls": [0, 0], "counted": []}


def test_gpu_columns_lead_and_sort_the_rows():
    s = gpu_trace().summary()
    # THEN the rows are in device-time order (host order would be root, fc2, fc1)
    assert [r["module"] for r in s.rows] == ["", "fc1", "fc2", "attn"]
    for r in s.rows:
        assert tuple(r[k] for k in GPU_KEYS) == DEVICE[r["module"]], r["module"]
    # the GPU columns come right after the row's identity, in CSV/JSON and in the dicts
    assert s.columns[:9] == ("module", "type", "mode", "timing") + GPU_KEYS
    assert list(s.rows[0])[:9] == list(s.columns[:9])
    # host numbers untouched
    fc2 = next(r for r in s.rows if r["module"] == "fc2")
    assert (fc2["total_ns"], fc2["bwd_total_ns"]) == (320_000, 180_000)
    # attn: a kernel site of a compiled region, device time only
    attn = s.rows[-1]
    assert attn["timing"] == "kernels" and attn["calls"] is None and attn["total_ns"] is None


def test_gpu_text_table_labels_host_columns():
    text = gpu_trace().summary().to_text()
    header = text.splitlines()[0].split()
    assert header[:4] == ["module", "type", "calls", "gpu_calls"]
    assert header[4:8] == ["gpu_total", "gpu_self", "gpu_bwd_total", "gpu_bwd_self"]
    assert "host_total" in header and "host_bwd_total" in header and "total" not in header
    lines = text.splitlines()
    assert lines[1].split()[:8] == ["<root>", "Net", "2", "2", "1.20", "ms", "100", "µs"]
    assert lines[2].startswith("fc1 ")
    assert "sorted by gpu_total + gpu_bwd_total (device time)" in text
    assert "device clock aligned to the host's within ±1.50 µs" in text
    assert LAUNCH_NOTE not in text
    wide = gpu_trace().summary().to_text(wide=True).splitlines()[0].split()
    assert "host_p50" in wide and "host_bwd_self" in wide and "p50" not in wide


def test_gpu_csv_and_json_carry_the_columns():
    s = gpu_trace().summary()
    rows = list(csv.DictReader(io.StringIO(s.to_csv())))
    assert [r["module"] for r in rows] == ["", "fc1", "fc2", "attn"]
    assert rows[1]["gpu_total_ns"] == "800000" and rows[1]["gpu_bwd_self_ns"] == "400000"
    assert rows[3]["total_ns"] == ""  # device time only
    doc = json.loads(s.to_json())
    assert [r["gpu_self_ns"] for r in doc["rows"]] == [100_000, 800_000, 200_000, 100_000]
    assert any("gpu: 2 timed steps" in n for n in doc["notes"])


def test_mfu_and_tflops_come_from_device_time():
    s = gpu_trace(flops=flop_info(), device_name="NVIDIA H100 80GB HBM3").summary(
        peak_tflops=100.0)
    fc1 = next(r for r in s.rows if r["module"] == "fc1")
    # fc1: 4 GFLOP per forward in 400 µs of device time (host: 100 µs, 4x more)
    assert fc1["tflops"] == pytest.approx(4e9 / 400_000 / 1e3)
    assert fc1["bwd_tflops"] == pytest.approx(8e9 / 200_000 / 1e3)
    # MFU: (2 x 4 + 2 x 8) GFLOP over (800 + 400) µs of device time, peak 100 TFLOP/s
    assert fc1["mfu"] == pytest.approx(24e9 / 1_200_000 / 1e3 / 100.0)
    assert any("over the device time of the timed calls" in n for n in s.notes)


def test_cuda_without_device_time_says_launch_time_once_and_withholds_mfu():
    s = gpu_trace(gpu=False, flops=flop_info()).summary(peak_tflops=100.0)
    text = s.to_text(flops=True)
    assert text.count("host (launch) times") == 1
    assert "gpu_total" not in text
    fc1 = next(r for r in s.rows if r["module"] == "fc1")
    assert fc1["flops"] == 4e9  # FLOPs are still counted
    assert (fc1["tflops"], fc1["bwd_tflops"], fc1["mfu"]) == (None, None, None)
    assert "MFU" not in text.splitlines()[0] and "TFLOP/s" not in text.splitlines()[0]
    assert "flops" in text.splitlines()[0].split()
    assert [r["module"] for r in s.rows] == ["", "fc2", "fc1"]  # host order, no GPU columns
    assert "gpu_total_ns" not in s.columns


def test_cpu_run_is_unchanged():
    s = gpu_trace(gpu=False, accelerator=None, flops=flop_info()).summary(peak_tflops=100.0)
    text = s.to_text(flops=True)
    assert "launch" not in text and "host_" not in text and "gpu" not in text
    fc1 = next(r for r in s.rows if r["module"] == "fc1")
    # host time is compute time on a CPU: 4 GFLOP in 100 µs
    assert fc1["tflops"] == pytest.approx(4e9 / 100_000 / 1e3)
    assert fc1["mfu"] is not None


def test_kernel_rows_are_labelled_launch_time_without_device_time():
    cuda = gpu_trace(gpu=False)
    assert kernel_label(cuda) == "kernel launches"
    assert kernel_label(gpu_trace()) == "kernels"
    assert kernel_label(gpu_trace(gpu=False, accelerator=None)) == "kernels"
    # a summary row timed from kernel marks, on each kind of run
    from hooktrace.analysis.summary import Summary

    for trace, label in ((cuda, "[kernel launches]"), (gpu_trace(gpu=False, accelerator=None),
                                                        "[kernels]")):
        s = Summary.from_trace(trace)
        s.rows[1]["timing"] = "kernels"
        text = s.to_text(wide=True)
        assert f"fc2 {label}" in text
        launch = "host time launching the module's kernels (not their run time)" in text
        assert launch == (label == "[kernel launches]")


def test_timed_steps_with_gpu_every():
    # gpu_every=2 on a 4-step run: only steps 0 and 2 have device time
    t = gpu_trace(steps=4)
    g = t.gpu_spans()
    keep = ((g.start_ns - GPU_T0) // GPU_STEP_NS) % 2 == 0
    from hooktrace.reading import GpuSpans

    set_gpu_spans(t, GpuSpans({k: getattr(g, k)[keep] for k in
                               ("start_ns", "end_ns", "self_ns", "span", "module", "cat",
                                "device", "stream")}))
    t.info["gpu"].update(every=2, timed_steps=2)
    assert timed_steps(t).tolist() == [0, 2]
    s = t.summary()
    fc1 = next(r for r in s.rows if r["module"] == "fc1")
    assert (fc1["gpu_calls"], fc1["gpu_total_ns"], fc1["calls"]) == (2, 800_000, 4)
    assert "2 timed steps (1 step in 2)" in s.to_text()


# -- diff ----------------------------------------------------------------------------


def test_diff_compares_device_time_and_gates_on_it():
    from hooktrace.analysis.diff import compare

    # B: fc1's device time doubled (400 -> 800 µs per call), host times the same
    d = compare(gpu_trace(), gpu_trace(fc1_gpu_ns=800_000))
    assert d.gpu
    rows = {(r["module"], r["phase"]): r for r in d.rows}
    fc1 = rows[("fc1", "gpu forward")]
    assert (fc1["p50_a_ns"], fc1["p50_b_ns"], fc1["per_step_change_ns"]) == (
        400_000, 800_000, 400_000)
    assert rows[("", "gpu forward")]["per_step_b_ns"] == 1_000_000
    assert rows[("fc1", "gpu backward")]["p50_a_ns"] == 200_000
    assert rows[("attn", "gpu forward")]["timing_a"] == "kernels"
    assert rows[("fc1", "forward")]["per_step_change_ns"] == 0  # host unchanged
    # the GPU rows lead
    assert [r["phase"].startswith("gpu ") for r in d.rows] == sorted(
        (r["phase"].startswith("gpu ") for r in d.rows), reverse=True)
    assert d.rows[0]["module"] == "fc1"
    assert d.failures(50.0, min_share=0.0) == ["fc1 gpu forward: +100.0%",
                                               "<root> gpu forward: +66.7%"]
    assert "the gate (--fail-above) checks them" in d.to_text()
    assert json.loads(d.to_json())["gpu"] is True


def test_diff_gate_ignores_host_rows_when_both_have_device_time():
    from hooktrace.analysis.diff import compare

    # B: fc2's host time doubled (launch time), device time the same
    d = compare(gpu_trace(), gpu_trace(fc2_host_ns=320_000))
    assert d.failures(50.0, min_share=0.0) == []
    # without device time the same change fails the gate
    d = compare(gpu_trace(gpu=False), gpu_trace(gpu=False, fc2_host_ns=320_000))
    assert not d.gpu
    assert d.failures(50.0, min_share=0.0) == ["fc2 forward: +100.0%"]


def test_diff_one_run_without_device_time_compares_host_time():
    from hooktrace.analysis.diff import compare

    d = compare(gpu_trace(gpu=False), gpu_trace(fc1_gpu_ns=800_000))
    assert not d.gpu and d.failures(50.0, min_share=0.0) == []
    assert ("fc1", "gpu forward") in d.only_b
    assert any("only B recorded device time" in n for n in d.notes)


def test_diff_ranks_gate_on_device_time():
    from hooktrace.analysis.diff import compare_ranks

    d = compare_ranks({0: gpu_trace(), 1: gpu_trace()},
                      {0: gpu_trace(), 1: gpu_trace(fc1_gpu_ns=600_000)})
    assert d.gpu
    assert d.failures(20.0, min_share=0.0) == ["fc1 gpu forward on rank 1: +50.0%",
                                               "<root> gpu forward on rank 1: +33.3%"]


def test_diff_cli_gate_names_the_gpu_row(monkeypatch, capsys):
    import hooktrace.analysis.diff as diff
    import hooktrace.data.paths as paths  # (the verb's entry point, issue #48)
    from hooktrace.cli import main

    monkeypatch.setattr(paths, "compare_paths", lambda a, b, workers=None: diff.compare(
        gpu_trace(), gpu_trace(fc1_gpu_ns=800_000), names=(a, b)))
    assert main(["diff", "a.htrace", "b.htrace", "--fail-above", "50", "--min-share", "0"]) == 1
    err = capsys.readouterr().err
    assert "fc1 gpu forward: +100.0%" in err and "fc1 forward" not in err


def test_diff_kernel_rows_of_a_cuda_run_without_device_time_are_launches():
    from hooktrace.analysis.diff import _label

    row = {"module": "attn", "phase": "forward", "timing_a": "kernels", "timing_b": "kernels"}
    assert _label(row, launch=True) == "attn [kernel launches] forward"
    assert _label(row) == "attn [kernels] forward"
    assert _label(dict(row, phase="gpu forward"), launch=True) == "attn [kernels] gpu forward"


# -- HTML report ---------------------------------------------------------------------


def _report_table(html_text: str) -> tuple[list[str], list[list[str]]]:
    import re

    table = html_text.split('<table id="summary">')[1].split("</table>")[0]
    heads = re.findall(r'<th data-col="\d+" data-key="([^"]+)"[^>]*>([^<]*)</th>', table)
    rows = [re.findall(r'<td data-v="([^"]*)"', tr) for tr in table.split("<tr>")[2:]]
    return [f"{k}={name}" for k, name in heads], rows


def test_report_shows_the_gpu_columns_first_and_the_icicle_in_device_time():
    from hooktrace.reporters.html import render_report

    text = render_report(gpu_trace())
    heads, rows = _report_table(text)
    assert heads[:7] == ["module=module", "type=type", "timing=timing", "gpu_calls=gpu_calls",
                         "gpu_total_ns=gpu_total", "gpu_self_ns=gpu_self",
                         "gpu_bwd_total_ns=gpu_bwd_total"]
    assert "total_ns=host_total (time)" in heads and "bwd_total_ns=host_bwd_total (time)" in heads
    assert [r[0] for r in rows] == ["", "fc1", "fc2", "attn"]
    assert rows[1][4] == "800000"  # fc1's gpu_total, the sort key of the cell
    assert "device time recorded" in text
    icicle = json.loads(text.split("var ice = ")[1].split(";\n")[0])
    # fc1's forward box: its device self time, 800 µs (host: 200 µs)
    assert icicle["values"][icicle["ids"].index("run/forward/fc1")] == 800.0


def test_report_of_a_cuda_run_without_device_time_says_launch_time():
    from hooktrace.reporters.html import render_report

    text = render_report(gpu_trace(gpu=False))
    heads, _ = _report_table(text)
    assert "total_ns=total (time)" in heads and not any("gpu" in h for h in heads)
    assert text.count("host (launch) times") == 1
    assert "host (launch)" not in render_report(gpu_trace(gpu=False, accelerator=None))


# -- summary --by-shape ---------------------------------------------------------------


def _shaped(**kw):
    import numpy as np

    t = gpu_trace(shape_signatures=["float32[2,8]", "float32[4,8]"], fc1_gpu_ns=400_000, **kw)
    # forward spans 0-2 (step 0) ran signature 0, 3-5 (step 1) signature 1
    sig = np.array([0, 0, 0, 1, 1, 1] + [-1] * 6, np.int64)
    t.derived("span_shapes", lambda: (sig, sig))
    return t


def test_by_shape_carries_device_time():
    from hooktrace.analysis.shapes import ShapeTable

    table = ShapeTable.from_trace(_shaped())
    assert table.gpu
    rows = [(r["module"], r["in_shapes"], r["gpu_total_ns"], r["gpu_bwd_total_ns"],
             r["total_ns"]) for r in table.rows]
    # device order (root, fc1, fc2) per signature; host would put fc2 before fc1
    assert rows[:2] == [("", "float32[2,8]", 600_000, 340_000, 300_000),
                        ("", "float32[4,8]", 600_000, 340_000, 300_000)]
    assert rows[2][:4] == ("fc1", "float32[2,8]", 400_000, 200_000)
    assert [r[0] for r in rows[4:]] == ["fc2", "fc2"]
    text = table.to_text()
    assert text.splitlines()[0].split()[:6] == ["module", "in_shapes", "out_shapes",
                                                "gpu_total", "gpu_p50", "gpu_bwd_total"]
    assert "host_total" in text.splitlines()[0]
    header = table.to_csv().splitlines()[0].split(",")
    assert header[5:9] == ["gpu_calls", "gpu_total_ns", "gpu_p50_ns", "gpu_bwd_total_ns"]
    assert json.loads(table.to_json())["rows"][2]["gpu_p50_ns"] == 400_000


def test_by_shape_without_device_time_is_unchanged():
    from hooktrace.analysis.shapes import ShapeTable

    table = ShapeTable.from_trace(_shaped(gpu=False))
    assert not table.gpu and "gpu" not in table.to_text() and "gpu" not in table.to_csv()
    assert [r["module"] for r in table.rows][2:4] == ["fc2", "fc2"]  # host order


# -- the ranks' straggler tables ------------------------------------------------------


def _ranks(*traces):
    from hooktrace.analysis.rankset import RankFile
    from hooktrace.analysis.stragglers import _combine, reduce_rank

    stats = [reduce_rank(t, RankFile.from_trace(f"rank{i}.htrace", t))
             for i, t in enumerate(traces)]
    return _combine(stats, [], 0.5, 100_000)


def test_straggler_tables_carry_device_time():
    # rank 1: fc1's device time 3x (1.2 ms per step), host times the same
    report = _ranks(gpu_trace(rank=0, world_size=2),
                    gpu_trace(rank=1, world_size=2, fc1_gpu_ns=1_200_000))
    rows = {(r["module"], r["phase"]): r for r in report.rows}
    fc1 = rows[("fc1", "gpu fwd")]
    assert (fc1["median_ns"], fc1["slowest_rank"], fc1["slowest_ns"], fc1["excess_ns"]) == (
        800_000, 1, 1_200_000, 800_000)
    assert rows[("fc1", "gpu bwd")]["median_ns"] == 200_000
    assert rows[("attn", "gpu fwd")]["median_ns"] == 50_000  # a kernel site, no host span
    assert rows[("fc1", "fwd")]["median_ns"] == 100_000  # host per step
    assert report.rows[0]["phase"].startswith("gpu")  # device time first
    # the straggler is named on the device: fc1 (root's excess is explained by it)
    found = [(s["rank"], s["module"], s["phase"], s["step"], s["excess_ns"])
             for s in report.stragglers]
    assert found == [(1, "fc1", "gpu fwd", 0, 800_000), (1, "fc1", "gpu fwd", 1, 800_000)]
    text = report.to_text()
    import re

    assert "gpu fwd / gpu bwd: device time" in text
    assert re.search(r"^fc1\s+gpu fwd\s+800 µs\s+1\s+1.20 ms", text, re.M), text


def test_straggler_tables_per_timed_step_with_gpu_every():
    import numpy as np

    from hooktrace.reading import GpuSpans

    t = gpu_trace(rank=0, steps=4)
    g = t.gpu_spans()
    keep = ((g.start_ns - GPU_T0) // GPU_STEP_NS) % 2 == 0  # steps 0 and 2 timed
    set_gpu_spans(t, GpuSpans({k: getattr(g, k)[keep] for k in
                               ("start_ns", "end_ns", "self_ns", "span", "module", "cat",
                                "device", "stream")}))
    report = _ranks(t, gpu_trace(rank=1, steps=4))
    rows = {(r["module"], r["phase"]): r for r in report.rows}
    # 400 µs per timed step on both ranks (not 200 µs over all 4 steps on rank 0)
    assert rows[("fc1", "gpu fwd")]["slowest_ns"] == 400_000
    assert np.isclose(rows[("fc1", "gpu fwd")]["median_ns"], 400_000)
    assert report.stragglers == []


# -- exports -------------------------------------------------------------------------


def test_chrome_export_draws_a_gpu_row_per_device_and_stream(tmp_path):
    from hooktrace.exporters.chrome import write_chrome

    with open(tmp_path / "run.json", "wb") as f:
        write_chrome(gpu_trace(), f)
    doc = json.loads((tmp_path / "run.json").read_text())
    rows = {e["args"]["name"]: e["tid"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "GPU 0 stream 7" in rows and "GPU 0 stream 13" in rows
    gpu = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("hooktrace.gpu_")]
    assert len(gpu) == 14  # 7 intervals per step, 2 steps
    fwd = [e for e in gpu if e["tid"] == rows["GPU 0 stream 7"]]
    assert {e["cat"] for e in fwd} == {"hooktrace.gpu_forward"}
    base = doc["baseTimeNanoseconds"]
    assert base == GPU_T0 - 5_000  # the first step's start
    fc1 = next(e for e in fwd if e["name"] == "fc1")
    # fc1's first interval: [T0 + 60 µs, + 400 µs] on the device timeline, host-aligned
    assert (fc1["ts"], fc1["dur"]) == (65.0, 400.0)
    assert fc1["args"] == {"module": "fc1", "type": "Linear", "call": 0, "device": 0,
                           "stream": 7, "self_ns": 400_000}
    attn = [e for e in fwd if e["name"] == "attn"]  # kernel sites: numbered per module
    assert [e["args"]["call"] for e in attn] == [0, 1]
    bwd = [e for e in gpu if e["tid"] == rows["GPU 0 stream 13"]]
    assert {e["cat"] for e in bwd} == {"hooktrace.gpu_backward"} and len(bwd) == 6
    tracks = [t for t in doc["hooktrace"]["tracks"] if t["kind"] == "gpu"]
    assert [(t["device"], t["stream"], t["lane"]) for t in tracks] == [(0, 7, 0), (0, 13, 0)]


def test_chrome_export_window_clips_the_gpu_rows():
    import io

    from hooktrace.analysis._filters import Filters
    from hooktrace.exporters.chrome import write_chrome

    b = io.BytesIO()
    write_chrome(gpu_trace(), b, filters=Filters(steps=(1, 1)))
    doc = json.loads(b.getvalue())
    gpu = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("hooktrace.gpu_")]
    assert len(gpu) == 7 and all(e["args"]["call"] == 1 for e in gpu if e["name"] != "attn")


def test_no_gpu_rows_without_device_time():
    import io

    from hooktrace.exporters.chrome import write_chrome

    b = io.BytesIO()
    write_chrome(gpu_trace(gpu=False), b)
    assert b"GPU 0" not in b.getvalue() and b"hooktrace.gpu_" not in b.getvalue()


@pytest.fixture(scope="module")
def tp():
    from perfetto_check import trace_processor

    with trace_processor() as tp:
        yield tp


def test_gpu_rows_pass_perfetto_check_in_both_formats(tp, tmp_path):
    from perfetto_check import check

    from hooktrace.exporters.chrome import write_chrome
    from hooktrace.exporters.perfetto import write_perfetto

    trace = gpu_trace()
    with open(tmp_path / "run.json", "wb") as f:
        write_chrome(trace, f)
    with open(tmp_path / "run.pftrace", "wb") as f:
        assert write_perfetto(trace, f) == {"slices": 26, "not_nested": 0}
    js, pb = check([tmp_path / "run.json", tmp_path / "run.pftrace"], tp)
    assert js.ok and pb.ok, f"{js}\n{pb}"
    assert {"hooktrace.gpu_forward", "hooktrace.gpu_backward"} <= js.categories
    assert pb.slices == js.slices + 1  # (and the .pftrace's "hooktrace info" instant)
    rows = tp.query("select t.name as track, s.name, s.ts, s.dur, s.depth from slice s "
                    "join track t on s.track_id = t.id where t.name like 'GPU %' "
                    "order by t.name, s.ts, s.depth")
    on7 = [r for r in rows if r["track"] == "GPU 0 stream 7"]
    assert len(on7) == 8 and len(rows) == 14
    # the root's forward, its children nested one level down, at the device's times
    assert (on7[0]["name"], on7[0]["ts"], on7[0]["dur"], on7[0]["depth"]) == (
        "Net", GPU_T0 + 50_000, 600_000, 0)
    assert (on7[1]["name"], on7[1]["ts"], on7[1]["depth"]) == ("fc1", GPU_T0 + 60_000, 1)
    args = tp.query("select a.key, a.int_value from slice s join track t on s.track_id = t.id "
                    "join args a on a.arg_set_id = s.arg_set_id where t.name = 'GPU 0 stream 13'"
                    " and s.name = 'fc1' and s.ts = " + str(GPU_T0 + 765_000))
    got = {r["key"].split(".")[-1]: r["int_value"] for r in args}
    assert got["stream"] == 13 and got["self_ns"] == 200_000 and got["device"] == 0


def _compiled_region(**info):
    import numpy as np

    from conftest import build_trace

    from hooktrace._events import EVENT_DTYPE

    # one compiled region (Block) whose wrapper ran two kernel sites (kernels.py's example)
    ev = np.zeros(6, EVENT_DTYPE)
    ev["kind"] = [1, 8, 9, 8, 9, 2]
    ev["id"] = [0, 0, 0, 1, 1, 0]
    ev["t"] = np.array([0, 10, 30, 40, 100, 120]) + GPU_T0
    ev["tid"] = 1
    return build_trace(ev, [("", "Block"), ("norm", "LayerNorm"), ("fc", "Linear")],
                       kernel_sites=[["triton_0", "norm", "forward"],
                                     ["extern_kernels.mm", "fc", "forward"]], **info)


def test_kernel_rows_and_slices_of_a_cuda_run_without_device_time_are_launches(tmp_path, tp):
    from perfetto_check import check

    from hooktrace.exporters.chrome import write_chrome
    from hooktrace.exporters.perfetto import write_perfetto

    cuda, cpu = _compiled_region(accelerator="cuda"), _compiled_region()
    text = cuda.summary().to_text()
    assert "fc [kernel launches]" in text and "norm [kernel launches]" in text
    assert "fc [kernels]" in cpu.summary().to_text()
    for trace, launch in ((cuda, True), (cpu, False)):
        with open(tmp_path / "k.json", "wb") as f:
            write_chrome(trace, f)
        ks = [e for e in json.loads((tmp_path / "k.json").read_text())["traceEvents"]
              if e.get("cat") == "hooktrace.kernel"]
        assert [(e["name"], e["dur"], e["args"].get("launch")) for e in ks] == [
            ("norm", 0.02, True if launch else None), ("fc", 0.06, True if launch else None)]
        with open(tmp_path / "k.pftrace", "wb") as f:
            write_perfetto(trace, f)
        [pb] = check([tmp_path / "k.pftrace"], tp)
        assert pb.ok, pb
        got = tp.query("select count(*) as n from slice s join args a on a.arg_set_id = "
                       "s.arg_set_id where a.key like '%launch'")
        assert got == [{"n": 2 if launch else 0}]
