"""Per-module-call overhead of hooktrace against the usual alternatives.

One process, variants interleaved round by round, min of N rounds. For each
model it prints the time per forward (or training step), the added ns per module
call against no tracing, and that added cost as a fraction of the
record_function recipe's (profiler off) measured in the same run.

    python benchmarks/overhead.py            # full run (~2 min on 2 cores)
    python benchmarks/overhead.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import hooktrace
from hooktrace.demo import GPTConfig, TinyGPT

Installer = Callable[[nn.Module], contextlib.AbstractContextManager[Any]]


# -- variants: each is a context manager that instruments a model ------------


@contextlib.contextmanager
def no_tracing(model: nn.Module) -> Iterator[None]:
    yield


@contextlib.contextmanager
def _hooks(model: nn.Module, make: Callable[[str], tuple[Callable, Callable]]) -> Iterator[None]:
    handles = []
    for name, m in model.named_modules():
        pre, post = make(name or type(m).__name__)
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def empty_python_hooks(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    def make(name: str) -> tuple[Callable, Callable]:
        def pre(mod: nn.Module, args: Any) -> None:
            return None

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            return None

        return pre, post

    return _hooks(model, make)


def _range_hooks(model: nn.Module, factory: Callable[[str], Any]) -> contextlib.AbstractContextManager[None]:
    """The Lightning / blog recipe: enter a profiler range in a pre-hook, exit it in a post-hook."""
    stack: list[Any] = []

    def make(name: str) -> tuple[Callable, Callable]:
        def pre(mod: nn.Module, args: Any) -> None:
            r = factory(name)
            r.__enter__()
            stack.append(r)

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            stack.pop().__exit__(None, None, None)

        return pre, post

    return _hooks(model, make)


def record_function_recipe(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    return _range_hooks(model, torch.profiler.record_function)


def record_function_fast_recipe(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    return _range_hooks(model, torch._C._profiler._RecordFunctionFast)


@contextlib.contextmanager
def with_profiler(inner: Installer, model: nn.Module) -> Iterator[None]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with inner(model):
            yield


def hooktrace_mode(mode: str) -> Installer:
    def install(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return hooktrace.trace(model, mode=mode)  # type: ignore[arg-type]

    return install


VARIANTS: dict[str, Installer] = {
    "none": no_tracing,
    "empty Python hooks": empty_python_hooks,
    "record_function recipe": record_function_recipe,
    "record_function recipe + profiler": lambda m: with_profiler(record_function_recipe, m),
    "_RecordFunctionFast recipe": record_function_fast_recipe,
    "_RecordFunctionFast + profiler": lambda m: with_profiler(record_function_fast_recipe, m),
    "hooktrace hooks": hooktrace_mode("hooks"),
    "hooktrace wrap (default)": hooktrace_mode("wrap"),
}
BASELINE = "record_function recipe"


# -- models -------------------------------------------------------------------


def identity_chain() -> tuple[nn.Module, Callable[[], Any], int]:
    model = nn.Sequential(*[nn.Identity() for _ in range(1000)])
    x = torch.zeros(1)
    return model, lambda: model(x), 1001


def linear_relu() -> tuple[nn.Module, Callable[[], Any], int]:
    layers: list[nn.Module] = []
    for _ in range(200):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*layers)
    x = torch.randn(4, 16)
    return model, lambda: model(x), 401


def tiny_gpt() -> tuple[nn.Module, Callable[[], Any], int]:
    torch.manual_seed(0)
    cfg = GPTConfig(layers=2, context=16)
    model = TinyGPT(cfg)
    x = torch.randint(0, cfg.vocab, (1, cfg.context))
    n_calls = len(list(model.named_modules())) + cfg.layers * 0
    return model, lambda: model(x), n_calls


MODELS = {
    "1000 x Identity (forward)": identity_chain,
    "200 x (Linear+ReLU) (forward)": linear_relu,
    "TinyGPT 2 layers (forward)": tiny_gpt,
}


def measure(run: Callable[[], Any], inner: int) -> float:
    """Seconds per call of ``run``, over ``inner`` calls."""
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            run()
        return (time.perf_counter_ns() - t0) / inner / 1e9
    finally:
        gc.enable()


def bench_model(
    name: str, make: Callable[[], tuple[nn.Module, Callable[[], Any], int]], rounds: int, inner: int
) -> None:
    model, run, calls = make()
    best = {v: float("inf") for v in VARIANTS}
    with torch.no_grad():
        for _ in range(rounds):
            for vname, install in VARIANTS.items():
                with install(model):
                    run()  # warm-up inside the variant
                    best[vname] = min(best[vname], measure(run, inner))
    base = best["none"]
    recipe_added = best[BASELINE] - base
    print(f"\n{name}: {calls} module calls per forward, min of {rounds} rounds x {inner}")
    print(f"{'variant':38} {'per forward':>12} {'added/call':>12} {'vs recipe':>10}")
    for vname in VARIANTS:
        added_ns = (best[vname] - base) / calls * 1e9
        ratio = (best[vname] - base) / recipe_added if recipe_added > 0 else float("nan")
        extra = "" if vname != "none" else ""
        print(
            f"{vname:38} {best[vname] * 1e6:10.1f}us {added_ns:10.1f}ns {ratio:9.3f}x{extra}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread")
    for name, make in MODELS.items():
        inner = 5 if args.quick else (30 if "Identity" in name else 50)
        bench_model(name, make, rounds, inner)


if __name__ == "__main__":
    main()
