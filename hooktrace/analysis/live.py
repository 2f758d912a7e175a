"""What ``hooktrace top`` shows (issue #51): the newest windows of the runs writing an
``aggregate=`` folder, reduced to one row per module and phase.

A run recording with ``aggregate=DIR`` rewrites ``DIR/live/<run>.json`` about once a
second with the rows of the windows it closed since (:mod:`hooktrace.record.aggregate`;
``hooktrace top PID`` attaches with ``aggregate=`` a private folder). :class:`Watch` reads
those files and gives a :class:`View`: per module and phase the time per step and its
share of the step, the calls per step, the device time per step when recorded, and the
change against the first window it saw; the step time and steps per second; the footer
lines that matter (the unattributed time: outside every module call; dropped
events). With several runs or ranks writing, each row is its slowest's, named.

Example:
    >>> import json, os, tempfile
    >>> d = tempfile.mkdtemp(); os.makedirs(f"{d}/live")
    >>> rows = {"steps": [2, 2, 2], "module": ["<root>", "fc", "<step>"],
    ...         "mode": ["forward", "forward", "step"], "calls": [2, 2, 2],
    ...         "total_ms": [6.0, 4.0, 10.0]}
    >>> with open(f"{d}/live/r.json", "w") as f:
    ...     json.dump({"run": "r", "rank": None, "ended": False, "steps": 9,
    ...                "dropped_events": 0, "rows": rows}, f)
    >>> v = Watch(d).look()
    >>> v.step_ms, v.steps_per_s, [(r.module, r.ms, r.share, r.calls) for r in v.rows]
    (5.0, 200.0, [('<root>', 3.0, 60.0, 1.0), ('fc', 2.0, 40.0, 1.0)])
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from hooktrace._input import open_input
from hooktrace.analysis.aggregates import LIVE_DIR, ROOT_ROW, STEP_ROW, source_labels

__all__ = ["LIVE_DIR", "Row", "SORTS", "View", "Watch", "read_live"]

# a live file not rewritten for this long, and not marked ended: a run that stopped writing
STALE_S = 30.0
# the orders the rows can be shown in (hooktrace top's s key cycles through them)
SORTS = ("time", "calls", "change", "name")


@dataclass(frozen=True)
class Row:
    """One module and phase over the newest windows (times in ms per step)."""

    module: str
    mode: str
    ms: float
    share: float | None  # percent of the step
    calls: float  # per step
    gpu_ms: float | None  # device time, when recorded
    change: float | None  # percent against the first window seen (None: not seen before)
    source: str | None = None  # the slowest run or rank, when several write the folder
    mem_peak: int | None = None  # bytes, the largest peak inside a call (memory=True)


@dataclass
class View:
    """One look at the folder: the rows, the step and the footer lines."""

    rows: list[Row]
    step_ms: float
    steps_per_s: float
    steps: int  # steps recorded so far (the run with most)
    sources: list[str]  # the runs or ranks shown ("rank 0", ...; one run: [])
    ended: bool  # every run shown has ended
    age_s: float  # since the newest live file was written
    footer: list[str] = field(default_factory=list)

    def sorted(self, by: str = "time", contains: str = "") -> list[Row]:
        """The rows whose module names hold ``contains`` (any case), in order ``by``
        (one of :data:`SORTS`)."""
        rows = [r for r in self.rows if contains.lower() in r.module.lower()]
        keys = {"time": lambda r: -r.ms, "calls": lambda r: -r.calls,
                "change": lambda r: -abs(r.change or 0.0), "name": lambda r: r.module}
        return sorted(rows, key=keys[by])

    def to_json(self) -> dict[str, Any]:
        """As ``hooktrace top --once --json`` prints it."""
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [asdict(r) for r in self.rows]}


def read_live(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The live files of ``folder`` (``DIR/live/*.json``) written within STALE_S of the
    newest (the runs writing now, or the last ones that did), each with its ``mtime``;
    one being replaced or cut short is left out."""
    live = os.path.join(os.fspath(folder), LIVE_DIR)
    try:
        stats = [(e.path, e.stat().st_mtime) for e in os.scandir(live)
                 if e.name.endswith(".json")]
    except FileNotFoundError:  # (no step yet; a file replaced while read: the next look)
        stats = []
    newest = max((m for _, m in stats), default=0.0)
    out = []
    for path, mtime in sorted(stats):
        if mtime < newest - STALE_S:  # (a folder shared by runs for weeks: the old ones)
            continue
        try:  # (a FIFO or a device named like a live file is never opened: issue #46)
            with open_input(path) as f:
                data = json.loads(f.read().decode("utf-8"))
            if isinstance(data.get("rows"), dict) and isinstance(data.get("run"), str):
                out.append({**data, "mtime": mtime})
        except (OSError, ValueError, AttributeError):
            continue
    return out


