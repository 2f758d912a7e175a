"""``hooktrace attach`` (issue #39): how long from the attach to the first recorded step,
and what a step costs while attached, against ``hooktrace run`` on the same script.

One small MLP training job (the tests' job: 5 Linear/activation modules, batch 64, one
intra-op thread, no sleep) is run three ways, each for STEPS steps, logging each step's
wall time:

- plain: untraced;
- run: under ``hooktrace run`` from the start;
- attach: untraced, then ``hooktrace attach --steps ATTACH_STEPS`` mid-run (from this
  process, through ``hooktrace.record.attach.attach``: the status gives the attach's times).

Printed: the time from calling attach (gdb included) to the first step mark in the
target, the time until it detached, and the median step time before, during and after
the attach, against the plain and ``run`` medians.

    .venv/bin/python benchmarks/attach.py     # about 1 minute
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hooktrace.record.attach import AttachRequest, attach  # noqa: E402

STEPS = 3000
ATTACH_AT = 800  # steps before attaching
ATTACH_STEPS = 200

JOB = textwrap.dedent('''
    import sys, time
    import torch
    from torch import nn
    torch.manual_seed(0)
    torch.set_num_threads(1)
    steps, log = int(sys.argv[1]), sys.argv[2]
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    with open(log, "w") as f:
        for step in range(steps):
            t0 = time.time_ns()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            f.write(f"{t0} {time.time_ns() - t0}\\n")
            f.flush()
''')


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [e.get("PYTHONPATH")])])
    return e


def read(log: Path) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (line.split() for line in log.read_text().splitlines()
                                          if len(line.split()) == 2)]


def median_us(rows: list[tuple[int, int]]) -> float:
    return statistics.median(d for _, d in rows) / 1e3 if rows else float("nan")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hooktrace-attach-bench-"))
    job = work / "job.py"
    job.write_text(JOB)
    subprocess.run([sys.executable, job, str(STEPS), work / "plain.log"], env=env(), check=True)
    subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", work / "run.htrace", job,
                    str(STEPS), work / "run.log"], env=env(), check=True,
                   stderr=subprocess.DEVNULL)
    log = work / "attach.log"
    proc = subprocess.Popen([sys.executable, job, str(STEPS), log], env=env())
    while not log.exists() or len(read(log)) < ATTACH_AT:
        time.sleep(0.01)
    request = AttachRequest(options={"output": str(work / "attach.htrace")},
                            steps=ATTACH_STEPS, seconds=None, timeout=120)
    t0 = time.time_ns()
    [outcome] = attach([proc.pid], request, work)
    proc.wait()
    st = outcome.status
    assert outcome.state == "done", st
    rows = read(log)
    attached, detached = st["attached_unix_ns"], st["detached_unix_ns"]
    before = [r for r in rows if r[0] + r[1] < attached][100:]
    during = [r for r in rows if r[0] > st["first_step_unix_ns"] and r[0] + r[1] < detached]
    after = [r for r in rows if r[0] > detached][:len(during)]
    plain, run = read(work / "plain.log")[100:], read(work / "run.log")[100:]
    print(f"torch job: 5 modules, {STEPS} steps, attach after {ATTACH_AT}, "
          f"--steps {ATTACH_STEPS}")
    print(f"attach call to agent running      {(attached - t0) / 1e6:8.1f} ms")
    print(f"attach call to first step mark    {(st['first_step_unix_ns'] - t0) / 1e6:8.1f} ms")
    print(f"attach call to detached           {(detached - t0) / 1e6:8.1f} ms")
    print(f"attach call returned after        {(time.time_ns() - t0) / 1e6:8.1f} ms "
          "(process end included)")
    print("median step time (us)   plain     run   before  attached  after")
    print(f"                     {median_us(plain):7.1f} {median_us(run):7.1f} "
          f"{median_us(before):8.1f} {median_us(during):9.1f} {median_us(after):6.1f}")
    print(f"added per step: run {median_us(run) - median_us(plain):+.1f} us, attached "
          f"{median_us(during) - median_us(before):+.1f} us (vs the same process before); "
          f"after detach {median_us(after) - median_us(before):+.1f} us")
    print(json.dumps({"steps_recorded": st["steps"]}))


if __name__ == "__main__":
    main()
