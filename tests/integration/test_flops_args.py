"""FLOP args on the spans of real runs: exports (JSON, .pftrace) and merges with
torch.profiler carry per call the FLOPs FlopCounterMode counts, and Perfetto reads them."""

from __future__ import annotations

import copy
import gzip
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from perfetto_check import perfetto_check, trace_processor
from pftrace_decode import chrome_slices, decode
from test_flops import reference

import hooktrace
from hooktrace.cli import main
from hooktrace.merge import merge_traces
from models import Shared, tiny_bert, tiny_gpt2

SPAN_CATS = ("hooktrace.forward", "hooktrace.backward")
STEPS = 3
CPU = [torch.profiler.ProfilerActivity.CPU]


def _tensor(out: Any) -> torch.Tensor:
    for attr in ("logits", "last_hidden_state", "hidden"):
        if hasattr(out, attr):
            return getattr(out, attr)
    return out


class _AsTensor(torch.nn.Module):
    """Wraps a model whose output is not a tensor, for test_flops.reference."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tensor(self.model(x))


CASES: dict[str, Callable[[], tuple[torch.nn.Module, torch.Tensor]]] = {
    # one Linear run 3 times per call, a loop over a ModuleList, dict/dataclass outputs
    # (the root returns a dataclass: the FLOP counter must stay open for its backward)
    "mlp": lambda: (Shared(), torch.randn(2, 4)),
    "gpt2": lambda: (tiny_gpt2(), torch.randint(0, 64, (2, 16))),
    "bert": lambda: (tiny_bert(), torch.randint(0, 64, (2, 16))),
}


def step(model: torch.nn.Module, x: torch.Tensor) -> None:
    _tensor(model(x)).float().pow(2).mean().backward()


def reference_counts(model: torch.nn.Module, x: torch.Tensor
                     ) -> tuple[dict[str, int], dict[str, int]]:
    """FlopCounterMode's per-module counts of one root call, forward and backward,
    keyed by the model's own qualified names."""
    torch.manual_seed(0)
    fwd, bwd = reference(_AsTensor(copy.deepcopy(model)), x)

    def strip(d: dict[str, int]) -> dict[str, int]:
        return {("" if k == "model" else k.removeprefix("model.")): v for k, v in d.items()
                if k != ""}
    return strip(fwd), strip(bwd)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per model: the run (3 steps, flops=True), its JSON and .pftrace exports by the CLI,
    and FlopCounterMode's counts of one step."""
    out = tmp_path_factory.mktemp("flops_args")
    result = {}
    for name, make in CASES.items():
        model, x = make()
        ref = reference_counts(model, x)
        with hooktrace.trace(model, flops=True) as tr:
            for _ in range(STEPS):
                step(model, x)
                tr.step()
        tr.save(out / f"{name}.htrace")
        for ext in ("json", "pftrace"):
            assert main(["export", str(out / f"{name}.htrace"), "-o",
                         str(out / f"{name}.{ext}")]) == 0
        result[name] = {"trace": tr, "ref": ref, "json": out / f"{name}.json",
                        "pftrace": out / f"{name}.pftrace", "model": model, "x": x}
    return result


def span_events(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data,
                     parse_float=Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in SPAN_CATS]


