"""Per-step aggregates and the detail policy (issue #31): trace(model, aggregate=DIR)
reduces each step's events to per-module rows (Parquet, one table) and drops them,
unless the detail policy keeps the step as DIR/steps/step-N_<run>.htrace."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.record.aggregate import DetailPolicy, load_aggregates


def kept_file(folder: Path, step: int) -> Path:
    """The one file DIR/steps holds for ``step`` (step-N_<run>.htrace)."""
    (found,) = (folder / "steps").glob(f"step-{step}_*.htrace")
    return found


def kept_names(folder: Path) -> list[str]:
    """The kept steps' names without their run, in step order."""
    names = [f.name.split("_")[0] for f in (folder / "steps").glob("step-*.htrace")]
    return sorted(names, key=lambda n: int(n[len("step-"):]))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)
        self.slow_at: int | None = None
        self.nan_at: int | None = None
        self.calls = 0
        self.starts: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.starts.append(time.perf_counter())
        if self.calls - 1 == self.slow_at:
            # slow against the steps measured so far, whatever this machine's load (a fixed
            # 0.2 s was under slow=30 x the median when two CPU burners ran: steps took
            # ~7 ms): 100 x their median step
            steps = [b - a for a, b in zip(self.starts[:-1], self.starts[1:])]
            time.sleep(max(0.2, 100 * statistics.median(steps)))
        h = self.act(self.fc1(x))
        if self.calls - 1 == self.nan_at:
            h = h * float("nan")
        return self.fc2(h)


def train(model: Net, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def test_rows_per_step_module_and_mode_and_the_raw_events_go(tmp_path: Path) -> None:
    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", detail="every=10",
                         aggregate_interval=0) as tr:
        train(model, 25)
    t = load_aggregates(tmp_path / "agg").to_pydict()
    assert sorted(set(t["step"])) == list(range(25))
    rows = {(s, m, mode): c for s, m, mode, c in zip(t["step"], t["module"], t["mode"],
                                                      t["calls"], strict=True)}
    for step in range(25):
        for module in ("<root>", "fc1", "act", "fc2"):
            assert rows[(step, module, "forward")] == 1
        assert rows[(step, "fc1", "backward")] == 1
        assert rows[(step, "<step>", "step")] == 1
    assert all(p >= 0 and m >= p for p, m in zip(t["p50_ms"], t["max_ms"], strict=True))
    # every 10th step keeps its events, loadable like any trace
    assert kept_names(tmp_path / "agg") == ["step-0", "step-10", "step-20"]
    step10 = hooktrace.load(kept_file(tmp_path / "agg", 10))
    assert {r["module"] for r in step10.summary().rows} >= {"", "fc1", "act", "fc2"}
    assert [k["why"] for k in tr.info["aggregate"]["detail"]] == ["every"] * 3
    # the kept step's rows are its spans reduced: total, median, max per module and mode
    # (within 10 ns: the clock conversion of the run then and of the saved step differ)
    from hooktrace.reading import CAT_FORWARD

    sp = step10.spans()
    names = [m[0] or "<root>" for m in step10.modules]
    for slot, module in enumerate(names):
        d = (sp.end_ns - sp.start_ns)[(sp.module == slot) & (sp.cat == CAT_FORWARD)] / 1e6
        i = next(i for i in range(len(t["step"])) if t["step"][i] == 10
                 and t["module"][i] == module and t["mode"][i] == "forward")
        assert t["total_ms"][i] == pytest.approx(d.sum(), rel=1e-4, abs=1e-5)
        assert t["p50_ms"][i] == pytest.approx(float(np.median(d)), rel=1e-4, abs=1e-5)
        assert t["max_ms"][i] == pytest.approx(d.max(), rel=1e-4, abs=1e-5)
    # the others were dropped: the result holds only what came after the last step
    assert len(tr.result.events) == 0


