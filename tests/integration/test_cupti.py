"""Kernel busy time from CUPTI (issue #49) through a fake libcupti (fake_cupti.cpp).

The fake is CUPTI where it hurts: records arrive late (held back over flushes), out of
order (shuffled), lost (counted as CUPTI counts them), in a clock of their own; a second
subscriber is refused. Each test launches fake kernels from inside module calls (the
forward, a backward on the autograd thread, several Python threads, a captured graph
replayed) and checks what hooktrace's join makes of them against what it launched:
counts and durations the test chose, never how fast this machine is.
"""

from __future__ import annotations

import ctypes
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.errors import NoDeviceError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MS = 1_000_000
RUNTIME, LAUNCH_KERNEL, KERNEL = 2, 211, 10
DRIVER, CU_LAUNCH_KERNEL = 1, 307


@pytest.fixture(scope="session")
def fake_lib() -> Path:
    out = REPO / "build" / "fake_cupti" / "libfakecupti.so"
    src = HERE / "fake_cupti.cpp"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["c++", "-std=c++17", "-O1", "-shared", "-fPIC", str(src), "-o", str(out)],
                       check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture
def cupti(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HOOKTRACE_CUPTI_LIB", str(fake_lib))
    monkeypatch.delenv("HOOKTRACE_GPU_MODE", raising=False)
    lib = ctypes.CDLL(str(fake_lib))
    lib.fake_cupti_launch.restype = ctypes.c_uint32
    lib.fake_cupti_launch.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64]
    lib.fake_cupti_graph_node.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.fake_cupti_graph_launch.restype = ctypes.c_uint32
    lib.fake_cupti_graph_launch.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int,
                                            ctypes.c_uint32, ctypes.c_uint64]
    lib.fake_cupti_set.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.fake_cupti_get.restype = ctypes.c_uint64
    lib.fake_cupti_get.argtypes = [ctypes.c_char_p]
    for knob, value in (("other_holds", 0), ("lose_every", 0), ("late_flushes", 2),
                        ("buffer_records", 3), ("seed", 7)):
        lib.fake_cupti_set(knob.encode(), value)
    return lib


class Launches(nn.Module):
    """Launches `n` fake kernels of `dur` ns on `stream` per call, then runs `inner`."""

    def __init__(self, lib: Any, n: int, dur: int, stream: int = 7,
                 inner: nn.Module | None = None) -> None:
        super().__init__()
        self.lib, self.n, self.dur, self.stream = lib, n, dur, stream
        self.inner = inner if inner is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n):
            # runtime and driver launches alternate (Inductor and Triton use the driver)
            domain, cbid = (RUNTIME, LAUNCH_KERNEL) if i % 2 == 0 else (DRIVER, CU_LAUNCH_KERNEL)
            self.lib.fake_cupti_launch(domain, cbid, KERNEL, b"gemm", self.stream,
                                       self.dur)
        return self.inner(x)


class BackwardLaunch(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lib: Any) -> torch.Tensor:
        ctx.lib = lib
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        for _ in range(3):
            ctx.lib.fake_cupti_launch(RUNTIME, LAUNCH_KERNEL, KERNEL, b"gemm_bwd", 7, 2 * MS)
        return g * 2, None


class WithBackward(nn.Module):
    def __init__(self, lib: Any) -> None:
        super().__init__()
        self.lib = lib
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return BackwardLaunch.apply(self.lin(x), self.lib)


def row(summary: Any, module: str, mode: str = "train") -> dict[str, Any]:
    return next(r for r in summary.rows if r["module"] == module and r["mode"] == mode)