def by_root_call(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The hooktrace spans grouped by the root call they belong to (a forward span by
    the root call it lies in, a backward span by its forward call's)."""
    roots = sorted((e for e in events if e["cat"] == SPAN_CATS[0] and e["args"]["module"] == ""),
                   key=lambda e: e["ts"])
    assert len(roots) == STEPS
    root_of: dict[tuple[str, int], int] = {}
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["cat"] == SPAN_CATS[0]:
            r = next(i for i, root in enumerate(roots)
                     if root["ts"] <= e["ts"] <= root["ts"] + root["dur"])
            root_of[(e["args"]["module"], e["args"]["call"])] = r
            out[r].append(e)
    for e in events:
        if e["cat"] == SPAN_CATS[1]:
            out[root_of[(e["args"]["module"], e["args"]["call"])]].append(e)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_each_module_s_spans_add_up_to_flop_counter_mode_s_count(runs, name: str) -> None:
    # GIVEN a model traced with flops=True for three steps and exported to JSON
    run = runs[name]
    fwd_ref, bwd_ref = run["ref"]
    assert fwd_ref and bwd_ref
    groups = by_root_call(span_events(run["json"]))
    for r, events in groups.items():
        # THEN every forward and backward span has its FLOPs
        assert all(isinstance(e["args"]["flops"], int) for e in events)
        # AND in each root call, a module's spans add up to FlopCounterMode's count
        types = {e["args"]["module"]: e["args"]["type"] for e in events}
        for cat, ref in ((SPAN_CATS[0], fwd_ref), (SPAN_CATS[1], bwd_ref)):
            total: Counter[str] = Counter()
            for e in events:
                if e["cat"] == cat:
                    total[e["args"]["module"]] += e["args"]["flops"]
            assert {m: v for m, v in total.items() if v} == {
                m: v for m, v in ref.items() if m in total}, (name, r, cat)
            # (FlopCounterMode gives backward FLOPs to eval-mode Dropouts, which return
            # their input and so have no backward span: no span carries those)
            assert all(types[m] == "Dropout" and cat == SPAN_CATS[1]
                       for m in set(ref) - set(total)), (name, r, cat)
        # AND the counted call (the first) says so instead of giving a TFLOP/s
        for e in events:
            if r == 0:
                assert e["args"]["flops_counted"] is True and "tflops" not in e["args"]
            else:
                assert "flops_counted" not in e["args"]
                assert ("tflops" in e["args"]) == (e["args"]["flops"] > 0 and e["dur"] > 0)
                if "tflops" in e["args"]:
                    achieved = e["args"]["flops"] / (e["dur"] * 1000) / 1000
                    assert float(e["args"]["tflops"]) == pytest.approx(float(achieved), rel=1e-3)


def test_a_module_run_three_times_per_call_gets_a_third_each(runs) -> None:
    events = by_root_call(span_events(runs["mlp"]["json"]))[1]
    fwd_ref = runs["mlp"]["ref"][0]
    shared = [e["args"]["flops"] for e in events
              if e["cat"] == SPAN_CATS[0] and e["args"]["module"] == "shared"]
    assert len(shared) == 3 and sum(shared) == fwd_ref["shared"]
    assert max(shared) - min(shared) <= 1


@pytest.mark.parametrize("name", list(CASES))
def test_span_args_are_the_summary_s_flops_per_call(runs, name: str) -> None:
    # GIVEN the summary of the run and its JSON export
    run = runs[name]
    # (a module may have a training row and an [eval] row: the backward spans are the
    # calls of the row that has backward calls)
    rows: dict[tuple[str, str], dict] = {}
    for r in run["trace"].summary().rows:
        if r["module"] == "<unattributed>":  # one row per node name: no span args
            continue
        for cat, calls in ((SPAN_CATS[0], "calls"), (SPAN_CATS[1], "bwd_calls")):
            if r[calls]:
                assert (cat, r["module"]) not in rows or cat == SPAN_CATS[0], r["module"]
                rows.setdefault((cat, r["module"]), r)
    per_module: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in span_events(run["json"]):
        per_module[(e["cat"], e["args"]["module"])].append(e["args"]["flops"])
    # THEN the summary's flops (bwd_flops) per call is the mean of the spans' args
    assert per_module
    for (cat, module), values in per_module.items():
        key = "flops" if cat == SPAN_CATS[0] else "bwd_flops"
        assert rows[(cat, module)][key] == pytest.approx(sum(values) / len(values)), (module, cat)


@pytest.mark.parametrize("name", list(CASES))
def test_pftrace_args_are_the_json_s(runs, name: str) -> None:
    # GIVEN the same run exported to .pftrace and JSON
    run = runs[name]
    got = [s for s in decode(run["pftrace"].read_bytes())["slices"] if s[2] in SPAN_CATS]
    want = [s for s in chrome_slices(run["json"].read_bytes()) if s[2] in SPAN_CATS]
    # THEN every module span, its args included (flops, tflops as the same double,
    # flops_counted), is the same
    assert want and Counter(got) == Counter(want)
    assert any(dict(s[5]).get("tflops") for s in got)


def _merged_spans(path: Path) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Args of the hooktrace spans of a merged trace, by (cat, module, call, k-th)."""
    out: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    seen: Counter[tuple[str, str, int]] = Counter()
    for e in sorted(span_events(path), key=lambda e: e["ts"]):
        key = (e["cat"], e["args"]["module"], e["args"]["call"])
        out[(*key, seen[key])] = {k: e["args"].get(k) for k in (
            "flops", "tflops", "flops_counted")}
        seen[key] += 1
    return out


def test_merged_traces_carry_the_export_s_flop_args(runs, tmp_path: Path) -> None:
    # GIVEN a flops=True run recorded under torch.profiler, merged, and exported
    model, x = runs["gpt2"]["model"], runs["gpt2"]["x"]
    with hooktrace.trace(model, flops=True) as tr, torch.profiler.profile(
            activities=CPU) as prof:
        for _ in range(2):
            step(model, x)
            tr.step()
    prof.export_chrome_trace(str(tmp_path / "profiler.json"))
    merge_traces(tr, tmp_path / "profiler.json", tmp_path / "merged.json")
    tr.export_chrome(tmp_path / "export.json")
    # THEN its module spans have the export's FLOP args
    merged = _merged_spans(tmp_path / "merged.json")
    assert merged and merged == _merged_spans(tmp_path / "export.json")
    assert any(a["tflops"] for a in merged.values())
    # AND hooktrace.profile(..., trace_kwargs={"flops": True}) writes them too
    with hooktrace.profile(model, tmp_path / "p.json", activities=CPU,
                           trace_kwargs={"flops": True}):
        for _ in range(2):
            step(model, x)
    spans = span_events(tmp_path / "p.json")
    assert spans and all(isinstance(e["args"]["flops"], int) for e in spans)


def test_a_run_without_flops_exports_no_flop_args(runs, tmp_path: Path) -> None:
    model, x = runs["mlp"]["model"], runs["mlp"]["x"]
    with hooktrace.trace(model) as tr, torch.profiler.profile(activities=CPU) as prof:
        step(model, x)
    prof.export_chrome_trace(str(tmp_path / "profiler.json"))
    merge_traces(tr, tmp_path / "profiler.json", tmp_path / "merged.json")
    tr.export_chrome(tmp_path / "t.json")
    tr.export_perfetto(tmp_path / "t.pftrace")
    args = ([e["args"] for p in ("t.json", "merged.json") for e in span_events(tmp_path / p)]
            + [dict(s[5]) for s in decode((tmp_path / "t.pftrace").read_bytes())["slices"]])
    assert args and not any({"flops", "tflops", "flops_counted"} & set(a) for a in args)


def test_perfetto_reads_the_flop_args(runs, tmp_path: Path) -> None:
    # GIVEN flops=True exports (JSON, .pftrace, with autograd nodes) and a merged trace
    run = runs["gpt2"]
    src = run["json"].with_suffix(".htrace")
    assert main(["export", str(src), "-o", str(tmp_path / "nodes.json"), "--nodes"]) == 0
    model, x = run["model"], run["x"]
    with hooktrace.trace(model, flops=True) as tr, torch.profiler.profile(
            activities=CPU) as prof:
        step(model, x)
        step(model, x)
    prof.export_chrome_trace(str(tmp_path / "profiler.json"))
    merge_traces(tr, tmp_path / "profiler.json", tmp_path / "merged.json")
    files = [run["json"], run["pftrace"], tmp_path / "nodes.json", tmp_path / "merged.json"]
    tp = trace_processor()
    try:
        # THEN Perfetto's importer loses nothing
        perfetto_check(files, tp)
        # AND it has the args: every hooktrace span's flops, and the TFLOP/s as reals
        found = {}
        for path, prefix in ((run["json"], "args"), (run["pftrace"], "debug"),
                             (tmp_path / "merged.json", "args")):
            assert tp.load(path) is None
            rows = tp.query(
                "select s.category as cat, a.key as key, a.int_value as i, a.real_value as r "
                "from slice s join args a using (arg_set_id) "
                f"where a.key in ('{prefix}.flops', '{prefix}.tflops', "
                f"'{prefix}.flops_counted') and s.category like 'hooktrace.%'")
            n_spans = tp.query("select count(*) as n from slice where category in "
                               "('hooktrace.forward', 'hooktrace.backward')")[0]["n"]
            found[path] = (prefix, rows, n_spans)
    finally:
        tp.close()
    for path, (prefix, rows, n_spans) in found.items():
        keys = Counter(r["key"] for r in rows)
        assert keys[f"{prefix}.flops"] == n_spans > 0, path
        assert keys[f"{prefix}.tflops"] > 0 and keys[f"{prefix}.flops_counted"] > 0, path
        reals = [r["r"] for r in rows if r["key"] == f"{prefix}.tflops"]
        assert all(isinstance(v, float) and v > 0 for v in reals), path
        want = {e["args"]["flops"] for e in span_events(run["json"])}
        if path == run["json"] or path == run["pftrace"]:
            assert {r["i"] for r in rows if r["key"] == f"{prefix}.flops"} == want


def test_schedule_windows_number_their_own_root_calls(tmp_path: Path) -> None:
    # GIVEN hooktrace.profile with a schedule recording steps 2 and 5 (one window each),
    # the input's shape changing at step 5 (a new signature, counted in that window)
    model = Shared()
    sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=2)
    with hooktrace.profile(model, tmp_path / "w", schedule=sched, activities=CPU,
                           trace_kwargs={"flops": True}) as p:
        for i in range(6):
            step(model, torch.randn(2 if i < 5 else 3, 4))
            p.step()
    assert len(p.outputs) == 2
    first, second = (span_events(Path(o)) for o in sorted(p.outputs))
    # THEN the first window's call ran at a known signature: timed, not counted
    shared = lambda events: [e["args"] for e in events  # noqa: E731
                             if e["cat"] == SPAN_CATS[0] and e["args"]["module"] == "shared"]
    assert [a["flops"] for a in shared(first)] == [2 * 2 * 4 * 4] * 3
    assert all("tflops" in a and "flops_counted" not in a for a in shared(first))
    # AND the second window's call is the new signature's counted one
    assert [a["flops"] for a in shared(second)] == [2 * 3 * 4 * 4] * 3
    assert all(a.get("flops_counted") is True for a in shared(second))


def test_a_streamed_run_keeps_its_flops(tmp_path: Path) -> None:
    model, x = Shared(), torch.randn(2, 4)
    with hooktrace.trace(model, flops=True, out=tmp_path / "s.htrace"):
        for _ in range(2):
            step(model, x)
    run = hooktrace.load(tmp_path / "s.htrace")
    assert run.info["flops"]["calls"] == [0, 0]
    run.export_chrome(tmp_path / "s.json")
    shared = [e["args"] for e in span_events(tmp_path / "s.json")
              if e["cat"] == SPAN_CATS[0] and e["args"]["module"] == "shared"]
    assert [a["flops"] for a in shared] == [2 * 2 * 4 * 4] * 6
    assert sum(bool(a.get("flops_counted")) for a in shared) == 3


def test_a_ring_buffer_holds_the_newest_root_calls(tmp_path: Path) -> None:
    # GIVEN a ring buffer too small for the run: the first (counted) calls are gone
    model = Shared()
    with hooktrace.trace(model, flops=True, policy="ring", capacity=4096) as tr:
        for i in range(200):
            step(model, torch.randn(2 if i < 199 else 3, 4))  # the last call: a new shape
    assert tr.overwritten_events > 0
    tr.export_chrome(tmp_path / "r.json")
    roots = [e for e in span_events(tmp_path / "r.json")
             if e["cat"] == SPAN_CATS[0] and e["args"]["module"] == ""]
    # THEN the newest root calls have their own signature's FLOPs; only the last is counted
    assert len(roots) >= 2
    sigs = tr.info["flops"]["signatures"]
    assert [r["args"]["flops"] for r in roots] == (
        [sigs[0]["forward"][""]] * (len(roots) - 1) + [sigs[1]["forward"][""]])
    assert [bool(r["args"].get("flops_counted")) for r in roots] == [False] * (
        len(roots) - 1) + [True]
    row = {r["module"]: r for r in tr.summary().rows}[""]
    assert row["flops"] == pytest.approx(sum(r["args"]["flops"] for r in roots) / len(roots))