def test_the_slow_step_and_the_first_nonfinite_step_keep_full_detail(tmp_path: Path) -> None:
    model = Net()
    model.slow_at, model.nan_at = 12, 17
    with hooktrace.trace(model, aggregate=tmp_path / "agg", numerics=True, aggregate_interval=0,
                         detail="every=0,slow=30,nonfinite") as tr:
        train(model, 22)
    why = {k["step"]: k["why"] for k in tr.info["aggregate"]["detail"]}
    # (a ~1 ms step; 200 ms is far beyond 30 x the median, whatever the machine's noise)
    assert why[12] == "slow"  # (the first slow one: none before it is kept as slow)
    assert why[17] == "nonfinite"
    assert [s for s, w in why.items() if w == "nonfinite"] == [17]  # the first one only
    slow_step = hooktrace.load(kept_file(tmp_path / "agg", 12))
    assert {r["module"] for r in slow_step.summary().rows} >= {"", "fc1", "act", "fc2"}
    assert slow_step.summary().counts["steps"] == 0 or len(slow_step.events)
    nan_step = hooktrace.load(kept_file(tmp_path / "agg", 17))
    assert len(nan_step.events) and any(n.startswith("act") or "fc2" in n or n == ""
                                        for n in [m for m, _ in nan_step.modules])
    t = load_aggregates(tmp_path / "agg").to_pydict()
    nf = [(s, m) for s, m, mode, n in zip(t["step"], t["module"], t["mode"], t["nonfinite"],
                                           strict=True) if n]
    assert nf and min(s for s, _ in nf) == 17


def test_keep_step_from_code(tmp_path: Path) -> None:
    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", detail="every=0,signal",
                         aggregate_interval=0) as tr:
        train(model, 3)
        tr.keep_step()
        train(model, 2)
    assert [k["step"] for k in tr.info["aggregate"]["detail"]] == [3]


def test_keep_step_and_loggers_need_an_aggregate_output() -> None:
    # (the recorder asks its components; none serves these without aggregate=)
    model = Net()
    with hooktrace.trace(model) as tr:
        with pytest.raises(RuntimeError, match="this trace has no aggregate= output"):
            tr.keep_step()
        with pytest.raises(RuntimeError, match="this trace has no aggregate= output"):
            tr.add_logger(lambda step, rows: None)
        train(model, 1)
    assert len(tr.steps()) == 1


def test_detail_policy_and_combinations_are_checked(tmp_path: Path) -> None:
    assert DetailPolicy.parse("every=5,slow=2.5") == DetailPolicy(5, 2.5, False, False)
    with pytest.raises(ValueError, match="detail: unknown trigger 'often'"):
        hooktrace.trace(Net(), aggregate=tmp_path, detail="often")
    with pytest.raises(ValueError, match=r"detail: 'slow=0.5': expected"):
        hooktrace.trace(Net(), aggregate=tmp_path, detail="slow=0.5")
    with pytest.raises(ValueError, match="cannot be combined with out="):
        hooktrace.trace(Net(), aggregate=tmp_path, out=tmp_path / "x.htrace")


def test_an_interval_reduces_many_steps_into_one_row_per_module(tmp_path: Path) -> None:
    # the default: one window per second, so disk grows with time, not with steps
    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", detail="every=0",
                         aggregate_interval=3600):
        train(model, 10)
    t = load_aggregates(tmp_path / "agg").to_pydict()
    rows = {(m, mode): (s, n, c) for s, n, m, mode, c in zip(
        t["step"], t["steps"], t["module"], t["mode"], t["calls"], strict=True)}
    assert rows[("fc1", "forward")] == (0, 10, 10)  # first step, steps, calls
    assert rows[("fc1", "backward")] == (0, 10, 10)
    assert rows[("<step>", "step")] == (0, 10, 10)
    assert len(t["step"]) == len(rows)  # one window
    with pytest.raises(ValueError, match="aggregate_interval must be a number of seconds"):
        hooktrace.trace(model, aggregate=tmp_path, aggregate_interval=-1)


RUN_SCRIPT = """
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter
import hooktrace

m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
writer = SummaryWriter("tb")
hooktrace.log_to(writer, top=2)   # the global trace of hooktrace run
x = torch.randn(4, 4)
for _ in range(6):
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()
writer.close()
"""