def test_forward_and_backward_kernels_are_joined_to_their_modules(cupti: Any) -> None:
    inner = Launches(cupti, 2, 1 * MS)
    model = nn.Sequential(Launches(cupti, 3, 1 * MS, inner=inner), WithBackward(cupti))
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        for _ in range(2):
            model(torch.ones(2, 4, requires_grad=True)).sum().backward()
            tr.step()
    data = tr.result
    info = data.info["kernels"]
    assert info["lost"] == 0 and "gpu" not in data.info  # kernels only: no event per call
    s = data.summary()
    outer, leaf = row(s, "0"), row(s, "0.inner")
    # the fake serializes a stream: busy time is exactly what was launched
    assert (leaf["kernels"], leaf["kernel_ns"]) == (4, 4 * MS)
    assert (outer["kernels"], outer["kernel_ns"], outer["kernel_self_ns"]) == (10, 10 * MS, 6 * MS)
    bwd = row(s, "1")
    assert (bwd["kernels"], bwd["kernels_bwd"], bwd["kernel_bwd_ns"]) == (0, 6, 12 * MS)
    root = row(s, "")
    assert (root["kernels"], root["kernel_ns"], root["kernel_bwd_ns"]) == (10, 10 * MS, 12 * MS)
    text = s.to_text()
    assert "kernel" in text and "gpu_" not in text.splitlines()[0]


def test_records_late_out_of_order_and_lost_are_counted_never_placed_wrong(cupti: Any) -> None:
    cupti.fake_cupti_set(b"lose_every", 4)
    cupti.fake_cupti_set(b"late_flushes", 5)
    model = nn.Sequential(Launches(cupti, 5, MS), Launches(cupti, 3, 2 * MS, stream=9))
    before_lost = cupti.fake_cupti_get(b"lost")
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        for _ in range(4):
            model(torch.ones(1))
            tr.step()
    data = tr.result
    lost = cupti.fake_cupti_get(b"lost") - before_lost
    assert lost == 32 // 4 and data.info["kernels"]["lost"] == lost
    s = data.summary()
    a, b = row(s, "0"), row(s, "1")
    assert a["kernels"] + b["kernels"] == 32 - lost
    # whatever survived is where it was launched, with its own duration
    assert a["kernel_ns"] == a["kernels"] * MS and b["kernel_ns"] == b["kernels"] * 2 * MS
    assert "records lost by CUPTI" in "\n".join(s.to_text().splitlines()[-4:])


