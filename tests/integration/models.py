"""Small real models for the integration tests (no downloads)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet basic block: in-place ReLU and ``out += identity``."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ConvNet(nn.Module):
    def __init__(self, c: int = 4, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.layers = nn.Sequential(*[BasicBlock(c) for _ in range(blocks)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.stem(x))
        x = self.layers(x)
        return self.fc(torch.flatten(self.pool(x), 1))


@dataclass
class Output:
    hidden: torch.Tensor
    extra: dict[str, torch.Tensor]


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": self.lin(x), "skip": x}


class DataclassOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = DictOut()

    def forward(self, x: torch.Tensor) -> Output:
        d = self.inner(x)
        return Output(hidden=d["y"] * 2, extra=d)


class Shared(nn.Module):
    """One Linear used three times per call, and a loop over a ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.loop = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.out = DataclassOut()

    def forward(self, x: torch.Tensor) -> Output:
        for _ in range(3):
            x = torch.tanh(self.shared(x))
        for layer in self.loop:
            x = layer(x)
        return self.out(x)


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ok = nn.Linear(4, 4)
        self.bad = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bad(self.ok(x))  # shape mismatch: raises inside self.bad


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return BertModel(cfg).eval()


def tiny_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval()
