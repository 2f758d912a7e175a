"""``hooktrace attach`` on real training jobs (issue #39).

Each job is a small MLP trained for many steps with a short sleep per step, started as
a subprocess; the test waits until it has stepped a few times, attaches with
``--steps 3``, and lets it finish. The job writes its final loss, a checksum of its
parameters and whether ``nn.Module.__call__`` and torch's global hook dicts are the
ones it started with; the same job run unattached must write the same, bit for bit.

Needs gdb and ptrace rights over a child process (CI: root, gdb from .ci/run); the
tests skip and say which is missing otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torchrun_retry

import hooktrace
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD

REPO = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent('''
    import hashlib, os, sys, time
    import torch
    from torch import nn
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om

    steps, pause, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    compiled, ddp = "--compile" in sys.argv, "--ddp" in sys.argv
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        out = f"{out}.rank{dist.get_rank()}"
    HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks", "_global_forward_hooks_always_called",
             "_global_module_registration_hooks", "_global_parameter_registration_hooks",
             "_global_buffer_registration_hooks")

    def hooks():
        return ([dict(getattr(mm, n)) for n in HOOKS if hasattr(mm, n)],
                dict(om._global_optimizer_pre_hooks), dict(om._global_optimizer_post_hooks))

    before = (nn.Module.__call__, hooks())
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    net = torch.compile(model, backend="aot_eager") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    with open(out + ".progress", "w") as progress:
        for step in range(steps):
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            progress.write(f"{step}\\n")
            progress.flush()
            time.sleep(pause)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    restored = (nn.Module.__call__, hooks()) == before
    lines = [f"loss {loss.item()!r}", f"params {digest}", f"restored {restored}"]
    if compiled:
        from torch._dynamo.utils import counters
        lines.append(f"frames {dict(counters['frames'])}")
        lines.append(f"recompiles {dict(counters['recompiles'])}")
    with open(out, "w") as f:
        f.write("\\n".join(lines) + "\\n")
''')

STEPS = 400
PAUSE = 0.02


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [e.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS", "RANK"):
        e.pop(name, None)
    e.update(extra)
    return e


def hooktrace_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hooktrace", *map(str, args)], cwd=cwd,
                          env=env(), capture_output=True, text=True, timeout=300)


def spawn(*cmd: str | Path, cwd: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*map(str, cmd)], cwd=cwd, env=env(**extra), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_steps(progress: Path, n: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if progress.exists() and len(progress.read_text().split()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{progress}: fewer than {n} steps in 240 s")


def finish(proc: subprocess.Popen[str], torch_abort_ok: bool = False) -> str:
    """torch_abort_ok: a torchrun job may still hit torch's own gloo abort at exit, after
    its work (tests/torchrun_retry.py); the caller then checks the work's results."""
    out, err = proc.communicate(timeout=300)
    if torch_abort_ok and torchrun_retry.TORCH_SHUTDOWN_ABORT in err:
        return err
    assert proc.returncode == 0, err
    return err


