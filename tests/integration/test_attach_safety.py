"""``hooktrace attach`` against another local user, signals, and users' scripts (issues #46
and #47; the red team's scripts are ../shared/repro/attack/attach_*.sh).

The attacker is an unprivileged uid with no passwd entry (any uid will do for what it
does: create, rename and link names in a folder it can write), run as a forked child of
this process that drops root with setgid/setuid: it needs no Python of its own and no
user account on the machine. The job and the attach run as this process's user; the
tests that need to change users skip unless it is root (CI is). The jobs are small
torch loops started as subprocesses.

Needs gdb and ptrace rights over a child process (CI: root, gdb from .ci/run).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hooktrace
from test_attach import can_attach, env, finish, hooktrace_cli, spawn, wait_for_steps

pytestmark = pytest.mark.usefixtures("can_attach")
__all__ = ["can_attach"]  # (the fixture, shared with test_attach.py)

# A training loop that reports, each step, whether hooktrace is installed in it (1: its
# nn.Module.__call__ patched or a global hook of torch's), and can be held in a blocking read of its stdin (a call that runs no
# bytecode: a pending call waits for it) at a given step.
JOB = textwrap.dedent('''
    import os, signal, sys, time
    import torch
    from torch import nn
    from torch.nn.modules import module as mm
    {head}
    steps, pause, progress = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    hold_at = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    net = torch.compile(model, backend="aot_eager") if "--compile" in sys.argv else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    call = nn.Module.__call__
    with open(progress, "w") as f:
        for step in range(steps):
            if step == hold_at:
                f.write("held\\n"); f.flush()
                sys.stdin.read(1)
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            traced = int(nn.Module.__call__ is not call or any(
                getattr(mm, n) for n in dir(mm) if n.startswith("_global_") and n.endswith("hooks")))
            f.write(f"{{step}} {{traced}}\\n"); f.flush()
            time.sleep(pause)
    print(f"usr1 {{len(got)}}", flush=True)
''')


def write_job(folder: Path, head: str = "") -> Path:
    path = folder / "job.py"
    path.write_text(JOB.format(head=head))
    return path


def progress_rows(progress: Path) -> list[list[str]]:
    return [line.split() for line in progress.read_text().splitlines()]


def start_job(job: Path, progress: Path, *args: str, steps: int = 3000,
              pause: float = 0.01, stdin: bool = False, cwd: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(job), str(steps), str(pause), str(progress),
                             *args], cwd=cwd, env=env(), text=True,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc


# -- another local user --------------------------------------------------------------


def other_uid() -> int:
    """An unprivileged uid no account on this machine uses (skips unless root)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (setuid in a forked child): "
                    "CI runs as root")
    import pwd

    used = {p.pw_uid for p in pwd.getpwall()}
    return next(u for u in range(61000, 65000) if u not in used)


