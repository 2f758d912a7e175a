""".pftrace exports of real training steps, opened by Perfetto's own trace processor.

``perfetto_check`` must report no import error; then every slice Perfetto built is
compared with the Chrome export of the same run (row, name, category, exact ns, depth), by
querying the same trace processor.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from perfetto_check import TraceProcessor, perfetto_check, trace_processor
from pftrace_decode import chrome_slices
from test_perfetto import train

import hooktrace
from hooktrace.analysis._filters import Filters
from hooktrace.cli import main
from hooktrace.exporters.chrome import export_chrome
from models import ConvNet, tiny_llama


def perfetto_slices(tp: TraceProcessor, path: Path) -> list[tuple[str, str, str, int, int]]:
    """(row, name, category, start, end) of every thread-row and steps-row slice Perfetto
    built."""
    assert tp.load(path) is None
    rows = tp.query("select s.ts, s.dur, s.name, s.category as cat, "
                    "coalesce(tr.name, t.name) as row from slice s "
                    "join thread_track tr on s.track_id = tr.id join thread t using (utid)")
    # the "steps" row: a named child track of the process, not of a thread
    rows += tp.query("select s.ts, s.dur, s.name, s.category as cat, tr.name as row "
                     "from slice s join track tr on s.track_id = tr.id "
                     "where tr.name = 'steps'")
    return [(r["row"], r["name"], r["cat"], int(r["ts"]), int(r["ts"]) + int(r["dur"]))
            for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("pftrace")
    paths = {}
    for name, model, x in (("llama", tiny_llama().train(), torch.randint(0, 64, (2, 8))),
                           ("convnet", ConvNet().train(), torch.randn(2, 3, 8, 8))):
        with hooktrace.trace(model) as tr:
            train(model, x, steps=3)
        tr.save(out / f"{name}.htrace")
        paths[name] = out / f"{name}.htrace"
    return paths


@pytest.mark.parametrize("nodes", [False, True])
def test_pftrace_loads_cleanly_and_matches_the_json_slice_for_slice(runs, tmp_path, nodes):
    files = []
    for name, run in runs.items():
        # GIVEN a real run exported by the CLI both ways
        flag = ["--nodes"] if nodes else []
        assert main(["export", str(run), "-o", str(tmp_path / f"{name}.pftrace"), *flag]) == 0
        assert main(["export", str(run), "-o", str(tmp_path / f"{name}.json"), *flag]) == 0
        files.append(tmp_path / f"{name}.pftrace")
        # THEN it is at most half the JSON's size even on a tiny run
        assert (tmp_path / f"{name}.pftrace").stat().st_size < (
            tmp_path / f"{name}.json").stat().st_size / 2
    with trace_processor() as tp:
        # THEN Perfetto imports it with no error or data loss
        reports = perfetto_check(files, tp)
        assert {"hooktrace.backward", "hooktrace.autograd_unattributed"} <= set().union(
            *(r.categories for r in reports))
        # THEN Perfetto's slices are the JSON's, on rows of the same names
        for name in runs:
            want = [s[:5] for s in chrome_slices((tmp_path / f"{name}.json").read_bytes())]
            got = perfetto_slices(tp, tmp_path / f"{name}.pftrace")
            assert Counter(got) == Counter(want), name


def test_filters_on_a_real_run(runs, tmp_path):
    run = hooktrace.load(runs["llama"])
    spans = run.spans()
    span_cats = ("hooktrace.forward", "hooktrace.backward", "hooktrace.recompute")
    duration = (int(spans.end_ns.max()) - int(spans.start_ns.min())) / 1e9
    cases = {
        "depth": Filters(max_depth=2),
        "window": Filters(start=duration / 3, end=2 * duration / 3),
        "both": Filters(start=duration / 4, max_depth=3),
    }
    files = []
    for name, f in cases.items():
        run.export_perfetto(tmp_path / f"{name}.pftrace", nodes=True, start=f.start, end=f.end,
                            max_depth=f.max_depth)
        export_chrome(run, tmp_path / f"{name}.json", nodes=True, filters=f)
        files.append(tmp_path / f"{name}.pftrace")
    with trace_processor() as tp:
        perfetto_check(files, tp)
        got_by_case = {name: perfetto_slices(tp, tmp_path / f"{name}.pftrace") for name in cases}
    origin = min(int(spans.start_ns.min()), int(spans.nodes.start_ns.min()))
    for name, f in cases.items():
        got = got_by_case[name]
        want = [s[:5] for s in chrome_slices((tmp_path / f"{name}.json").read_bytes())]
        assert got and Counter(got) == Counter(want), name
        n_spans = sum(1 for s in got if s[2] in span_cats)
        assert 0 < n_spans < len(spans), name
        if f.start is not None:
            assert min(s[3] for s in got) >= origin + round(f.start * 1e9)
        if f.end is not None:
            assert max(s[4] for s in got) <= origin + round(f.end * 1e9)
        if f.max_depth is not None:
            # depth: the forward rows hold exactly the calls at depth 0..N in the window
            forward = [s for s in got if s[2] == "hooktrace.forward"]
            assert len(forward) <= int((spans.depth[spans.cat == 0] <= f.max_depth).sum())
            if f.start is None:
                assert len(forward) == int((spans.depth[spans.cat == 0] <= f.max_depth).sum())
