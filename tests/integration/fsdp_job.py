"""A torchrun job for tests/integration/test_fsdp.py: FSDP2 (fully_shard on 4 blocks and the
root) on gloo, logging each FSDP unshard wait (forward and backward) with time.time_ns().

    python -m torch.distributed.run --nproc-per-node 2 fsdp_job.py {trace|run} OUT_PREFIX

"trace": records with hooktrace.trace(model) and writes OUT_PREFIX_rank<R>.htrace;
"run": records nothing itself (run it under `hooktrace run`). Both write
OUT_PREFIX_rank<R>.waits.json: [fqn, "pre_forward"|"pre_backward", start_ns, end_ns]."""
import json
import os
import sys
import time
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

waits = []
def logged(name):
    original = getattr(FSDPParamGroup, name)
    def f(self, *a, **k):
        t0 = time.time_ns()
        try:
            return original(self, *a, **k)
        finally:
            waits.append((self._module_fqn or "", name, t0, time.time_ns()))
    setattr(FSDPParamGroup, name, f)
logged("pre_forward")
logged("pre_backward")

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))

class Net(nn.Module):
    def __init__(self, d=256, n=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 1)
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = Net()
# An explicit CPU mesh: without one, fully_shard meshes the accelerator torch finds
# (torch._C._get_accelerator(): CUDA on a GPU machine) and moves the parameters there.
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for b in model.blocks:
    fully_shard(b, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
how = sys.argv[1]
os.makedirs(os.path.dirname(sys.argv[2]) or ".", exist_ok=True)
out = sys.argv[2]
def train():
    for step in range(2):
        torch.manual_seed(100 + rank + step)
        loss = model(torch.randn(16, 256)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
if how == "trace":
    import hooktrace
    with hooktrace.trace(model) as tr:
        train()
    tr.result.save(f"{out}_rank{rank}.htrace")
else:
    train()
json.dump(waits, open(f"{out}_rank{rank}.waits.json", "w"))
dist.barrier()
dist.destroy_process_group()
