"""Aggregates that survive signals and say what kill -9 lost (issues #46 and #47).

A signal's handler never runs inside a step's reduction (the recorder holds it until the
step mark is done); the rows since the last part are written on every end that runs
Python (SIGTERM under ``hooktrace run``, Ctrl-C, ``sys.exit`` from a handler, an
interpreter exit with the trace still open); after ``kill -9`` the readers say which steps
are missing, and a folder killed before its first part reads as that, not as ranks.

Every check decides on counts: the steps the job says it finished against the steps the
folder holds, never on how fast anything ran.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.data.aggregates import load_aggregates, run_progress, steps_aggregated
from hooktrace.errors import HooktraceError

REPO = Path(__file__).resolve().parents[2]

# A training loop that writes, after each optimizer step, how many it finished (one
# write of a fixed width at offset 0: what it says is whole whenever the process dies).
#   HIT=term|int|exit|kill0|kill6: the Nth window reduction (reduce_window) sends the job
#     SIGTERM / SIGINT / SIGTERM to a handler calling sys.exit(3) / SIGKILL (kill0: no
#     part before; kill6: the parts hold steps 0-5, as PART_ROWS=1 makes a part per window
#     until step 5)
#   READY: print "ready" after this many steps (the random-signal test's start)
JOB = """
import os, signal, sys, time
import torch
from torch import nn
import hooktrace.analysis.aggregates as agg
import hooktrace.record.aggregate as rec

hit, at = os.environ.get("HIT", ""), int(os.environ.get("AT", "0"))
steps, ready = int(os.environ.get("STEPS", "20")), int(os.environ.get("READY", "0"))
if hit == "exit":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
if hit.startswith("kill"):
    rec.LIVE_SECONDS = 0.0  # DIR/live/<run>.json at every window (step): exact counts
    if hit == "kill6":
        rec.PART_ROWS = 1
reduce_window, calls = agg.reduce_window, [0]