def as_other_user(uid: int, work: Callable[[], None]) -> int:
    """Runs ``work()`` in a forked child as ``uid`` (no groups); returns its pid. The
    child only makes system calls (os.*): nothing of torch or threads."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            work()
            code = 0
        finally:
            os._exit(code)
    return pid


def wait_child(pid: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not end in {timeout} s")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user can write (a group-shared output folder: not sticky), on a
    path every user can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="hooktrace-shared-test-"))
    os.chmod(base, 0o755)
    folder = base / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    yield folder
    subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_queued_call_left_behind_runs_nothing_another_user_plants(
        tmp_path: Path, shared: Path) -> None:
    # GIVEN a job whose main thread is blocked in a call (no bytecode runs: the queued
    # call waits), and another user watching /tmp and the output folder for attach's
    # folders, ready to re-create each one (with every file seen in it) once it goes
    uid = other_uid()
    marker = shared / "PLANTED-CODE-RAN"
    plant = (f"open({str(marker)!r}, 'w').write('ran')\n").encode()

    def squat() -> None:
        seen: dict[str, list[str]] = {}
        end = time.monotonic() + 40
        while time.monotonic() < end:
            for top in ("/tmp", str(shared)):
                for name in os.listdir(top):
                    if "hooktrace-attach" in name and not name.startswith("hooktrace-attach-gdb"):
                        path = os.path.join(top, name)
                        try:
                            seen[path] = sorted(set(seen.get(path, [])) | set(os.listdir(path)))
                        except OSError:
                            seen.setdefault(path, [])
            for path, names in list(seen.items()):
                if not os.path.lexists(path):
                    try:
                        os.mkdir(path, 0o777)
                        for n in {*names, "token", "pending.py", "status"}:
                            with open(os.path.join(path, n), "wb") as f:
                                f.write(plant)
                    except OSError:
                        pass
                    del seen[path]
            time.sleep(0.005)

    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, "3", stdin=True, cwd=tmp_path)
    squatter = as_other_user(uid, squat)
    try:
        wait_for_steps_text(progress, "held", proc)
        # WHEN attach gives up (--timeout) on the blocked job
        attached = hooktrace_cli("attach", proc.pid, "-o", shared / "run.htrace", "--timeout",
                                 "2", cwd=tmp_path)
        assert attached.returncode == 1, attached.stderr
        assert "no recording started" in attached.stderr, attached.stderr
        time.sleep(1.0)  # (the other user re-creates what it saw)
        # AND the job's main thread returns to Python and trains on
        assert proc.stdin is not None
        proc.stdin.write("x")
        proc.stdin.flush()
        wait_for_steps(progress, 20, proc)
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.kill(squatter, signal.SIGKILL)
        wait_child(squatter)
        for name in os.listdir("/tmp"):  # (what the other user made there, if anything)
            path = os.path.join("/tmp", name)
            if "hooktrace-attach" in name and os.lstat(path).st_uid == uid:
                subprocess.run(["rm", "-rf", path], check=False)
    # THEN the queued call ran nothing: no code of the other user's, no recording
    assert not marker.exists()
    assert progress_rows(progress)[-1][1] == "0"  # no hook of hooktrace's
    assert "hooktrace" not in err and "Traceback" not in err, err


def wait_for_steps_text(progress: Path, text: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if progress.exists() and text in progress.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{progress}: no {text!r} in 240 s")


def test_names_in_a_shared_output_folder_cannot_be_planted(tmp_path: Path,
                                                            shared: Path) -> None:
    # GIVEN a job, files of its user, and another user who plants links in the shared
    # output folder at the names attach once used: the status's temporary file and
    # the default output (hooktrace-<host>_<PID>.htrace, known to anyone seeing the PID)
    uid = other_uid()
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    precious = {name: tmp_path / name for name in ("status-target", "output-target")}
    for path in precious.values():
        path.write_text("the job owner's data\n")
    proc = start_job(job, progress, cwd=tmp_path)
    try:
        wait_for_steps(progress, 5, proc)
        pid, host = proc.pid, socket.gethostname()
        links = {f".hooktrace-attach-{pid}.json.{pid}.tmp": precious["status-target"],
                 f".hooktrace-attach-{pid}.json": precious["status-target"],
                 f"hooktrace-{host}_{pid}.htrace": precious["output-target"]}

        def plant() -> None:
            for name, target in links.items():
                os.symlink(target, shared / name)

        assert wait_child(as_other_user(uid, plant)) == 0
        # WHEN the job's user attaches without -o, in the shared folder
        attached = hooktrace_cli("attach", pid, "--steps", "2", cwd=shared)
        assert attached.returncode == 0, attached.stderr
        finish(proc)
    finally:
        proc.kill()
    # THEN the job's files are untouched, and the trace is a file of its own, there
    for path in precious.values():
        assert path.read_text() == "the job owner's data\n"
    out = shared / f"hooktrace-{host}_{pid}.htrace"
    assert not out.is_symlink() and out.stat().st_uid == os.geteuid()
    assert len(hooktrace.load(out).steps()) >= 3
    # attach's private folder is gone (the other user's links stay: theirs)
    assert not [p for p in shared.glob(".hooktrace-attach-*") if not p.is_symlink()]


def test_a_forged_status_is_neither_believed_nor_printed_raw(tmp_path: Path,
                                                              shared: Path) -> None:
    # GIVEN another user who keeps writing a status file of their own, with escape
    # sequences and a recording that never happened, in the shared output folder
    uid = other_uid()
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, cwd=tmp_path)
    forged = {"state": "done", "steps": 99, "nonce": "guess", "message": "x",
              "lines": ["\x1b]0;TITLE\x07\x1b[31mFAKE: hooktrace: wrote nothing\x1b[0m"]}

    def forge() -> None:
        end = time.monotonic() + 20
        while time.monotonic() < end:
            for name in os.listdir(shared):
                if name.startswith(".hooktrace-attach-") and os.path.isdir(shared / name):
                    try:  # (into attach's folder, if it could)
                        (shared / name / "status").write_text(json.dumps(forged))
                    except OSError:
                        pass
            tmp = shared / ".forged"
            tmp.write_text(json.dumps(forged))
            os.replace(tmp, shared / f".hooktrace-attach-{proc.pid}.json")
            time.sleep(0.005)

    try:
        wait_for_steps(progress, 5, proc)
        forger = as_other_user(uid, forge)
        time.sleep(0.5)
        # WHEN the job's user attaches with -o in that folder
        attached = hooktrace_cli("attach", proc.pid, "-o", shared / "run.htrace", "--steps", "2",
                                 cwd=tmp_path)
        wait_child(forger)
        finish(proc)
    finally:
        proc.kill()
    # THEN attach reports the job's own recording, and no escape reaches the terminal
    assert attached.returncode == 0, attached.stderr
    assert "\x1b" not in attached.stderr and "FAKE" not in attached.stderr
    assert f"hooktrace: wrote {shared / 'run.htrace'}" in attached.stderr
    assert len(hooktrace.load(shared / "run.htrace").steps()) >= 3


# -- signals and stopped jobs ----------------------------------------------------------


def traced(pid: int) -> bool:
    """Whether a tracer (attach's gdb) holds ``pid`` now."""
    try:
        return "TracerPid:\t0\n" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("how", ["one", "stream"])
def test_signals_while_gdb_holds_the_job_reach_it_after(tmp_path: Path, how: str) -> None:
    # GIVEN a job that handles SIGUSR1 (a checkpoint on a scheduler's signal)
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, steps=1500, cwd=tmp_path)
    sent = [0]
    stop = threading.Event()

    def send() -> None:
        # one SIGUSR1 while gdb holds the job, or a stream of them through the attach
        while not stop.is_set() and not traced(proc.pid):
            time.sleep(0.001)
        if how == "one":  # (gdb then loads symbols for ~0.1 s before its first call)
            time.sleep(0.02)
            os.kill(proc.pid, signal.SIGUSR1)
            sent[0] += 1
            return
        while not stop.is_set() and sent[0] < 2000:
            os.kill(proc.pid, signal.SIGUSR1)
            sent[0] += 1
            time.sleep(0.001)

    try:
        wait_for_steps(progress, 5, proc)
        sender = threading.Thread(target=send)
        sender.start()
        # WHEN hooktrace attaches meanwhile
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace", "--steps",
                                 "2", cwd=tmp_path)
        stop.set()
        sender.join()
        out, err = proc.communicate(timeout=300)
    finally:
        stop.set()
        proc.kill()
    # THEN the job lives on to its end, it received the signal, and the attach worked
    assert proc.returncode == 0, err
    got = int(re.search(r"usr1 (\d+)", out).group(1))  # type: ignore[union-attr]
    assert (got == 1) if how == "one" else (1 <= got <= sent[0])
    assert attached.returncode == 0, attached.stderr
    assert len(hooktrace.load(tmp_path / "t.htrace").steps()) >= 3