def test_launches_on_several_threads_go_to_each_threads_module(cupti: Any) -> None:
    models = [Launches(cupti, 4, MS, stream=10 + i) for i in range(3)]
    holder = nn.ModuleList(models)
    with hooktrace.trace(holder, gpu=True, gpu_mode="kernels") as tr:
        threads = [threading.Thread(target=lambda m=m: [m(torch.ones(1)) for _ in range(5)])
                   for m in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s = tr.result.summary()
    for i in range(3):
        r = row(s, str(i))
        assert (r["kernels"], r["kernel_ns"]) == (20, 20 * MS)


def test_a_captured_graph_replayed_three_times_is_named_by_module(cupti: Any) -> None:
    nodes = [1000 + i for i in range(3)]

    class Captures(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for n in nodes:  # stream capture: the node is created inside the call
                cupti.fake_cupti_graph_node(n, 0)
            return x

    model = nn.Sequential(Captures(), Launches(cupti, 1, MS))
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        model(torch.ones(1))
        for n in nodes:  # the end of the capture creates the executable graph's nodes
            cupti.fake_cupti_graph_node(n + 500, 0)  # (outside any module call), and
            cupti.fake_cupti_graph_node(n + 500, n)  # reports them cloned (CUDA 13.0)
        exe = (ctypes.c_uint64 * 3)(*[n + 500 for n in nodes])
        for _ in range(3):  # replays, outside any module call
            cupti.fake_cupti_graph_launch(exe, 3, 7, MS)
        # a graph whose capture hooktrace never saw: counted, left on the replay's span
        unknown = (ctypes.c_uint64 * 2)(77, 78)
        cupti.fake_cupti_graph_launch(unknown, 2, 7, MS)
    data = tr.result
    s = data.summary()
    assert (row(s, "0")["kernels"], row(s, "0")["kernel_ns"]) == (9, 9 * MS)
    from hooktrace.analysis.kernel_time import kernel_records

    k = kernel_records(data)
    assert (k.graph_kernels, k.graph_unnamed) == (11, 2)
    assert (int(k.graph.sum()), int(k.by_node.sum())) == (11, 9)
    named = sum(r["kernel_self_ns"] or 0 for r in s.rows if r["mode"] == "train")
    assert named == 10 * MS  # 9 replayed + 1 launched; the unknown graph's 2 ms unplaced


def test_a_second_subscriber_is_refused_in_one_line_or_falls_back(
        cupti: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cupti.fake_cupti_set(b"other_holds", 1)
    model = Launches(cupti, 1, MS)
    with pytest.raises(NoDeviceError, match="held by another tool"):
        with hooktrace.trace(model, gpu=True, gpu_mode="kernels"):
            model(torch.ones(1))
    monkeypatch.setenv("HOOKTRACE_GPU_TIMER", "host")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hooktrace.trace(model, gpu=True) as tr:  # auto: falls back to events
            model(torch.ones(1))
    assert any("device events instead" in str(w.message) for w in caught)
    info = tr.result.info
    assert info["gpu"]["timer"] == "host" and "held by another tool" in info["kernels"]["unavailable"]


def test_torch_profiler_started_while_recording_gets_cupti_and_gives_it_back(cupti: Any) -> None:
    model = Launches(cupti, 2, MS)
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        model(torch.ones(1))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            assert not cupti.fake_cupti_get(b"subscribed")  # yielded to the profiler
            model(torch.ones(1))
        assert cupti.fake_cupti_get(b"subscribed")  # taken back
        model(torch.ones(1))
    data = tr.result
    assert data.info["kernels"]["yielded"] == 1
    # the calls before and after the profiler are timed; the one under it is not
    assert row(data.summary(), "")["kernels"] == 4


def test_both_modes_give_idle_inside_the_span(cupti: Any, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    import time

    class Gappy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            cupti.fake_cupti_launch(RUNTIME, LAUNCH_KERNEL, KERNEL, b"k", 21, MS)
            time.sleep(0.02)  # the host is slow: the device idles between the two
            cupti.fake_cupti_launch(RUNTIME, LAUNCH_KERNEL, KERNEL, b"k", 21, MS)
            return x

    model = Gappy()
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        model(torch.ones(1))
    r = row(tr.result.summary(), "")
    # idle is at least the injected host delay less the first kernel, measured against it
    assert r["kernel_ns"] == 2 * MS and r["kernel_idle_ns"] >= 20 * MS - MS


def test_exports_draw_each_kernel_under_its_module_on_the_device_row(
        cupti: Any, tmp_path: Path) -> None:
    import json

    from perfetto_check import perfetto_check

    cupti.fake_cupti_set(b"late_flushes", 0)
    inner = Launches(cupti, 2, MS, stream=31)
    model = nn.Sequential(Launches(cupti, 1, MS, stream=31, inner=inner), WithBackward(cupti))
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        model(torch.ones(2, 4, requires_grad=True)).sum().backward()
        tr.step()
    tr.export_chrome(tmp_path / "k.json")
    tr.export_perfetto(tmp_path / "k.pftrace")
    events = json.loads((tmp_path / "k.json").read_text())["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    device = [e for e in events if e.get("ph") == "X" and rows.get(e["tid"], "").startswith("GPU 0 stream 31")]
    kernels = [e for e in device if e["args"].get("kernel")]
    assert sorted(e["name"] for e in kernels) == ["gemm"] * 3
    assert {e["args"]["module"] for e in kernels} == {"0", "0.inner"}
    # each kernel lies inside its module's slice on the same row
    module = {e["args"]["module"]: e for e in device if not e["args"].get("kernel")}
    for e in kernels:
        m = module[e["args"]["module"]]
        assert m["ts"] <= e["ts"] and e["ts"] + e["dur"] <= m["ts"] + m["dur"] + 1
    reports = perfetto_check([tmp_path / "k.json", tmp_path / "k.pftrace"])
    assert all(r.ok for r in reports), reports


def test_the_parquet_spans_table_and_the_report_carry_kernel_time(
        cupti: Any, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from hooktrace.cli import main

    cupti.fake_cupti_set(b"late_flushes", 0)
    model = nn.Sequential(Launches(cupti, 3, MS), Launches(cupti, 1, 2 * MS))
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        model(torch.ones(1))
    tr.save(tmp_path / "k.htrace")
    assert main(["export", str(tmp_path / "k.htrace"), "-o", str(tmp_path / "k.parquet")]) == 0
    rows = {r["module"]: r for r in pq.read_table(tmp_path / "k.parquet").to_pylist()}
    assert (rows["0"]["kernel_ns"], rows["0"]["kernels"]) == (3 * MS, 3)
    assert (rows["1"]["kernel_ns"], rows[""]["kernel_ns"]) == (2 * MS, 5 * MS)
    assert main(["report", str(tmp_path / "k.htrace"), "-o", str(tmp_path / "k.html")]) == 0
    assert "kernel busy time (CUPTI) recorded" in (tmp_path / "k.html").read_text()


def test_a_file_whose_kernel_events_lie_reads_without_crashing(cupti: Any, tmp_path: Path
                                                               ) -> None:
    """Kernel name indexes past the names table, a record without its second event and
    a clock that is not pairs: placed where they can be, named nowhere, never a crash."""
    from hooktrace._events import CUPTI_KERNEL, CUPTI_KERNEL_MORE
    from hooktrace.analysis.kernel_time import kernel_records
    from hooktrace.reading import TraceData

    cupti.fake_cupti_set(b"late_flushes", 0)
    model = nn.Sequential(Launches(cupti, 3, MS))
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        model(torch.ones(1))
    d = tr.result
    ev = d.events.copy()
    more = np.flatnonzero(ev["kind"] == CUPTI_KERNEL_MORE)
    ev["rf_tid"][more] = 2**31  # name index far past the table
    ev["kind"][more[0]] = CUPTI_KERNEL  # the first record loses its second event... twice
    info = dict(d.info, kernels=dict(d.info["kernels"], clock=[["x", 1], [2]]))
    TraceData(ev, d.modules, d.node_names, d.clock, info).save(tmp_path / "lie.htrace")
    bad = hooktrace.load(tmp_path / "lie.htrace")
    k = kernel_records(bad)
    assert k.unpaired >= 1 and len(k) == 2
    bad.summary().to_text()
    bad.export_chrome(tmp_path / "lie.json")
    bad.export_perfetto(tmp_path / "lie.pftrace")


def test_kernels_launched_from_a_compiled_kernel_site_go_to_the_module_it_names(
        cupti: Any) -> None:
    """Compiled code marks each kernel call (record/kernels.py: _ht_kb(site) ... _ht_ke):
    what is launched between the marks is the site's module's, inside the region's."""
    import hooktrace._C as _C
    from hooktrace.record import kernels

    site = kernels.site("triton_poi_fused_gelu_0", "inner.act", "forward")

    class Region(nn.Module):  # stands for a compiled module: its children never run
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Sequential()
            self.inner.add_module("act", nn.GELU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            cupti.fake_cupti_launch(RUNTIME, LAUNCH_KERNEL, KERNEL, b"glue", 7, MS)
            _C.kernel_begin(site)
            for _ in range(2):
                cupti.fake_cupti_launch(DRIVER, CU_LAUNCH_KERNEL, KERNEL, b"triton", 7, 2 * MS)
            _C.kernel_end(site)
            return x

    model = nn.Sequential(Region())
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        for _ in range(3):
            model(torch.ones(1))
    s = tr.result.summary()
    act, inner, region = row(s, "0.inner.act"), row(s, "0.inner"), row(s, "0")
    assert (act["kernels"], act["kernel_ns"], act["kernel_self_ns"]) == (6, 12 * MS, 12 * MS)
    assert (inner["kernel_ns"], inner["kernel_self_ns"]) == (12 * MS, 0)
    assert (region["kernels"], region["kernel_ns"], region["kernel_self_ns"]) == (9, 15 * MS, 3 * MS)


def test_a_gradient_accumulation_goes_with_the_node_that_made_it(cupti: Any) -> None:
    """The engine adds a tensor's gradient contributions after the node that produced
    the last one, before the next node runs: torch.profiler counts that add in the
    producing node's module (its evaluate_function range), and so does hooktrace."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hooktrace.analysis.kernel_time import kernel_records

    class Launching(TorchDispatchMode):  # each op of the backward launches its kernel
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            cupti.fake_cupti_launch(RUNTIME, LAUNCH_KERNEL, KERNEL, str(func).encode(), 7, MS)
            return func(*args, **(kwargs or {}))

    class Act(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x + x  # x's gradient has three contributions: two adds

    model = nn.Sequential(nn.Linear(4, 4), Act())
    x = torch.ones(2, 4)
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
        loss = model(x).sum()
        with Launching():
            loss.backward()
    d = tr.result
    k, spans = kernel_records(d), d.spans()
    names = d.info["kernels"]["names"]
    placed = np.flatnonzero(k.span >= 0)
    where = [(d.modules[int(spans.module[k.span[i]])][0], int(spans.cat[k.span[i]]),
              names[int(k.name[i])]) for i in placed]
    linear_bwd = [n for m, c, n in where if m == "0" and c == 1]
    act_bwd = [n for m, c, n in where if m == "1" and c == 1]
    assert linear_bwd and not any(n.startswith("aten.add") for n in linear_bwd), linear_bwd
    assert sum(n.startswith("aten.add") for n in act_bwd) >= 1, act_bwd


def test_aggregates_carry_kernel_time_per_step_and_the_summary_reads_it(
        cupti: Any, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from hooktrace.data.aggregates import aggregate_rows
    from hooktrace.record.aggregate import load_aggregates

    cupti.fake_cupti_set(b"late_flushes", 0)
    model = nn.Sequential(Launches(cupti, 2, MS), Launches(cupti, 1, 3 * MS, stream=9))
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels", aggregate=tmp_path / "agg",
                         aggregate_interval=0, detail="every=0") as tr:
        for _ in range(4):
            model(torch.ones(1))
            tr.step()
    table = load_aggregates(tmp_path / "agg")
    rows, steps = aggregate_rows(table)
    got = {(r["module"], r["mode"]): r["kernel_ms_per_step"] for r in rows}
    assert steps == 4
    assert got[("0", "forward")] == pytest.approx(2.0) and got[("1", "forward")] == pytest.approx(3.0)


def test_tflops_are_over_the_kernels_busy_time(cupti: Any) -> None:
    """With kernel busy time (and no event intervals), TFLOP/s is over busy time, not
    over the host's launch time."""
    cupti.fake_cupti_set(b"late_flushes", 0)

    class Mm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(64, 64, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            cupti.fake_cupti_launch(RUNTIME, LAUNCH_KERNEL, KERNEL, b"gemm", 7, 10 * MS)
            return self.lin(x)

    model = Mm()
    with hooktrace.trace(model, gpu=True, gpu_mode="kernels", flops=True) as tr:
        for _ in range(3):
            model(torch.ones(32, 64))
    r = row(tr.result.summary(), "")
    flops = 2 * 32 * 64 * 64  # one matmul per call
    assert r["tflops"] == pytest.approx(flops / (10 * MS) / 1e3, rel=1e-3)


def test_two_traces_at_once_share_cupti_and_each_gets_its_kernels(cupti: Any) -> None:
    cupti.fake_cupti_set(b"late_flushes", 0)
    a, b = Launches(cupti, 2, MS), Launches(cupti, 3, MS, stream=8)
    with hooktrace.trace(a, gpu=True, gpu_mode="kernels") as ta:
        with hooktrace.trace(b, gpu=True, gpu_mode="kernels") as tb:
            a(torch.ones(1))
            b(torch.ones(1))
        assert cupti.fake_cupti_get(b"subscribed")  # a still records
        a(torch.ones(1))
    assert not cupti.fake_cupti_get(b"subscribed")
    assert row(ta.result.summary(), "")["kernels"] == 4
    assert row(tb.result.summary(), "")["kernels"] == 3


def test_diff_compares_kernel_busy_time_when_both_runs_have_it(cupti: Any) -> None:
    from hooktrace.analysis.diff import compare

    cupti.fake_cupti_set(b"late_flushes", 0)

    def run(dur: int) -> Any:
        model = nn.Sequential(Launches(cupti, 2, dur), Launches(cupti, 1, MS, stream=9))
        with hooktrace.trace(model, gpu=True, gpu_mode="kernels") as tr:
            for _ in range(3):
                model(torch.ones(1))
                tr.step()
        return tr.result

    d = compare(run(MS), run(3 * MS))
    assert d.gpu
    rows = {(r["module"], r["phase"]): r for r in d.rows}
    slower = rows[("0", "gpu forward")]
    assert (slower["p50_a_ns"], slower["p50_b_ns"]) == (2 * MS, 6 * MS)
    assert rows[("1", "gpu forward")]["p50_change_ns"] == 0
