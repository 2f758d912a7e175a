"""Flight recorder: dumps on exception, signal, hang and request, while threads record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace


class Sleepy(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ZeroDivisionError("boom")


def net(inner: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), inner))


def test_dump_on_exception_names_the_module_that_raised(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]
                                                          ) -> None:
    model = net(Raises())
    with pytest.raises(ZeroDivisionError):
        with hooktrace.trace(model, dump_on="exception", dump_dir=tmp_path) as tr:
            model(torch.randn(1, 2))
    (path,) = tmp_path.glob("*.exception-*.htrace")
    block = hooktrace.load(path).info["dump"]
    assert block["reason"] == "exception" and block["error_in"] == "1.1"
    assert block["exception"] == "ZeroDivisionError: boom"
    assert "ZeroDivisionError: boom raised inside 1.1 forward, step 0" in capfd.readouterr().err
    assert "forward" not in model.__dict__ and len(tr.spans()) == 5  # the model is clean


def test_dump_on_signal_chains_the_previous_handler(tmp_path: Path) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        model = net(nn.Identity())
        with hooktrace.trace(model, dump_on=["signal"], dump_dir=tmp_path):
            model(torch.randn(1, 2))
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)  # let the handler run between bytecodes
        (path,) = tmp_path.glob("*.signal-*.htrace")
        assert seen == [signal.SIGUSR1]  # the user's handler still ran
        assert len(hooktrace.load(path).spans()) == 5
        # and is back in place after the block
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert seen == [signal.SIGUSR1] * 2 and len(list(tmp_path.iterdir())) == 1
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_dump_on_hang_says_which_module_and_for_how_long(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]
                                                          ) -> None:
    model = net(Sleepy(1.5))
    with hooktrace.trace(model, dump_on="hang", hang_timeout=0.5, dump_dir=tmp_path):
        model(torch.randn(1, 2))
    (path,) = tmp_path.glob("*.hang-*.htrace")  # once per hang, not once per poll
    block = hooktrace.load(path).info["dump"]
    (main,) = [t for t in block["threads"] if t["open"]]
    assert main["open"] == ["Sequential", "1", "1.1"] and main["since_ns"] >= 0.5e9
    assert any("time.sleep" in line for line in main["python_stack"])
    err = capfd.readouterr().err
    assert "MainThread is inside 1.1 forward, step 0, for" in err
    # the CLI shows it again, with the Python stacks
    r = subprocess.run([sys.executable, "-m", "hooktrace", "stacks", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "MainThread is inside 1.1 forward" in r.stdout
    assert "Python stack of MainThread" in r.stdout
    r = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert "note: dump (hang): MainThread is inside 1.1 forward" in r.stdout


def test_ring_dump_while_four_threads_record(tmp_path: Path) -> None:
    models = [net(nn.Identity()) for _ in range(4)]
    stop = threading.Event()

    def work(m: nn.Module) -> None:
        x = torch.randn(1, 2)
        while not stop.is_set():
            m(x)

    with hooktrace.trace(models[0], policy="ring", capacity=8192) as tr0:
        traces = [hooktrace.trace(m, policy="ring", capacity=8192) for m in models[1:]]
        for t in traces:
            t.__enter__()
        threads = [threading.Thread(target=work, args=(m,)) for m in models]
        for t in threads:
            t.start()
        try:
            time.sleep(0.2)
            paths = [tr0.dump(tmp_path) for _ in range(3)] + hooktrace.dump(tmp_path)
        finally:
            stop.set()
            for t in threads:
                t.join()
            for t in traces:
                t.__exit__(None, None, None)
    # hooktrace.dump() covers every recording trace; no dump overwrote another
    assert len(paths) == 3 + 4 and len(set(paths)) == 7 == len(list(tmp_path.iterdir()))
    for path in paths:
        run = hooktrace.load(path)
        spans = run.spans()
        assert len(spans) > 0 and (spans.duration_ns >= 0).all()
        assert run.info["dump"]["reason"] == "request"
        # a ring keeps the newest events: the dump ends near the time it was taken
        assert run.info["dump"]["time_unix_ns"] - int(spans.end_ns.max()) < 5e9


def test_bad_flight_recorder_arguments_are_refused_before_touching_the_model(
        tmp_path: Path) -> None:
    model = net(nn.Identity())
    (tmp_path / "f").write_text("x")
    for kwargs, err in (({"dump_on": "oom"}, ValueError), ({"dump_on": 3}, TypeError),
                        ({"hang_timeout": 0}, ValueError),
                        ({"dump_signal": signal.SIGKILL}, ValueError),
                        ({"dump_dir": tmp_path / "f"}, ValueError)):
        with pytest.raises(err):
            hooktrace.trace(model, **kwargs)
    assert "forward" not in model.__dict__
    with hooktrace.trace(model):  # still traceable
        model(torch.randn(1, 2))
