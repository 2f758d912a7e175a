"""``hooktrace top`` (issue #51) in a real terminal: tmux runs it, the test types keys
(``send-keys``) and reads the screen (``capture-pane``).

The job trains a small MLP until a stop file appears, then writes how many steps it
ran, its final loss, a checksum of its parameters and whether ``nn.Module.__call__``
and torch's global hook dicts are the ones it started with; the same job run
unwatched for that many steps must write the same, bit for bit. Everything is decided
on what the screen and the files say, never on how fast the machine is.

Needs tmux (CI: .ci/run installs it) and, for ``top PID``, what ``hooktrace attach``
needs (gdb, ptrace rights: tests/integration/test_attach.py's ``can_attach``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_attach import JOB as DDP_JOB  # (its --ddp job)
from test_attach import (  # noqa: F401 (can_attach: a fixture)
    PAUSE,
    STEPS,
    can_attach,
    env,
    finish,
    spawn,
    wait_for_steps,
)

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it)")

JOB = textwrap.dedent('''
    import hashlib, os, sys, time
    import torch
    from torch import nn
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om

    steps, out = int(sys.argv[1]), sys.argv[2]  # steps 0: until out.stop exists
    torch.manual_seed(0)
    torch.set_num_threads(1)
    HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks", "_global_forward_hooks_always_called")

    def hooks():
        return ([dict(getattr(mm, n)) for n in HOOKS if hasattr(mm, n)],
                dict(om._global_optimizer_pre_hooks), dict(om._global_optimizer_post_hooks))

    before = (nn.Module.__call__, hooks())
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    step = 0
    with open(out + ".progress", "w") as progress:
        while step < steps if steps else not os.path.exists(out + ".stop"):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            progress.write(f"{step}\\n")
            progress.flush()
            time.sleep(0.02 if not steps else 0)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    restored = (nn.Module.__call__, hooks()) == before
    with open(out, "w") as f:
        f.write(f"steps {step}\\nloss {loss.item()!r}\\nparams {digest}\\nrestored {restored}\\n")
''')


class Terminal:
    """A tmux session of its own (its own server socket), ``width`` x ``height``; what
    :meth:`start` runs there leaves its exit status in ``rc``, its stderr in ``err``."""

    def __init__(self, cwd: Path) -> None:
        self.socket, self.cwd = f"hooktrace-test-{uuid.uuid4().hex[:8]}", cwd
        self.rc, self.err = cwd / f"{self.socket}.rc", cwd / f"{self.socket}.err"

    def start(self, *args: str | Path, width: int = 110, height: int = 30) -> None:
        command, cwd = [sys.executable, "-m", "hooktrace", "top", *map(str, args)], self.cwd
        # (the trap: a shell waiting for top outlives a Ctrl-C, to write top's status)
        line = (f"trap : INT; {shlex.join(command)} 2>{shlex.quote(str(self.err))}; "
                f"echo $? > {shlex.quote(str(self.rc))}")
        self.tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                  "-c", str(cwd), "-e", f"PYTHONPATH={env()['PYTHONPATH']}",
                  "-e", f"TMPDIR={cwd}", "sh", "-c", line)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=60, check=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, ok: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.rc.exists():
                raise AssertionError(f"top ended waiting for {what}: {self.err.read_text()}")
            screen = self.screen()
            if ok(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"no {what} in 180 s:\n{self.screen()}")

    def ended(self) -> tuple[int, str]:
        deadline = time.monotonic() + 120
        while not (self.rc.exists() and self.rc.read_text().strip()):
            assert time.monotonic() < deadline, self.screen()
            time.sleep(0.1)
        return int(self.rc.read_text()), self.err.read_text()

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def steps_shown(screen: str) -> int:
    found = re.search(r"steps/s, (\d+) steps", screen.splitlines()[0] if screen else "")
    return int(found.group(1)) if found else -1


def rows(screen: str) -> list[tuple[str, str]]:
    """(module, phase) of each row of the table on ``screen``."""
    lines = screen.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("module "))
    out = []
    for line in lines[head + 1:]:
        if not line.strip() or line.startswith("..."):
            break
        out.append((line.split()[0], line.split()[1]))
    return out


def top(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hooktrace", "top", *map(str, args)],
                          cwd=cwd, env=env(TMPDIR=str(cwd)), capture_output=True, text=True,
                          timeout=300)


def can_attach_here() -> bool:
    from hooktrace.errors import AttachError
    from hooktrace.record.attach import check_target

    try:
        check_target(os.getpid())
    except AttachError:
        return False
    return True


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "job.py").write_text(JOB)
    yield tmp_path


def stop_and_compare(job: subprocess.Popen[str], work: Path, result: Path,
                     watched_to_the_end: bool = False) -> str:
    """Stops the job, checks it against an unwatched run of as many steps, returns its
    stderr. ``watched_to_the_end``: the job compared its hooks while still watched (it
    detaches at its exit)."""
    Path(f"{result}.stop").write_text("")
    _, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    steps = int(result.read_text().split()[1])
    plain = work / "plain.txt"
    subprocess.run([sys.executable, work / "job.py", str(steps), plain], cwd=work, env=env(),
                   check=True, timeout=300)
    assert "restored True" in plain.read_text()
    if watched_to_the_end:
        assert "restored False" in result.read_text()
        plain.write_text(plain.read_text().replace("restored True", "restored False"))
    assert result.read_text() == plain.read_text()
    return err


def check_table(t: Terminal) -> None:
    """The table appears and updates; the s and / keys change it."""
    first = t.wait_for(lambda s: steps_shown(s) > 0 and ("0", "backward") in rows(s), "table")
    t.wait_for(lambda s: steps_shown(s) > steps_shown(first), "a rise in steps")
    assert rows(first)[0] == ("<root>", "forward")  # by time: the root, which holds all
    t.keys("s", "s", "s")  # time -> calls -> change -> name
    by_name = t.wait_for(lambda s: "sort: name" in s, "the name order")
    assert [m for m, _ in rows(by_name)] == sorted(m for m, _ in rows(by_name))
    t.keys("/", "4", "Enter")
    filtered = t.wait_for(lambda s: "filter: 4" in s and ("4", "forward") in rows(s)
                          and len(rows(s)) == 2, "the filtered rows")
    assert set(rows(filtered)) == {("4", "forward"), ("4", "backward")}


@needs_tmux
@pytest.mark.usefixtures("can_attach")
def test_top_pid_in_a_terminal_leaves_the_job_as_it_was(work: Path) -> None:
    # GIVEN a training job well into its run
    result = work / "watched.txt"
    job = spawn(sys.executable, work / "job.py", "0", result, cwd=work)
    t = Terminal(work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 10, job)
        t.start(job.pid)
        # WHEN top watches it, sorted and filtered, then q
        check_table(t)
        t.keys("q")
        rc, err = t.ended()
        # THEN it detached, saying so in one line, and the job went on
        assert rc == 0 and err == f"hooktrace: detached from process {job.pid}, which goes on\n"
        assert job.poll() is None
        # and --once --json reads it once more, as data
        once = top(job.pid, "--once", "--after", "2", "--json", cwd=work)
        assert once.returncode == 0, once.stderr
        data = json.loads(once.stdout)
        assert data["steps"] > 0 and data["step_ms"] > 0
        assert {(r["module"], r["mode"]) for r in data["rows"]} >= {("4", "backward")}
        job_err = stop_and_compare(job, work, result)
    finally:
        t.close()
        job.kill()
    assert "hooktrace" not in job_err  # nothing printed into the job's log
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["job.py", "plain.txt", "plain.txt.progress", "watched.txt", "watched.txt.progress",
         "watched.txt.stop", t.rc.name, t.err.name])  # nothing left of the attaches


@needs_tmux
def test_top_dir_of_an_aggregate_run(work: Path) -> None:
    result = work / "run.txt"
    job = spawn(sys.executable, "-m", "hooktrace", "run", "--aggregate", work / "agg",
                work / "job.py", "0", result, cwd=work)
    t = Terminal(work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 10, job)
        t.start(work / "agg")
        check_table(t)
        if can_attach_here():  # the job records itself: top PID says where to look instead
            refused = top(job.pid, "--once", cwd=work)
            assert refused.returncode == 1 and refused.stderr.count("\n") == 1
            assert "already under hooktrace" in refused.stderr
            assert "with --aggregate DIR, hooktrace top DIR watches it" in refused.stderr
        once = top(work / "agg", "--once", "--after", "1", "--json", cwd=work)
        assert once.returncode == 0, once.stderr
        assert ("0", "forward") in {(r["module"], r["mode"]) for r in json.loads(once.stdout)["rows"]}
        t.keys("q")
        assert t.ended() == (0, "")
        stop_and_compare(job, work, result)
    finally:
        t.close()
        job.kill()
    # the job ended: top DIR says so, after its last table
    ended = top(work / "agg", "--once", "--after", "1", cwd=work)
    assert ended.returncode == 0 and "ended" in ended.stdout.splitlines()[0]
    assert ended.stderr == f"hooktrace: the job writing {work / 'agg'} ended; its run: " \
                           f"hooktrace summary {work / 'agg'}\n"


@needs_tmux
@pytest.mark.usefixtures("can_attach")
@pytest.mark.parametrize("how", ["Ctrl-C", "SIGHUP", "SIGTERM", "job ends", "top stopped"])
def test_top_ends_cleanly(work: Path, how: str) -> None:
    result = work / "watched.txt"
    job = spawn(sys.executable, work / "job.py", "0", result, cwd=work)
    t = Terminal(work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 10, job)
        t.start(job.pid)
        t.wait_for(lambda s: steps_shown(s) > 0, "table")
        shell = int(t.tmux("list-panes", "-t", "t", "-F", "#{pane_pid}"))
        [watcher] = map(int, Path(f"/proc/{shell}/task/{shell}/children").read_text().split())
        if how == "Ctrl-C":
            t.keys("C-c")
        elif how.startswith("SIG"):  # SIGHUP: the terminal closes under top
            os.kill(watcher, getattr(signal, how))
        elif how == "job ends":
            Path(f"{result}.stop").write_text("")
        else:  # stopped (Ctrl-Z) past its lease: the job detaches by itself, says it ended
            os.kill(watcher, signal.SIGSTOP)
            deadline = time.monotonic() + 120
            while not any('"ended": true' in p.read_text()
                          for p in work.glob("hooktrace-top-*/live/*.json")):
                assert time.monotonic() < deadline, "the job did not detach by itself"
                time.sleep(0.2)
            os.kill(watcher, signal.SIGCONT)
        rc, err = t.ended()
        said = {"Ctrl-C": "interrupted (Ctrl-C); detached", "SIGHUP": "the terminal closed "
                "(SIGHUP); detached", "SIGTERM": "terminated (SIGTERM); detached",
                "job ends": f"process {job.pid} ended while watched\n",
                "top stopped": f"error: process {job.pid} stopped recording: top did not "
                               "touch its lease for 10 s or more (stopped, or stalled), so "
                               "the job detached by itself\n"}
        assert err.startswith(f"hooktrace: {said[how]}") and err.count("\n") == 1, err
        assert rc == {"Ctrl-C": 130, "SIGHUP": 129, "SIGTERM": 143, "job ends": 0,
                      "top stopped": 1}[how]
        stop_and_compare(job, work, result, watched_to_the_end=how == "job ends")
    finally:
        t.close()
        job.kill()


@pytest.mark.usefixtures("can_attach")
def test_ranks_one_row_set_with_the_slowest_rank_named(work: Path) -> None:
    # GIVEN a 2-rank gloo job under torchrun (test_attach.py's), well into its run
    (work / "ddp_job.py").write_text(DDP_JOB)
    result = work / "ddp.txt"
    proc = spawn(sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", work / "ddp_job.py", STEPS, PAUSE, result, "--ddp",
                 cwd=work,
                 OMP_NUM_THREADS="1")
    try:
        for rank in (0, 1):
            wait_for_steps(Path(f"{result}.rank{rank}.progress"), 10, proc)
        # WHEN top watches torchrun's workers once
        once = top("--ranks", proc.pid, "--once", "--after", "2", "--json", cwd=work)
        assert once.returncode == 0, once.stderr
        finish(proc, torch_abort_ok=True)
    finally:
        proc.kill()
    # THEN one row set, each row naming the rank it is the slowest of
    data = json.loads(once.stdout)
    assert data["sources"] == ["rank 0", "rank 1"]
    assert {r["source"] for r in data["rows"]} <= {"rank 0", "rank 1"}
    assert len({(r["module"], r["mode"]) for r in data["rows"]}) == len(data["rows"])
    assert once.stderr == f"hooktrace: detached from torchrun {proc.pid} (2 workers), which " \
                          "goes on\n"
    for rank in (0, 1):
        assert "restored True" in Path(f"{result}.rank{rank}").read_text()


@pytest.mark.usefixtures("can_attach")
def test_a_job_that_never_steps(work: Path) -> None:
    job = spawn(sys.executable, "-c", "import time, torch\nwhile True:\n    time.sleep(0.02)\n",
                cwd=work)
    try:
        time.sleep(0.5)
        once = top(job.pid, "--once", "--after", "1", "--timeout", "2", cwd=work)
        assert once.returncode == 1 and once.stdout == ""
        # (the job detaches at its next module call: it makes none)
        assert once.stderr == (f"hooktrace: error: process {job.pid} reached no optimizer step "
                               "in 2 s (blocked, or not stepping an optimizer?); process "
                               f"{job.pid} detaches at its next module call\n")
        assert job.poll() is None
    finally:
        job.kill()


@pytest.mark.parametrize("args, said", [
    (["999999999"], "no process with PID 999999999"),
    (["no/such\x1b[2J"], "no/such\\x1b[2J: no such folder"),
    (["."], ".: not an --aggregate folder"),
    ([".", "--ranks"], "--ranks takes the PID of torchrun"),
    (["--after", "0", "--once", "."], "--after must be positive"),
    (["--json", "."], "--json prints one table: use it with --once"),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    done = top(*args, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"hooktrace: error: {said}") and done.stderr.count("\n") == 1


def test_without_a_terminal_top_says_to_use_once(tmp_path: Path) -> None:
    (tmp_path / "live").mkdir()
    done = top(tmp_path, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("hooktrace: error: hooktrace top draws its table in a terminal; "
                           "without one, use --once (and --json)\n")
