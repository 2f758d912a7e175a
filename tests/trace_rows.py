"""Shared test helpers: read a (merged) Chrome trace's rows and check strict nesting."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path
from typing import Any

from hooktrace.format._kineto import us_to_ns


def load_json(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data, parse_float=str)


def rows_of(doc: dict[str, Any]) -> dict[tuple[Any, Any], list[tuple[int, int, dict[str, Any]]]]:
    rows: dict[tuple[Any, Any], list[tuple[int, int, dict[str, Any]]]] = collections.defaultdict(
        list)
    base = doc.get("baseTimeNanoseconds", 0)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            s = base + us_to_ns(e["ts"])
            rows[(e["pid"], e["tid"])].append((s, s + us_to_ns(e["dur"]), e))
    return rows


def strict_nesting_violations(slices: list[tuple[int, int, Any]]) -> list[Any]:
    """Pairs of slices on one row that partially overlap (pure-Python reference)."""
    bad = []
    stack: list[tuple[int, int, Any]] = []
    for sl in sorted(slices, key=lambda t: (t[0], -t[1])):
        while stack and stack[-1][1] <= sl[0]:
            stack.pop()
        if stack and sl[1] > stack[-1][1]:
            bad.append((stack[-1], sl))
        stack.append(sl)
    return bad


def our_rows(doc: dict[str, Any]) -> set[tuple[Any, Any]]:
    return {(e["pid"], e["tid"]) for e in doc["traceEvents"]
            if e.get("ph") == "X" and str(e.get("cat", "")).startswith("hooktrace.")}
