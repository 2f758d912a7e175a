"""Traces as data (issue #29) on synthetic runs: the schema, the tables against the
numpy views they come from, Parquet datasets of many ranks, the streamed export's
bounded memory, ``hooktrace query``, and the straggler tables on DuckDB equal to the
worker pool's."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import backward_trace, build_trace, gpu_trace, random_stream, set_gpu_spans

import hooktrace
from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")

REPO = Path(__file__).resolve().parents[2]


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_ranks", REPO / "benchmarks" / "ranks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 synthetic ranks (benchmarks/ranks.py's: 50 steps, rank 2 slow in layers.5 at
    step 7), ~4000 events each."""
    d = tmp_path_factory.mktemp("ranks")
    bench = _bench()
    for r in range(4):
        bench.write_rank(d / f"run.rank{r}.htrace", r, 4, 4000)
    return d


@pytest.fixture(scope="module")
def dataset(rank_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pq") / "tables"
    assert main(["export", str(rank_dir), "-o", f"{out}/"]) == 0
    return out


# -- the schema and the tables --------------------------------------------------------


def test_the_schema_is_versioned_int64_and_documented() -> None:
    from hooktrace.data.schema import ALL_TABLES, SCHEMA_VERSION, TABLES, describe, schema

    from hooktrace.data import schema as declared

    assert TABLES == ("spans", "steps", "modules", "memory", "numerics", "runs", "gpu")
    # (the names are hooktrace._input's, below the tables layer, issue #48: the
    # schema declares the columns of each, in that order)
    assert tuple(declared._TABLES) == TABLES
    for t in ALL_TABLES:
        s = schema(t)
        assert s.metadata[b"hooktrace.schema_version"] == str(SCHEMA_VERSION).encode()
        assert s.names[:2] == ["rank", "window"]
        for f in s:
            assert not pa.types.is_unsigned_integer(f.type), (t, f)
            if f.name.endswith("_ns") or (f.name.endswith("_bytes") and t == "aggregates"):
                assert f.type == pa.int64(), (t, f)
            assert (f.metadata or {}).get(b"doc"), f"{t}.{f.name} has no doc"
    doc = (REPO / "docs" / "schema.md").read_text()
    for t in ALL_TABLES:  # docs/schema.md lists every column of every table
        for f in schema(t):
            assert f"| `{f.name}` |" in doc.split(f"### {t}")[1].split("###")[0], (t, f.name)
    assert describe().count("###") == len(ALL_TABLES) == len(TABLES) + 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spans_table_is_the_spans_of_the_run(seed: int) -> None:
    from hooktrace.data.tables import to_arrow

    run = backward_trace(seed) if seed == 3 else build_trace(random_stream(seed))
    spans = run.spans()
    t = to_arrow(run, "spans")
    assert t.num_rows == len(spans)
    assert t.column("dur_ns").to_numpy().tolist() == spans.duration_ns.tolist()
    assert t.column("self_ns").to_numpy().tolist() == spans.self_ns.tolist()
    assert t.column("phase").to_pylist() == [("forward", "backward", "recompute")[c]
                                             for c in spans.cat.tolist()]
    assert t.column("module").to_pylist() == [run.modules[m][0] for m in spans.module.tolist()]
    assert t.column("unfinished").to_pylist() == ((spans.flags & 2) != 0).tolist()
    assert t.column("parent").null_count == int(np.count_nonzero(spans.parent < 0))
    # nothing recorded the extras: null, not zero
    for name in ("gpu_dur_ns", "flops", "absmax", "mem_peak_bytes", "in_shapes"):
        assert t.column(name).null_count == t.num_rows


def test_to_arrow_and_to_pandas_of_a_result() -> None:
    run = build_trace(random_stream(4), rank=3)
    t = run.to_arrow("spans")
    assert set(t.column("rank").to_pylist()) == {3}
    df = run.to_pandas("modules")
    assert df["module"].tolist() == [m for m, _ in run.modules]
    with pytest.raises(hooktrace.errors.HooktraceError, match="no table 'spanz'"):
        run.to_arrow("spanz")


def test_export_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    # One process per measurement: Arrow's pool peak (max_memory) is the process's, so
    # each run starts at 0. The run holds ~400k spans; its whole spans table in Arrow is
    # ~50 MB. Written in batches of 4096 rows, Arrow never holds more than a few batches.
    code = r"""
import sys, pyarrow as pa
sys.path.insert(0, sys.argv[3])
from ranks import write_rank
from hooktrace.reading import load
from hooktrace.data.parquet import write_table
from hooktrace.data.tables import to_arrow
write_rank(sys.argv[1] + ".htrace", 0, 1, 800_000)
run = load(sys.argv[1] + ".htrace", mmap=True)
rows = write_table(run, "spans", sys.argv[1] + ".parquet", batch_rows=int(sys.argv[2]))
peak = pa.default_memory_pool().max_memory()
print(rows, peak, to_arrow(run, "spans").nbytes)
"""
    out = {}
    for batch in (4096, 1 << 30):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"b{batch}"), str(batch),
                            str(REPO / "benchmarks")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out[batch] = [int(x) for x in r.stdout.split()]
    rows, small_peak, whole_table = out[4096]
    _, big_peak, _ = out[1 << 30]
    assert rows > 390_000 and whole_table > 30_000_000
    assert small_peak < whole_table / 8, out   # bounded by the batch, not the run
    assert big_peak > 4 * small_peak, out        # (the measure sees a whole-run batch)
    assert pq.read_metadata(tmp_path / "b4096.parquet").num_row_groups == -(-rows // 4096)


# -- datasets of many ranks -------------------------------------------------------------


def test_a_rank_directory_is_one_hive_dataset(rank_dir: Path, dataset: Path) -> None:
    import pyarrow.dataset as ds

    assert sorted(p.name for p in (dataset / "spans").iterdir()) == [f"rank={r}" for r in range(4)]
    d = ds.dataset(dataset / "spans", partitioning="hive")
    assert sorted(set(d.to_table(columns=["rank"]).column("rank").to_pylist())) == [0, 1, 2, 3]
    per_rank = duckdb.sql(f"SELECT rank, count(*), sum(dur_ns) FROM read_parquet("
                          f"'{dataset}/spans/**/*.parquet', hive_partitioning=true) "
                          "GROUP BY rank ORDER BY rank").fetchall()
    for rank, n, total in per_rank:
        run = hooktrace.load(rank_dir / f"run.rank{rank}.htrace")
        assert n == len(run.spans()) and total == int(run.spans().duration_ns.sum())
    assert len(pq.read_table(dataset / "runs").to_pylist()) == 4


def test_windows_are_a_window_partition_in_step_order(tmp_path: Path) -> None:
    bench = _bench()
    src = tmp_path / "windows"
    src.mkdir()
    bench.write_rank(tmp_path / "whole.htrace", 0, 1, 2000)
    whole = hooktrace.load(tmp_path / "whole.htrace")
    for first in (30, 10):  # written out of step order
        info = dict(whole.info, window={"first_step": first, "last_step": first + 4,
                                        "complete": True})
        info.pop("rank"), info.pop("world_size")
        hooktrace.TraceResult(whole.events, whole.modules, [], whole.clock, info).save(
            src / f"run.steps{first}.htrace")
    out = tmp_path / "spans.parquet"
    assert main(["export", str(src), "-o", str(out)]) == 0
    runs = sorted((p.parent.name, p.name) for p in out.rglob("*.parquet"))
    assert [w for w, _ in runs] == ["window=0", "window=1"]
    from hooktrace.data.engine import query

    first = query(str(src), 'SELECT "window", min(first_step) AS f FROM runs GROUP BY ALL '
                            'ORDER BY 1').to_pylist()
    assert first == [{"window": 0, "f": 10}, {"window": 1, "f": 30}]
    assert query(str(out), 'SELECT DISTINCT "window" FROM spans ORDER BY 1').to_pylist() == [
        {"window": 0}, {"window": 1}]


def test_straggler_tables_on_duckdb_equal_the_pools(rank_dir: Path, dataset: Path) -> None:
    """The straggler tables of a Parquet export (DuckDB over the dataset) equal the
    worker pool's from the ``.htrace`` files themselves."""
    from hooktrace.data.paths import analyze

    def doc(report: Any) -> dict[str, Any]:
        d = json.loads(report.to_json())
        for r in d["ranks"]:
            r["path"] = Path(r["path"]).name
        return d

    pool = doc(analyze([rank_dir]))
    other = doc(analyze([dataset]))
    assert other == pool
    assert [(s["rank"], s["module"], s["step"]) for s in pool["stragglers"]][:1] == [
        (2, "layers.5", 7)]


def test_a_verb_asks_what_a_path_is_once(dataset: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """Issue #48: the straggler tables, diff and query of a Parquet export classify each
    path once (hooktrace.analysis.inputs.resolve): the engine's tables are a view of that
    answer, not a second look at the path."""
    import os

    import hooktrace.analysis.inputs as inputs
    from hooktrace.analysis import diff, rankset
    from hooktrace.data import engine, paths

    asked: list[str] = []  # each look at a path: resolve, or find_source of a bare path
    real, real_find = inputs.resolve, engine.find_source

    def counting(path: Any) -> Any:
        asked.append(os.fspath(path))
        return real(path)

    def finding(path: Any) -> Any:
        if not isinstance(path, inputs.Input):
            asked.append(os.fspath(path))
            path = real(path)
        return real_find(path)

    for module in (inputs, rankset, diff, engine, paths):
        monkeypatch.setattr(module, "resolve", counting)
    monkeypatch.setattr(engine, "find_source", finding)
    paths.analyze([dataset])
    assert asked == [str(dataset)]
    asked.clear()
    engine.query(dataset, "SELECT count(*) FROM spans")
    assert asked == [str(dataset)]
    asked.clear()
    paths.compare_paths(str(dataset), str(dataset), workers=1)
    assert asked == [str(dataset)] * 2
    # the engine's tables follow resolve's answer
    with pytest.raises(engine.QueryError, match="^gone$"):
        real_find(inputs.Input(str(dataset), inputs.Kind.MISSING, problem="gone"))


def _gpu_ranks() -> list[Any]:
    """3 synthetic CUDA ranks (conftest.gpu_trace: host spans, device intervals and a
    kernel site without a host span), rank 2's fc1 forward 3 ms on the device."""
    return [gpu_trace(fc1_gpu_ns=f, steps=3, rank=r, world_size=3)
            for r, f in ((0, 400_000), (1, 420_000), (2, 3_400_000))]


def test_gpu_table_is_the_runs_device_intervals() -> None:
    from hooktrace.data.tables import to_arrow

    run = _gpu_ranks()[0]
    gpu = run.gpu_spans()
    t = to_arrow(run, "gpu").to_pydict()
    assert len(t["dur_ns"]) == len(gpu) == 21
    assert t["dur_ns"] == gpu.duration_ns.tolist() and t["self_ns"] == gpu.self_ns.tolist()
    kernels = [i for i, s in enumerate(gpu.span.tolist()) if s < 0]
    assert kernels and all(t["timing"][i] == "kernels" and t["span"][i] is None
                           and t["module"][i] == "attn" for i in kernels)
    assert sorted(set(t["step"])) == [0, 1, 2]
    assert to_arrow(gpu_trace(gpu=False), "gpu").num_rows == 0


def test_straggler_gpu_phases_on_sql_equal_the_pools() -> None:
    """The SQL reduction (DuckDB here; Spark runs the same STRAGGLER_SQL) gives the pool
    path's "gpu fwd"/"gpu bwd" rows, per-step entries and stragglers, exactly."""
    from hooktrace.data.engine import straggler_tables
    from hooktrace.data.schema import TABLES, file_schema
    from hooktrace.data.tables import Where, batches
    from hooktrace.analysis.rankset import RankFile
    from hooktrace.analysis.stragglers import _combine, reduce_rank, summary_from_tables

    runs = _gpu_ranks()
    files = [RankFile.from_trace(f"run.rank{r}.htrace", run) for r, run in enumerate(runs)]
    pool = json.loads(_combine([reduce_rank(run, f) for run, f in zip(runs, files)], [], 0.5,
                               1_000_000).to_json())
    con = duckdb.connect()
    for t in TABLES:
        bs = [b for r, run in enumerate(runs)
              for b in batches(run, t, Where(rank=r, path=f"run.rank{r}.htrace"))]
        con.register(t, pa.Table.from_batches(bs, schema=file_schema(t, partitioned=False)))
    sql = json.loads(summary_from_tables([straggler_tables(con)]).to_json())
    assert sql == pool
    phases = {(r["module"], r["phase"]) for r in pool["rows"]}
    assert {("fc1", "gpu fwd"), ("attn", "gpu fwd"), ("fc1", "gpu bwd")} <= phases
    assert {(s["rank"], s["module"], s["phase"]) for s in pool["stragglers"]} == {
        (2, "fc1", "gpu fwd")}


def _same_parts(a: Any, b: Any) -> None:
    from dataclasses import fields

    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            assert list(x) == list(y), f.name  # (the same keys, in the same order)
            for k in x:
                if isinstance(x[k], np.ndarray):
                    assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), (f.name, k)
                else:
                    assert x[k] == y[k], (f.name, k, x[k], y[k])
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, (f.name, x, y)


def _sql_part(run: Any, keep_calls: bool) -> Any:
    """One run's diff numbers from the SQL that ``hooktrace diff`` runs over a Parquet
    export (hooktrace.data.engine.diff_tables), over the run's own tables."""
    from hooktrace.analysis._diff_parts import part_from_tables
    from hooktrace.analysis.device_time import gpu_recorded
    from hooktrace.data.engine import diff_tables, split_files
    from hooktrace.data.tables import to_arrow

    gpu = gpu_recorded(run)
    con = duckdb.connect(config={"threads": 1})
    try:
        for t in ("spans", "steps", "gpu") if gpu else ("spans", "steps"):
            con.register(t, to_arrow(run, t))
        # (one file: no rank or window, r = w = -1)
        t = diff_tables(con, gpu=gpu, calls=[(-1, -1)] if keep_calls else [])
    finally:
        con.close()
    return part_from_tables(split_files(t).get((-1, -1), {}), run.info, gpu, keep_calls)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_diff_numbers_on_duckdb_equal_numpys(seed: int) -> None:
    """hooktrace.analysis.diff's per-file numbers (p50s, IQRs, per-step columns, whole-run sums,
    every call when pooled, device time) from the SQL a Parquet export is diffed with
    equal numpy's exactly, on damaged multi-thread streams, backward spans with eval
    calls, and CUDA runs with device time (a kernel site without host span, one step,
    none)."""
    from hooktrace.analysis._diff_parts import trace_part

    runs = [build_trace(random_stream(seed)), build_trace(random_stream(seed, p_node=0.2)),
            backward_trace(seed)]
    if seed == 1:
        runs += [gpu_trace(), gpu_trace(steps=1), gpu_trace(gpu=False)]
    for run in runs:
        for keep_calls in (False, True):
            want = trace_part(run, keep_calls)
            assert want.types  # (something to compare)
            _same_parts(want, _sql_part(run, keep_calls))


# -- the command line -------------------------------------------------------------------


def test_query_prints_a_table_csv_json_and_writes_parquet(
        rank_dir: Path, dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = ("SELECT rank, count(*) AS n, sum(dur_ns) AS ns FROM spans "
           "GROUP BY rank ORDER BY rank")
    capsys.readouterr()
    assert main(["query", str(rank_dir), sql]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["rank", "n", "ns"] and text[-1] == "(4 rows)"
    assert main(["query", str(dataset), sql, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3] and isinstance(rows[0]["ns"], int)
    assert main(["query", str(rank_dir / "run.rank0.htrace"), sql, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == '"rank","n","ns"'
    out = tmp_path / "r.parquet"
    assert main(["query", str(dataset), sql, "-o", str(out)]) == 0
    assert pq.read_table(out).to_pylist() == rows


def test_query_errors_are_one_line(rank_dir: Path, capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path) -> None:
    assert main(["query", str(rank_dir), "SELECT nope FROM spans"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the query failed" in err and "nope" in err
    assert main(["query", str(tmp_path / "missing"), "SELECT 1"]) == 1
    assert "no such file" in capsys.readouterr().err
    # a corrupt rank among others: a warning naming it, the others queried
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in rank_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "run.rank3.htrace").write_bytes(b"HTRACE\0\0garbage")
    assert main(["query", str(bad), "SELECT count(DISTINCT rank) AS n FROM spans", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [{"n": 3}]
    assert out.err.startswith("hooktrace: warning: ") and "run.rank3.htrace" in out.err


@pytest.mark.parametrize("verb", ["query", "export"])
def test_without_the_data_extra_a_verb_says_what_to_install(rank_dir: Path, tmp_path: Path,
                                                             verb: str) -> None:
    code = ("import sys\nsys.modules['pyarrow'] = None\nsys.modules['duckdb'] = None\n"
            "from hooktrace.cli import main\nsys.exit(main(sys.argv[1:]))")
    argv = (["query", str(rank_dir), "SELECT 1"] if verb == "query" else
            ["export", str(rank_dir / "run.rank0.htrace"), "-o", str(tmp_path / "s.parquet")])
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "pip install hooktrace[data]" in r.stderr
    assert not (tmp_path / "s.parquet").exists()


def test_export_refusals(rank_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                         ) -> None:
    one = str(rank_dir / "run.rank0.htrace")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    cases = [
        (["export", one, "-o", f"{full}/"], "not empty"),
        (["export", one, "-o", str(tmp_path / "s.parquet"), "--steps", "1:2"], "hooktrace query"),
        (["export", one, "-o", str(tmp_path / "s.parquet"), "--table", "nodes"], "no such table"),
        (["merge", one, one, "-o", str(tmp_path / "m.parquet")], "Chrome JSON only"),
        (["merge-ranks", str(rank_dir), "-o", str(tmp_path / "m.parquet")], "Chrome JSON"),
    ]
    for argv, words in cases:
        capsys.readouterr()
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "m.parquet").exists()
    assert main(["export", one, "-o", str(tmp_path / "steps.parquet"), "--table", "steps"]) == 0
    assert pq.read_table(tmp_path / "steps.parquet").num_rows == 50


def test_a_file_that_is_not_parquet_is_one_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A .parquet that is text, or empty, given to query or summary (alone, or inside a
    directory): hooktrace's one line naming the file, not pyarrow's traceback."""
    (tmp_path / "text.parquet").write_text("not parquet")
    (tmp_path / "dir" / "rank=0").mkdir(parents=True)
    (tmp_path / "dir" / "rank=0" / "part.parquet").write_bytes(b"")
    for path, name in ((tmp_path / "text.parquet", "text.parquet"),
                       (tmp_path / "dir", "part.parquet")):
        for argv in (["query", str(path), "SELECT count(*) FROM spans"], ["summary", str(path)]):
            capsys.readouterr()
            assert main(argv) == 1, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and name in err[0] and "not a readable Parquet file" in err[0], (
                argv, err)


def test_single_run_verbs_import_no_data_packages(rank_dir: Path, tmp_path: Path) -> None:
    one = str(rank_dir / "run.rank0.htrace")
    code = ("import json, sys\nfrom hooktrace.cli import main\n"
            "for argv in json.loads(sys.argv[1]):\n    assert main(argv) == 0, argv\n"
            "print(json.dumps([m for m in ('pyarrow', 'duckdb', 'pyspark', 'pandas') "
            "if m in sys.modules]))")
    verbs = [["summary", one], ["summary", one, "--json"], ["export", one, "-o",
             str(tmp_path / "a.json")], ["--help"] and ["summary", one, "--steps"]]
    r = subprocess.run([sys.executable, "-c", code, json.dumps(verbs)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == []


# -- the documented queries ---------------------------------------------------------------


def _doc_queries() -> list[str]:
    text = (REPO / "docs" / "data.md").read_text()
    return [block.split("```")[0].strip() for block in text.split("```sql")[1:]]


def test_docs_have_the_three_queries() -> None:
    assert len(_doc_queries()) >= 3


@pytest.mark.parametrize("i", range(3))
def test_each_documented_query_runs(i: int, rank_dir: Path, dataset: Path) -> None:
    from hooktrace.data.engine import query

    sql = _doc_queries()[i]
    a = query(str(rank_dir), sql)
    b = query(str(dataset), sql)
    assert a.to_pylist() == b.to_pylist()
    # (these ranks have no attention backward: tests/integration/test_data_runs.py runs the
    # first query on a torchrun job's, with rows)
    assert a.num_rows > 0 or i == 0


def test_gpu_time_lights_up_from_the_gpu_spans_contract() -> None:
    """Issue #28's GpuSpans (empty until its recording lands): per span, the device time
    of its intervals, null for the spans it did not time."""
    from hooktrace.data.tables import to_arrow
    from hooktrace.reading import GpuSpans

    run = backward_trace(3)
    n = len(run.spans())
    assert n >= 3
    set_gpu_spans(run, GpuSpans({  # spans 0 and 2 timed, span 0 by two intervals
        "start_ns": np.array([0, 50, 10]), "end_ns": np.array([40, 70, 15]),
        "self_ns": np.array([30, 20, 5]), "span": np.array([0, 0, 2]),
        "module": np.zeros(3, np.uint32), "cat": np.zeros(3, np.uint8),
        "device": np.zeros(3, np.int16), "stream": np.full(3, 7)}))
    t = to_arrow(run, "spans")
    dur, self_ = t.column("gpu_dur_ns").to_pylist(), t.column("gpu_self_ns").to_pylist()
    assert dur[:3] == [60, None, 5] and self_[:3] == [50, None, 5]
    assert dur[3:] == [None] * (n - 3)
