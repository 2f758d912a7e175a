"""Shared helpers: synthetic event streams and traces (no torch modules needed)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pytest

from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, FLAG_ERROR, NODE_BEGIN, NODE_END, Clock
from hooktrace.reading import (
    CAT_BACKWARD,
    CAT_RECOMPUTE,
    NO_PASS,
    GpuSpans,
    Nodes,
    Spans,
    Steps,
    TraceData,
)
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


GPU_MODULES = [("", "Net"), ("fc1", "Linear"), ("fc2", "Linear"), ("attn", "Attention")]
GPU_STEP_NS = 2_000_000  # the synthetic GPU run's steps start every 2 ms
GPU_T0 = 1_000_000_000  # ... from 1 s after the epoch (Perfetto drops negative times)
GPU_INFO = {"timer": "host", "every": 1, "timed_steps": 2, "skipped_capturing": 0,
            "dropped": 0, "align_error_ns": 1500}


def gpu_trace(*, gpu: bool = True, fc1_gpu_ns: int = 400_000, fc2_host_ns: int = 160_000,
              steps: int = 2, **info: Any) -> TraceResult:
    """A synthetic CUDA run of ``Net(fc1, fc2, attn)`` with device time (issue #28): per
    step, one forward and one backward of each; ``attn`` is a kernel site of a compiled
    region (device intervals with ``span == -1``, no host span).

    Per step (ns; ``o`` = GPU_T0 + step * GPU_STEP_NS), host spans (forward: root [o, o+300k],
    fc1 [o+10k, o+110k], fc2 [o+120k, o+120k+fc2_host_ns]; backward: root [o+400k,
    o+800k] self 20k, fc2 [o+410k, o+500k], fc1 [o+510k, o+600k]) and device
    intervals, forward on stream 7 (root 600k + (F - 400k), fc1 F = ``fc1_gpu_ns``,
    fc2 100k, attn 50k: root self 50k) and backward on stream 13 (root 340k, fc2 100k,
    fc1 200k: root self 40k). Host order: root, fc2, fc1; device order: root, fc1,
    fc2, attn. ``gpu=False``: the same run without device time (``info["gpu"]`` absent);
    ``info`` overrides (``accelerator=None`` for a CPU run)."""
    f = fc1_gpu_ns
    host: list[tuple[int, int, int, int, int, int, int]] = []  # start, end, self, parent, mod, depth, cat
    fwd_host = [(0, 300_000, 1, -1, 0), (10_000, 110_000, None, 0, 1),
                (120_000, 120_000 + fc2_host_ns, None, 0, 2)]
    bwd_host = [(400_000, 800_000, 20_000, -1, 0), (410_000, 500_000, None, 0, 2),
                (510_000, 600_000, None, 0, 1)]
    n_fwd = 3 * steps
    index: dict[tuple[int, int, int], int] = {}  # (step, cat, module) -> span index
    for cat, pattern, base in ((0, fwd_host, 0), (CAT_BACKWARD, bwd_host, n_fwd)):
        for s in range(steps):
            o = GPU_T0 + s * GPU_STEP_NS
            first = base + 3 * s
            for k, (a, b, self_, parent, mod) in enumerate(pattern):
                index[(s, cat, mod)] = first + k
                if self_ is None:
                    self_ = b - a
                elif cat == 0:
                    self_ = (b - a) - 100_000 - fc2_host_ns
                host.append((o + a, o + b, self_, -1 if parent < 0 else first + parent, mod,
                             0 if parent < 0 else 1, cat))
    arr = np.array(host, np.int64)
    n = len(arr)
    spans = Spans({"start_ns": arr[:, 0], "end_ns": arr[:, 1], "self_ns": arr[:, 2],
                   "parent": arr[:, 3], "module": arr[:, 4].astype(np.uint32),
                   "tid": np.ones(n, np.uint32), "depth": arr[:, 5].astype(np.uint32),
                   "call": np.array([i // 3 for i in range(n)], np.uint32) % steps,
                   "flags": np.zeros(n, np.uint8), "cat": arr[:, 6].astype(np.uint8)},
                  threads=np.array([1], np.uint32), orphan_exits=0, unfinished=0)
    rows = []  # start, end, self, span, module, cat, stream
    for s in range(steps):
        o = GPU_T0 + s * GPU_STEP_NS
        d = f - 400_000
        rows += [
            (o + 50_000, o + 650_000 + d, 50_000, index[(s, 0, 0)], 0, 0, 7),
            (o + 60_000, o + 60_000 + f, f, index[(s, 0, 1)], 1, 0, 7),
            (o + 460_000 + d, o + 560_000 + d, 100_000, index[(s, 0, 2)], 2, 0, 7),
            (o + 560_000 + d, o + 610_000 + d, 50_000, -1, 3, 0, 7),
            (o + 650_000 + d, o + 990_000 + d, 40_000, index[(s, CAT_BACKWARD, 0)], 0,
             CAT_BACKWARD, 13),
            (o + 660_000 + d, o + 760_000 + d, 100_000, index[(s, CAT_BACKWARD, 2)], 2,
             CAT_BACKWARD, 13),
            (o + 765_000 + d, o + 965_000 + d, 200_000, index[(s, CAT_BACKWARD, 1)], 1,
             CAT_BACKWARD, 13),
        ]
    g = np.array(rows, np.int64)
    full_info: dict[str, Any] = {"accelerator": "cuda"}
    if gpu:
        full_info["gpu"] = dict(GPU_INFO, timed_steps=steps)
    full_info.update(info)
    full_info = {k: v for k, v in full_info.items() if v is not None}
    trace = trace_with_spans(spans, GPU_MODULES, **full_info)
    # each step ends 5 µs before the next one's first call (a step mark's own time
    # belongs to the step it ends)
    trace._steps = Steps(np.arange(steps), GPU_T0 + np.arange(steps) * GPU_STEP_NS - 5_000,
                         GPU_T0 + np.arange(1, steps + 1) * GPU_STEP_NS - 5_000,
                         np.ones(steps, bool))
    set_gpu_spans(trace, GpuSpans({
        "start_ns": g[:, 0], "end_ns": g[:, 1], "self_ns": g[:, 2], "span": g[:, 3],
        "module": g[:, 4].astype(np.uint32), "cat": g[:, 5].astype(np.uint8),
        "device": np.zeros(len(g), np.int16), "stream": g[:, 6]}) if gpu else GpuSpans.empty())
    return trace


def set_gpu_spans(trace: TraceData, gpu: GpuSpans) -> None:
    """Give ``trace`` these device intervals, as if ``device_time.gpu_spans`` had paired
    them from its marks (it caches them on the trace under ``"gpu_spans"``)."""
    trace.__dict__.setdefault("_derived", {})["gpu_spans"] = gpu


@pytest.fixture
def make_events() -> Callable[[Iterable[Sequence[int]]], np.ndarray]:
    return build_events


@pytest.fixture
def make_trace() -> Callable[..., TraceResult]:
    return build_trace
