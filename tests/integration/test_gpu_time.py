"""Device time per module call (issue #28), through the host-clock timer seam
(HOOKTRACE_GPU_TIMER=host, hooktrace/record/gpu_time.py): the pool and its exhaustion,
timings pending until a step mark, gpu_every, nested self time, one backward mark per
change of module, the .htrace round trip (saved, and streamed by `hooktrace run`), the
validator on a corrupt GPU event, CUDA-graph capture skipped, and gpu=True without CUDA
as one line. The tests at the end need a CUDA device (real c10::Event timing)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hooktrace
import hooktrace._C as _C
from hooktrace._events import GPU_BACKWARD, GPU_MARK, GPU_NO_MODULE, GPU_TIME, STEP
from hooktrace.errors import NoDeviceError
from hooktrace.format import TraceFileError
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, TraceData

@pytest.fixture(autouse=True)
def _event_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file tests device-event intervals: gpu=True's mode on CUDA is kernels."""
    monkeypatch.setenv("HOOKTRACE_GPU_MODE", "events")


REPO = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()


@pytest.fixture
def host_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKTRACE_GPU_TIMER", "host")


class Sleepy(nn.Module):
    def __init__(self, ms: float, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.ms, self.inner, self.fc = ms, inner, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        x = self.fc(x)
        return self.inner(x) if self.inner is not None else x


def _train(net: nn.Module, steps: int, **opts: object) -> TraceData:
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with hooktrace.trace(net, **opts) as tr:
        for _ in range(steps):
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    return tr.result


def _marks(data: TraceData, backward: bool | None = None) -> np.ndarray:
    ev = data.events
    sel = ev["kind"] == GPU_MARK
    if backward is not None:
        sel &= ((ev["flags"] & GPU_BACKWARD) != 0) == backward
    return ev[sel]


def test_forward_intervals_nest_with_self_time(host_timer: None) -> None:
    net = Sleepy(2, Sleepy(1))
    data = _train(net, 2, gpu=True)
    g, spans = data.gpu_spans(), data.spans()
    fwd = g.cat == CAT_FORWARD
    # one interval per forward call (4 modules with a call each, 2 steps)
    assert int(fwd.sum()) == int((spans.cat == CAT_FORWARD).sum()) == 2 * 4
    assert (spans.module[g.span] == g.module).all()
    for i in np.flatnonzero(fwd):
        kids = np.flatnonzero(fwd & (spans.parent[g.span] == g.span[i]))
        assert g.self_ns[i] == g.duration_ns[i] - g.duration_ns[kids].sum()
        for k in kids:  # nested in the parent's interval
            assert g.start_ns[i] <= g.start_ns[k] <= g.end_ns[k] <= g.end_ns[i]
    info = data.info["gpu"]
    assert info["timer"] == "host" and info["every"] == 1 and info["timed_steps"] == 2
    assert info["dropped"] == 0 and info["skipped_capturing"] == 0
    assert info["align_error_ns"] == 0
    assert "accelerator" not in data.info or CUDA


def test_backward_marks_one_per_change_of_module(host_timer: None) -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = _train(net, 3, gpu=True)
    bwd = _marks(data, backward=True)
    nodes = data.spans().nodes
    # per pass: Linear 2, ReLU, Linear 0 (AddmmBackward0 + TBackward0 each: one mark),
    # then the graph task's end closes the last interval
    slots = {name: i for i, (name, _) in enumerate(data.modules)}
    expected = [slots["2"], slots["1"], slots["0"], GPU_NO_MODULE] * 3
    assert bwd["id"].tolist() == expected
    assert len(bwd) < len(nodes)  # fewer marks than autograd nodes
    g = data.gpu_spans()
    back = g.cat == CAT_BACKWARD
    assert sorted(data.modules[m][0] for m in g.module[back][:4]) == ["", "0", "1", "2"]
    spans = data.spans()
    assert (spans.cat[g.span[back]] == CAT_BACKWARD).all()
    for i in np.flatnonzero(back & (g.module == slots[""])):
        # the root's backward interval holds its children's, and has no work of its own
        kids = np.flatnonzero(back & (spans.parent[g.span] == g.span[i]))
        assert len(kids) == 3 and g.self_ns[i] == 0
        assert g.start_ns[i] == g.start_ns[kids].min() and g.end_ns[i] == g.end_ns[kids].max()


def test_timings_resolve_at_step_marks_not_before(host_timer: None) -> None:
    net = Sleepy(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with hooktrace.trace(net, gpu=True) as tr:
        net(torch.randn(2, 4)).sum().backward()
        before = tr.snapshot().events
        opt.step()  # the step mark resolves them
        after = tr.snapshot().events
    assert (before["kind"] == GPU_MARK).sum() > 0 and (before["kind"] == GPU_TIME).sum() == 0
    assert (after["kind"] == GPU_TIME).sum() == (after["kind"] == GPU_MARK).sum()
    # resolved at the step mark (just before it is recorded), after every mark
    assert (after["kind"] == STEP).sum() == 1
    assert (after["t"][after["kind"] == GPU_TIME] >= before["t"].max()).all()


def test_gpu_every_times_every_nth_step(host_timer: None) -> None:
    data = _train(Sleepy(0), 5, gpu=True, gpu_every=2)
    steps = data.steps()
    marks = _marks(data)
    t = data.clock.to_unix_ns(marks["t"])
    timed = set(steps.number[steps.index_of(t)].tolist())
    assert timed == {0, 2, 4}
    assert data.info["gpu"]["every"] == 2 and data.info["gpu"]["timed_steps"] == 3
    assert len(data.gpu_spans()) > 0


def test_pool_exhaustion_is_counted_not_waited_for(host_timer: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    net = nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)])
    attempted = len(_marks(_train(net, 1, gpu=True)))
    monkeypatch.setenv("HOOKTRACE_GPU_POOL", "4")
    data = _train(net, 1, gpu=True)
    marks = len(_marks(data))
    # a call the full pool cannot serve is dropped and counted, never waited for;
    # a half-full pool resolves what is done from the hot path (issue #36: without
    # step marks nothing was timed once the pool filled), so more than 4 are timed
    assert marks + data.info["gpu"]["dropped"] == attempted
    assert marks > 4
    data2 = _train(net, 2, gpu=True)
    assert len(_marks(data2)) + data2.info["gpu"]["dropped"] == 2 * attempted