def test_a_stopped_job_is_refused_in_one_line_and_left_as_it_was(tmp_path: Path) -> None:
    # GIVEN a job suspended with SIGSTOP (Ctrl-Z, a scheduler's suspend)
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, steps=300, cwd=tmp_path)
    try:
        wait_for_steps(progress, 5, proc)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)
        # WHEN hooktrace attaches
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace",
                                 "--timeout", "5", cwd=tmp_path)
        # THEN it is refused in one line, and the job, continued, runs to its end
        assert attached.returncode == 1
        assert attached.stderr.count("\n") == 1, attached.stderr
        assert "is stopped" in attached.stderr and f"kill -CONT {proc.pid}" in attached.stderr
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "usr1 0" in out and "hooktrace" not in err
    assert not (tmp_path / "t.htrace").exists()


def test_ctrl_c_ends_the_recording_at_once_with_one_line(tmp_path: Path) -> None:
    # GIVEN an attach recording a job for many steps
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, steps=100000, cwd=tmp_path)
    try:
        wait_for_steps(progress, 5, proc)
        attach = subprocess.Popen([sys.executable, "-m", "hooktrace", "attach", str(proc.pid),
                                   "-o", str(tmp_path / "t.htrace"), "--steps", "100000"],
                                  cwd=tmp_path, env=env(), text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not any(row[1] != "0" for row in progress_rows(progress)[-3:]):
            assert time.monotonic() < deadline and attach.poll() is None, attach.communicate()
            time.sleep(0.05)
        # WHEN the user presses Ctrl-C
        attach.send_signal(signal.SIGINT)
        _, err = attach.communicate(timeout=60)
        # THEN attach says so in one line, and the job has stopped recording by then:
        # nothing of hooktrace's is left in it, and the trace is written
        recorded = len(progress_rows(progress))
        wait_for_steps(progress, recorded + 5, proc)
        proc.terminate()
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert attach.returncode == 130
    assert err.count("\n") == 1 and "interrupted" in err and "Traceback" not in err, err
    assert "wrote" in err and str(tmp_path / "t.htrace") in err
    assert all(row[1] == "0" for row in progress_rows(progress)[recorded:])
    assert len(hooktrace.load(tmp_path / "t.htrace").steps()) >= 2
    assert not list(tmp_path.glob(".hooktrace-attach-*"))


# -- what users met (issue #47) ------------------------------------------------------------


def test_a_script_with_globals_named_compile_exec_open_is_recorded(tmp_path: Path) -> None:
    # GIVEN a training script with globals named like builtins (nanoGPT's train.py has
    # `compile = False`): the injected code once ran in __main__'s namespace
    job = write_job(tmp_path, head="compile = False\nexec = None\nopen = open\nimport builtins")
    progress = tmp_path / "progress"
    proc = start_job(job, progress, steps=400, cwd=tmp_path)
    try:
        wait_for_steps(progress, 5, proc)
        # WHEN hooktrace attaches for 5 steps
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace", "--steps",
                                 "5", "--timeout", "60", cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    # THEN it records them, and the script's namespace is as it was
    assert attached.returncode == 0, attached.stderr
    assert "5 steps recorded after the partial one" in attached.stderr
    trace = hooktrace.load(tmp_path / "t.htrace")
    assert int(trace.steps().complete.sum()) == 5
    assert proc.returncode == 0 and "hooktrace" not in err, err


def test_timeout_waits_what_it_says(tmp_path: Path) -> None:
    # GIVEN a job blocked in a call
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, "3", stdin=True, cwd=tmp_path)
    try:
        wait_for_steps_text(progress, "held", proc)
        # WHEN attach is given --timeout 3
        began = time.monotonic()
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace", "--timeout",
                                 "3", cwd=tmp_path)
        took = time.monotonic() - began
    finally:
        proc.kill()
    # THEN it gives up after 3 s, not 33 (a bound with room for a loaded machine)
    assert attached.returncode == 1 and "no recording started in 3 s" in attached.stderr
    assert took < 20, took


