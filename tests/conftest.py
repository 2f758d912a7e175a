"""Shared helpers: synthetic event streams and traces (no torch modules needed)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pytest

from hooktrace._events import ENTER, EVENT_DTYPE, EXIT, FLAG_ERROR, NODE_BEGIN, NODE_END, Clock
from hooktrace.reading import TraceData

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


def default_modules(n: int) -> list[tuple[str, str]]:
    return [("", "Net")] + [(f"layer.{i}", "Linear") for i in range(1, n)]


def build_trace(
    events: np.ndarray,
    modules: Sequence[tuple[str, str]] | None = None,
    *,
    node_names: Sequence[str] = (),
    clock: Clock = IDENTITY_CLOCK,
    **info: Any,
) -> TraceData:
    """A TraceData with sensible defaults; ``modules`` default to enough slots."""
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
    return TraceData(events, list(modules), list(node_names), clock, full_info)


def random_stream(
    seed: int,
    *,
    n_threads: int = 3,
    calls_per_thread: int = 60,
    n_modules: int = 6,
    p_lose_exit: float = 0.05,
    p_lose_enter: float = 0.05,
    p_error: float = 0.1,
    p_node: float = 0.05,
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


@pytest.fixture
def make_events() -> Callable[[Iterable[Sequence[int]]], np.ndarray]:
    return build_events


@pytest.fixture
def make_trace() -> Callable[..., TraceData]:
    return build_trace
