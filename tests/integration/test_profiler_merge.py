"""Merge and attribution with a real torch.profiler (CPU) run next to hooktrace."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.format._kineto import ProfilerTraceError, us_to_ns
from hooktrace.merge import MergeError, attribute, merge_traces
from hooktrace.record.profiling import merged_trace_handler
from models import ConvNet, tiny_bert, tiny_llama
from trace_rows import load_json, our_rows, rows_of, strict_nesting_violations

NODE = "autograd::engine::evaluate_function: "
CPU = [torch.profiler.ProfilerActivity.CPU]

CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Any], str, str]] = {
    # model, input, op that each leaf module's forward must contain, module type
    "llama": (tiny_llama, lambda: torch.randint(0, 64, (1, 8)), "aten::linear", "Linear"),
    "bert": (tiny_bert, lambda: torch.randint(0, 64, (1, 8)), "aten::linear", "Linear"),
    "convnet": (ConvNet, lambda: torch.randn(2, 3, 8, 8), "aten::conv2d", "Conv2d"),
}


def loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().pow(2).mean()
    return out[0].float().pow(2).mean()  # transformers ModelOutput


def run_profiled(model: nn.Module, x: Any, tmp_path: Path, *, backward: bool
                 ) -> tuple[hooktrace.Trace, Path]:
    with hooktrace.trace(model) as tr, torch.profiler.profile(activities=CPU) as prof:
        out = model(x)
        if backward:
            loss_of(out).backward()
    path = tmp_path / "profiler.json"
    prof.export_chrome_trace(str(path))
    return tr, path


def x_events(doc: dict[str, Any], pred: Callable[[dict[str, Any]], bool]
             ) -> list[tuple[int, int, dict[str, Any]]]:
    base = doc["baseTimeNanoseconds"]
    out = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and pred(e):
            s = base + us_to_ns(e["ts"])
            out.append((s, s + us_to_ns(e["dur"]), e))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_every_op_lies_in_its_module_span_after_merge(case: str, tmp_path: Path) -> None:
    # GIVEN a real model run under torch.profiler and hooktrace together
    make_model, make_input, op, mtype = CASES[case]
    model = make_model()
    tr, prof = run_profiled(model, make_input(), tmp_path, backward=False)

    # WHEN merged
    out = tmp_path / "merged.json"
    result = merge_traces(tr, prof, out)
    doc = load_json(out)

    # THEN every `op` lies inside a forward span of a `mtype` module on the same thread
    spans = x_events(doc, lambda e: e.get("cat") == "hooktrace.forward"
                     and e["args"]["type"] == mtype)
    ops = x_events(doc, lambda e: e.get("cat") == "cpu_op" and e["name"] == op)
    assert ops and spans
    for s, e, ev in ops:
        assert any(a <= s and e <= b and sp["tid"] == ev["tid"] for a, b, sp in spans), ev
    # and module spans share the profiler's thread row (same pid/tid as its ops)
    assert {(sp["pid"], sp["tid"]) for _, _, sp in spans} <= {
        (ev["pid"], ev["tid"]) for _, _, ev in ops}
    assert result.shared == len(tr.spans()) and result.adjacent == 0


@pytest.mark.parametrize("case", list(CASES))
def test_merged_trace_keeps_every_profiler_event_and_nests(case: str, tmp_path: Path) -> None:
    make_model, make_input, _, _ = CASES[case]
    model = make_model().train()
    tr, prof = run_profiled(model, make_input(), tmp_path, backward=True)
    out = tmp_path / "merged.json.gz"
    merge_traces(tr, prof, out)
    original = json.loads(prof.read_bytes(), parse_float=str)
    doc = load_json(out)
    # every profiler event, in order and unchanged but for its ts, which is rebased
    # to the same Unix nanosecond; then only ours
    n = len(original["traceEvents"])
    base, old_base = doc["baseTimeNanoseconds"], original["baseTimeNanoseconds"]
    for before, after in zip(original["traceEvents"], doc["traceEvents"][:n]):
        assert {k: v for k, v in before.items() if k != "ts"} == {
            k: v for k, v in after.items() if k != "ts"}
        if "ts" in before and before["ph"] != "M":
            assert base + us_to_ns(after["ts"]) == old_base + us_to_ns(before["ts"])
    assert all(str(e.get("cat", "")).startswith("hooktrace.") or e["ph"] == "M"
               for e in doc["traceEvents"][n:])
    # strict nesting on every row hooktrace writes or shares
    rows = rows_of(doc)
    assert our_rows(doc)
    for row in our_rows(doc):
        assert strict_nesting_violations(rows[row]) == [], row
    # (measured: the profiler's own integer-tid rows nest exactly too, since
    # kineto prints exact ns; checked here so a change in kineto shows up)
    for row, slices in rows.items():
        if isinstance(row[1], int) and row not in our_rows(doc):
            assert strict_nesting_violations(slices) == [], row


BACKWARD_NODES = {"convnet": ("ConvolutionBackward0", "Conv2d"),
                  "bert": ("AddmmBackward0", "Linear")}


@pytest.mark.parametrize("case", list(BACKWARD_NODES))
def test_backward_nodes_attributed_by_sequence_number(case: str, tmp_path: Path) -> None:
    # Needs no hooktrace backward spans: uses the profiler's "Sequence number" /
    # "Fwd thread id" and the sequence numbers hooktrace records at module calls.
    make_model, make_input, _, _ = CASES[case]
    node, mtype = BACKWARD_NODES[case]
    model = make_model().train()
    tr, prof = run_profiled(model, make_input(), tmp_path, backward=True)
    table = attribute(tr, prof, top_ops=1000)
    holders = [r for r in table.rows if r["phase"] == "backward"
               and any(name == NODE + node for name, _ in r["top_ops"])]
    assert holders, table.to_text()
    assert {r["type"] for r in holders} == {mtype}
    expected = sum(1 for e in json.loads(prof.read_bytes())["traceEvents"]
                   if e.get("name") == NODE + node)
    assert table.counts["backward_by_sequence"] >= expected


@pytest.mark.parametrize("case", list(BACKWARD_NODES))
def test_backward_nodes_lie_in_their_module_backward_span(case: str, tmp_path: Path) -> None:
    make_model, make_input, _, _ = CASES[case]
    node, mtype = BACKWARD_NODES[case]
    model = make_model().train()
    tr, prof = run_profiled(model, make_input(), tmp_path, backward=True)
    assert (tr.spans().cat == 1).any(), "no backward spans recorded"
    out = tmp_path / "merged.json"
    merge_traces(tr, prof, out)
    doc = load_json(out)
    bwd = x_events(doc, lambda e: e.get("cat") == "hooktrace.backward"
                   and e["args"]["type"] == mtype)
    # the node's own range (RecordScope.BACKWARD_FUNCTION, the range hooktrace records);
    # the engine's "evaluate_function: ..." range around it also covers the engine's
    # bookkeeping after the node (input buffers), which can outlast the module's span
    nodes = x_events(doc, lambda e: e.get("cat") == "cpu_op" and e["name"] == node)
    assert nodes and bwd
    for s, e, _ in nodes:
        assert any(a <= s and e <= b for a, b, _ in bwd)
    # backward spans never share the profiler's thread row
    assert all(sp["tid"] != ev["tid"] for _, _, sp in bwd for _, _, ev in nodes)
    rows = rows_of(doc)
    for row in our_rows(doc):
        assert strict_nesting_violations(rows[row]) == [], row


def test_unrelated_profiler_trace_is_refused(tmp_path: Path) -> None:
    # GIVEN a profiler trace of one run and a later hooktrace run (same process)
    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    with torch.profiler.profile(activities=CPU) as prof:
        model(x)
    path = tmp_path / "old.json"
    prof.export_chrome_trace(str(path))
    with hooktrace.trace(model) as tr:
        model(x)
    with pytest.raises(MergeError, match="does not overlap"):
        merge_traces(tr, path, tmp_path / "m.json")
    with pytest.raises(MergeError, match="does not overlap"):
        attribute(tr, path)


def test_truncated_real_trace_names_position(tmp_path: Path) -> None:
    model = ConvNet()
    tr, prof = run_profiled(model, torch.randn(1, 3, 8, 8), tmp_path, backward=False)
    data = prof.read_bytes()
    prof.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProfilerTraceError, match=r"profiler.json: malformed profiler trace JSON "
                                                 r"at line \d+ column \d+ \(byte \d+\)"):
        merge_traces(tr, prof, tmp_path / "m.json")


def test_profile_one_liner_writes_merged_gzip(tmp_path: Path) -> None:
    model = tiny_llama()
    x = torch.randint(0, 64, (1, 8))
    out = tmp_path / "merged.json.gz"
    with hooktrace.profile(model, out, activities=CPU) as p:
        model(x)
    assert p.outputs == [str(out)] and p.result is not None
    doc = load_json(out)
    assert any(e.get("cat") == "hooktrace.forward" for e in doc["traceEvents"])
    assert any(e.get("cat") == "cpu_op" for e in doc["traceEvents"])


def test_schedule_handler_merges_each_window_with_its_spans(tmp_path: Path) -> None:
    # GIVEN 6 steps, profiled with a schedule: wait 1, warmup 1, active 2, twice
    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    with hooktrace.trace(model) as tr:
        handler = merged_trace_handler(tr, tmp_path / "traces", worker_name="w")
        with torch.profiler.profile(
            activities=CPU, on_trace_ready=handler,
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2),
        ) as prof:
            for _ in range(8):
                model(x)
                prof.step()
        # each window was merged as it ended, while the trace kept recording
        assert len(handler.outputs) == 2 and all(Path(p).exists() for p in handler.outputs)
    outputs = handler.finish()
    # THEN one merged file per window, each with only that window's forward calls
    assert len(outputs) == 2
    n_root = len([i for i in range(len(tr.spans())) if tr.spans().depth[i] == 0])
    assert n_root == 8
    for path in outputs:
        doc = load_json(Path(path))
        roots = [e for e in doc["traceEvents"] if e.get("cat") == "hooktrace.forward"
                 and e["args"]["module"] == ""]
        assert len(roots) == 2, path
        rows = rows_of(doc)
        for row in our_rows(doc):
            assert strict_nesting_violations(rows[row]) == [], row
    assert not list((tmp_path / "traces").glob("*.profiler.json"))


def test_long_schedule_merges_every_window_with_bounded_memory(tmp_path: Path) -> None:
    # GIVEN the reproducer of issue #7: a repeating schedule over 16 steps and a
    # buffer that holds 8 of them (501 modules: 1002 events per step)
    model = nn.Sequential(*[nn.Identity() for _ in range(500)])
    x = torch.randn(2)
    sched = torch.profiler.schedule(wait=2, warmup=1, active=1, repeat=4)
    with hooktrace.profile(model, tmp_path / "traces", schedule=sched, activities=CPU,
                           trace_kwargs={"capacity": 8192}) as p:
        for _ in range(16):
            model(x)
            p.step()
    # THEN every window is merged (none refused as "another run"), each with all of
    # its spans: the trace records only active steps and drains each window
    assert len(p.outputs) == 4 and p.handler is not None and not p.handler.failed
    for out in p.outputs:
        block = load_json(Path(out))["hooktrace"]
        assert block["shared"] == 501 and block["dropped_events"] == 0, out


def test_a_window_bigger_than_the_buffer_reports_its_drops(tmp_path: Path) -> None:
    model = nn.Sequential(*[nn.Identity() for _ in range(500)])
    x = torch.randn(2)
    sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=3)
    with pytest.warns(RuntimeWarning, match="events were dropped"):
        with hooktrace.profile(model, tmp_path / "traces", schedule=sched, activities=CPU,
                               trace_kwargs={"capacity": 600}) as p:
            for _ in range(9):
                model(x)
                p.step()
    assert len(p.outputs) == 3 and p.handler is not None and not p.handler.failed
    for out in p.outputs:
        block = load_json(Path(out))["hooktrace"]
        # 1002 module events and the step mark, into room for 600
        assert block["dropped_events"] == 1003 - 600 and block["shared"] < 501


def test_profile_output_paths_are_checked_before_the_run(tmp_path: Path) -> None:
    model = ConvNet()
    (tmp_path / "afile").write_text("x")
    sched = torch.profiler.schedule(wait=0, warmup=0, active=1)
    # a schedule writes a directory of windows: an existing file is refused up front
    with pytest.raises(hooktrace.errors.OutputPathError, match="is not a directory"):
        hooktrace.profile(model, tmp_path / "afile", schedule=sched)
    # without a schedule: a file name must say .json or .json.gz
    with pytest.raises(hooktrace.errors.OutputPathError, match=r"\.json or \.json\.gz"):
        hooktrace.profile(model, tmp_path / "merged.txt")
    # an existing directory, or a name ending in '/', receives <host>_<pid>.merged.json.gz
    for target in (str(tmp_path) + "/", str(tmp_path / "new") + "/"):
        with hooktrace.profile(model, target, activities=CPU) as p:
            model(torch.randn(1, 3, 8, 8))
        (written,) = p.outputs
        assert Path(written).parent == Path(target) and written.endswith(".merged.json.gz")
        assert any(e.get("cat") == "hooktrace.forward"
                   for e in load_json(Path(written))["traceEvents"])
    assert not list(tmp_path.glob("**/*.tmp"))


def test_never_called_containers_get_no_attribution_rows(tmp_path: Path) -> None:
    model = tiny_llama().train()
    tr, prof = run_profiled(model, torch.randint(0, 64, (1, 8)), tmp_path, backward=True)
    table = attribute(tr, prof)
    containers = {name for name, m in model.named_modules() if isinstance(m, nn.ModuleList)}
    assert containers and not containers & {r["module"] for r in table.rows}
    # AccumulateGrad has no sequence number: unattributed, as in the plain summary
    plain = {r["type"] for r in tr.summary().rows if r["module"] == "<unattributed>"}
    assert "torch::autograd::AccumulateGrad" in plain
    for r in table.rows:
        if r["module"] != "<unattributed>":
            assert not any("AccumulateGrad" in name for name, _ in r["top_ops"]), r


def test_cli_summary_with_profiler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hooktrace.cli import main

    model = ConvNet().train()
    tr, prof = run_profiled(model, torch.randn(2, 3, 8, 8), tmp_path, backward=True)
    run = tmp_path / "run.htrace"
    tr.save(run)
    assert main(["summary", str(run), "--profiler", str(prof), "--top-ops", "2"]) == 0
    text = capsys.readouterr().out
    assert "stem" in text and "backward" in text and "aten::conv2d" in text
    assert "ConvolutionBackward0" in text
    assert main(["summary", str(run), "--profiler", str(prof), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert any(r["module"] == "stem" and r["phase"] == "forward" for r in rows)


def test_profiler_rows_use_os_thread_ids(tmp_path: Path) -> None:
    # What the merge relies on: kineto's host tid is the OS tid hooktrace records.
    model = ConvNet()
    tr, prof = run_profiled(model, torch.randn(1, 3, 8, 8), tmp_path, backward=False)
    tids = {e["tid"] for e in json.loads(prof.read_bytes())["traceEvents"]
            if e.get("cat") == "cpu_op"}
    assert threading.get_native_id() in tids
    assert set(tr.spans().tid.tolist()) == {threading.get_native_id()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_kernels_are_attributed(tmp_path: Path) -> None:
    model = ConvNet().cuda()
    x = torch.randn(2, 3, 8, 8, device="cuda")
    with hooktrace.trace(model) as tr, torch.profiler.profile() as prof:
        model(x)
        torch.cuda.synchronize()
    path = tmp_path / "p.json"
    prof.export_chrome_trace(str(path))
    table = attribute(tr, path)
    assert table.counts["gpu_activities"] > 0
    assert table.row("stem")["gpu_self_ns"] > 0  # type: ignore[index]


def test_emit_profiler_names_ranges_by_qualified_name_under_the_root(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU()))
    with hooktrace.trace(model, emit_profiler=True), torch.profiler.profile(
            activities=CPU) as prof:
        model(torch.randn(2, 4))
    path = tmp_path / "p.json"
    prof.export_chrome_trace(str(path))
    names = {e["name"] for e in json.loads(path.read_bytes())["traceEvents"]
             if e.get("cat") == "user_annotation"}
    assert {"Sequential", "Sequential.0", "Sequential.1", "Sequential.1.0"} <= names
    assert not {"0", "1", "1.0"} & names


def test_device_time_rows_join_the_profilers_trace(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run recorded with gpu=True (here on the host-clock seam) merged with its
    torch.profiler trace keeps hooktrace's "GPU d stream s" rows, one slice per timed
    interval at its time, and Perfetto's importer keeps every slice."""
    from perfetto_check import perfetto_check

    monkeypatch.setenv("HOOKTRACE_GPU_TIMER", "host")
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    with hooktrace.trace(model, gpu=True) as tr, torch.profiler.profile(activities=CPU) as prof:
        loss_of(model(x)).backward()
    path = tmp_path / "profiler.json"
    prof.export_chrome_trace(str(path))
    g = tr.result.gpu_spans()
    assert len(g) > 0
    out = tmp_path / "merged.json"
    merge_traces(tr.result, path, out)
    doc = load_json(out)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    gpu = x_events(doc, lambda e: e.get("cat", "").startswith("hooktrace.gpu_"))
    assert sorted((s, t) for s, t, _ in gpu) == sorted(
        (int(a), int(b)) for a, b in zip(g.start_ns, g.end_ns))
    assert {names[(e["pid"], e["tid"])].split(" (")[0] for _, _, e in gpu} == {"GPU 0 stream 0"}
    assert any(t.get("kind") == "gpu" for t in doc["hooktrace"]["tracks"])
    perfetto_check([out])