def test_run_aggregate_writes_rows_and_log_to_finds_the_global_trace(tmp_path: Path) -> None:
    import subprocess
    import sys

    from test_loggers import scalars_in

    script = tmp_path / "train.py"
    script.write_text(RUN_SCRIPT)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--aggregate", "agg",
                        "--aggregate-interval", "0", "--detail", "every=5", str(script)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "6 steps aggregated in agg/aggregates, 2 kept whole in agg/steps" in r.stderr
    # every step went into the aggregates: no empty .htrace beside them
    assert not list(tmp_path.glob("*.htrace")), list(tmp_path.iterdir())
    assert "hooktrace: wrote" not in r.stderr
    t = load_aggregates(tmp_path / "agg").to_pydict()
    assert sorted(set(t["step"])) == list(range(6))
    assert kept_names(tmp_path / "agg") == ["step-0", "step-5"]
    got = scalars_in(tmp_path / "tb")
    assert len([k for k in got if k.startswith("hooktrace/fwd_ms/")]) == 2
    assert sorted(s for s, _ in got["hooktrace/step_ms"]) == list(range(6))
    bad = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--aggregate", "agg",
                          "--detail", "sometimes", str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1].endswith(
        "detail: unknown trigger 'sometimes'; expected every=N, slow=K, nonfinite, signal")