@pytest.fixture(scope="module")
def can_attach(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skips unless this machine lets a process attach to its child with gdb."""
    from hooktrace.record.attach import check_target
    from hooktrace.errors import AttachError

    if sys.platform != "linux":
        pytest.skip("hooktrace attach reads /proc: Linux only")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        check_target(child.pid)
    except AttachError as e:
        pytest.skip(f"cannot attach here: {e}")
    finally:
        child.kill()
        child.wait()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("attach") / "job.py"
    path.write_text(JOB)
    return path


@pytest.fixture(scope="module")
def plain(job: Path) -> str:
    """The job's final output, run unattached (no pause: it changes nothing)."""
    out = job.parent / "plain.txt"
    subprocess.run([sys.executable, str(job), str(STEPS), "0", str(out)], cwd=job.parent,
                   env=env(), check=True, timeout=300)
    return out.read_text()


def check_trace(path: Path, steps: int) -> None:
    trace = hooktrace.load(path)
    assert len(trace.steps()) >= steps
    spans = trace.spans()
    names = {trace.modules[int(m)][0] for m in spans.module[spans.cat == CAT_FORWARD]}
    backward = {trace.modules[int(m)][0] for m in spans.module[spans.cat == CAT_BACKWARD]}
    layers = {"0", "1", "2", "3", "4"}
    assert layers <= {n.rsplit(".", 1)[-1] for n in names}, names
    assert layers <= {n.rsplit(".", 1)[-1] for n in backward}, backward


@pytest.mark.usefixtures("can_attach")
def test_attach_records_three_steps_and_leaves_the_job_as_it_was(job: Path, plain: str) -> None:
    # GIVEN a training job well into its run
    work = job.parent
    result = work / "attached.txt"
    proc = spawn(sys.executable, job, STEPS, PAUSE, result, cwd=work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 20, proc)
        # WHEN hooktrace attaches for 3 steps
        attached = hooktrace_cli("attach", proc.pid, "-o", work / "attach.htrace", "--steps",
                                 "3", cwd=work)
        # THEN it says where the file is, once the job detached
        assert attached.returncode == 0, attached.stderr
        assert f"hooktrace: wrote {work / 'attach.htrace'}" in attached.stderr
        assert "detached" in attached.stderr
        assert proc.poll() is None  # the job goes on
        job_stderr = finish(proc)
    finally:
        proc.kill()
    # the file has the partial step and 3 whole ones, every module forward and backward
    check_trace(work / "attach.htrace", 4)
    # the job finished as an unattached one did, model and hooks as they were
    assert result.read_text() == plain
    assert "restored True" in plain
    assert "hooktrace" not in job_stderr  # nothing printed into the job's log
    assert not list(work.glob(".hooktrace-attach-*"))


@pytest.mark.usefixtures("can_attach")
def test_attach_with_seconds_and_options(job: Path, plain: str) -> None:
    work = job.parent
    result = work / "seconds.txt"
    proc = spawn(sys.executable, job, STEPS, PAUSE, result, cwd=work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 10, proc)
        attached = hooktrace_cli("attach", proc.pid, "-o", f"{work / 'out'}/", "--seconds", "1",
                                 "--memory", "--shapes", cwd=work)
        assert attached.returncode == 0, attached.stderr
        finish(proc)
    finally:
        proc.kill()
    [path] = (work / "out").glob(f"hooktrace-*_{proc.pid}.htrace")
    trace = hooktrace.load(path)
    assert trace.info.get("memory") and trace.info.get("shape_signatures"), trace.info.keys()
    assert result.read_text() == plain


@pytest.mark.usefixtures("can_attach")
def test_a_job_under_hooktrace_run_says_so(job: Path) -> None:
    work = job.parent
    result = work / "run.txt"
    proc = spawn(sys.executable, "-m", "hooktrace", "run", "-o", work / "run.htrace", job,
                 STEPS, PAUSE, result, cwd=work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 5, proc)
        attached = hooktrace_cli("attach", proc.pid, "-o", work / "no.htrace", cwd=work)
        assert attached.returncode == 1
        assert attached.stderr.count("\n") == 1, attached.stderr
        assert "already under hooktrace" in attached.stderr
        finish(proc)
    finally:
        proc.kill()
    assert not (work / "no.htrace").exists()
    assert len(hooktrace.load(work / "run.htrace").steps()) == STEPS


LOOP = "import time, torch\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.02)\n"


def site_packages() -> str:
    """Where torch is installed: on PYTHONPATH with -S, torch imports and hooktrace
    (installed editable, through a .pth file that -S skips) does not."""
    import torch

    return str(Path(torch.__file__).parents[1])


@pytest.mark.usefixtures("can_attach")
@pytest.mark.parametrize("case", ["no-pid", "not-python", "no-hooktrace", "other-version"])
def test_bad_targets_are_one_line_and_left_untouched(case: str, tmp_path: Path) -> None:
    proc: subprocess.Popen[str] | None = None
    if case == "no-pid":
        pid = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
        expected = f"no process with PID {pid}"
    elif case == "not-python":
        proc = spawn(shutil.which("sleep") or "/bin/sleep", "60", cwd=tmp_path)
        pid, expected = proc.pid, "is not a CPython interpreter"
    elif case == "no-hooktrace":  # -S: torch's folder alone on the path, no .pth files
        proc = subprocess.Popen([sys.executable, "-S", "-c", LOOP], cwd=tmp_path, text=True,
                                env={**env(), "PYTHONPATH": site_packages()},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pid, expected = proc.pid, "cannot import hooktrace"
    else:
        fake = tmp_path / "fake" / "hooktrace"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("")
        (fake / "_version.py").write_text("__version__ = '0.0.0-other'\n")
        proc = subprocess.Popen([sys.executable, "-S", "-c", LOOP], cwd=tmp_path, text=True,
                                env={**env(), "PYTHONPATH": os.pathsep.join(
                                    [str(tmp_path / "fake"), site_packages()])},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pid, expected = proc.pid, "has hooktrace 0.0.0-other"
    try:
        if case in ("no-hooktrace", "other-version"):  # (once torch is imported)
            assert proc is not None and proc.stdout is not None
            assert proc.stdout.readline() == "ready\n", proc.communicate()
        else:
            time.sleep(0.5)
        attached = hooktrace_cli("attach", pid, "-o", tmp_path / "t.htrace", "--timeout", "30",
                                 cwd=tmp_path)
        assert attached.returncode == 1
        assert attached.stderr.startswith("hooktrace: error: ")
        assert attached.stderr.count("\n") == 1, attached.stderr
        assert expected in attached.stderr, attached.stderr
        if proc is not None:
            assert proc.poll() is None  # still running, as it was
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            assert out == "" and "hooktrace" not in err
    finally:
        if proc is not None:
            proc.kill()
    assert not (tmp_path / "t.htrace").exists()
    assert not list(tmp_path.glob(".hooktrace-attach-*"))


@pytest.mark.usefixtures("can_attach")
def test_a_compiled_job_records_its_region_and_does_not_recompile(job: Path) -> None:
    work = job.parent
    plain_out, result = work / "compiled-plain.txt", work / "compiled.txt"
    subprocess.run([sys.executable, str(job), "60", "0", str(plain_out), "--compile"],
                   cwd=work, env=env(), check=True, timeout=300)
    proc = spawn(sys.executable, job, STEPS, PAUSE, result, "--compile", cwd=work)
    try:
        wait_for_steps(Path(f"{result}.progress"), 20, proc)
        attached = hooktrace_cli("attach", proc.pid, "-o", work / "compiled.htrace",
                                 "--steps", "3", cwd=work)
        assert attached.returncode == 0, attached.stderr
        finish(proc)
    finally:
        proc.kill()
    trace = hooktrace.load(work / "compiled.htrace")
    assert len(trace.steps()) >= 4
    spans = trace.spans()
    assert (spans.cat == CAT_FORWARD).sum() >= 4  # the compiled region: one span a step
    # the same graphs and no recompile: what an unattached run compiled (its step
    # count differs; its compile counters do not)
    got = dict(line.split(" ", 1) for line in result.read_text().splitlines())
    want = dict(line.split(" ", 1) for line in plain_out.read_text().splitlines())
    assert got["restored"] == "True"
    assert got["frames"] == want["frames"] and got["recompiles"] == want["recompiles"]


@pytest.mark.usefixtures("can_attach")
def test_ranks_attaches_to_every_worker_of_a_torchrun_job(job: Path) -> None:
    # GIVEN a 2-rank gloo job under torchrun, well into its run
    work = job.parent / "ranks"
    work.mkdir()
    result = work / "ddp.txt"
    proc = spawn(sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", job, STEPS, PAUSE, result, "--ddp", cwd=work,
                 OMP_NUM_THREADS="1")
    try:
        for rank in (0, 1):
            wait_for_steps(Path(f"{result}.rank{rank}.progress"), 10, proc)
        # WHEN hooktrace attaches to the torchrun agent's workers
        attached = hooktrace_cli("attach", "--ranks", proc.pid, "-o", work / "ddp.htrace",
                                 "--steps", "3", cwd=work)
        assert attached.returncode == 0, attached.stderr
        finish(proc, torch_abort_ok=True)
    finally:
        proc.kill()
    # THEN one file per rank, named as torchrun -m hooktrace run names them
    for rank in (0, 1):
        check_trace(work / f"ddp_rank{rank}.htrace", 4)
        assert "restored True" in Path(f"{result}.rank{rank}").read_text()
    summary = hooktrace_cli("summary", work, cwd=work)
    assert summary.returncode == 0, summary.stderr
    merged = hooktrace_cli("merge-ranks", work, "-o", work / "ranks.json", cwd=work)
    assert merged.returncode == 0, merged.stderr