def reducing(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 7 and hit == "kill6":
        rec.PART_ROWS = 10 ** 9  # the parts hold steps 0-5
    if calls[0] == at:
        sig = {"term": signal.SIGTERM, "int": signal.SIGINT, "exit": signal.SIGTERM}.get(
            hit, signal.SIGKILL)
        os.kill(os.getpid(), sig)
        for _ in range(1000):  # a Python handler would have run by now
            pass
    return reduce_window(*args, **kwargs)


agg.reduce_window = reducing
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
fd = os.open(os.environ["COUNT"], os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(steps):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    os.pwrite(fd, b"%12d" % (i + 1), 0)
    if i + 1 == ready:
        print("ready", flush=True)
print("finished", flush=True)
"""


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [e.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS", "RANK"):
        e.pop(name, None)
    e.update(extra)
    return e


def run_cmd(tmp_path: Path, *flags: str) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return [sys.executable, "-m", "hooktrace", "run", "--aggregate", str(tmp_path / "agg"),
            "--aggregate-interval", "0", "--detail", "every=0", *flags, str(script)]


def finished_steps(tmp_path: Path) -> int:
    """The steps the job says it finished (0 if it finished none)."""
    text = (tmp_path / "count").read_bytes().strip() if (tmp_path / "count").exists() else b""
    return int(text or 0)


def aggregated(tmp_path: Path) -> int:
    return steps_aggregated(load_aggregates(tmp_path / "agg"))


@pytest.mark.parametrize("hit, status", [("term", -signal.SIGTERM), ("int", -signal.SIGINT),
                                         ("exit", 3)])
def test_a_signal_inside_the_reduction_loses_no_row(tmp_path: Path, hit: str,
                                                    status: int) -> None:
    # GIVEN hooktrace run --aggregate, WHEN SIGTERM (hooktrace run's handler), Ctrl-C or a
    # SIGTERM whose handler calls sys.exit lands inside the 12th step's reduction (it
    # re-entered the reduction, failed with "need at least one array to concatenate" and
    # wrote no part: issue #46)
    r = subprocess.run(run_cmd(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=env(HIT=hit, AT="12", STEPS="1000",
                                            COUNT=str(tmp_path / "count")))
    # THEN the process ends as the signal says, once the step is done, and every step it
    # finished is in the folder (the 12th too: its mark was done, the job's count not)
    assert r.returncode == status, r.stderr
    assert "failed to end the trace" not in r.stderr and "could not" not in r.stderr, r.stderr
    done = finished_steps(tmp_path)
    assert done == 11
    assert aggregated(tmp_path) == 12
    (progress,) = run_progress(tmp_path / "agg")
    assert progress["ended"] and progress["steps"] == 12


def test_random_sigterms_lose_no_row_a_clean_exit_would_have_written(tmp_path: Path) -> None:
    # GIVEN a job under hooktrace run --aggregate, reducing every step (the reduction is
    # most of a step mark), WHEN SIGTERM comes at a random moment after it started
    # training, N times (20 by hand: HOOKTRACE_TEST_SIGTERMS=20)
    runs = int(os.environ.get("HOOKTRACE_TEST_SIGTERMS", "5"))
    rng = random.Random(46)
    for k in range(runs):
        work = tmp_path / f"run{k}"
        work.mkdir()
        p = subprocess.Popen(run_cmd(work), cwd=work, env=env(
            STEPS="100000", READY="10", COUNT=str(work / "count")),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            assert p.stdout.readline() == "ready\n"
            time.sleep(rng.uniform(0.0, 0.4))  # (where it lands: anywhere in a step)
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=300)
        finally:
            p.kill()
        # THEN it dies of SIGTERM, and the folder holds every step the job finished (and
        # the one whose mark was done when the signal came, if the job had not counted it)
        assert p.returncode == -signal.SIGTERM, err
        done, rows = finished_steps(work), aggregated(work)
        assert done >= 10
        assert done <= rows <= done + 1, (k, done, rows, err)


def killed(tmp_path: Path, hit: str, *flags: str) -> None:
    """The job under hooktrace run --aggregate, killed with SIGKILL in its 12th step's
    reduction (no Python runs: what the folder then holds is what the readers have)."""
    r = subprocess.run(run_cmd(tmp_path, *flags), cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env(HIT=hit, AT="12", STEPS="1000",
                                                       COUNT=str(tmp_path / "count")))
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert finished_steps(tmp_path) == 11


def hooktrace_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hooktrace", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env())


def test_a_folder_killed_before_its_first_part_reads_as_that_not_as_ranks(
        tmp_path: Path) -> None:
    # GIVEN an aggregate run killed (kill -9) before its first part, with steps kept whole
    killed(tmp_path, "kill0", "--detail", "every=5")
    agg = tmp_path / "agg"
    assert not list((agg / "aggregates").glob("*.parquet"))
    assert len(list((agg / "steps").glob("step-*.htrace"))) == 3  # steps 0, 5, 10
    # WHEN every verb that reads a folder reads it (it read as "3 ranks, 3 steps", a
    # straggler table of one process: issue #47)
    for verb in (["summary", agg], ["report", agg, "-o", tmp_path / "r.html"],
                 ["diff", agg, agg], ["query", agg, "SELECT 1"]):
        r = hooktrace_cli(*verb, cwd=tmp_path)
        # THEN one line: no part yet, the run was killed, its steps from 0 on are lost
        # (the 11 it finished counted; the 12th died in its reduction), and where the kept
        # steps are
        assert r.returncode == 1, (verb, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert "ranks" not in r.stdout + line and "straggler" not in r.stdout + line
        assert "an aggregate= folder with no part (part-*.parquet) yet" in line, line
        assert "ended without writing its last part (killed" in line, line
        assert "its steps from step 0 on are lost (at least 11," in line, line
        assert "step-0_" in line and "and 2 more" in line, line


def test_kill_9_after_parts_the_readers_say_which_steps_are_missing(tmp_path: Path) -> None:
    # GIVEN an aggregate run whose parts hold steps 0-5, killed (kill -9) at step 11
    killed(tmp_path, "kill6", "--detail", "every=0")
    agg = tmp_path / "agg"
    assert aggregated(tmp_path) == 6
    # WHEN its folder is read
    r = hooktrace_cli("summary", agg, cwd=tmp_path)
    # THEN the table of the 6 steps, and a line saying steps from 6 on are lost (5 of
    # them counted: steps 6-10; the 12th died in its reduction)
    assert r.returncode == 0, r.stderr
    assert f"{agg}: 6 steps aggregated" in r.stdout
    (note,) = [line for line in r.stdout.splitlines() if line.startswith("note: run ")]
    assert "ended without writing its last part (killed: kill -9" in note, note
    assert "its steps from step 6 on are lost (at least 5," in note, note
    doc = __import__("json").loads(hooktrace_cli("summary", agg, "--json", cwd=tmp_path).stdout)
    assert doc["unwritten"] == [note.removeprefix("note: ")]
    assert hooktrace_cli("report", agg, "-o", tmp_path / "r.html", cwd=tmp_path).returncode == 0
    assert "its steps from step 6 on are lost" in (tmp_path / "r.html").read_text()


def test_a_run_that_ended_says_nothing_missing(tmp_path: Path) -> None:
    r = subprocess.run(run_cmd(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=env(STEPS="7", COUNT=str(tmp_path / "count")))
    assert r.returncode == 0, r.stderr
    assert aggregated(tmp_path) == 7
    (progress,) = run_progress(tmp_path / "agg")
    assert progress["ended"] and progress["steps"] == 7
    assert "note:" not in hooktrace_cli("summary", tmp_path / "agg", cwd=tmp_path).stdout


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


def train(model: nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def test_the_part_interval_is_an_option_and_its_default_is_a_minute(tmp_path: Path) -> None:
    import hooktrace.record.aggregate as aggregate
    from hooktrace.record.launch import add_options, options_from_args

    # GIVEN aggregate_part_interval=0: a part at every window (every step here)
    model = net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0,
                         aggregate_part_interval=0, detail="every=0") as tr:
        train(model, 3)
    assert len(list((tmp_path / "agg" / "aggregates").glob("part-*.parquet"))) == 3
    assert tr.info["aggregate"]["parts"] == 3 and tr.info["aggregate"]["part_interval"] == 0
    # the default: a minute (kill -9 loses 60 s at most; it was 5 minutes, not settable)
    assert aggregate.PART_SECONDS == 60.0
    model = net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg2") as tr:
        train(model, 2)
    assert tr.info["aggregate"]["part_interval"] == 60.0
    # its flag, and the one-line errors
    import argparse

    p = argparse.ArgumentParser()
    add_options(p)
    opts = options_from_args(p.parse_args(["--aggregate", str(tmp_path / "a3"),
                                           "--aggregate-part-interval", "5"]))
    assert opts.record.aggregate_part_interval == 5.0
    with pytest.raises(ValueError, match=r"aggregate_part_interval must be a number of "
                                         r"seconds >= 0, got -1"):
        hooktrace.trace(net(), aggregate=tmp_path / "a4", aggregate_part_interval=-1)


def test_a_trace_never_exited_writes_its_rows_at_interpreter_exit(tmp_path: Path) -> None:
    # GIVEN a trace entered and never exited (a trainer that did not end its callback),
    # WHEN the interpreter exits (sys.exit)
    code = textwrap.dedent(f"""
        import sys, torch, hooktrace
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        tr = hooktrace.trace(model, aggregate={str(tmp_path / 'agg')!r}, aggregate_interval=0)
        tr.__enter__()
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        sys.exit(0)
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env())
    # THEN its rows are written all the same
    assert r.returncode == 0, r.stderr
    assert aggregated(tmp_path) == 4


TAIL = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
with torch.no_grad():
    model(torch.randn(2, 4))  # an evaluation after the last step
"""


def test_run_aggregate_writes_no_stray_trace_and_names_the_folder_once(tmp_path: Path) -> None:
    # GIVEN a script with module calls after its last step, WHEN hooktrace run
    # --aggregate agg/ (it also wrote hooktrace-<host>_<pid>.htrace into the working
    # folder, and printed agg//aggregates: issue #47)
    (tmp_path / "t.py").write_text(TAIL)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--aggregate", "agg/",
                        "t.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=env())
    assert r.returncode == 0, r.stderr
    # THEN no .htrace; the line names agg/aggregates, and counts the tail it left out
    assert not list(tmp_path.glob("*.htrace")), list(tmp_path.iterdir())
    assert "hooktrace: wrote" not in r.stderr and "//" not in r.stderr, r.stderr
    assert "5 steps aggregated in agg/aggregates, 1 kept whole in agg/steps; " \
           "6 events after the last step not aggregated" in r.stderr, r.stderr


CALLBACK_INSIDE = """
import torch, hooktrace
from torch import nn
from hooktrace.integrations import TraceSession
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
session = TraceSession(None, chrome=None, backward=True, capacity=1 << 16, summary=False,
                       aggregate="cb", aggregate_interval=0)
session.log_scalars(3, None)
session.start(model)
for _ in range(4):
    model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
    session.step()
session.finish(rank=0, world_size=1)
print("written", session.written, "logged", len(session.pending))
try:
    with hooktrace.trace(model, aggregate="api"):
        pass
except hooktrace.HooktraceError as e:
    print("refused:", e)
"""


def test_a_callback_inside_run_aggregate_uses_its_folder_and_says_so(tmp_path: Path) -> None:
    # GIVEN a trainer callback with aggregate="cb" in a script run under hooktrace run
    # --aggregate agg (two recorders wrote into two folders, with no word: issue #47)
    (tmp_path / "t.py").write_text(CALLBACK_INSIDE)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--aggregate", "agg",
                        "--aggregate-interval", "0", "t.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stderr
    # THEN the callback records nothing of its own: it says its folder is not used, its
    # rows and logs come from the run's folder
    assert not (tmp_path / "cb").exists()
    assert "hooktrace: the callback's aggregate=cb is not used: hooktrace run --aggregate " \
           "already aggregates this process into agg" in r.stderr, r.stderr
    assert "written ['agg'] logged 4" in r.stdout, r.stdout
    assert aggregated(tmp_path) == 4
    # AND a trace(model, aggregate=...) of its own inside it is refused in one line
    refused = [line for line in r.stdout.splitlines() if line.startswith("refused:")]
    assert refused and "already aggregates every module call of this process into 'agg'" \
        in refused[0] and not (tmp_path / "api").exists()


def test_a_trace_with_aggregate_outside_any_run_is_not_refused(tmp_path: Path) -> None:
    model = net()
    with hooktrace.trace(model, aggregate=tmp_path / "agg", aggregate_interval=0):
        train(model, 2)
    assert aggregated(tmp_path) == 2
    inner = net()
    with pytest.raises(HooktraceError, match="already aggregates every module call"):
        with hooktrace.global_trace(aggregate=str(tmp_path / "g")):  # (what run starts)
            with hooktrace.trace(inner, aggregate=tmp_path / "inner"):
                pass
    assert not (tmp_path / "inner").exists()


def test_an_attached_recording_leaves_the_jobs_own_aggregate_traces_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hooktrace.record.process_state import STATE

    # GIVEN the process-wide recording of hooktrace attach (or top: STATE.attachment),
    # WHEN the job starts a trace of its own with aggregate=
    class Attachment:  # (what the recorder asks of one)
        def run_info(self) -> dict[str, object]:
            return {}

    monkeypatch.setattr(STATE, "attachment", Attachment())
    own = net()
    with hooktrace.global_trace(aggregate=str(tmp_path / "attached")):
        with hooktrace.trace(own, aggregate=tmp_path / "own", aggregate_interval=0):
            train(own, 2)
    # THEN it records as it would without the attach (refusing it would fail the job)
    assert steps_aggregated(load_aggregates(tmp_path / "own")) == 2