def test_capturing_records_nothing_and_counts(host_timer: None) -> None:
    net = Sleepy(0)
    with hooktrace.trace(net, gpu=True) as tr:
        net(torch.randn(2, 4))
        _C.gpu_set_capturing(True)
        try:
            net(torch.randn(2, 4))
        finally:
            _C.gpu_set_capturing(False)
    data = tr.result
    assert len(_marks(data)) == 4  # Sleepy and its Linear, the first call only
    assert data.info["gpu"]["skipped_capturing"] == 4


def test_saved_trace_gives_the_same_gpu_spans(host_timer: None, tmp_path: Path) -> None:
    data = _train(Sleepy(1, Sleepy(0)), 2, gpu=True)
    path = tmp_path / "run.htrace"
    data.save(path)
    loaded = hooktrace.load(path)
    a, b = data.gpu_spans().to_records(), loaded.gpu_spans().to_records()
    assert len(a) > 0 and np.array_equal(a, b)
    assert loaded.info["gpu"] == data.info["gpu"]


def test_streamed_trace_gives_the_same_gpu_spans(host_timer: None, tmp_path: Path) -> None:
    net = Sleepy(1, Sleepy(0))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    path = tmp_path / "stream.htrace"
    with hooktrace.trace(net, gpu=True, out=path) as tr:
        for _ in range(2):
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
    a, b = tr.result.gpu_spans().to_records(), hooktrace.load(path).gpu_spans().to_records()
    assert len(a) > 0 and np.array_equal(a, b)


