"""An ``aggregate=`` folder shared, a full disk, a kill mid-write, SIGUSR2 (issue #35):
runs and ranks in one folder stay apart, a disk that refuses a write costs rows (counted,
one warning), never the training run; a part a killed run left half written is not read;
``kill -USR2`` keeps a step whatever order the traces end in."""

from __future__ import annotations

import errno
import os
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
import hooktrace.record.aggregate as aggregate
from hooktrace.cli import main
from hooktrace.errors import HooktraceError
from hooktrace.data.aggregates import aggregate_summary, kept_steps, load_aggregates


def train(model: nn.Module, steps: int, width: int = 8) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


def net(width: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def step_rows(table: Any) -> dict[tuple[str, int | None], int]:
    """Steps aggregated per (run, rank)."""
    out: dict[tuple[str, int | None], int] = {}
    for run, rank, mode, steps in zip(*(table[k].to_pylist() for k in ("run", "rank", "mode",
                                                                        "steps")), strict=True):
        if mode == "step":
            out[(run, rank)] = out.get((run, rank), 0) + steps
    return out


def test_two_runs_in_one_folder_keep_their_rows_and_steps_apart(tmp_path: Path) -> None:
    # GIVEN two runs, 20 and 7 steps, one after the other in the same folder (the second
    # used to write part-00001.parquet again, replacing the first's rows)
    folder = tmp_path / "agg"
    infos = []
    for steps in (20, 7):
        model = net()
        with hooktrace.trace(model, aggregate=folder, aggregate_interval=0,
                             detail="every=5") as tr:
            train(model, steps)
        infos.append(tr.info["aggregate"])
    # THEN both runs' rows are there, each under its run, and each run's kept steps
    table = load_aggregates(folder)
    assert step_rows(table) == {(infos[0]["run"], None): 20, (infos[1]["run"], None): 7}
    assert len(os.listdir(folder / "aggregates")) == 2
    kept = kept_steps(folder)
    assert sorted((k["step"], k["run"]) for k in kept) == sorted(
        [(s, infos[0]["run"]) for s in (0, 5, 10, 15)] + [(s, infos[1]["run"]) for s in (0, 5)])
    # THEN the summary says there are two runs and gives each its ms per step
    lines = aggregate_summary(folder).splitlines()
    assert lines[0].endswith("27 steps aggregated, " + str(len(table)) + " rows, 2 runs: "
                             "run 1: 20 steps, run 2: 7 steps") or lines[0].endswith(
        "2 runs: run 1: 7 steps, run 2: 20 steps"), lines[0]
    assert lines[1].split()[8:12] == ["run", "1", "run", "2"]
    assert "steps kept whole (6)" in lines[-1]


def test_ranks_in_one_folder_are_shown_as_ranks(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN rank 0 (30 steps) and rank 1 (12 steps) of a torchrun launch, one folder
    folder = tmp_path / "agg"
    for rank, steps in ((0, 30), (1, 12)):
        monkeypatch.setenv("RANK", str(rank))
        model = net()
        with hooktrace.trace(model, aggregate=folder, aggregate_interval=0, detail="every=0"):
            train(model, steps)
    # THEN each rank's rows carry its rank, its parts its rank in the name
    table = load_aggregates(folder)
    assert sorted((rank, n) for (_, rank), n in step_rows(table).items()) == [(0, 30), (1, 12)]
    assert sorted(p.split("_rank")[1][0] for p in os.listdir(folder / "aggregates")) == ["0",
                                                                                          "1"]
    # THEN the summary names the ranks, with a ms/step column for each
    monkeypatch.delenv("RANK")
    lines = aggregate_summary(folder).splitlines()
    assert lines[0].endswith("2 ranks: rank 0: 30 steps, rank 1: 12 steps"), lines[0]
    assert "rank 0" in lines[1] and "rank 1" in lines[1]
    fc = next(line.split() for line in lines if line.startswith("0 ") and "forward" in line)
    assert fc[2] == "42" and len(fc) == 10  # calls over both; total, self, ms/step, 2 ranks,
    # p50, max


def test_a_full_disk_costs_rows_and_kept_steps_not_the_training_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    from hooktrace.reading import TraceData

    # GIVEN a part every 20 rows and a disk that fills after the first part
    monkeypatch.setattr(aggregate, "PART_ROWS", 20)
    real_write = pq.write_table
    written: list[str] = []

    def write_table(table: Any, where: Any, **kwargs: Any) -> None:
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(where))
        written.append(os.fspath(where))
        real_write(table, where, **kwargs)

    def save(self: Any, path: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", os.fspath(path))

    monkeypatch.setattr(pq, "write_table", write_table)
    monkeypatch.setattr(TraceData, "save", save)
    model = net()
    # WHEN a run of 30 steps keeps every 10th step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                             detail="every=10") as tr:
            train(model, 30)
    # THEN the training ran to its end, with one warning saying what was lost
    agg = tr.info["aggregate"]
    assert agg["steps"] == 30
    mine = [w for w in caught if "aggregate=" in str(w.message)]
    assert len(mine) == 1 and "No space left" in str(mine[0].message), mine
    assert agg["lost_steps"] == 3 and agg["detail"] == []
    # THEN the part written before the disk filled is whole, the rest counted as lost
    table = load_aggregates(tmp_path / "agg")
    assert agg["parts"] == 1 and os.path.basename(written[0]).startswith(".part-")
    per_step = len(table) // sum(step_rows(table).values())
    assert len(table) + agg["lost_rows"] == 30 * per_step
    assert agg["lost_rows"] > 0 and "No space left" in agg["write_error"]
    assert not [f for f in os.listdir(tmp_path / "agg" / "aggregates") if f.startswith(".")]


def test_a_read_only_folder_does_not_stop_training(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    folder = tmp_path / "agg"
    model = net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hooktrace.trace(model, aggregate=folder, aggregate_interval=0,
                             detail="every=2") as tr:
            train(model, 1)
            os.chmod(folder / "aggregates", 0o500)
            os.chmod(folder / "steps", 0o500)
            try:
                train(model, 5)
            finally:
                os.chmod(folder / "aggregates", 0o700)
                os.chmod(folder / "steps", 0o700)
    agg = tr.info["aggregate"]
    assert agg["steps"] == 6 and agg["lost_rows"] > 0 and agg["lost_steps"] >= 2
    assert len([w for w in caught if "aggregate=" in str(w.message)]) == 1


def test_a_part_left_half_written_by_a_kill_is_not_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a folder with a finished part and the temporary files a kill -9 during a part
    # write leaves (this version's .part-*.tmp, and an older version's part-N.parquet.tmp)
    folder = tmp_path / "agg"
    model = net()
    with hooktrace.trace(model, aggregate=folder, aggregate_interval=0, detail="every=0"):
        train(model, 4)
    parts = folder / "aggregates"
    good = next(parts.iterdir())
    (parts / f".{good.name[:-len('.parquet')]}-00002.parquet.tmp").write_bytes(b"PAR1 cut")
    (parts / "part-00002.parquet.tmp").write_bytes(b"PAR1 cut")
    # THEN summary, report and diff read the finished part, and so does a pyarrow dataset
    # of the folder for the temporary name this version writes
    assert main(["summary", str(folder)]) in (0, None)
    assert "4 steps aggregated" in capsys.readouterr().out
    assert main(["report", str(folder), "-o", str(tmp_path / "r.html")]) in (0, None)
    assert main(["diff", str(folder), str(folder)]) in (0, None)
    import pyarrow.dataset as ds

    (parts / "part-00002.parquet.tmp").unlink()
    assert ds.dataset(parts, format="parquet").to_table().num_rows == len(
        load_aggregates(folder))


@pytest.mark.parametrize("order", ["first_out_first", "last_out_first"])
def test_sigusr2_handler_is_restored_whatever_order_traces_end(tmp_path: Path,
                                                              order: str) -> None:
    # GIVEN two aggregate= traces that end in the order they started, or the reverse
    # (the first to end used to restore SIG_DFL: kill -USR2 then ended the process)
    before = signal.getsignal(signal.SIGUSR2)
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    ta = hooktrace.trace(a, aggregate=tmp_path / "a", aggregate_interval=0, detail="signal")
    tb = hooktrace.trace(b, aggregate=tmp_path / "b", aggregate_interval=0, detail="signal")
    ta.__enter__()
    tb.__enter__()
    try:
        a(torch.randn(1, 2))
        ta.step()
        b(torch.randn(1, 2))
        tb.step()
        first, second = (ta, tb) if order == "first_out_first" else (tb, ta)
        first.__exit__(None, None, None)
        # WHEN kill -USR2 arrives while the other still records
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, before)
        os.kill(os.getpid(), signal.SIGUSR2)  # (Python runs the handler before returning)
        model = a if second is ta else b
        model(torch.randn(1, 2))
        second.step()
    finally:
        second.__exit__(None, None, None)
    # THEN the process lives, the other trace kept the step after the signal
    assert [k["why"] for k in second.info["aggregate"]["detail"]] == ["signal"]
    # THEN the handler from before both is back
    assert signal.getsignal(signal.SIGUSR2) == before


def test_sigusr2_off_the_main_thread_is_refused_unless_a_trace_listens(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGUSR2)
    errors: list[BaseException] = []

    def run(detail: str) -> None:
        try:
            model = net()
            with hooktrace.trace(model, aggregate=tmp_path / detail.replace(",", "_"),
                                 aggregate_interval=0, detail=detail):
                train(model, 2)
        except BaseException as e:  # noqa: BLE001 (handed to the main thread)
            errors.append(e)

    def on_thread(detail: str) -> None:
        t = threading.Thread(target=run, args=(detail,))
        t.start()
        t.join()

    # GIVEN a trace started on another thread, with the signal trigger (on by default)
    on_thread(aggregate.DEFAULT_DETAIL)
    # THEN it is refused in one line saying why and what to do (kill -USR2 would have
    # ended the process: no handler can be set off the main thread)
    assert len(errors) == 1 and isinstance(errors[0], HooktraceError)
    assert "main thread" in str(errors[0]) and "\n" not in str(errors[0])
    assert signal.getsignal(signal.SIGUSR2) == before
    errors.clear()
    # THEN without the trigger it records; and with a trace on the main thread listening,
    # a thread's trace joins it
    on_thread("every=1")
    main_model = net()
    with hooktrace.trace(main_model, aggregate=tmp_path / "main", aggregate_interval=0,
                         detail="signal"):
        on_thread("every=0,signal")
    assert errors == []
    assert signal.getsignal(signal.SIGUSR2) == before


# -- what aggregate= writes, and says (issue #35 item 16) --------------------------------

SCRIPT = """
import torch
from torch import nn
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
for _ in range(4):
    opt.zero_grad()
    m(torch.randn(4, 4)).sum().backward()
    opt.step()
"""


def test_run_aggregate_summary_prints_the_table_and_exports_are_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"}
    # WHEN hooktrace run --aggregate --summary: the folder's table (it printed nothing)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--aggregate", "agg",
                        "--aggregate-interval", "0", "--summary", str(script)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "agg: 4 steps aggregated" in r.stderr and "<step>" in r.stderr, r.stderr
    # WHEN --chrome with --aggregate (it wrote an empty export): refused in one line,
    # before the script runs
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--aggregate", "agg2",
                        "--chrome", "c.json", str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "--chrome and --pftrace export the trace in memory" in err[0]
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "agg2").exists()


def test_a_callback_with_aggregate_writes_no_trace_of_the_tail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from hooktrace.integrations import TraceSession

    monkeypatch.chdir(tmp_path)
    # GIVEN a trainer callback's session with aggregate= and events after the last step
    session = TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=True,
                           aggregate=str(tmp_path / "agg"), aggregate_interval=0,
                           detail="every=0")
    model = net()
    session.start(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        session.step()
    model(torch.randn(4, 8))  # (an evaluation after the last step)
    session.finish(rank=0, world_size=1)
    # THEN no .htrace holding only that tail, and the line says what happened
    assert not list(tmp_path.glob("*.htrace"))
    assert session.written == [str(tmp_path / "agg")]
    err = capsys.readouterr().err
    assert "3 steps aggregated" in err and "events after the last step not aggregated" in err
    assert "agg: 3 steps aggregated" in err  # summary=True: the folder's table
    # no step at all: a line saying there is no summary, as run --aggregate --summary
    empty = TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=True,
                         aggregate=str(tmp_path / "agg0"))
    empty.start(net())
    empty.finish(rank=0, world_size=1)
    assert f"no step was aggregated in {tmp_path / 'agg0'}: no summary" in capsys.readouterr().err
    # and chrome= with aggregate= is refused when the callback is made
    with pytest.raises(ValueError, match="chrome= exports the trace in memory"):
        TraceSession(None, chrome=str(tmp_path / "c.json"), backward=True, capacity=1 << 16,
                     summary=False, aggregate=str(tmp_path / "agg"))