def test_two_attaches_to_one_job_do_not_share_a_status(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, steps=100000, cwd=tmp_path)
    try:
        wait_for_steps(progress, 5, proc)
        # GIVEN an attach recording 150 steps, its output in the folder of a second one
        first = subprocess.Popen([sys.executable, "-m", "hooktrace", "attach", str(proc.pid),
                                  "-o", str(tmp_path / "a.htrace"), "--steps", "150"],
                                 cwd=tmp_path, env=env(), text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not any(row[1] != "0" for row in progress_rows(progress)[-3:]):
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)
        # WHEN a second attach comes while the first records
        second = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "b.htrace", "--steps",
                               "2", cwd=tmp_path)
        _, first_err = first.communicate(timeout=300)
        proc.terminate()
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    # THEN the second is refused, and the first ends as it would have alone
    assert second.returncode == 1
    assert "already recorded by another hooktrace attach" in second.stderr, second.stderr
    assert first.returncode == 0, first_err
    assert int(hooktrace.load(tmp_path / "a.htrace").steps().complete.sum()) >= 150
    assert not (tmp_path / "b.htrace").exists()
    assert not list(tmp_path.glob(".hooktrace-attach-*"))


def test_a_process_without_torch_is_refused_and_nothing_is_imported(tmp_path: Path) -> None:
    loop = ("import sys, time\n"
            "for _ in range(600):\n    time.sleep(0.01)\n"
            "print('torch' in sys.modules, 'hooktrace' in sys.modules)\n")
    proc = spawn(sys.executable, "-c", loop, cwd=tmp_path)
    try:
        time.sleep(0.5)
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace", "--timeout",
                                 "30", cwd=tmp_path)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert attached.returncode == 1 and attached.stderr.count("\n") == 1, attached.stderr
    assert "has not imported torch" in attached.stderr
    assert out.strip() == "False False", (out, err)