def test_hooktrace_run_gpu_streams_device_time(host_timer: None, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for i in range(4):
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
    """))
    out = tmp_path / "run.htrace"
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--gpu", "--gpu-every", "2",
                        "-o", str(out), str(script)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = hooktrace.load(out)
    assert data.info["gpu"]["every"] == 2 and data.info["gpu"]["timed_steps"] == 2
    g = data.gpu_spans()
    assert set(g.cat.tolist()) == {CAT_FORWARD, CAT_BACKWARD}
    names = {data.modules[m][0] for m in g.module}
    assert {"0", "1", "2"} <= names


def test_validator_rejects_a_corrupt_gpu_event(host_timer: None, tmp_path: Path) -> None:
    data = _train(Sleepy(0), 1, gpu=True)
    for field, value, words in (("id", 999, "GPU mark's module id 999 out of range"),
                                ("flags", 3, "on a GPU mark")):
        ev = data.events.copy()
        ev[field][np.flatnonzero(ev["kind"] == GPU_MARK)[0]] = value
        path = tmp_path / f"bad_{field}.htrace"
        TraceData(ev, data.modules, data.node_names, data.clock, data.info).save(path)
        with pytest.raises(TraceFileError) as e:
            hooktrace.load(path)
        assert words in str(e.value) and "\n" not in str(e.value)
    ev = data.events.copy()
    ev["seq"][np.flatnonzero(ev["kind"] == GPU_TIME)[0]] = 5  # 1970: outside the run
    path = tmp_path / "bad_time.htrace"
    TraceData(ev, data.modules, data.node_names, data.clock, data.info).save(path)
    with pytest.raises(TraceFileError, match="expected a GPU time within"):
        hooktrace.load(path)


def test_bad_gpu_every_is_one_line() -> None:
    with pytest.raises(ValueError, match="gpu_every must be a positive integer"):
        hooktrace.trace(nn.Linear(2, 2), gpu=True, gpu_every=0)
    with pytest.raises(TypeError, match="gpu must be True or False"):
        hooktrace.trace(nn.Linear(2, 2), gpu="yes")


@pytest.mark.skipif(CUDA, reason="checks the machine without CUDA")
def test_gpu_without_cuda_is_one_clear_line(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOKTRACE_GPU_TIMER", raising=False)
    net = nn.Linear(2, 2)
    with pytest.raises(NoDeviceError, match="gpu=True needs a CUDA device") as e:
        hooktrace.trace(net, gpu=True)
    assert "\n" not in str(e.value)
    with pytest.raises(NoDeviceError, match="needs a CUDA device"):
        hooktrace.global_trace(gpu=True)
    assert net(torch.ones(1, 2)).shape == (1, 2) and type(net).__call__ is nn.Module.__call__
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--gpu", str(script)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "needs a CUDA device" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(CUDA, reason="checks the machine without CUDA")
def test_hooktrace_1_with_gpu_without_cuda_runs_untraced_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOKTRACE_GPU_TIMER", raising=False)
    env = {**os.environ, "HOOKTRACE": "1", "HOOKTRACE_OPTIONS": "--gpu",
           "HOOKTRACE_OUT": str(tmp_path / "x.htrace"), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout == "ran\n"
    assert r.stderr.count("\n") == 1 and "needs a CUDA device" in r.stderr


# --- on a CUDA device ----------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@needs_cuda
def test_cuda_events_time_forward_and_backward_without_a_sync(monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.delenv("HOOKTRACE_GPU_TIMER", raising=False)
    net = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    with hooktrace.trace(net, gpu=True) as tr:
        for _ in range(3):
            torch.cuda.set_sync_debug_mode("error")
            try:
                net(x).sum().backward()
                opt.step()
                opt.zero_grad()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    data = tr.result
    g = data.gpu_spans()
    assert data.info["gpu"]["timer"] == "cuda" and data.info["accelerator"] == "cuda"
    assert set(g.cat.tolist()) == {CAT_FORWARD, CAT_BACKWARD}
    assert (g.duration_ns > 0).all() and (g.self_ns >= 0).all()
    assert data.info["gpu"]["align_error_ns"] < 10_000_000


@needs_cuda
def test_cuda_graph_capture_is_skipped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOOKTRACE_GPU_TIMER", raising=False)
    net = nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    with hooktrace.trace(net, gpu=True) as tr:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            net(x)  # warm-up, timed
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            net(x)
        graph.replay()
    info = tr.result.info["gpu"]
    assert info["skipped_capturing"] == 2
    assert len(_marks(tr.result)) == 2


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc, self.act = nn.LayerNorm(32), nn.Linear(32, 32), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(self.norm(x)))


def test_kernel_sites_of_compiled_regions_are_timed(host_timer: None) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(_Block(), nn.Linear(32, 1))
    net[0].compile()
    data = _train_shaped(net, 2)
    g, ev = data.gpu_spans(), data.events
    sites = (ev["kind"] == GPU_MARK) & ((ev["flags"] & 4) != 0)
    kernel_marks = int(((ev["kind"] == 8) | (ev["kind"] == 9)).sum())
    assert kernel_marks > 0 and int(sites.sum()) == kernel_marks  # one event each
    k = g.span == -1
    names = {data.modules[m][0] for m in g.module[k]}
    # an interval per kernel of a module below the region; the region's own kernels (site
    # path "") stay in its interval, as its host time does (issue #48: one resolver)
    below = [data.info["kernel_sites"][i][1] != "" for i in ev["id"][sites].tolist()]
    assert 0 < int(k.sum()) == sum(below) // 2 < kernel_marks // 2
    assert names and all(n.startswith("0.") for n in names)
    assert set(g.cat[k].tolist()) == {CAT_FORWARD, CAT_BACKWARD}
    # the region's forward interval keeps only what its kernels did not take
    block = int(next(i for i, (n, _) in enumerate(data.modules) if n == "0"))
    for i in np.flatnonzero((g.module == block) & (g.cat == CAT_FORWARD) & ~k):
        inside = k & (g.start_ns >= g.start_ns[i]) & (g.end_ns <= g.end_ns[i])
        assert inside.any()
        assert g.self_ns[i] == g.duration_ns[i] - g.duration_ns[inside].sum()


def _train_shaped(net: nn.Module, steps: int) -> TraceData:
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with hooktrace.trace(net, gpu=True) as tr:
        for i in range(steps):
            net(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    return tr.result


def test_trainer_callbacks_take_the_gpu_options(host_timer: None) -> None:
    from hooktrace.integrations import TraceSession

    session = TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=False,
                           gpu=True, gpu_every=3)
    assert session.record.gpu and session.record.gpu_every == 3
    with pytest.raises(ValueError, match="gpu_every must be a positive integer"):
        TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=False,
                     gpu=True, gpu_every=-1)


def test_merge_ranks_draws_each_ranks_gpu_rows_on_rank_0s_clock(host_timer: None,
                                                                 tmp_path: Path) -> None:
    """``hooktrace merge-ranks`` of runs recorded with gpu=True: each rank's process has
    the one-rank export's "GPU d stream s" rows, its intervals moved onto rank 0's clock
    with the rest of the rank, and Perfetto's importer keeps every slice."""
    import json

    from perfetto_check import perfetto_check

    from hooktrace.cli import main

    # The two "ranks" are recorded one after the other; merge-ranks takes ranks that
    # do not overlap in time for separate runs. Rank 1's clock offset is chosen so that
    # on rank 0's clock it starts 3 ms after rank 0 did (overlapping by construction,
    # whatever the load: before, a fixed 3 ms offset failed when the gap was larger).
    runs = [_train(Sleepy(1, Sleepy(0)), 2, gpu=True) for _ in (0, 1)]
    starts = [int(d.steps().start_ns[0]) for d in runs]
    offsets = {0: 0, 1: starts[1] - starts[0] - 3_000_000}
    want: dict[int, list[tuple[int, int]]] = {}
    for rank, data in enumerate(runs):
        data.info.update(rank=rank, world_size=2, clock_offset_ns=offsets[rank],
                         clock_offset_uncertainty_ns=1000)
        g = data.gpu_spans()
        assert len(g) > 0
        want[rank] = sorted((int(a) - offsets[rank], int(b) - offsets[rank])
                            for a, b in zip(g.start_ns, g.end_ns))
        (tmp_path / f"rank{rank}").mkdir()
        data.save(tmp_path / f"rank{rank}" / "trace.htrace")
    out = tmp_path / "all.json"
    assert main(["merge-ranks", str(tmp_path), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    base = doc["baseTimeNanoseconds"]
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}
    pids = {e["args"]["name"].split(" ·")[0]: e["pid"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}
    for rank in (0, 1):
        pid = pids[f"rank {rank}"]
        gpu = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("hooktrace.gpu_")
               and e["pid"] == pid]
        assert {rows[(pid, e["tid"])] for e in gpu} <= {
            n for (p, _), n in rows.items() if p == pid and n.startswith("GPU ")}
        assert {e["cat"] for e in gpu} == {"hooktrace.gpu_forward", "hooktrace.gpu_backward"}
        got = sorted((base + round(e["ts"] * 1000), base + round((e["ts"] + e["dur"]) * 1000))
                     for e in gpu)
        assert got == want[rank], rank
    tracks = [t for t in doc["hooktrace"]["ranks"] if t.get("gpu_intervals")]
    assert len(tracks) == 2
    perfetto_check([out])


class _Reentrant(nn.Module):
    """A module that calls itself (three deep), around a Linear each time."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, depth: int = 3) -> torch.Tensor:
        y = self.inner(x)
        return self(y, depth - 1) if depth else y


def test_a_module_calling_itself_has_every_call_timed(host_timer: None) -> None:
    """Issue #35 item 13: the outer call's exit mark, after its inner call ended, found
    the inner call and was lost (10 of 40 calls timed, a parent's device time below its
    own child's). Each call is timed and holds the calls it made."""
    net = nn.Sequential(nn.Linear(4, 4), _Reentrant())
    data = _train(net, 2, gpu=True)
    g = data.gpu_spans()
    spans = data.spans()
    slot = next(i for i, (n, _) in enumerate(data.modules) if n == "1")
    fwd = (g.module == slot) & (g.cat == CAT_FORWARD)
    calls = int(((spans.module == slot) & (spans.cat == CAT_FORWARD)).sum())
    assert calls == 8 and int(fwd.sum()) == calls
    row = {int(s): i for i, s in enumerate(g.span.tolist())}
    for i in np.flatnonzero(fwd).tolist():
        parent = int(spans.parent[int(g.span[i])])
        if parent >= 0 and parent in row and int(spans.module[parent]) == slot:
            p = row[parent]
            assert g.start_ns[p] <= g.start_ns[i] and g.end_ns[i] <= g.end_ns[p]


def test_each_backward_call_of_a_module_calling_itself_has_its_own_interval(
        host_timer: None) -> None:
    """Issue #35 item 13, backward: the calls of a module called again back to back
    (here 1.inner, once per level of 1) run their backward nodes back to back, and the
    device mark came only when the module changed: one stretch took all four calls (2
    of 8 timed), and widened every 1 above it past its host end (device backward 1.6x
    the host's under the host clock). Each call now gets its own mark: every backward
    call timed, each interval begun inside its own call, in call order, none
    overlapping the next."""
    net = nn.Sequential(nn.Linear(4, 4), _Reentrant())
    data = _train(net, 2, gpu=True)
    g = data.gpu_spans()
    spans = data.spans()
    slot = next(i for i, (n, _) in enumerate(data.modules) if n == "1.inner")
    host = np.flatnonzero((spans.module == slot) & (spans.cat == CAT_BACKWARD))
    assert len(host) == 8
    row = {int(s): i for i, s in enumerate(g.span.tolist())}
    assert all(int(i) in row for i in host), (len([i for i in host if int(i) in row]), 8)
    by_start = sorted(host.tolist(), key=lambda i: int(spans.start_ns[i]))
    for i in by_start:
        r = row[i]
        assert spans.start_ns[i] <= g.start_ns[r] <= spans.end_ns[i]
    for a, b in zip(by_start, by_start[1:]):
        assert g.end_ns[row[a]] <= g.start_ns[row[b]]