def test_a_submodule_named_root_keeps_rows_of_its_own(tmp_path: Path) -> None:
    # GIVEN a submodule whose name is the root's label in the module column
    model = nn.Sequential()
    model.add_module("<root>", nn.Linear(8, 8))
    model.add_module("head", nn.Linear(8, 1))
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         detail="every=0"):
        train(model, 3)
    # THEN its rows are its own: the root's forward calls are the model's, 3
    t = load_aggregates(tmp_path / "agg").to_pydict()
    calls: dict[tuple[str, str], int] = {}
    for m, mode, c in zip(t["module"], t["mode"], t["calls"], strict=True):
        calls[(m, mode)] = calls.get((m, mode), 0) + c
    assert calls[("<root>", "forward")] == 3 and calls[("'<root>'", "forward")] == 3


def test_a_submodule_added_inside_the_trace_is_named_in_a_warning() -> None:
    model = net()
    with pytest.warns(UserWarning, match="'extra' added to the model inside the trace: not "
                                         "recorded"):
        with hooktrace.trace(model):
            model.add_module("extra", nn.Identity())
            train(model, 1)
    # and none when nothing was added
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        other = net()
        with hooktrace.trace(other):
            train(other, 1)


# -- memory stays bounded (issue #35 item 14) ---------------------------------------------


