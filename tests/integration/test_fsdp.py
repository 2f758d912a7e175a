"""FSDP2 and the span definition (issue #16): one story under trace() and run.

FSDP2 all-gathers a block's parameters in the block's forward pre-hook and again
in a pre-backward hook. A module's span is its whole call, hooks included, so
each unshard wait must lie inside its own block's forward span and backward span,
whichever entry point recorded it. The job (fsdp_job.py) logs every wait with
time.time_ns(), the clock the trace's times are converted to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hooktrace
import torchrun_retry
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BLOCKS = [f"blocks.{i}" for i in range(4)]
SLACK_NS = 2_000  # the trace's tick-to-ns conversion is good to ~100 ns


def _torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    for name in ("HOOKTRACE", "HOOKTRACE_OUT", "HOOKTRACE_OPTIONS", "RANK"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           *args]
    return torchrun_retry.run(cmd, cwd=tmp_path, env=env, timeout=300)


def _innermost(tr: hooktrace.TraceData, cat: int, t0: int, t1: int) -> str | None:
    """The deepest span of ``cat`` containing [t0, t1]."""
    s = tr.spans()
    best, depth = None, -1
    for i in range(len(s)):
        if (s.cat[i] == cat and s.start_ns[i] - SLACK_NS <= t0 and t1 <= s.end_ns[i] + SLACK_NS
                and int(s.depth[i]) > depth):
            best, depth = tr.modules[int(s.module[i])][0], int(s.depth[i])
    return best


@pytest.mark.parametrize("entry", ["trace", "run"])
def test_each_blocks_unshard_wait_is_inside_its_own_span(tmp_path: Path, entry: str) -> None:
    job = str(HERE / "fsdp_job.py")
    if entry == "trace":
        r = _torchrun(tmp_path, job, "trace", "out/t")
    else:
        r = _torchrun(tmp_path, "-m", "hooktrace", "run", "-o", "out/t.htrace", job, "run", "out/t")
    if r.returncode != 0 and "Traceback" not in r.stderr.split("ChildFailedError")[0]:
        pytest.skip(f"torchrun cannot start workers here: {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        tr = hooktrace.load(tmp_path / "out" / f"t_rank{rank}.htrace")
        waits = json.loads((tmp_path / "out" / f"t_rank{rank}.waits.json").read_text())
        assert tr.info["span_definition"] == 2
        assert tr.info["scope"] == ("model" if entry == "trace" else "process")
        block_waits = [w for w in waits if w[0] in BLOCKS]
        # 2 steps x 4 blocks, forward and backward
        assert sorted((w[0], w[1]) for w in block_waits) == sorted(
            (b, kind) for b in BLOCKS for kind in ("pre_forward", "pre_backward") for _ in range(2))
        for fqn, kind, t0, t1 in block_waits:
            cat = CAT_FORWARD if kind == "pre_forward" else CAT_BACKWARD
            assert _innermost(tr, cat, t0, t1) == fqn, (entry, rank, fqn, kind)
