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
import warnings
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


# The forward bar the feature benchmarks (memory.py, shapes.py) add their option to.
FORWARD_BAR: dict[str, Any] = {"backward": False, "steps": None, "capacity": 1 << 24}


def hooktrace_trace(**kwargs: Any) -> Installer:
    def install(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return hooktrace.trace(model, **kwargs)

    return install


@contextlib.contextmanager
def recipe_with_full_backward_hooks(model: nn.Module) -> Iterator[None]:
    """The recipe for forward and backward: record_function ranges opened and closed
    by forward hooks and by full backward (pre-)hooks."""
    stack: list[Any] = []
    handles = []

    def enter(name: str) -> Callable[..., None]:
        def hook(*args: Any) -> None:
            r = torch.profiler.record_function(name)
            r.__enter__()
            stack.append(r)

        return hook

    def leave(*args: Any) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(enter(name)))
        handles.append(m.register_forward_hook(leave))
        handles.append(m.register_full_backward_pre_hook(enter(name + ".backward")))
        handles.append(m.register_full_backward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


VARIANTS: dict[str, Installer] = {
    "none": no_tracing,
    "empty Python hooks": empty_python_hooks,
    "record_function recipe": record_function_recipe,
    "record_function recipe + profiler": lambda m: with_profiler(record_function_recipe, m),
    "_RecordFunctionFast recipe": record_function_fast_recipe,
    "_RecordFunctionFast + profiler": lambda m: with_profiler(record_function_fast_recipe, m),
    "hooktrace trace(model)": hooktrace_trace(),
    "hooktrace, emit_profiler": hooktrace_trace(emit_profiler=True),
    "hooktrace, emit_profiler + profiler": lambda m: with_profiler(
        hooktrace_trace(emit_profiler=True), m
    ),
}
BASELINE = "record_function recipe"

TRAIN_VARIANTS: dict[str, Installer] = {
    "none": no_tracing,
    "recipe: record_function + full backward hooks": recipe_with_full_backward_hooks,
    "hooktrace, backward=False": hooktrace_trace(backward=False),
    "hooktrace (default, with backward)": hooktrace_trace(),
}
TRAIN_BASELINE = "recipe: record_function + full backward hooks"


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
    return model, lambda: model(x), len(list(model.named_modules()))


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


def best_times(variants: dict[str, Installer], model: nn.Module, run: Callable[[], Any],
               rounds: int, inner: int, grad: bool) -> dict[str, float]:
    """The best seconds per ``run`` of each variant: variants interleaved round by round,
    each warmed up once inside its own installation."""
    best = {v: float("inf") for v in variants}
    with torch.set_grad_enabled(grad):
        for _ in range(rounds):
            for name, install in variants.items():
                with install(model):
                    run()
                    best[name] = min(best[name], measure(run, inner))
    return best


def forward_table(variants: dict[str, Installer], models: dict[str, Callable[[], Any]],
                  rounds: int, inner: int, bar: str = "hooktrace (time only)") -> None:
    """One table per model: every variant's best seconds per forward run (grad off,
    variants interleaved round by round), the ns it adds per module call over ``none``,
    over the ``bar`` variant, and that as a multiple of the bar's own added cost."""
    for title, make in models.items():
        model, run, calls = make()
        best = best_times(variants, model, run, rounds, inner, grad=False)
        base, bar_s = best["none"], best[bar]
        print(f"\n{title}: {calls} module calls per run, min of {rounds} rounds x {inner}")
        print(f"{'variant':28} {'per run':>11} {'added/call':>12} {'over bar/call':>14} "
              f"{'vs bar':>8}")
        for name in variants:
            added = best[name] - base
            ratio = added / (bar_s - base) if bar_s > base else float("nan")
            print(f"{name:28} {best[name] * 1e6:9.1f}us {added / calls * 1e9:10.1f}ns "
                  f"{(best[name] - bar_s) / calls * 1e9:12.1f}ns {ratio:7.2f}x")


def bench(
    title: str,
    variants: dict[str, Installer],
    baseline: str,
    model: nn.Module,
    run: Callable[[], Any],
    calls: int,
    rounds: int,
    inner: int,
    grad: bool,
) -> dict[str, float]:
    """Prints one table; returns the best seconds per run of each variant."""
    best = best_times(variants, model, run, rounds, inner, grad)
    base = best["none"]
    recipe_added = best[baseline] - base
    print(f"\n{title}: {calls} module calls per run, min of {rounds} rounds x {inner}")
    print(f"{'variant':46} {'per run':>11} {'added/call':>12} {'vs recipe':>10}")
    for vname in variants:
        added_ns = (best[vname] - base) / calls * 1e9
        ratio = (best[vname] - base) / recipe_added if recipe_added > 0 else float("nan")
        print(f"{vname:46} {best[vname] * 1e6:9.1f}us {added_ns:10.1f}ns {ratio:9.3f}x")
    return best


def train_step_section(rounds: int, inner: int) -> None:
    """Forward + backward on 200 x (Linear+ReLU); the per-autograd-node cost of backward recording."""
    torch.manual_seed(0)
    model, forward, calls = linear_relu()

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        forward().sum().backward()

    best = bench("200 x (Linear+ReLU) training step (forward + backward)", TRAIN_VARIANTS,
                 TRAIN_BASELINE, model, step, calls, rounds, inner, grad=True)
    with hooktrace.trace(model) as tr:
        step()
    nodes = len(tr.spans().nodes)
    per_node = (best["hooktrace (default, with backward)"]
                - best["hooktrace, backward=False"]) / nodes * 1e9
    added = best["hooktrace (default, with backward)"] - best["none"]
    recipe = best[TRAIN_BASELINE] - best["none"]
    print(f"autograd nodes per step: {nodes}; backward recording adds {per_node:.0f} ns per node")
    print(f"hooktrace's added time per step is 1/{recipe / added:.0f} of the recipe's"
          if added > 0 else "hooktrace's added time per step is below measurement noise")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    # The recipe's full backward hooks warn that no input requires grad; expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    print(f"torch {torch.__version__}, hooktrace {hooktrace.__version__}, 1 intra-op thread")
    for name, make in MODELS.items():
        inner = 5 if args.quick else (30 if "Identity" in name else 50)
        model, run, calls = make()
        bench(name, VARIANTS, BASELINE, model, run, calls, rounds, inner, grad=False)
    train_step_section(rounds, 3 if args.quick else 20)


if __name__ == "__main__":
    main()
