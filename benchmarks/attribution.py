"""Span pairing and backward attribution time against nesting depth (issue #8).

Three synthetic single-thread streams per depth D, each timed through
``Spans.from_events`` (the C++ ``build_spans``: pairing, call index, backward
attribution):

* ``chain``: D module calls nested in one another; on the way out each call
  creates one autograd node (so call k's sequence-number range holds every
  range below it), then one backward pass runs the D nodes. Every node's
  innermost call is found below the deepest range and every call gets a
  backward span: the shape that made attribution quadratic in D.
* ``orphan exits``: D ENTERs, then D EXITs of a module that is not open
  (a crafted or damaged file): each EXIT used to scan the whole stack.
* ``orphan node ends``: D nested NODE_BEGINs, then D NODE_ENDs with unknown
  sequence numbers, the same for autograd nodes.

    python benchmarks/attribution.py                 # D = 5k, 10k, 20k, 40k
    python benchmarks/attribution.py --depths 20000 --repeat 5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, NODE_BEGIN, NODE_END, Clock
from hooktrace.reading import CAT_BACKWARD, Spans

CLOCK = Clock(0, 1_700_000_000_000_000_000, 1.0)


def _events(kind: np.ndarray, ids: np.ndarray, seq: np.ndarray) -> np.ndarray:
    ev = np.zeros(len(kind), EVENT_DTYPE)
    ev["kind"], ev["id"], ev["seq"] = kind, ids, seq
    ev["t"] = np.arange(len(ev), dtype=np.uint64) * 10
    ev["tid"] = ev["rf_tid"] = 7
    return ev


def chain(depth: int) -> np.ndarray:
    """D nested calls (module k % 100), one node per call, then one backward pass."""
    k = np.arange(depth)
    # forward: ENTER 0..D-1 (no node created yet: seq 0), then EXIT D-1..0; call k
    # creates node seq D-1-k just before its EXIT, so its range is [0, D-k)
    kind = np.concatenate([np.full(depth, ENTER), np.full(depth, EXIT)])
    ids = np.concatenate([k % 100, (k % 100)[::-1]])
    seq = np.concatenate([np.zeros(depth), np.arange(1, depth + 1)])
    # backward, one pass (graph task 1): nodes run newest first, seq D-1..0
    node_seq = np.arange(depth - 1, -1, -1)
    kind = np.concatenate([kind, np.tile([NODE_BEGIN, NODE_END], depth)])
    ids = np.concatenate([ids, np.tile([0, 1], depth)])
    seq = np.concatenate([seq, np.repeat(node_seq, 2)])
    return _events(kind, ids.astype(np.uint32), seq.astype(np.uint64))


def orphan_exits(depth: int) -> np.ndarray:
    kind = np.concatenate([np.full(depth, ENTER), np.full(depth, EXIT)])
    ids = np.concatenate([np.zeros(depth), np.ones(depth)]).astype(np.uint32)
    return _events(kind, ids, np.zeros(2 * depth, np.uint64))


def orphan_node_ends(depth: int) -> np.ndarray:
    kind = np.concatenate([np.full(depth, NODE_BEGIN), np.full(depth, NODE_END)])
    seq = np.concatenate([np.arange(depth), np.arange(depth) + depth]).astype(np.uint64)
    return _events(kind, np.zeros(2 * depth, np.uint32), seq)


def best_of(repeat: int, fn: Callable[[], Spans]) -> tuple[float, Spans]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[5000, 10000, 20000, 40000])
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = parser.parse_args()
    cases = {"chain": chain, "orphan exits": orphan_exits, "orphan node ends": orphan_node_ends}
    print(f"| depth | {' | '.join(cases)} |")
    print(f"| ---: | {' | '.join('---:' for _ in cases)} |")
    for depth in args.depths:
        cells = []
        for name, make in cases.items():
            ev = make(depth)
            secs, spans = best_of(args.repeat, lambda ev=ev: Spans.from_events(ev, CLOCK))
            if name == "chain":  # the result, not only the time: every call got its span
                assert int(np.count_nonzero(spans.cat == CAT_BACKWARD)) == depth
                assert spans.nodes.unattributed == 0
            cells.append(f"{secs:.3f} s")
        print(f"| {depth} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
