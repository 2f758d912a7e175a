"""Running a torchrun job from a test, with one retry for torch's own shutdown abort."""

from __future__ import annotations

import subprocess
from typing import Any

# torch 2.13's gloo sometimes aborts a worker at interpreter exit, after the script's
# work is done ("terminate called without an active exception" from a destructor): seen
# in 1 of 6-8 *untraced* runs of a 2-rank DDP job on this machine, with or without a
# barrier before destroy_process_group. It is not hooktrace's, so such a run is tried
# again, up to RETRIES more times, and the last result stands. One retry was not enough:
# a CI run met the abort twice in a row on the untraced run of one test (p ~ 1/50 per
# test, and the suite runs about ten torchrun jobs); with four tries it is ~1/2400.
TORCH_SHUTDOWN_ABORT = "terminate called without an active exception"
RETRIES = 3


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    for _ in range(RETRIES):
        if r.returncode == 0 or TORCH_SHUTDOWN_ABORT not in r.stderr:
            break
        r = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return r
