"""The built-in demo: a small GPT-style model trained a few steps on synthetic data.

No downloads: the model is defined here and the task (predict the next token of
a repeating random sequence) is generated. Used by ``hooktrace demo`` and the
benchmarks.

Example::

    from hooktrace.demo import TinyGPT, run_demo
    result = run_demo("out", steps=3)
    print(result.summary_text)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 128
    context: int = 64
    width: int = 64
    heads: int = 4
    layers: int = 4


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer in the shape of GPT-2, small enough for a CPU."""

    def __init__(self, cfg: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def synthetic_batch(cfg: GPTConfig, batch: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences that repeat a random 8-token motif: learnable in a few steps."""
    motif = torch.randint(0, cfg.vocab, (batch, 8), generator=generator)
    seq = motif.repeat(1, cfg.context // 8 + 1)[:, : cfg.context + 1]
    return seq[:, :-1], seq[:, 1:]


def train_step(model: TinyGPT, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> float:
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


@dataclass
class DemoResult:
    htrace: Path
    chrome: Path
    losses: list[float]
    summary_text: str
    report: Path | None = None  # None when plotly is not installed
    report_error: str = ""


def run_demo(out_dir: str | Path, steps: int = 5, batch: int = 8, seed: int = 0,
             flops: bool = False) -> DemoResult:
    """Train TinyGPT for ``steps`` steps under hooktrace; write the trace files to ``out_dir``.
    ``flops`` records FLOPs per module too (``hooktrace.trace(flops=True)``)."""
    from hooktrace.record import trace

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_step(model, opt, *synthetic_batch(cfg, batch, gen))  # warm-up, untraced
    losses: list[float] = []
    with trace(model, flops=flops, memory=True) as tr:
        for _ in range(steps):
            losses.append(train_step(model, opt, *synthetic_batch(cfg, batch, gen)))
    htrace = out / "demo.htrace"
    chrome = out / "demo.json"
    tr.save(htrace)
    tr.export_chrome(chrome)
    from hooktrace.reporters.html import ReportError, write_report

    report: Path | None = out / "report.html"
    error = ""
    try:
        write_report(tr.result, out / "report.html", source=str(htrace), title="hooktrace demo: TinyGPT")
    except ReportError as e:  # the report is optional (plotly); the trace files are not
        report, error = None, str(e)
    return DemoResult(htrace, chrome, losses, tr.summary().to_text(flops=flops), report, error)
