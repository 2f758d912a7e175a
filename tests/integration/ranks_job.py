"""A torchrun job for tests/integration/test_ranks.py: a small transformer trained on CPU
with gloo (DDP, or FSDP2's fully_shard), traced on every rank.

    python -m torch.distributed.run --nproc-per-node 2 ranks_job.py OUT_DIR [ddp|fsdp2]
        [--slow-rank R --slow-steps 1,3 [--slow-in forward|backward|outside]] [--profile]

Each rank writes OUT_DIR/rank<R>/trace.htrace (and profiler.json with --profile). The
slow rank sleeps 30 ms at the given steps: in the forward of module ``slow`` (the
default), in its backward, or outside every module before the step's forward (as
data loading would).
"""

from __future__ import annotations

import argparse
import re
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import hooktrace
from hooktrace.record.distributed import align_clocks, default_output_name, injected_offset_ns

SLEEP_S = 0.030


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.seconds:
            time.sleep(ctx.seconds)
        return grad, None


class Slow(nn.Module):
    """Sleeps on one rank at some steps, in its forward or its backward: the straggler
    the tables must name."""

    def __init__(self, sleepy: bool, steps: set[int], where: str = "forward") -> None:
        super().__init__()
        self.sleepy, self.steps, self.calls, self.where = sleepy, steps, 0, where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        now = self.sleepy and self.calls in self.steps
        self.calls += 1
        if self.where == "backward":
            return _SleepInBackward.apply(x, SLEEP_S if now else 0.0)
        if now and self.where == "forward":
            time.sleep(SLEEP_S)
        return x


class Net(nn.Module):
    def __init__(self, sleepy: bool, steps: set[int], where: str = "forward") -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.slow = Slow(sleepy, steps, where)
        self.head = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.slow(self.encoder(self.embed(x))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("mode", choices=("ddp", "fsdp2"), default="ddp", nargs="?")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-steps", default="")
    p.add_argument("--slow-in", choices=("forward", "backward", "outside"), default="forward")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow_steps = {int(s) for s in args.slow_steps.split(",") if s}
    sleepy = rank == args.slow_rank
    net = Net(sleepy, slow_steps, args.slow_in)
    if args.mode == "ddp":
        model: nn.Module = nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # an explicit CPU mesh: by default fully_shard meshes the accelerator torch finds
        # (CUDA on a GPU machine) and moves the parameters there
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in net.encoder.layers:
            fully_shard(layer, mesh=mesh)
        model = fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(rank))
    out_dir = os.path.join(args.out, "")
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
        if args.profile else None
    with hooktrace.trace(model) as tr:
        align_clocks()  # every rank: the start measurement
        if prof is not None:
            prof.__enter__()
        for i in range(args.steps):
            if sleepy and args.slow_in == "outside" and i in slow_steps:
                time.sleep(SLEEP_S)  # host work before the forward (data loading)
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        if prof is not None:
            prof.__exit__(None, None, None)
        align_clocks()  # every rank: the end measurement
    path = default_output_name(out_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tr.save(path)
    if prof is not None:
        prof_path = os.path.join(os.path.dirname(path), "profiler.json")
        prof.export_chrome_trace(prof_path)
        shift = injected_offset_ns(rank)
        if shift:
            # A real clock error shifts the profiler's times as much as hooktrace's; the
            # test-only setting shifts only hooktrace's, so shift the profiler's here.
            # (as text: parsing kineto's ts as floats would round them off the exact ns)
            with open(prof_path) as f:
                text = f.read()
            text = re.sub(r'"baseTimeNanoseconds":\s*(\d+)',
                          lambda m: f'"baseTimeNanoseconds": {int(m.group(1)) + shift}', text)
            with open(prof_path, "w") as f:
                f.write(text)
    # (fewer torch aborts at exit with a barrier first: tests/torchrun_retry.py)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
