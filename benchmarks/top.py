"""``hooktrace top`` (issue #51): what being watched costs a job per step, against the
same job before and after, in one run.

The job is benchmarks/attach.py's (a small MLP, 5 modules, batch 64, one intra-op thread,
no sleep: the launch-bound worst case, where hooktrace's per-call cost is the largest
share of a step), logging each step's start and wall time until a stop file appears.
After BEFORE steps, ``hooktrace top PID --once --after WATCH_S --json`` watches it (the
real command: attach, a table a second, detach); then AFTER more steps run. Printed: the
median step time before, while watched (from ATTACH_MARGIN_S after top started, the
attach's gdb stop left out, to top's exit) and after, and what ``top`` itself reported.

    .venv/bin/python benchmarks/top.py     # about 30 s
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attach import JOB, env, median_us, read  # noqa: E402 (benchmarks/attach.py)

BEFORE, AFTER = 3000, 3000  # steps
WATCH_S = 10.0
ATTACH_MARGIN_S = 3.0  # attach (gdb stops the job ~0.5 s) and the first window

# benchmarks/attach.py's job, looping until DIR/stop exists (steps 0)
JOB_UNTIL_STOP = JOB.replace("for step in range(steps):",
                             "while not os.path.exists(log + '.stop'):").replace(
                                 "import sys, time", "import os, sys, time")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hooktrace-top-bench-"))
    job, log = work / "job.py", work / "job.log"
    job.write_text(JOB_UNTIL_STOP)
    proc = subprocess.Popen([sys.executable, job, "0", log], env=env())
    while not log.exists() or len(read(log)) < BEFORE:
        time.sleep(0.01)
    t0 = time.time_ns()
    top = subprocess.run([sys.executable, "-m", "hooktrace", "top", str(proc.pid), "--once",
                          "--after", str(WATCH_S), "--json"], env=env(), capture_output=True,
                         text=True, check=True)
    t1 = time.time_ns()
    watched_until = len(read(log))
    while len(read(log)) < watched_until + AFTER:
        time.sleep(0.01)
    Path(f"{log}.stop").write_text("")
    proc.wait()
    rows = read(log)
    before = [r for r in rows if r[0] + r[1] < t0][-BEFORE // 2:]
    during = [r for r in rows if r[0] > t0 + ATTACH_MARGIN_S * 1e9 and r[0] + r[1] < t1]
    after = [r for r in rows if r[0] > t1][AFTER // 10:]
    seen = json.loads(top.stdout)
    print(f"torch job: 5 modules, watched by hooktrace top --once --after {WATCH_S:g} "
          f"({len(during)} steps), {top.stderr.strip()}")
    print("step time (us)      before  watched   after")
    for name, of in (("median", median_us), ("mean", mean_us)):
        print(f"{name:<18} {of(before):7.1f}  {of(during):7.1f}  {of(after):6.1f}")
    print(f"added per step while watched: median {median_us(during) - median_us(before):+.1f} "
          f"us, mean {mean_us(during) - mean_us(before):+.1f} us "
          f"({100 * (mean_us(during) / mean_us(before) - 1):+.1f} %); after: mean "
          f"{mean_us(after) - mean_us(before):+.1f} us")
    print(f"top's own view: step {seen['step_ms'] * 1e3:.1f} us (the recorder's, step mark "
          f"to step mark), {len(seen['rows'])} rows, {seen['steps']} steps recorded")


def mean_us(rows: list[tuple[int, int]]) -> float:
    """Wall time per step over the stretch: slow steps (a window reduced) count."""
    return (rows[-1][0] + rows[-1][1] - rows[0][0]) / len(rows) / 1e3


if __name__ == "__main__":
    main()
