"""trace() entry on an HF GPT-2 process (issue #31): the cost of ``with
hooktrace.trace(model):`` before the first module call, against the heap walk it
used to do to find torch.compile() wrappers (``gc.get_objects()`` with ``issubclass``
over every object), measured in the same process.

GPT-2 is built from ``GPT2Config()`` (124 M parameters, no download); transformers
imports Dynamo, so before issue #31 every entry walked the whole heap.

    python benchmarks/startup.py            # 15 rounds
    python benchmarks/startup.py --quick    # 3 rounds
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time


def heap_walk() -> int:
    """What trace() entry did before issue #31 (record/scopes.py _compiled_wrappers)."""
    optimized = sys.modules["torch._dynamo.eval_frame"].OptimizedModule
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), optimized))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 3 if args.quick else 15

    from transformers import GPT2Config, GPT2LMHeadModel

    import hooktrace

    model = GPT2LMHeadModel(GPT2Config())
    objects = len(gc.get_objects())
    modules = len(list(model.modules()))
    first_entry = []
    entry, walk = [], []
    for i in range(rounds):
        tr = hooktrace.trace(model, backward=False)
        t0 = time.perf_counter()
        tr.__enter__()
        t1 = time.perf_counter()
        tr.__exit__(None, None, None)
        (first_entry if i == 0 else entry).append((t1 - t0) * 1e3)
        t0 = time.perf_counter()
        heap_walk()
        walk.append((time.perf_counter() - t0) * 1e3)
    entry = entry or first_entry
    print(f"GPT-2 (GPT2Config()): {modules} modules, {objects:,} objects on the heap, "
          f"{rounds} rounds")
    print(f"{'what':<40}{'median ms':>12}{'min ms':>10}")
    print(f"{'trace() entry, first in the process':<40}{first_entry[0]:>12.2f}"
          f"{first_entry[0]:>10.2f}")
    print(f"{'trace() entry, later':<40}{statistics.median(entry):>12.2f}{min(entry):>10.2f}")
    print(f"{'baseline: the heap walk alone':<40}{statistics.median(walk):>12.2f}"
          f"{min(walk):>10.2f}")


if __name__ == "__main__":
    main()