class Watch:
    """An ``aggregate=`` folder being written, looked at again and again; the first
    value seen of each row is what its change is measured against."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = os.fspath(folder)
        self.first: dict[tuple[str, str], float] = {}

    def look(self) -> View | None:
        """The newest windows of the runs writing now (else of the last ones that did);
        None before any has closed a window."""
        files = [f for f in read_live(self.folder) if _steps(f["rows"])]
        if not files:
            return None
        now, newest = time.time(), max(f["mtime"] for f in files)
        labels = source_labels([(f["run"], f.get("rank")) for f in files])
        per = [(labels[(f["run"], f.get("rank"))], f, _per_step(f["rows"])) for f in files]
        best: dict[tuple[str, str], tuple[str, dict[str, Any], float]] = {}
        for label, f, rows in per:
            for key, r in rows.items():
                if key not in best or r["ms"] > best[key][1]["ms"]:
                    best[key] = (label, r, r["step_ms"])
        out = []
        for key, (label, r, step_ms) in best.items():
            if key[1] == "step":
                continue
            base = self.first.setdefault(key, r["ms"])
            out.append(Row(key[0], key[1], r["ms"], 100 * r["ms"] / step_ms if step_ms else None,
                           r["calls"], r["gpu_ms"],
                           100 * (r["ms"] - base) / base if base else None,
                           label if len(files) > 1 else None, r["mem_peak"]))
        step_ms = max(rows[(STEP_ROW, "step")]["ms"] for _, _, rows in per)
        view = View(out, step_ms, 1e3 / step_ms if step_ms else 0.0,
                    max(int(f.get("steps") or 0) for f in files),
                    [label for label, _, _ in per] if len(files) > 1 else [],
                    all(f.get("ended") for f in files), max(0.0, now - newest))
        view.footer = _footer(view, sum(int(f.get("dropped_events") or 0) for f in files))
        return view


def _steps(rows: dict[str, list[Any]]) -> int:
    return sum(int(n or 0) for n, m in zip(rows.get("steps", []), rows.get("mode", []))
               if m == "step")


def _per_step(rows: dict[str, list[Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (module, mode) of one live file: ms, calls and device ms per step, and the
    memory peak."""
    n = max(1, _steps(rows))
    sums: dict[tuple[str, str], list[Any]] = {}
    none = [None] * len(rows["module"])
    # device time: the kernels' busy time (CUPTI) when recorded, else the timing events'
    gpu = [k if k is not None else e for k, e in zip(rows.get("kernel_ms") or none,
                                                     rows.get("gpu_ms") or none)]
    for module, mode, calls, total, g, mem in zip(
            rows["module"], rows["mode"], rows["calls"], rows["total_ms"], gpu,
            rows.get("mem_peak_bytes") or none):
        s = sums.setdefault((str(module), str(mode)), [0.0, 0, None, None])
        s[0] += float(total or 0.0)
        s[1] += int(calls or 0)
        if g is not None:
            s[2] = (s[2] or 0.0) + float(g)
        if mem is not None:
            s[3] = max(s[3] or 0, int(mem))
    step_ms = sums.get((STEP_ROW, "step"), [0.0])[0] / n
    return {k: {"ms": t / n, "calls": c / n, "gpu_ms": None if g is None else g / n,
                "mem_peak": mem, "step_ms": step_ms} for k, (t, c, g, mem) in sums.items()}


def _footer(view: View, dropped: int) -> list[str]:
    """The lines under the table that matter now."""
    from hooktrace.text import format_ns

    lines = []
    names = {r.module for r in view.rows}
    # the outermost calls: the root when the model was traced, else the modules no other
    # module holds
    roots = {ROOT_ROW} if ROOT_ROW in names else {
        n for n in names if not any(n.startswith(p + ".") for p in names)}
    inside = sum(r.ms for r in view.rows if r.module in roots and not r.source)
    outside = view.step_ms - inside
    if not view.sources and view.step_ms and outside >= 0.01 * view.step_ms:
        lines.append(f"unattributed: {format_ns(outside * 1e6)} per step "
                     f"({100 * outside / view.step_ms:.0f}%) outside every module call: "
                     "optimizer, data, loss")
    if dropped:
        lines.append(f"note: {dropped} events dropped (buffer full: raise --capacity) - "
                     "totals may be incomplete")
    return lines
