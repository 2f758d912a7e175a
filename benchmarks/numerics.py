"""The cost of numeric health per module call (``trace(model, numerics=True)``), issue #19.

A training step (forward + backward, grads zeroed) of HF GPT-2 built from a small
config, one process, variants interleaved round by round, min of N rounds, against
no tracing measured in the same run:

* ``hooktrace (time only)``: ``trace(model)``, forward and backward spans;
* ``hooktrace numerics=True``: adds abs-max, RMS and the non-finite count of every
  call's output and of the gradient of its inputs, every step;
* ``stat hooks recipe``: Python forward hooks computing abs-max and ``isfinite`` of
  each module's output with ``.item()``, and a grad-norm hook per parameter (the
  ``ForwardCheck`` / ``GradientCheck`` pattern);
* ``detect_anomaly(check_nan=True)``: torch's way to find the op that made a NaN.

The last column is each variant's added time over anomaly mode's (issue #19's target
for numerics=True: at most 1/10, i.e. 0.10).

    python benchmarks/numerics.py            # full run (~2 min on 2 cores)
    python benchmarks/numerics.py --quick    # smoke run
    python benchmarks/numerics.py --device cuda --config 124m --dtype bfloat16 --batch 8 --seq 1024

On CUDA (the deferred path: no host sync per call) each step ends with an SGD step
(lr 0: the step marks at which the deferred statistics are read) and a synchronize;
traced variants then mark steps at the optimizer's step(), as a training run does.
There ``numerics=True`` runs twice: as a user gets it (the fused Triton kernel when
triton works on this GPU) and with it turned off (``HOOKTRACE_NUMERICS_FUSED=0``: the
ATen ops); the last lines say which deferred path each run took.
"""

from __future__ import annotations

import argparse
import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import hooktrace
from overhead import best_times  # benchmarks/overhead.py


STEPS: Any = None  # the traced variants' steps= ("optimizer" on CUDA: see the docstring)


def gpt2(device: str = "cpu", config: str = "small", dtype: str = "float32", batch: int = 2,
         seq: int = 64) -> tuple[nn.Module, Callable[[], Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if config == "124m":  # GPT-2 small as released: 12 layers, 768 wide, 50257 tokens
        cfg = GPT2Config(n_positions=max(seq, 1024))
    else:
        cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
                         n_positions=max(seq, 64), bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=getattr(torch, dtype))
    model.train()
    x = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.0) if device != "cpu" else None

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        model(x, labels=x).loss.backward()
        if opt is not None:
            opt.step()
            torch.cuda.synchronize()
    return model, step


@contextlib.contextmanager
def none(model: nn.Module) -> Iterator[None]:
    yield


@contextlib.contextmanager
def time_only(model: nn.Module) -> Iterator[None]:
    with hooktrace.trace(model, steps=STEPS, capacity=1 << 24):
        yield


PATHS: dict[str, str] = {}  # numerics variant -> the deferred path that ran (info)


def _path_of(tr: Any) -> str:
    info = tr.result.info["numerics"]
    note = info.get("deferred_note")
    return info.get("deferred_path", "?") + (f" ({note})" if note else "")


@contextlib.contextmanager
def numerics(model: nn.Module) -> Iterator[None]:
    with hooktrace.trace(model, steps=STEPS, capacity=1 << 24, numerics=True) as tr:
        yield
    PATHS["hooktrace numerics=True"] = _path_of(tr)


@contextlib.contextmanager
def numerics_aten(model: nn.Module) -> Iterator[None]:
    """numerics=True with the fused Triton kernel turned off (CUDA: the five ATen ops
    per tensor), to compare with the fused path in the same run."""
    import os

    import hooktrace._C as _C

    os.environ["HOOKTRACE_NUMERICS_FUSED"] = "0"
    _C.set_numerics_fused(None)
    try:
        with hooktrace.trace(model, steps=STEPS, capacity=1 << 24, numerics=True) as tr:
            yield
        PATHS["hooktrace numerics=True, ATen ops"] = _path_of(tr)
    finally:
        del os.environ["HOOKTRACE_NUMERICS_FUSED"]


@contextlib.contextmanager
def stat_hooks(model: nn.Module) -> Iterator[None]:
    log: list[Any] = []

    def fwd(m: nn.Module, args: Any, out: Any) -> None:
        t = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            log.append((t.detach().abs().max().item(), bool(torch.isfinite(t).all().item())))

    handles = [m.register_forward_hook(fwd) for m in model.modules()]
    handles += [p.register_hook(lambda g: log.append(g.norm().item())) for p in model.parameters()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def anomaly(model: nn.Module) -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Anomaly Detection has been enabled"
        with torch.autograd.detect_anomaly(check_nan=True):
            yield


VARIANTS: dict[str, Callable[[nn.Module], contextlib.AbstractContextManager[Any]]] = {
    "none": none,
    "hooktrace (time only)": time_only,
    "hooktrace numerics=True": numerics,
    "stat hooks recipe": stat_hooks,
    "detect_anomaly(check_nan=True)": anomaly,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--config", choices=("small", "124m"), default="small",
                    help="small: 2 layers, 128 wide, 1000 tokens (default); 124m: GPT-2 small")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    inner = 2 if args.quick else 5
    global STEPS
    if args.device != "cpu":
        STEPS = "optimizer"
    else:
        torch.set_num_threads(1)
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, device {args.device}"
          + (" (1 intra-op thread)" if args.device == "cpu" else ""))
    model, step = gpt2(args.device, args.config, args.dtype, args.batch, args.seq)
    variants = dict(VARIANTS)
    if args.device != "cpu":  # the deferred path, fused (if triton works here) and not
        names = list(VARIANTS)
        variants = {k: VARIANTS[k] for k in names[:3]}
        variants["hooktrace numerics=True, ATen ops"] = numerics_aten
        variants.update({k: VARIANTS[k] for k in names[3:]})
    best = best_times(variants, model, step, rounds, inner, grad=True)
    base = best["none"]
    anomaly_added = best["detect_anomaly(check_nan=True)"] - base
    print(f"\nGPT-2 ({args.config}, {args.dtype}, {args.batch} x {args.seq} tokens, "
          f"{args.device}) training step, min of {rounds} rounds x {inner}")
    print(f"{'variant':32} {'per step':>10} {'added':>9} {'vs anomaly':>11}")
    for name in variants:
        added = best[name] - base
        print(f"{name:32} {best[name] * 1e3:8.2f}ms {added / base * 100:+8.1f}% "
              f"{added / anomaly_added:10.3f}x")
    # which deferred path ran (info["numerics"]): "triton" (one fused kernel per
    # tensor) or "aten" (five ATen ops per tensor; on CPU no variant defers)
    for name, path in PATHS.items():
        print(f"{name}: deferred path {path}")


if __name__ == "__main__":
    main()