def test_summary_of_an_aggregate_folder_reads_the_table_without_torch(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=4"):
        train(model, 9)
    code = ("import io, json, sys, contextlib\nfrom hooktrace.cli import main\n"
            "out = io.StringIO()\nwith contextlib.redirect_stdout(out):\n"
            "    code = main(['summary', sys.argv[1]])\n"
            "print(json.dumps({'code': code, 'out': out.getvalue(), "
            "'torch': 'torch' in sys.modules}))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "agg")], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["code"] in (0, None) and not got["torch"]
    lines = got["out"].splitlines()
    assert lines[0].endswith("9 steps aggregated, " + str(9 * 9) + " rows")
    fc1 = next(line.split() for line in lines if line.startswith("fc1 ") and "forward" in line)
    assert fc1[2] == "9"  # calls over the run
    assert "steps kept whole (3)" in lines[-1] and "/step-8_" in lines[-1]


def test_summary_of_an_aggregate_folder_as_json_and_csv(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """summary DIR --json / --csv printed the text table (a script parsing it got a
    JSONDecodeError); they now give the table's rows, and a flag the folder cannot serve
    is one line instead of being ignored."""
    import csv
    import io
    import json

    from hooktrace.cli import main

    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=4"):
        train(model, 5)
    folder = str(tmp_path / "agg")
    assert main(["summary", folder]) in (0, None)
    text = capsys.readouterr().out.splitlines()
    assert main(["summary", folder, "--json"]) in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["counts"]["steps"] == 5 and doc["counts"]["rows"] == 5 * 9
    assert len(doc["kept_steps"]) == 2
    rows = {(r["module"], r["mode"]): r for r in doc["rows"]}
    fc1_text = next(line.split() for line in text if line.startswith("fc1 ") and "forward" in line)
    fc1 = rows[("fc1", "forward")]
    assert fc1["calls"] == int(fc1_text[2]) == 5
    assert f"{fc1['total_ms']:.2f}" == fc1_text[3] and f"{fc1['ms_per_step']:.3f}" == fc1_text[5]
    assert f"{fc1['self_ns'] / 1e6:.2f}" == fc1_text[4] and fc1["total_ns"] > 0
    assert rows[("<step>", "step")]["calls"] == 5
    assert main(["summary", folder, "--csv", "--top", "3"]) in (0, None)
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["module"] for r in table] == [r["module"] for r in doc["rows"][:4]]
    assert float(table[0]["total_ms"]) == pytest.approx(doc["rows"][0]["total_ms"])
    assert main(["summary", folder, "--by-shape"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--by-shape needs a trace" in err[0]


def test_memory_peaks_when_memory_is_recorded(tmp_path: Path) -> None:
    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0, memory=True,
                         detail="every=0"):
        train(model, 3)
    t = load_aggregates(tmp_path / "agg").to_pydict()
    peaks = {(s, m, mode): p for s, m, mode, p in zip(t["step"], t["module"], t["mode"],
                                                        t["mem_peak_bytes"], strict=True)}
    assert all(peaks[(s, "fc1", "forward")] > 0 for s in range(3))
    assert peaks[(0, "<step>", "step")] is None
    assert all(g is None for g in t["gpu_ms"])  # no device time recorded on the CPU


def test_device_time_per_module_and_phase_when_recorded() -> None:
    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, GpuSpans
    from hooktrace.analysis.device_time import gpu_ms_by_module

    g = GpuSpans({"start_ns": np.array([0, 2_000_000, 0]),
                  "end_ns": np.array([1_000_000, 5_000_000, 500_000]),
                  "self_ns": np.zeros(3, np.int64), "span": np.array([0, 1, 2]),
                  "module": np.array([1, 1, 2], np.uint32),
                  "cat": np.array([CAT_FORWARD, CAT_FORWARD, CAT_BACKWARD], np.uint8),
                  "device": np.zeros(3, np.int16), "stream": np.zeros(3, np.int64)})
    # (a trace whose paired device time is g: device_time.gpu_spans asks trace.derived)
    trace = type("T", (), {"derived": lambda self, key, make: g})()
    assert gpu_ms_by_module(trace) == {(1, CAT_FORWARD): 4.0, (2, CAT_BACKWARD): 0.5}
    empty = type("T", (), {"derived": lambda self, key, make: GpuSpans.empty()})()
    assert gpu_ms_by_module(empty) is None


def test_diff_of_two_aggregate_folders_and_the_signal_trigger(tmp_path: Path) -> None:
    import signal as signals

    from hooktrace.cli import main

    def run(folder: str, slow_fc2: bool) -> Any:
        model = Net()
        if slow_fc2:
            inner = model.fc2.forward
            model.fc2.forward = lambda x: (time.sleep(0.01), inner(x))[1]  # type: ignore
        with hooktrace.trace(model, aggregate=tmp_path / folder, aggregate_interval=0,
                             detail="every=0,signal") as tr:
            train(model, 4)
            os.kill(os.getpid(), signals.SIGUSR2)  # kill -USR2 <pid>: keep the next step
            train(model, 2)
        return tr

    tr = run("a", False)
    assert [(k["step"], k["why"]) for k in tr.info["aggregate"]["detail"]] == [(4, "signal")]
    run("b", True)
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    # fc2 took 10 ms more per step in B: far beyond 50%
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-above", "50",
                 "--min-share", "0"]) == 1


def test_query_reads_an_aggregate_folder_as_the_aggregates_view(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``hooktrace query DIR "... FROM aggregates"`` over ``trace(aggregate=DIR)``; the
    parts' columns are the declared ``aggregates`` schema (docs/schema.md)."""
    pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")
    import json

    from hooktrace.cli import main
    from hooktrace.data.engine import query
    from hooktrace.data.schema import file_schema

    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", detail="every=10",
                         aggregate_interval=0):
        train(model, 12)
    table = load_aggregates(tmp_path / "agg")
    declared = file_schema("aggregates", partitioned=False)
    assert table.schema.names == declared.names
    assert [f.type for f in table.schema] == [f.type for f in declared]
    got = query(tmp_path / "agg", "SELECT module, mode, sum(calls) AS calls FROM aggregates "
                                  "GROUP BY ALL ORDER BY module, mode").to_pylist()
    want: dict[tuple[str, str], int] = {}
    for m, mode, c in zip(*(table.column(k).to_pylist() for k in ("module", "mode", "calls"))):
        want[(m, mode)] = want.get((m, mode), 0) + c
    assert [(r["module"], r["mode"], r["calls"]) for r in got] == sorted(
        (m, mode, c) for (m, mode), c in want.items())
    assert ("fc1", "forward", 12) in [(r["module"], r["mode"], r["calls"]) for r in got]
    assert main(["query", str(tmp_path / "agg"), "--json",
                 "SELECT count(*) AS n, max(step) AS last, count(rank) AS ranked "
                 "FROM aggregates WHERE mode = 'step'"]) in (0, None)
    assert json.loads(capsys.readouterr().out) == [{"n": 12, "last": 11, "ranked": 0}]


def test_flop_rate_per_module_when_flops_are_recorded(tmp_path: Path) -> None:
    # GIVEN a run recorded with flops=True, a window per step and step 5 kept whole
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    with hooktrace.trace(model, aggregate=tmp_path / "agg", flops=True, aggregate_interval=0,
                         detail="every=5"):
        for _ in range(8):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    t = load_aggregates(tmp_path / "agg").to_pydict()
    tf = {(s, m, mode): v for s, m, mode, v in zip(t["step"], t["module"], t["mode"],
                                                     t["tflops"], strict=True)}
    # THEN step 0 ran under the FLOP counter (slower): no rate; later steps have one for
    # the Linear layers and the model, none for ReLU (no FLOPs) and the step row
    assert all(v is None for (s, _, _), v in tf.items() if s == 0)
    for step in range(1, 8):
        for module, mode in (("0", "forward"), ("2", "forward"), ("0", "backward"),
                             ("<root>", "forward"), ("<root>", "backward")):
            assert tf[(step, module, mode)] > 0, (step, module, mode)
        assert tf[(step, "1", "forward")] is None and tf[(step, "<step>", "step")] is None
    # THEN they are the summary's TFLOP/s of the same step (the kept one, a trace; to
    # 1e-3: the saved step's clock conversion differs from the run's by a few ns)
    rows = {r["module"]: r for r in hooktrace.load(
        kept_file(tmp_path / "agg", 5)).summary().rows}
    for module, name in (("", "<root>"), ("0", "0"), ("2", "2")):
        assert tf[(5, name, "forward")] == pytest.approx(rows[module]["tflops"], rel=1e-3)
        assert tf[(5, name, "backward")] == pytest.approx(rows[module]["bwd_tflops"], rel=1e-3)
    # THEN the rate is the FLOPs over the host time of the row (FlopCounterMode's count
    # of one call of fc "0": 2 x 16 x 64 x 128 forward)
    i = next(i for i in range(len(t["step"])) if (t["step"][i], t["module"][i],
                                                  t["mode"][i]) == (5, "0", "forward"))
    assert t["tflops"][i] == pytest.approx(2 * 16 * 64 * 128 / (t["total_ms"][i] * 1e-3) / 1e12,
                                           rel=1e-3)
    # THEN hooktrace summary DIR shows the rate over the run: FLOPs over time, the windows
    # weighed by their time (so between the fastest and the slowest window's)
    from hooktrace.data.aggregates import aggregate_summary

    text = aggregate_summary(tmp_path / "agg").splitlines()
    assert text[1].split()[-1] == "TFLOP/s"
    fc = next(line.split() for line in text if line.startswith("0 ") and "forward" in line)
    rates = [v for (s, m, mode), v in tf.items() if (m, mode) == ("0", "forward") and v]
    assert min(rates) * 0.999 <= float(fc[-1]) <= max(rates) * 1.001
    relu = next(line for line in text if line.startswith("1 ") and "forward" in line)
    assert len(relu.split()) == len(fc) - 1  # ReLU: no TFLOP/s (no FLOPs)
    # and a run without FLOPs has the column, empty
    model2 = Net()
    with hooktrace.trace(model2, aggregate=tmp_path / "plain", aggregate_interval=0,
                         detail="every=0"):
        train(model2, 2)
    assert all(v is None for v in load_aggregates(tmp_path / "plain")["tflops"].to_pylist())


def test_report_of_an_aggregate_folder_and_of_a_bad_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hooktrace.cli import main
    from hooktrace.record.aggregate import kept_steps

    model = Net()
    model.slow_at = 7
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=4,slow=30"):
        train(model, 9)
    # the kept steps and why, from DIR/kept.jsonl
    assert [(k["step"], k["why"]) for k in kept_steps(tmp_path / "agg")] == [
        (0, "every"), (4, "every"), (7, "slow"), (8, "every")]
    page = tmp_path / "agg.html"
    assert main(["report", str(tmp_path / "agg"), "-o", str(page)]) in (0, None)
    text = page.read_text()
    for step, why in ((0, "every"), (7, "slow")):
        name = kept_file(tmp_path / "agg", step).name
        assert f'href="agg/steps/{name}">{name}</a>: step {step} ({why})' in text
    assert "9 steps aggregated in 9 windows" in text
    assert '<td data-v="fc1">fc1</td><td data-v="forward">forward</td>' in text
    # the step chart: step 7 slept 200 ms, far above the ~1 ms steps: a log scale
    from hooktrace.reporters.aggregate import step_figure

    figure = step_figure(load_aggregates(tmp_path / "agg"), kept_steps(tmp_path / "agg"))
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert figure["data"][2]["x"] == [0, 4, 7, 8]
    capsys.readouterr()
    # a folder that holds no aggregates, and one whose part is not Parquet: one line each
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "-o", str(tmp_path / "x.html")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an aggregate= folder" in err[0] and "empty" in err[0]
    (tmp_path / "bad" / "aggregates").mkdir(parents=True)
    (tmp_path / "bad" / "aggregates" / "part-00001.parquet").write_bytes(b"not parquet")
    assert main(["report", str(tmp_path / "bad"), "-o", str(tmp_path / "x.html")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the aggregate table cannot be read" in err[0]
    assert "part-00001.parquet" in err[0]
    assert not (tmp_path / "x.html").exists()
    # summary and diff read the same table: the same one line, no traceback
    for argv in (["summary", str(tmp_path / "bad")],
                 ["diff", str(tmp_path / "bad"), str(tmp_path / "agg")]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the aggregate table cannot be read" in err[0], (argv, err)
        assert "part-00001.parquet" in err[0]


def test_an_aggregate_folder_where_a_trace_is_expected_is_one_line_naming_its_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its kept steps are single steps of one process, not a run's ranks: export,
    merge-ranks and a diff against a trace say so, name a kept step, and write nothing."""
    from hooktrace.cli import main

    model = Net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=2"):
        train(model, 5)
    assert len(list((tmp_path / "agg" / "steps").glob("step-*.htrace"))) == 3
    with hooktrace.trace(model, out=tmp_path / "one.htrace"):
        train(model, 2)
    agg, one = str(tmp_path / "agg"), str(tmp_path / "one.htrace")
    capsys.readouterr()
    for argv in (["export", agg, "-o", str(tmp_path / "x.json")],
                 ["export", agg, "-o", str(tmp_path / "x.parquet")],
                 ["merge-ranks", agg, "-o", str(tmp_path / "m.json")],
                 ["diff", agg, one], ["diff", one, agg]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "aggregate= folder" in err[0], (argv, err)
        assert os.path.join(agg, "steps", "step-N_<run>.htrace") in err[0], (argv, err)
    assert not list(tmp_path.glob("x.*")) and not (tmp_path / "m.json").exists()
    # a kept step is a trace like any other
    assert main(["diff", str(kept_file(tmp_path / "agg", 2)), one]) == 0


def test_eval_calls_between_steps_get_rows_of_their_own(tmp_path: Path) -> None:
    # GIVEN a validation pass (no_grad, eval mode) of 5 calls before each of 3 steps
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=0"):
        for _ in range(3):
            model.eval()
            with torch.no_grad():
                for _ in range(5):
                    model(x)
            model.train()
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    t = load_aggregates(tmp_path / "agg").to_pydict()
    calls = {(s, m, mode): c for s, m, mode, c in zip(t["step"], t["module"], t["mode"],
                                                       t["calls"], strict=True)}
    # THEN the training forward is one call per step, the eval calls are 5 apart
    for step in range(3):
        assert calls[(step, "fc1", "forward")] == 1
        assert calls[(step, "fc1", "eval")] == 5
        assert calls[(step, "fc1", "backward")] == 1
    # and a model trained in eval mode (every forward call flagged): its forward calls are
    # eval rows, as the summary has them (one definition of a call's mode, issue #37;
    # this view once called them "forward" when no call of the window was a training one)
    model2 = Net()
    model2.eval()
    with hooktrace.trace(model2, aggregate=tmp_path / "evalmode", aggregate_interval=0,
                         detail="every=0"):
        train(model2, 2)
    modes = set(load_aggregates(tmp_path / "evalmode")["mode"].to_pylist())
    assert modes == {"eval", "backward", "step"}


def test_eval_rows_carry_their_own_numerics(tmp_path: Path) -> None:
    """A NaN in a validation pass is the eval row's, not the training forward's: the
    eval calls' numerics go to their rows, the training calls' to theirs."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=0", numerics=True):
        for step in range(3):
            model.eval()
            with torch.no_grad():
                model(x * 100.0)  # eval: larger values than training's
                if step == 1:  # and a NaN in step 1's validation only
                    model.fc2(torch.full((4, 16), float("nan")))
            model.train()
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    t = load_aggregates(tmp_path / "agg").to_pydict()
    rows = {(s, m, mode): (nf, am) for s, m, mode, nf, am in zip(
        t["step"], t["module"], t["mode"], t["nonfinite"], t["absmax"], strict=True)}
    for step in range(3):
        (nf_e, am_e), (nf_f, am_f) = rows[(step, "fc1", "eval")], rows[(step, "fc1", "forward")]
        assert nf_e == 0 and nf_f == 0
        assert am_e is not None and am_f is not None and am_e > 10 * am_f
        # the NaN call's output: 4 x 2 values, all NaN
        assert rows[(step, "fc2", "eval")][0] == (8 if step == 1 else 0)
        assert rows[(step, "fc2", "forward")][0] == 0
        assert rows[(step, "fc2", "backward")] == (0, rows[(step, "fc2", "backward")][1])
        assert rows[(step, "fc2", "backward")][1] is not None
