"""``hooktrace run`` and the HOOKTRACE=1 switch, end to end (issue #10).

Every script is written to a temporary folder (never importable from the test
suite) and run in a subprocess twice, untraced (``python script.py``) and under
``python -m hooktrace run``; what the script prints (its losses, its argv) must
be the same, and the trace file must hold its modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
import torchrun_retry

import hooktrace
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD

REPO = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [e.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS", "RANK"):
        e.pop(name, None)
    e.update(extra)
    return e


def python(*args: str | Path, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return torchrun_retry.run([sys.executable, *map(str, args)], cwd=cwd, env=env(**extra_env),
                              timeout=300)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def write_training(path: Path, steps: int, width: int) -> Path:
    """A small training script: Linear+ReLU, SGD, ``steps`` optimizer steps; prints done."""
    return write(path, f"""
        import torch
        from torch import nn
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear({width}, {width}), nn.ReLU())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range({steps}):
            m(torch.randn(2, {width})).sum().backward()
            opt.step()
            opt.zero_grad()
        print("done")
    """)


def traced_and_untraced(tmp_path: Path, script: Path, *args: str,
                        options: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str],
                                                                hooktrace.TraceData]:
    """Runs the script both ways; asserts the same stdout and exit code."""
    plain = python(script, *args, cwd=tmp_path)
    out = tmp_path / f"{script.stem}.htrace"
    traced = python("-m", "hooktrace", "run", "-o", out, *options, script, *args, cwd=tmp_path)
    assert traced.stdout == plain.stdout, traced.stderr
    assert traced.returncode == plain.returncode, traced.stderr
    assert f"hooktrace: wrote {out}" in traced.stderr
    return traced, hooktrace.load(out)


def calls_per_module(trace: hooktrace.TraceData) -> dict[str, int]:
    spans = trace.spans()
    fwd = spans.cat == CAT_FORWARD
    counts: dict[str, int] = {}
    for m in spans.module[fwd]:
        name = trace.modules[int(m)][0]
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_the_trained_model_keeps_its_names_teacher_and_loss_are_prefixed(tmp_path: Path) -> None:
    # GIVEN a distillation loop with two top-level models and a loss module
    script = write(tmp_path / "distill.py", """
        import torch
        from torch import nn

        class Student(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            def forward(self, x):
                return self.encoder(x)

        class Teacher(Student):
            pass

        torch.manual_seed(0)
        student, teacher = Student(), Teacher()
        loss_fn = nn.MSELoss()
        opt = torch.optim.SGD(student.parameters(), lr=0.1)
        x = torch.randn(32, 8)
        for step in range(3):
            with torch.no_grad():
                target = teacher(x)
            loss = loss_fn(student(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item():.10f}")
            print("grad", float(student.encoder[0].weight.grad.abs().sum()))
    """)
    # WHEN it runs untraced and under hooktrace run
    _, trace = traced_and_untraced(tmp_path, script)
    # THEN the trained model (called with grad, though the teacher runs first) has the
    # names of its named_modules(); the teacher and the loss are prefixed with their class
    calls = calls_per_module(trace)
    for name in ("", "encoder", "encoder.0", "encoder.2",
                 "Teacher", "Teacher.encoder.1", "MSELoss"):
        assert calls.get(name) == 3, (name, calls)
    assert not any(name.startswith("Student") for name in calls)
    assert dict(trace.modules)["Teacher.encoder.0"] == "Linear"
    assert dict(trace.modules)[""] == "Student"
    assert trace.info["main_module"] == "Student"
    assert trace.info["scope"] == "process" and trace.info["span_definition"] == 2
    assert len(trace.steps()) == 3  # from the optimizer's step()
    # backward spans for the student only (the teacher ran under no_grad)
    spans = trace.spans()
    bwd_modules = {trace.modules[int(m)][0] for m in spans.module[spans.cat == CAT_BACKWARD]}
    assert "encoder.0" in bwd_modules
    assert not any(name.startswith("Teacher") for name in bwd_modules)


def test_model_built_inside_a_function_one_top_level_module(tmp_path: Path) -> None:
    script = write(tmp_path / "fn.py", """
        import torch
        from torch import nn

        def build():
            return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def main():
            torch.manual_seed(1)
            model = build()
            model.add_module("extra", nn.Identity())  # a module added after start
            for _ in range(2):
                loss = nn.functional.mse_loss(model(torch.randn(5, 4)), torch.zeros(5, 1))
                loss.backward()
                print(f"{loss.item():.10f}")

        if __name__ == "__main__":
            main()
    """)
    _, trace = traced_and_untraced(tmp_path, script, options=("--no-backward",))
    # one top-level module: the names are named_modules()'s, no class prefix
    assert trace.modules[:4] == [("", "Sequential"), ("0", "Linear"), ("1", "Tanh"),
                                 ("2", "Linear")]
    assert calls_per_module(trace) == {"": 2, "0": 2, "1": 2, "2": 2, "extra": 2}
    assert trace.info["backward"] is False and len(trace.spans().nodes) == 0


def test_raising_script_keeps_exit_code_and_traceback_and_writes_the_trace(tmp_path: Path) -> None:
    script = write(tmp_path / "fails.py", """
        import torch
        from torch import nn
        model = nn.Linear(2, 2)
        model(torch.ones(1, 2))
        print("before")
        raise ValueError("boom from the script")
    """)
    plain = python(script, cwd=tmp_path)
    out = tmp_path / "fails.htrace"
    r = python("-m", "hooktrace", "run", "-o", out, "--chrome", tmp_path / "fails.json", script,
               cwd=tmp_path)
    assert (r.returncode, r.stdout) == (plain.returncode, plain.stdout) == (1, "before\n")
    # the same traceback as python's: the script's frame, nothing of runpy or hooktrace
    assert r.stderr.endswith(plain.stderr), r.stderr
    assert f'File "{script}", line 7, in <module>' in r.stderr
    assert "runpy" not in r.stderr and "hooktrace/commands" not in r.stderr
    assert calls_per_module(hooktrace.load(out)) == {"": 1}
    assert (tmp_path / "fails.json").stat().st_size > 0


def test_argv_main_path_and_exit_code_as_python_gives_them(tmp_path: Path) -> None:
    script = write(tmp_path / "sub dir" / "args.py", """
        import json, os, sys
        import torch
        torch.nn.ReLU()(torch.ones(1))
        print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__,
                          "path0": sys.path[0], "main": sys.modules["__main__"].__dict__ is globals(),
                          "stdin": sys.stdin.read()}))
        sys.exit(int(sys.argv[-1]))
    """)
    args = ("--lr", "0.1", "-o", "x", "-m", "not.ours", "3")
    plain = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env(),
                           input="piped in", capture_output=True, text=True, timeout=120)
    traced = subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", "t.htrace",
                             str(script), *args], cwd=tmp_path, env=env(), input="piped in",
                            capture_output=True, text=True, timeout=120)
    assert plain.returncode == traced.returncode == 3
    assert traced.stdout == plain.stdout, traced.stderr
    assert '"main": true' in plain.stdout and '"stdin": "piped in"' in plain.stdout
    assert (tmp_path / "t.htrace").exists()


def test_dash_m_module(tmp_path: Path) -> None:
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "train.py", """
        import sys
        import torch
        from torch import nn
        torch.manual_seed(2)
        model = nn.Sequential(nn.Linear(3, 3))
        print(sys.argv[1:], __name__, f"{model(torch.ones(1, 3)).sum().item():.8f}")
    """)
    plain = python("-m", "pkg.train", "--epochs", "1", cwd=tmp_path)
    traced = python("-m", "hooktrace", "run", "-o", "m.htrace", "-m", "pkg.train", "--epochs", "1",
                    cwd=tmp_path)
    assert plain.returncode == traced.returncode == 0, traced.stderr
    assert traced.stdout == plain.stdout
    assert calls_per_module(hooktrace.load(tmp_path / "m.htrace")) == {"": 1, "0": 1}
    missing = python("-m", "hooktrace", "run", "-m", "pkg.nothing", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.startswith("hooktrace: error: -m pkg.nothing: no module named")


def test_default_output_name_carries_host_pid_and_rank(tmp_path: Path) -> None:
    script = write(tmp_path / "one.py", "import torch\ntorch.nn.ReLU()(torch.ones(1))\n")
    r = python("-m", "hooktrace", "run", script, cwd=tmp_path, RANK="1")
    assert r.returncode == 0, r.stderr
    (written,) = tmp_path.glob("*.htrace")
    assert written.name.startswith("hooktrace-") and written.name.endswith("_rank1.htrace")
    assert hooktrace.load(written).hostname in written.name


def make_venv_with_switch(tmp_path: Path) -> Path:
    """A venv whose site-packages holds hooktrace-autostart.pth, as an install puts it,
    and a .pth putting this checkout and the current environment's packages on sys.path
    (sorted before it, as the installed package's own entries are)."""
    root = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(root)
    bin_python = root / "bin" / "python"
    site = subprocess.run([bin_python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = [str(REPO), *(p for p in sys.path if p.endswith("site-packages"))]
    Path(site, "00-paths.pth").write_text("\n".join(here) + "\n")
    Path(site, "hooktrace-autostart.pth").write_text((REPO / "hooktrace-autostart.pth").read_text())
    return bin_python


def test_environment_switch_traces_at_startup_and_costs_nothing_when_off(tmp_path: Path) -> None:
    bin_python = make_venv_with_switch(tmp_path)
    script = write(tmp_path / "plain.py", """
        import sys
        import torch
        print("hooktrace imported:", "hooktrace" in sys.modules)
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        model(torch.ones(1, 2)).sum().backward()
    """)
    clean = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    off = subprocess.run([bin_python, script], cwd=tmp_path, env=clean, capture_output=True,
                         text=True, timeout=120)
    assert off.returncode == 0, off.stderr
    assert off.stdout == "hooktrace imported: False\n" and not list(tmp_path.glob("*.htrace"))
    out = tmp_path / "traces"
    on = subprocess.run([bin_python, script], cwd=tmp_path, capture_output=True, text=True,
                        timeout=120, env={**clean, "HOOKTRACE": "1", "HOOKTRACE_OUT": f"{out}/",
                                          "HOOKTRACE_OPTIONS": "--no-backward"})
    assert on.returncode == 0, on.stderr
    assert on.stdout == "hooktrace imported: True\n"
    (written,) = out.glob("hooktrace-*.htrace")
    trace = hooktrace.load(written)
    assert calls_per_module(trace) == {"": 1, "0": 1, "1": 1}
    assert trace.info["backward"] is False
    bad = subprocess.run([bin_python, script], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**clean, "HOOKTRACE": "1",
                                           "HOOKTRACE_OPTIONS": "--frobnicate"})
    assert bad.returncode == 0  # the program still runs, untraced
    assert "hooktrace: error: HOOKTRACE=1: not tracing this process: unknown option" in bad.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo is tested on Linux")
def test_torchrun_ddp_two_ranks_one_file_each(tmp_path: Path) -> None:
    script = write(tmp_path / "ddp.py", """
        import os
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(rank)
        for step in range(2):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            # one write per line: two ranks share the pipe
            os.write(1, f"rank {rank} step {step} loss {loss.item():.10f}\\n".encode())
        del model, opt  # (DDP's reducer first: fewer torch aborts at exit, torchrun_retry.py)
        dist.barrier()
        dist.destroy_process_group()
    """)
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    plain = python(*torchrun, script, cwd=tmp_path, OMP_NUM_THREADS="1")
    if plain.returncode != 0 and "Traceback" not in plain.stderr.split("ChildFailedError")[0]:
        pytest.skip(f"torchrun cannot start workers here: {plain.stderr[-500:]}")
    assert plain.returncode == 0, plain.stderr
    traced = python(*torchrun, "-m", "hooktrace", "run", "-o", "out/ddp.htrace", script,
                    cwd=tmp_path, OMP_NUM_THREADS="1")
    assert traced.returncode == 0, traced.stderr
    assert sorted(traced.stdout.splitlines()) == sorted(plain.stdout.splitlines())
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["ddp_rank0.htrace", "ddp_rank1.htrace"]
    for name in files:
        trace = hooktrace.load(tmp_path / "out" / name)
        calls = calls_per_module(trace)
        # DDP is the top-level module; the wrapped model is its "module"
        assert calls["module.0"] == 2 and calls["module.2"] == 2, calls
        assert dict(trace.modules)[""] == "DistributedDataParallel"
        assert len(trace.steps()) == 2


def test_pftrace_and_ring_options(tmp_path: Path) -> None:
    script = write(tmp_path / "loop.py", """
        import torch
        from torch import nn
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        for _ in range(200):
            m(torch.randn(2, 4))
        print("done")
    """)
    _, trace = traced_and_untraced(tmp_path, script, options=(
        "--ring", "--capacity", "256", "--pftrace", str(tmp_path / "loop.pftrace")))
    # the ring kept the newest events (the run recorded 1200), counting the rest
    assert trace.info["policy"] == "ring" and trace.overwritten_events > 0
    assert (tmp_path / "loop.pftrace").stat().st_size > 0


def test_flight_recorder_options_dump_on_hang_and_exception(tmp_path: Path) -> None:
    script = write(tmp_path / "stuck.py", """
        import sys, time
        import torch
        from torch import nn

        class Stuck(nn.Module):
            def forward(self, x):
                time.sleep(1.5)
                if sys.argv[1] == "raise":
                    raise RuntimeError("stuck for good")
                return x

        model = nn.Sequential(nn.Linear(2, 2), Stuck())
        model(torch.randn(1, 2))
    """)
    dumps = tmp_path / "dumps"
    r = python("-m", "hooktrace", "run", "-o", tmp_path / "s.htrace", "--ring",
               "--dump-on", "hang,exception", "--hang-timeout", "0.5", "--dump-dir", dumps,
               script, "raise", cwd=tmp_path)
    assert r.returncode == 1 and "RuntimeError: stuck for good" in r.stderr
    hang = hooktrace.load(next(dumps.glob("*.hang-*.htrace"))).info["dump"]
    (inside,) = [t for t in hang["threads"] if t["open"]]
    assert inside["open"] == ["Sequential", "1"] and inside["since_ns"] >= 0.5e9
    exc = hooktrace.load(next(dumps.glob("*.exception-*.htrace"))).info["dump"]
    assert exc["error_in"] == "1" and exc["exception"] == "RuntimeError: stuck for good"
    assert "MainThread is inside 1 forward" in r.stderr
    r = python("-m", "hooktrace", "run", "--dump-on", "oom", script, "ok", cwd=tmp_path)
    assert r.returncode == 1 and "--dump-on: dump_on: unknown ['oom']" in r.stderr


def test_schedule_option_writes_each_window(tmp_path: Path) -> None:
    script = write_training(tmp_path / "train.py", steps=6, width=4)
    plain = python(script, cwd=tmp_path)
    traced = python("-m", "hooktrace", "run", "-o", "train.htrace", "--schedule", "1,0,1,2",
                    script, cwd=tmp_path)
    assert traced.returncode == 0 and traced.stdout == plain.stdout, traced.stderr
    assert "warmup" not in traced.stderr  # torch's warning about the user's own choice
    # nothing was recorded after the last window: no empty file under the main name
    # (diff DIR:-1 would take it for the last window)
    assert not (tmp_path / "train.htrace").exists() and "there is no train.htrace" in traced.stderr
    windows = {p.name: hooktrace.load(p) for p in tmp_path.glob("train.*.htrace")}
    # steps 1 and 3 are the active ones: one file each, holding exactly that step
    assert sorted(windows) == ["train.1.htrace", "train.3.htrace"]
    for name, w in windows.items():
        step = int(name.split(".")[1])
        assert w.info["window"] == {"first_step": step, "last_step": step, "complete": True}
        assert calls_per_module(w)[""] == 1 and w.steps().number.tolist() == [step]
    r = python("-m", "hooktrace", "run", "--schedule", "1,x", script, cwd=tmp_path)
    assert r.returncode == 1 and "--schedule must be WAIT,WARMUP,ACTIVE" in r.stderr


LONG_TRAINING = """
    import sys, time
    import torch
    from torch import nn
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10000):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 3:
            print("ready", flush=True)
        time.sleep(0.01)
    print("finished")
"""


def _terminated(cmd: list[str | Path], cwd: Path, env_: dict[str, str]
                ) -> tuple[int, str, str]:
    """Starts cmd, sends SIGTERM once it printed "ready"; (exit status, stdout, stderr)."""
    import signal

    p = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env_, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline() == "ready\n"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    return p.returncode, out, err


def test_sigterm_writes_the_trace_then_dies_of_the_signal(tmp_path: Path) -> None:
    import signal

    # GIVEN a long training script under hooktrace run, WHEN a scheduler sends SIGTERM
    script = write(tmp_path / "long.py", LONG_TRAINING)
    out = tmp_path / "out" / "long.htrace"
    code, stdout, stderr = _terminated(
        [sys.executable, "-m", "hooktrace", "run", "-o", out, script], tmp_path, env())
    # THEN the process dies of SIGTERM as it would have, and what was recorded is written
    assert code == -signal.SIGTERM, stderr
    assert "finished" not in stdout
    assert f"hooktrace: wrote {out}" in stderr
    trace = hooktrace.load(out)
    assert calls_per_module(trace)[""] >= 4 and len(trace.steps()) >= 4


def test_sigterm_under_the_environment_switch(tmp_path: Path) -> None:
    import signal

    bin_python = make_venv_with_switch(tmp_path)
    script = write(tmp_path / "long.py", LONG_TRAINING)
    clean = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    out = tmp_path / "traces"
    code, _, stderr = _terminated([bin_python, script], tmp_path,
                                  {**clean, "HOOKTRACE": "1", "HOOKTRACE_OUT": f"{out}/"})
    assert code == -signal.SIGTERM, stderr
    (written,) = out.glob("hooktrace-*.htrace")
    assert calls_per_module(hooktrace.load(written))["0"] >= 4


def test_a_program_with_its_own_sigterm_handler_keeps_it(tmp_path: Path) -> None:
    # The program's handler wins: it exits normally, and the trace is written at exit.
    script = write(tmp_path / "own.py", textwrap.dedent("""
        import signal, sys
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
    """) + textwrap.dedent(LONG_TRAINING))
    out = tmp_path / "own.htrace"
    code, _, stderr = _terminated(
        [sys.executable, "-m", "hooktrace", "run", "-o", out, script], tmp_path, env())
    assert code == 3, stderr
    assert "SIGTERM" not in stderr and calls_per_module(hooktrace.load(out))[""] >= 4


def test_the_exit_line_points_at_something_perfetto_opens_and_says_what_was_lost(
        tmp_path: Path) -> None:
    # (one forward records 204 events, far more than the 64 held while the stream's
    # writer drains them: events are dropped)
    script = write(tmp_path / "loop.py", """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                                *[torch.nn.Identity() for _ in range(99)])
        for _ in range(50):
            m(torch.randn(2, 4))
    """)
    r = python("-m", "hooktrace", "run", "-o", "a.htrace", "--capacity", "64", script,
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("hooktrace: wrote")]
    assert "perfetto.dev" not in line  # Perfetto cannot open a .htrace
    assert "hooktrace export a.htrace -o a.pftrace" in line
    dropped = hooktrace.load(tmp_path / "a.htrace").dropped_events
    assert dropped > 0 and f"{dropped} events dropped" in line
    r = python("-m", "hooktrace", "run", "-o", "b.htrace", "--chrome", "b.json", script,
               cwd=tmp_path)
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("hooktrace: wrote")]
    assert "open b.json at https://ui.perfetto.dev" in line and "dropped" not in line


def test_the_flight_recorder_recipe_exits_0_with_its_trace(tmp_path: Path) -> None:
    # The README's recipe on a script that ends well: exit 0, the trace written, no dump.
    script = write(tmp_path / "ok.py", """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        m(torch.randn(2, 4)).sum().backward()
        print("ok")
    """)
    r = python("-m", "hooktrace", "run", "--ring", "--dump-on", "hang,signal,exception",
               "--dump-dir", "dumps", "-o", "ok.htrace", script, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    assert "Error" not in r.stderr and not (tmp_path / "dumps").exists()
    assert calls_per_module(hooktrace.load(tmp_path / "ok.htrace")) == {"": 1, "0": 1, "1": 1}


def test_no_module_called_writes_nothing(tmp_path: Path) -> None:
    script = write(tmp_path / "plain.py", """
        print("no model here")
    """)
    r = python("-m", "hooktrace", "run", "-o", "x.htrace", script, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "no model here\n", r.stderr
    assert "no nn.Module was called; nothing written" in r.stderr
    assert not (tmp_path / "x.htrace").exists()


def test_flops_option(tmp_path: Path) -> None:
    script = write(tmp_path / "lin.py", """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        m(torch.randn(2, 4))
    """)
    r = python("-m", "hooktrace", "run", "--flops", "-o", "f.htrace", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["module"]: row for row in hooktrace.load(tmp_path / "f.htrace").summary().rows}
    assert rows["0"]["flops"] == 2 * 2 * 4 * 8  # one addmm: 2 x batch x in x out


def test_rank_outputs_without_an_extension_are_found_by_the_same_name(tmp_path: Path) -> None:
    # GIVEN two ranks that ran `hooktrace run -o out` (as torchrun sets RANK)
    script = write(tmp_path / "lin.py", """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        m(torch.randn(2, 4)).sum().backward()
    """)
    for rank in ("0", "1"):
        r = python("-m", "hooktrace", "run", "-o", "out", script, cwd=tmp_path, RANK=rank)
        assert r.returncode == 0, r.stderr
    # THEN each wrote a .htrace file, and the name given to -o finds both
    assert sorted(p.name for p in tmp_path.glob("out*")) == ["out_rank0.htrace",
                                                              "out_rank1.htrace"]
    r = python("-m", "hooktrace", "summary", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "2 ranks" in r.stdout or "rank 1" in r.stdout, r.stdout
    r = python("-m", "hooktrace", "merge-ranks", "out", "-o", "all.json", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "all.json").stat().st_size > 0, r.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo is tested on Linux")
def test_torchrun_teardown_after_another_rank_failed_keeps_every_trace(tmp_path: Path) -> None:
    # GIVEN a DDP job where rank 1 raises after 3 steps while rank 0 goes on
    script = write(tmp_path / "fail.py", """
        import time, torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        if rank == 1:
            raise RuntimeError("rank 1 fails")
        time.sleep(120)  # until torchrun stops this rank (SIGTERM)
    """)
    r = python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "hooktrace", "run", "-o", "out/f.htrace", script, cwd=tmp_path,
               OMP_NUM_THREADS="1")
    if "RuntimeError: rank 1 fails" not in r.stderr:
        pytest.skip(f"torchrun cannot start workers here: {r.stderr[-500:]}")
    # THEN the job fails, the failed rank wrote its trace at exit, and the rank torchrun
    # stopped with SIGTERM wrote its own before dying of the signal
    assert r.returncode != 0
    assert "hooktrace: SIGTERM: writing the trace before exiting" in r.stderr
    for rank in (0, 1):
        trace = hooktrace.load(tmp_path / "out" / f"f_rank{rank}.htrace")
        assert len(trace.steps()) == 3 and calls_per_module(trace)["module.0"] == 3


def test_profile_option_writes_the_merged_trace_and_the_profilers_own(tmp_path: Path) -> None:
    import json

    script = write_training(tmp_path / "train.py", steps=3, width=8)
    plain = python(script, cwd=tmp_path)
    r = python("-m", "hooktrace", "run", "--profile", "-o", "out/", script, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    (htrace,) = (tmp_path / "out").glob("*.htrace")
    merged = htrace.with_name(htrace.stem + ".merged.json")
    raw = htrace.with_name(htrace.stem + ".profiler.json")
    doc = json.loads(merged.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    cats = {e.get("cat") for e in events}
    assert {"hooktrace.forward", "hooktrace.backward", "cpu_op"} <= cats
    linear = [e for e in events if e.get("cat") == "hooktrace.forward" and e["name"] == "0"]
    assert len(linear) == 3
    # the per-module op table from the run's own output
    s = python("-m", "hooktrace", "summary", htrace, "--profiler", raw, cwd=tmp_path)
    assert s.returncode == 0 and "aten::linear" in s.stdout, s.stderr


def test_profile_option_with_a_schedule_records_and_merges_each_window(tmp_path: Path) -> None:
    import json

    # GIVEN 6 training steps, a schedule recording steps 1 and 3 (wait 1, active 1, twice)
    script = write_training(tmp_path / "train.py", steps=6, width=8)
    plain = python(script, cwd=tmp_path)
    r = python("-m", "hooktrace", "run", "--profile", "--schedule", "1,0,1,2",
               "-o", "out/train.htrace", script, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == plain.stdout, r.stderr
    assert "Profiler clears events" not in r.stderr  # one window per cycle is what we ask
    # THEN each window has its .htrace, its merged trace and the profiler's own, side by side
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        f"train.{step}.{kind}" for step in (1, 3)
        for kind in ("htrace", "merged.json", "profiler.json")]
    for step in (1, 3):
        assert f"wrote window out/train.{step}.merged.json" in r.stderr
        doc = json.loads((out / f"train.{step}.merged.json").read_text())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        cats = {e.get("cat") for e in events}
        assert {"hooktrace.forward", "hooktrace.backward", "cpu_op"} <= cats
        # the window's one step: one call of each module, on the profiler's timeline
        linear = [e for e in events if e.get("cat") == "hooktrace.forward" and e["name"] == "0"]
        assert len(linear) == 1 and doc["hooktrace"]["outside_window"] == 0
        assert len([e for e in events if e.get("name") == "aten::linear"]) == 1
        # the per-module op table of the window, from the run's own output
        s = python("-m", "hooktrace", "summary", out / f"train.{step}.htrace", "--profiler",
                   out / f"train.{step}.profiler.json", cwd=tmp_path)
        assert s.returncode == 0 and "aten::linear" in s.stdout, s.stderr


# -- streamed to disk: a killed run leaves a loadable file (issue #17) ---------------

KILLED = """
    import os, signal, time
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for _ in range(200):
        model(x).sum().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.3)  # the stream's writer runs every 10 ms: these steps are on disk
    # a second model, made and first called once the stream has events
    head = nn.Sequential(nn.Linear(8, 2), nn.Tanh())
    for _ in range(100):
        head(model(x)).sum().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.3)
    print("trained", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no handler runs
"""


def stream_modules_blocks(path: Path) -> list[tuple[int, bool]]:
    """(first, whether EVENTS came before it) of each MODULES block of a stream file."""
    import struct

    from hooktrace.format import BLOCK_EVENTS, BLOCK_MODULES

    data = path.read_bytes()
    pos, events_seen, found = 16, False, []
    while pos + 24 <= len(data):
        btype, _, length = struct.unpack_from("<IIQ", data, pos)
        if btype == BLOCK_MODULES:
            found.append((struct.unpack_from("<I", data, pos + 24)[0], events_seen))
        events_seen |= btype == BLOCK_EVENTS
        pos += 24 + length
    return found


def test_sigkilled_run_leaves_a_stream_that_loads_up_to_the_cut(tmp_path: Path) -> None:
    import json
    import signal

    # GIVEN a training script under hooktrace run, WHEN it is SIGKILLed mid-run
    script = write(tmp_path / "killed.py", KILLED)
    out = tmp_path / "killed.htrace"
    r = python("-m", "hooktrace", "run", "-o", out, script, cwd=tmp_path)
    assert r.returncode == -signal.SIGKILL and r.stdout == "trained\n", r.stderr
    assert "hooktrace: wrote" not in r.stderr  # nothing ran at exit
    # THEN the streamed file loads up to where it was cut, and the summary says so
    summary = python("-m", "hooktrace", "summary", out, "--json", cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    doc = json.loads(summary.stdout)
    rows = {row["module"]: row for row in doc["rows"]}
    assert rows[""]["calls"] == 300 and rows["0"]["bwd_calls"] == 300
    # the second model, named in a MODULES block written after the first events
    assert rows["Sequential#2"]["calls"] == 100 and rows["Sequential#2.1"]["type"] == "Tanh"
    (cut,) = [note for note in doc["notes"] if "recording cut at byte" in note]
    assert cut.startswith(f"{out}: recording cut at byte ") and "did not finish" in cut
    trace = hooktrace.load(out)
    assert len(trace.steps()) >= 299 and trace.info["scope"] == "process"
    assert "cut" in trace.info and trace.spans().orphan_exits == 0
    blocks = stream_modules_blocks(out)
    assert blocks[0] == (0, False) and (4, True) in blocks, blocks


def test_a_run_streams_in_bounded_memory_and_ends_as_before(tmp_path: Path) -> None:
    # GIVEN a run recording ~100 chunks of events through 2 chunks of memory
    script = write(tmp_path / "long.py", """
        import torch
        m = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(50)])
        x = torch.zeros(1)
        for _ in range(4000):
            m(x)
        print("done")
    """)
    traced, trace = traced_and_untraced(tmp_path, script,
                                        options=("--capacity", "8192", "--no-backward"))
    # THEN memory never held more than 2 chunks: the rest went to the file as recorded,
    # and every event is in it or counted
    info = trace.info
    assert info["capacity"] == 8192 and info["stream"]["chunks"] <= 2
    assert len(trace.events) + trace.dropped_events == 4000 * 51 * 2
    assert len(trace.events) > 10 * 8192
    # the file ends with its FOOTER (not cut), and the exit line counts what it holds
    assert "cut" not in info
    line = next(x for x in traced.stderr.splitlines() if x.startswith("hooktrace: wrote"))
    assert f"(51 modules, {len(trace.events)} events" in line


def test_sigkill_under_the_environment_switch_leaves_a_loadable_stream(tmp_path: Path) -> None:
    import signal

    bin_python = make_venv_with_switch(tmp_path)
    script = write(tmp_path / "killed.py", KILLED)
    clean = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    out = tmp_path / "traces"
    r = subprocess.run([bin_python, script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**clean, "HOOKTRACE": "1", "HOOKTRACE_OUT": f"{out}/"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    (written,) = out.glob("hooktrace-*.htrace")
    trace = hooktrace.load(written)
    assert "cut" in trace.info
    assert calls_per_module(trace)["Sequential#2"] == 100


def test_help_says_a_ring_cannot_stream(tmp_path: Path) -> None:
    r = python("-m", "hooktrace", "run", "--help", cwd=tmp_path)
    assert "a ring cannot stream" in " ".join(r.stdout.split())


def test_forked_children_leave_the_parents_stream_alone(tmp_path: Path) -> None:
    # GIVEN a script whose DataLoader workers (forked) call a module, and which forks a
    # child that calls the model and exits as a script does (running hooktrace's exit)
    script = write(tmp_path / "forks.py", """
        import os, sys, torch
        from torch import nn
        from torch.utils.data import DataLoader, Dataset

        class Normed(Dataset):
            def __init__(self):
                self.norm = nn.LayerNorm(8)  # called in the workers
            def __len__(self):
                return 32
            def __getitem__(self, i):
                with torch.no_grad():
                    return self.norm(torch.full((8,), float(i)))

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for batch in DataLoader(Normed(), batch_size=8, num_workers=2):
                model(batch).sum().backward(); opt.step(); opt.zero_grad()
        pid = os.fork()
        if pid == 0:
            model(torch.zeros(1, 8))
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """)
    r = python("-m", "hooktrace", "run", "-o", "forks.htrace", script, cwd=tmp_path)
    # THEN every process ends (no lock inherited from the writer thread), the child
    # writes nothing, and the parent's stream is whole, with the parent's calls only
    assert r.returncode == 0 and r.stdout == "child 0\n", r.stderr
    assert "a forked child of the traced process: forks.htrace is the parent's stream" in r.stderr
    trace = hooktrace.load(tmp_path / "forks.htrace")
    assert "cut" not in trace.info
    assert calls_per_module(trace) == {"": 8, "0": 8, "1": 8}


def test_a_script_error_before_any_module_call_prints_nothing_written_after_it(
        tmp_path: Path) -> None:
    # GIVEN a script that raises before any module call (issue #38: "nothing written"
    # came before the script's traceback and read as its cause)
    script = write(tmp_path / "fails.py", """
        import torch
        raise ValueError('bad input')
    """)
    r = python("-m", "hooktrace", "run", "-o", tmp_path / "f.htrace", script, cwd=tmp_path)
    # THEN the traceback, then hooktrace's line (a script that wrote a trace keeps its
    # traceback last: test_raising_script_keeps_exit_code_and_traceback_and_writes_the_trace)
    assert r.returncode == 1, r.stderr
    err = r.stderr
    assert err.index("Traceback") < err.index("ValueError: bad input") < err.index(
        "hooktrace: no nn.Module was called; nothing written"), err
