"""Every view of one run agrees on calls, total and self time per (module, phase, mode)
(issue #37): they all group one per-call table (hooktrace.analysis.calls.Calls).

One recording keeps every step whole (``aggregate=DIR, detail="every=1"``, one step a
window), so each step is both an aggregate window and a trace; of each step's trace:
the summary, the summary of its Parquet export, the aggregate rows of that window,
diff's numbers, the straggler reduction and the HTML report's table. On an eager run
with eval calls between steps, and on a compiled run whose first step compiles
(kernel-derived rows, the ``<torch.compile>`` row, compile time out of the self time of
the span it ran in).
"""

from __future__ import annotations

import html.parser
import json
import subprocess
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.analysis._diff_parts import trace_part
from hooktrace.analysis._rank_reduce import reduce_rank
from hooktrace.analysis.rankset import RankFile
from hooktrace.analysis.summary import Summary
from hooktrace.analysis.aggregates import ROOT_ROW
from hooktrace.data.aggregates import load_aggregates

pytest.importorskip("duckdb")

Key = tuple[str, str, str]  # (module, phase, mode)
Numbers = dict[Key, tuple[int, int, int]]  # calls, total ns, self ns
STEPS = 4


def _record(folder: Path, compiled: bool) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Sequential(nn.Linear(64, 64),
                                                                    nn.ReLU()),
                        nn.Linear(64, 8))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with hooktrace.trace(net, aggregate=folder, aggregate_interval=0, detail="every=1"):
            fn = torch.compile(net) if compiled else net
            for _ in range(STEPS):
                opt.zero_grad()
                fn(torch.randn(4, 32)).sum().backward()
                if not compiled:
                    with torch.no_grad():  # a validation call inside the step: eval rows
                        net(torch.randn(2, 32))
                opt.step()


def _from_summary_rows(rows: list[dict[str, Any]]) -> Numbers:
    out: Numbers = {}
    for r in rows:
        if r["module"] == "<unattributed>":
            continue  # autograd nodes outside every module: not module calls
        for phase, prefix in (("forward", ""), ("backward", "bwd_")):
            if r[f"{prefix}calls"]:
                out[(r["module"], phase, r["mode"])] = (
                    int(r[f"{prefix}calls"]), int(r[f"{prefix}total_ns"]),
                    int(r[f"{prefix}self_ns"]))
    return out


def _from_aggregates(table: Any, step: int) -> Numbers:
    out: Numbers = {}
    for r in table.to_pylist():
        if r["step"] != step or r["mode"] in ("step", "recompute", "eval recompute"):
            continue
        mode = "eval" if r["mode"].startswith("eval") else "train"
        phase = "backward" if r["mode"].endswith("backward") else "forward"
        module = "" if r["module"] == ROOT_ROW else r["module"]
        out[(module, phase, mode)] = (r["calls"], r["total_ns"], r["self_ns"])
    return out


def _from_diff(trace: Any) -> Numbers:
    part = trace_part(trace)
    out: Numbers = {}
    for (module, phase), (total, self_, calls) in part.run.items():
        out[(module, "forward" if phase == "eval" else phase,
             "eval" if phase == "eval" else "train")] = (int(calls), int(total), int(self_))
    return out


def _from_stragglers(trace: Any, path: Path) -> Numbers:
    s = reduce_rank(trace, RankFile.from_trace(str(path), trace))
    acc: dict[Key, list[int]] = defaultdict(lambda: [0, 0, 0])
    for m, mode, phase, calls, total, self_ in zip(s.module, s.mode, s.phase, s.calls,
                                                   s.total_ns, s.self_ns, strict=True):
        key = (s.modules[m], ("forward", "backward")[phase], ("train", "eval")[mode])
        for i, v in enumerate((calls, total, self_)):
            acc[key][i] += int(v)
    return {k: (v[0], v[1], v[2]) for k, v in acc.items()}


class _Table(html.parser.HTMLParser):
    """The report's summary table: per row, data-key -> data-v."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []
        self.rows: list[list[str]] = []
        self._in = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id") == "summary":
            self._in = True
        elif self._in and tag == "th":
            self.keys.append(a["data-key"] or "")
        elif self._in and tag == "tr" and self.keys:
            self.rows.append([])
        elif self._in and tag == "td":
            self.rows[-1].append(a["data-v"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in = False


_NUMBERS = ("calls", "total_ns", "self_ns", "bwd_calls", "bwd_total_ns", "bwd_self_ns")


def _from_report(path: Path, tmp: Path) -> Numbers:
    out = tmp / "report.html"
    subprocess.run([sys.executable, "-m", "hooktrace", "report", str(path), "-o", str(out)],
                   check=True, capture_output=True)
    parser = _Table()
    parser.feed(out.read_text())
    rows = []
    for cells in parser.rows:
        row: dict[str, Any] = {"calls": 0, "bwd_calls": 0, "mode": "train"}
        for key, v in zip(parser.keys, cells, strict=True):
            row[key] = float(v) if key in _NUMBERS and v != "" else v
        rows.append(row)
    return _from_summary_rows(rows)


def _from_export(path: Path, tmp: Path) -> Numbers:
    from hooktrace.data.summary import summary_of_export

    out = tmp / "run.parquet"
    subprocess.run([sys.executable, "-m", "hooktrace", "export", str(path), "-o", str(out)],
                   check=True, capture_output=True)
    return _from_summary_rows(summary_of_export(out).rows)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_every_view_of_a_step_agrees_on_calls_total_and_self(tmp_path: Path,
                                                             compiled: bool) -> None:
    folder = tmp_path / "agg"
    _record(folder, compiled)
    table = load_aggregates(folder)
    kept = [json.loads(line) for line in (folder / "kept.jsonl").read_text().splitlines()]
    assert [k["step"] for k in kept] == list(range(STEPS))
    compile_rows = 0
    for k in kept:
        path = folder / "steps" / k["file"]
        trace = hooktrace.load(path)
        summary = _from_summary_rows(Summary.from_trace(trace).rows)
        modules = {key for key in summary if key[0] != "<torch.compile>"}
        assert len(modules) >= 8  # every module forward and backward (and eval) in the step
        compile_rows += len(summary) - len(modules)
        if not compiled:
            assert any(mode == "eval" for _, _, mode in summary)
        views = {"aggregate folder": _from_aggregates(table, k["step"]),
                 "Parquet export": _from_export(path, tmp_path),
                 "report": _from_report(path, tmp_path)}
        for name, numbers in views.items():  # (these have the compile row too)
            assert numbers == summary, (name, k["step"])
        # diff and the straggler tables compare modules across runs: no compile row
        for name, numbers in {"diff": _from_diff(trace),
                              "stragglers": _from_stragglers(trace, path)}.items():
            assert numbers == {key: v for key, v in summary.items() if key in modules}, (
                name, k["step"])
    # the compiled run compiled in its first step: its compile row was compared too
    assert (compile_rows > 0) == compiled