def test_a_job_held_by_another_attachs_gdb_says_so(tmp_path: Path) -> None:
    from hooktrace.record.attach import GDB_MARKER

    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, steps=1000, cwd=tmp_path)
    try:
        wait_for_steps(progress, 5, proc)
        # GIVEN another attach's gdb holding the job (its marker on the command line)
        holder = subprocess.Popen(["gdb", "-nx", "-batch", "-p", str(proc.pid), "-iex",
                                   GDB_MARKER, "-iex", "set auto-solib-add off",
                                   "-ex", "shell sleep 4", "-ex", "detach"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not traced(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace", cwd=tmp_path)
        holder.wait(timeout=60)
        finish(proc)
    finally:
        proc.kill()
    assert attached.returncode == 1 and attached.stderr.count("\n") == 1, attached.stderr
    assert "held by another hooktrace attach" in attached.stderr


def test_a_compiled_model_is_said_so_and_nothing_is_printed_into_the_job(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    progress = tmp_path / "progress"
    proc = start_job(job, progress, "-1", "--compile", steps=400, cwd=tmp_path)
    try:
        wait_for_steps(progress, 10, proc)
        attached = hooktrace_cli("attach", proc.pid, "-o", tmp_path / "t.htrace", "--steps",
                                 "3", cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert attached.returncode == 0, attached.stderr
    assert "compiled (torch.compile) before the attach" in attached.stderr
    assert "Warning" not in err and "hooktrace" not in err, err
    summary = hooktrace_cli("summary", tmp_path / "t.htrace", cwd=tmp_path)
    assert "compiled (torch.compile) before hooktrace attached" in summary.stdout
    assert "3 complete steps" in summary.stdout, summary.stdout
