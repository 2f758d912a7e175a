"""Shared helpers: synthetic event streams and traces (no torch modules needed)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pytest

from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, FLAG_ERROR, NODE_BEGIN, NODE_END, Clock
from hooktrace.reading import CAT_BACKWARD, CAT_RECOMPUTE, NO_PASS, Nodes, Spans, TraceData
from hooktrace.result import TraceResult

IDENTITY_CLOCK = Clock(ticks0=0, unix_ns0=0, ns_per_tick=1.0)


def build_events(rows: Iterable[Sequence[int]]) -> np.ndarray:
    """Events from ``(tid, kind, id, t[, flags])`` tuples, in the given order."""
    rows = list(rows)
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, row in enumerate(rows):
        tid, kind, id_, t = row[:4]
        ev[i]["tid"], ev[i]["kind"], ev[i]["id"], ev[i]["t"] = tid, kind, id_, t
        ev[i]["rf_tid"] = tid
        ev[i]["flags"] = row[4] if len(row) > 4 else 0
        ev[i]["seq"] = i
    return ev


def events_from(rows: Iterable[Sequence[int]], fields: Sequence[str] = ("tid", "kind", "id", "t"),
                **fixed: int) -> np.ndarray:
    """Events from rows of the named ``fields``' values (in the given order); every
    other field is ``fixed``'s value for it, or 0. ``build_events`` fills ``rf_tid``
    and ``seq`` for you; this fills nothing."""
    rows = list(rows)
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for name, value in fixed.items():
        ev[name] = value
    for name, column in zip(fields, zip(*rows)):
        ev[name] = column
    return ev


def default_modules(n: int) -> list[tuple[str, str]]:
    return [("", "Net")] + [(f"layer.{i}", "Linear") for i in range(1, n)]


def build_trace(
    events: np.ndarray,
    modules: Sequence[tuple[str, str]] | None = None,
    *,
    node_names: Sequence[str] = (),
    clock: Clock = IDENTITY_CLOCK,
    cls: type[TraceData] = TraceResult,
    **info: Any,
) -> Any:
    """A TraceResult (or ``cls``) with sensible defaults; ``modules`` default to enough
    slots, ``info`` to pid 4242 on testhost with no events lost."""
    if modules is None:
        n = int(events["id"].max()) + 1 if len(events) else 1
        modules = default_modules(n)
    full_info: dict[str, Any] = {
        "pid": 4242,
        "hostname": "testhost",
        "dropped_events": 0,
        "overwritten_events": 0,
    }
    full_info.update(info)
    return cls(events, list(modules), list(node_names), clock, full_info)


def random_stream(
    seed: int,
    *,
    n_threads: int = 3,
    calls_per_thread: int = 60,
    n_modules: int = 6,
    p_lose_exit: float = 0.05,
    p_lose_enter: float = 0.05,
    p_error: float = 0.1,
    p_node: float = 0.0,
    p_stray_exit: float = 0.03,
    cut_front: bool = True,
    max_depth: int = 6,
) -> np.ndarray:
    """A random, interleaved multi-thread stream with realistic damage.

    Each thread records properly nested calls (recursion allowed), then loses
    some ENTERs/EXITs, gains stray EXITs and NODE events, and may lose its
    beginning (as a ring buffer does); threads are interleaved at random while
    keeping each thread's order. Timestamps are non-decreasing per thread, with
    ties, so cross-thread call ordering ties happen too.
    """
    rng = random.Random(seed)
    per_thread: list[list[tuple[int, int, int, int, int]]] = []
    for th in range(n_threads):
        tid = 1000 + rng.randrange(0, 50) * 7 + th  # distinct, unordered
        t = rng.randrange(0, 50)
        rows: list[tuple[int, int, int, int, int]] = []
        stack: list[int] = []
        calls = 0
        while calls < calls_per_thread or stack:
            t += rng.choice((0, 0, 1, 2, 5, 13))
            if calls < calls_per_thread and len(stack) < max_depth and (
                not stack or rng.random() < 0.55
            ):
                mod = rng.randrange(n_modules)
                stack.append(mod)
                rows.append((tid, ENTER, mod, t, 0))
                calls += 1
            else:
                mod = stack.pop()
                flags = FLAG_ERROR if rng.random() < p_error else 0
                rows.append((tid, EXIT, mod, t, flags))
            if rng.random() < p_node:
                kind = rng.choice((NODE_BEGIN, NODE_END))
                rows.append((tid, kind, rng.randrange(3), t, 0))
            if rng.random() < p_stray_exit:
                rows.append((tid, EXIT, rng.randrange(n_modules), t, 0))
        damaged = []
        for row in rows:
            if row[1] == EXIT and rng.random() < p_lose_exit:
                continue
            if row[1] == ENTER and rng.random() < p_lose_enter:
                continue
            damaged.append(row)
        if cut_front and damaged:
            damaged = damaged[rng.randrange(len(damaged) // 3 + 1) :]
        per_thread.append(damaged)
    merged: list[tuple[int, int, int, int, int]] = []
    cursors = [0] * n_threads
    while True:
        live = [i for i in range(n_threads) if cursors[i] < len(per_thread[i])]
        if not live:
            break
        i = rng.choice(live)
        for _ in range(rng.randrange(1, 4)):
            if cursors[i] < len(per_thread[i]):
                merged.append(per_thread[i][cursors[i]])
                cursors[i] += 1
    return build_events(merged)


def garbage_stream(seed: int, n: int = 400, n_modules: int = 4) -> np.ndarray:
    """Uniformly random kinds, ids, tids and (non-monotonic) timestamps."""
    rng = np.random.default_rng(seed)
    ev = np.zeros(n, EVENT_DTYPE)
    ev["tid"] = rng.integers(1, 4, n)
    ev["kind"] = rng.integers(1, 5, n)
    ev["id"] = rng.integers(0, n_modules, n)
    ev["t"] = rng.integers(0, 10_000, n)
    ev["flags"] = rng.integers(0, 2, n)
    return ev


NODE_NAMES = ["AddmmBackward0", "ReluBackward0", "MulBackward0", "AccumulateGrad"]


def backward_spans(
    seed: int,
    *,
    n_threads: int = 2,
    roots_per_thread: int = 3,
    passes_per_root: int = 2,
    n_modules: int = 7,
    p_unattributed: float = 0.15,
    p_nested: float = 0.15,
    p_other_thread: float = 0.2,
    with_recompute: bool = True,
) -> Spans:
    """Spans shaped like build_spans' output once backward spans exist (issue #3).

    Forward: clean random call trees per thread, paired by the real
    ``Spans.from_events``. Backward: per (root call, pass) a random sequence of
    autograd nodes, each attributed to a random call of the root's subtree (so
    siblings interleave) or to none; mostly on the root's thread, sometimes on
    another; sometimes nested in the previous node of its thread (reentrant).
    Backward spans follow the documented rules: start/end over the nodes of
    the call and its descendants, self = direct nodes' self time, tid of the
    first node, parent = the parent call's span in the same pass, sorted by
    (tid, start, depth) after the forward and recompute spans.
    """
    rng = random.Random(seed)
    tids = [101 * (k + 1) for k in range(n_threads)]
    rows: list[tuple[int, int, int, int]] = []
    for tid in tids:
        t = rng.randrange(0, 100)

        def call(module: int, depth: int) -> None:
            nonlocal t
            rows.append((tid, ENTER, module, t))
            t += rng.randrange(1, 20)
            for _ in range(rng.randrange(0, 4) if depth < 3 else 0):
                call(rng.randrange(1, n_modules), depth + 1)
                t += rng.randrange(0, 10)
            rows.append((tid, EXIT, module, t))
            t += rng.randrange(1, 30)

        for _ in range(roots_per_thread):
            call(0, 0)
    fwd = Spans.from_events(build_events(rows), IDENTITY_CLOCK)
    arrays = {name: getattr(fwd, name).tolist() for name in
              ("start_ns", "end_ns", "self_ns", "parent", "module", "tid", "depth", "call",
               "flags", "cat")}
    n_fwd = len(fwd)
    children: dict[int, list[int]] = {i: [] for i in range(n_fwd)}
    for i, p in enumerate(arrays["parent"]):
        if p >= 0:
            children[p].append(i)

    def subtree(i: int) -> list[int]:
        out = [i]
        for c in children[i]:
            out += subtree(c)
        return out

    roots = [i for i in range(n_fwd) if arrays["parent"][i] < 0]
    end_fwd = max(arrays["end_ns"])
    if with_recompute:  # re-run one root's subtree per thread after all forward time
        for tid in tids:
            root = rng.choice([r for r in roots if arrays["tid"][r] == tid])
            shift = end_fwd + rng.randrange(10, 100) - arrays["start_ns"][root]
            new_index: dict[int, int] = {}
            for i in subtree(root):
                new_index[i] = len(arrays["start_ns"])
                for name in arrays:
                    arrays[name].append(arrays[name][i])
                j = new_index[i]
                arrays["start_ns"][j] += shift
                arrays["end_ns"][j] += shift
                arrays["parent"][j] = new_index.get(arrays["parent"][i], -1)
                arrays["cat"][j] = CAT_RECOMPUTE
    n_head = len(arrays["start_ns"])

    cursor = {tid: end_fwd + rng.randrange(0, 50) for tid in tids}
    node: dict[str, list[int]] = {k: [] for k in ("start_ns", "end_ns", "self_ns", "seq",
                                                  "name", "tid", "pass_id", "call")}
    nested_into: set[int] = set()
    last_on: dict[tuple[int, int], int] = {}
    pass_id = 0
    bwd: list[dict[str, int]] = []
    for root in roots:
        calls = subtree(root)
        for _ in range(passes_per_root):
            first = len(node["start_ns"])
            for _ in range(rng.randrange(3, 16)):
                tid = arrays["tid"][root]
                if n_threads > 1 and rng.random() < p_other_thread:
                    tid = rng.choice(tids)
                target = -1 if rng.random() < p_unattributed else rng.choice(calls)
                prev = last_on.get((pass_id, tid))
                if (prev is not None and prev not in nested_into and rng.random() < p_nested
                        and node["end_ns"][prev] - node["start_ns"][prev] >= 3):
                    nested_into.add(prev)
                    start, end = node["start_ns"][prev] + 1, node["end_ns"][prev] - 1
                    node["self_ns"][prev] -= end - start
                else:
                    start = cursor[tid] + rng.randrange(0, 6)
                    end = start + rng.randrange(1, 50)
                    cursor[tid] = end
                    last_on[(pass_id, tid)] = len(node["start_ns"])
                for key, value in (("start_ns", start), ("end_ns", end), ("self_ns", end - start),
                                   ("seq", rng.randrange(0, 1 << 40)),
                                   ("name", rng.randrange(len(NODE_NAMES))), ("tid", tid),
                                   ("pass_id", pass_id if rng.random() < 0.9 else NO_PASS),
                                   ("call", target)):
                    node[key].append(value)
            mine = range(first, len(node["start_ns"]))
            span_of: dict[int, int] = {}
            for c in calls:  # parents before children
                below = set(subtree(c))
                ns = [k for k in mine if node["call"][k] in below]
                if not ns:
                    continue
                ns.sort(key=lambda k: (node["start_ns"][k], k))
                parent = arrays["parent"][c]
                span_of[c] = len(bwd)
                bwd.append({
                    "start_ns": node["start_ns"][ns[0]],
                    "end_ns": max(node["end_ns"][k] for k in ns),
                    "self_ns": sum(node["self_ns"][k] for k in ns if node["call"][k] == c),
                    "parent": span_of[parent] if c != root else -1,
                    "module": arrays["module"][c], "tid": node["tid"][ns[0]],
                    "depth": arrays["depth"][c], "call": arrays["call"][c], "flags": 0,
                    "cat": CAT_BACKWARD, "forward": c, "pass": pass_id,
                })
            for k in mine:
                c = node["call"][k]
                node["call"][k] = span_of[c] if c >= 0 else -1  # temporary: index into bwd
            pass_id += 1
    order = sorted(range(len(bwd)), key=lambda b: (bwd[b]["tid"], bwd[b]["start_ns"],
                                                   bwd[b]["depth"], b))
    final = {b: n_head + pos for pos, b in enumerate(order)}
    for b in order:
        span = bwd[b]
        for name in arrays:
            value = span[name]
            if name == "parent" and value >= 0:
                value = final[value]
            arrays[name].append(value)
    dtypes = {"start_ns": np.int64, "end_ns": np.int64, "self_ns": np.int64,
              "parent": np.int64, "module": np.uint32, "tid": np.uint32, "depth": np.uint32,
              "call": np.uint32, "flags": np.uint8, "cat": np.uint8}
    nodes = Nodes({
        "start_ns": np.array(node["start_ns"], np.int64),
        "end_ns": np.array(node["end_ns"], np.int64),
        "self_ns": np.array(node["self_ns"], np.int64),
        "seq": np.array(node["seq"], np.uint64),
        "name": np.array(node["name"], np.uint32),
        "tid": np.array(node["tid"], np.uint32),
        "pass_id": np.array(node["pass_id"], np.uint32),
        "span": np.array([final[c] if c >= 0 else -1 for c in node["call"]], np.int64),
    })
    return Spans({name: np.array(v, dtypes[name]) for name, v in arrays.items()},
                 threads=np.array(tids, np.uint32), orphan_exits=0, unfinished=0,
                 node_events=2 * len(nodes), nodes=nodes)


def backward_trace(seed: int, **kwargs: Any) -> TraceResult:
    """A TraceResult whose spans are ``backward_spans(seed, **kwargs)``."""
    n_modules = kwargs.get("n_modules", 7)
    trace = build_trace(build_events([]), default_modules(n_modules), node_names=NODE_NAMES)
    trace._spans = backward_spans(seed, **kwargs)
    return trace


def trace_with_spans(spans: Spans, modules: Sequence[tuple[str, str]],
                     node_names: Sequence[str] = (), **info: Any) -> TraceResult:
    """A TraceResult whose spans are the given ones (events are not consulted)."""
    trace = build_trace(build_events([]), modules, node_names=node_names, **info)
    trace._spans = spans
    return trace


@pytest.fixture
def make_events() -> Callable[[Iterable[Sequence[int]]], np.ndarray]:
    return build_events


@pytest.fixture
def make_trace() -> Callable[..., TraceResult]:
    return build_trace
