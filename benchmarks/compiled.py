"""Cost of seeing inside torch.compile regions (issue #18): a compiled training step.

A small GPT-style model (pre-norm blocks: attention with SDPA, GELU MLP), one
``compile()`` per block as torchtitan does, a training step (forward, backward,
SGD step) timed in four variants, interleaved round by round in one process:

* ``compiled, untraced``: the baseline;
* ``compiled before the trace, traced``: regions are one span each (no marks);
* ``compiled under the trace, traced``: every kernel marked and recorded, the
  modules inside each block get kernel-derived rows (hooktrace.analysis.kernels);
* ``compiled under a trace, run untraced``: the marks are in the code, dormant.

Each variant has its own copy of the model classes (fresh code objects), so
Dynamo compiles each variant's blocks separately. The traced variants enter
``hooktrace.trace`` around each round's steps; the clock runs inside it.

    python benchmarks/compiled.py            # full run (~3 min on 2 cores)
    python benchmarks/compiled.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import hooktrace

MODEL_SOURCE = '''
import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))
'''

VOCAB, D, HEADS, LAYERS, BATCH, SEQ = 512, 256, 4, 4, 8, 128


def fresh_model() -> nn.Module:
    """The model from its own copy of the classes: code objects no other variant shares."""
    namespace: dict[str, Any] = {}
    exec(compile(MODEL_SOURCE, "<benchmark model>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["GPT"](VOCAB, D, HEADS, LAYERS)
    for b in model.blocks:
        b.compile()
    return model


class Variant:
    def __init__(self, name: str, compile_traced: bool, run_traced: bool) -> None:
        self.name = name
        self.model = fresh_model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.run_traced = run_traced
        self.times: list[float] = []
        g = torch.Generator().manual_seed(1)
        self.batch = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        # warm up (compiles here), under a trace when the variant is compiled under one
        with self.tracing(compile_traced):
            for _ in range(3):
                self.step()

    def tracing(self, on: bool) -> contextlib.AbstractContextManager[Any]:
        return hooktrace.trace(self.model) if on else contextlib.nullcontext()

    def step(self) -> None:
        logits = self.model(self.batch)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), self.batch.flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def round(self, steps: int) -> None:
        with self.tracing(self.run_traced) as tr:
            t0 = time.perf_counter()
            for _ in range(steps):
                self.step()
            self.times.append((time.perf_counter() - t0) / steps)
        if tr is not None:
            self.kernels = len(tr.result.events[tr.result.events["kind"] == 8]) // steps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--quick", action="store_true", help="3 rounds of 3 steps")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 3, 3
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    make: list[Callable[[], Variant]] = [
        lambda: Variant("compiled, untraced", False, False),
        lambda: Variant("compiled before the trace, traced", False, True),
        lambda: Variant("compiled under the trace, traced", True, True),
        lambda: Variant("compiled under a trace, run untraced", True, False),
    ]
    t0 = time.perf_counter()
    variants = [m() for m in make]
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread; "
          f"compiled {len(variants)} variants in {time.perf_counter() - t0:.0f} s")
    for _ in range(args.rounds):
        for v in variants:
            v.round(args.steps)
    base_min = min(variants[0].times)
    base_med = statistics.median(variants[0].times)
    print(f"GPT {LAYERS} blocks (d={D}, seq {SEQ}, batch {BATCH}), one compile() per block, "
          f"training step; {args.rounds} rounds x {args.steps} steps")
    print(f"{'variant':40s} {'min/step':>10s} {'median':>10s} {'min ratio':>10s} "
          f"{'med ratio':>10s}")
    for v in variants:
        lo, med = min(v.times), statistics.median(v.times)
        print(f"{v.name:40s} {lo * 1e3:8.2f}ms {med * 1e3:8.2f}ms {lo / base_min:10.3f} "
              f"{med / base_med:10.3f}")
    marked = variants[2]
    print(f"kernels recorded per step (compiled under the trace): {getattr(marked, 'kernels', 0)}")


if __name__ == "__main__":
    main()