def test_a_long_interval_closes_its_window_at_the_capacity(tmp_path: Path) -> None:
    # GIVEN a 600 s interval (it held every raw event of the window) and a capacity of
    # about 10 steps' events
    model = net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=600,
                         detail="every=0", capacity=200):
        train(model, 60)
    # THEN windows closed on the way, each of the steps the capacity holds
    table = load_aggregates(tmp_path / "agg")
    windows = [n for mode, n in zip(table["mode"].to_pylist(), table["steps"].to_pylist(),
                                    strict=True) if mode == "step"]
    assert sum(windows) == 60 and len(windows) > 2 and max(windows) < 60


def test_the_callbacks_pending_scalars_are_bounded(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import hooktrace.integrations as integrations
    from hooktrace.integrations import TraceSession

    # GIVEN a trainer that never logs, and room for 5 windows' scalars
    monkeypatch.setattr(integrations, "MAX_PENDING", 5)
    session = TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=False,
                           aggregate=str(tmp_path / "agg"), aggregate_interval=0,
                           detail="every=0")
    session.log_scalars(3, None)
    model = net()
    session.start(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        session.step()
    # THEN the newest 5 are held and the others counted
    assert len(session.pending) == 5 and session.dropped_pending == 12 - 5
    session.finish(rank=0, world_size=1)
