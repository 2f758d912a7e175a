"""Traces as data (issue #29) on real recordings: the Parquet ``spans`` table agrees
exactly with the Chrome export and with ``summary --json``; a torchrun (gloo) job of 4
ranks gives the same per-rank, per-module totals on DuckDB and on Spark, and the same
straggler tables on DuckDB, Spark and the worker pool."""

from __future__ import annotations

import gzip
import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model trained 3 steps (forward + backward) with eval calls in between."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 16),
                                                                     nn.Tanh()), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    with hooktrace.trace(model) as tr:
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                model(x)
    path = tmp_path_factory.mktemp("run") / "run.htrace"
    tr.result.save(path)
    return path


def _chrome_cats(run_file: Path, tmp_path: Path) -> Counter[Any]:
    chrome = tmp_path / "run.json.gz"
    assert main(["export", str(run_file), "-o", str(chrome)]) == 0
    doc = json.loads(gzip.decompress(chrome.read_bytes()))
    return Counter(e.get("cat") for e in doc["traceEvents"] if e.get("ph") == "X")


def _summary_sums(run_file: Path, capsys: pytest.CaptureFixture[str]
                  ) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    """summary --json as (module, phase, mode) -> (calls, total_ns, self_ns)."""
    capsys.readouterr()
    assert main(["summary", str(run_file), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    expected: dict[tuple[str, str, str], tuple[int, int, int]] = {}
    for r in rows:
        if r["module"] == "<unattributed>":  # autograd nodes of no module call: not spans
            continue
        if r["calls"]:
            expected[(r["module"], "forward", r["mode"])] = (r["calls"], r["total_ns"],
                                                             r["self_ns"])
        if r["bwd_calls"]:
            expected[(r["module"], "backward", r["mode"])] = (r["bwd_calls"], r["bwd_total_ns"],
                                                              r["bwd_self_ns"])
    return expected


def _parquet_sums(spans: Any) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    got: dict[tuple[str, str, str], tuple[int, int, int]] = {}
    for r in spans.select(["module", "phase", "mode", "dur_ns", "self_ns"]).to_pylist():
        key = (r["module"], r["phase"], r["mode"])
        n, total, self_ = got.get(key, (0, 0, 0))
        got[key] = (n + 1, total + r["dur_ns"], self_ + r["self_ns"])
    return got


def test_parquet_spans_agree_with_the_chrome_export_and_the_summary(
        run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spans.parquet"
    assert main(["export", str(run_file), "-o", str(out)]) == 0
    spans = pq.read_table(out)
    meta = pq.read_metadata(out).metadata
    assert meta[b"hooktrace.schema_version"] == b"1" and meta[b"hooktrace.table"] == b"spans"
    # row count = the forward + backward X events of the Chrome export
    cats = _chrome_cats(run_file, tmp_path)
    assert cats["hooktrace.backward"] > 0 and cats["hooktrace.forward"] > 0
    assert spans.num_rows == cats["hooktrace.forward"] + cats["hooktrace.backward"]
    # per (module, phase, mode): row count, sum(dur_ns), sum(self_ns) = summary --json's
    # calls, total and self, exactly
    expected = _summary_sums(run_file, capsys)
    got = _parquet_sums(spans)
    assert {k[2] for k in got} == {"train", "eval"}
    assert got == expected
    totals = {k: v[1] for k, v in expected.items()}
    # the same through TraceResult and DuckDB
    run = hooktrace.load(run_file)
    assert run.to_arrow("spans").num_rows == spans.num_rows
    df = run.to_pandas("spans")
    assert int(df["dur_ns"].sum()) == sum(totals.values())
    con = duckdb.connect()
    con.register("spans", spans)
    total = con.sql("SELECT module, phase, mode, sum(dur_ns) FROM spans GROUP BY ALL").fetchall()
    assert {(m, p, md): int(s) for m, p, md, s in total} == totals


@pytest.fixture(scope="module")
def compiled_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Embedding -> Dropout -> LayerNorm -> Linear compiled whole, trained 3 steps: a
    compile or two (forward; a lazy backward), kernel-derived rows."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(32, 16), nn.Dropout(0.1), nn.LayerNorm(16),
                        nn.Linear(16, 32))
    fn = torch.compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randint(0, 32, (4, 8))
    # (without Inductor's FX graph cache: a graph compiled before in this process or
    # machine would make the backward's lazy compile a cache lookup, recorded as none)
    with warnings.catch_warnings(), torch._inductor.config.patch(fx_graph_cache=False):
        warnings.simplefilter("ignore")
        with hooktrace.trace(fn) as tr:
            for _ in range(3):
                fn(x).sum().backward()
                opt.step()
                opt.zero_grad()
    path = tmp_path_factory.mktemp("compiled") / "run.htrace"
    tr.result.save(path)
    return path


def test_parquet_spans_of_a_compiled_run_agree_with_the_summary(
        compiled_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spans.parquet"
    assert main(["export", str(compiled_file), "-o", str(out)]) == 0
    spans = pq.read_table(out)
    # calls, total and self per (module, phase, mode) = the summary's, exactly: compile
    # time is the <torch.compile> rows' (out of the root's self), a kernel-derived row
    # lasts its kernels' summed time
    expected = _summary_sums(compiled_file, capsys)
    got = _parquet_sums(spans)
    assert ("<torch.compile>", "forward", "train") in got
    # the lazy backward compile (AOTAutograd's, in the first backward pass) is backward's
    assert ("<torch.compile>", "backward", "train") in got
    assert any(k[0] != "" and k[0] != "<torch.compile>" for k in got)  # kernel-derived rows
    assert got == expected
    rows = spans.to_pylist()
    compiles = hooktrace.load(compiled_file).info["compiles"]
    comp = [r for r in rows if r["timing"] == "compile"]
    assert len(comp) == len(compiles) >= 1
    assert sorted(r["dur_ns"] for r in comp) == sorted(c[1] - c[0] for c in compiles)
    assert all(r["module"] == "<torch.compile>" and r["slot"] == -1 and r["span"] is None
               and r["parent"] is not None and r["self_ns"] == r["dur_ns"] for r in comp)
    # a compile's parent (the span it ran in) has it out of its self time: the root's
    # forward self is less than its forward time less its children's
    kern = [r for r in rows if r["timing"] == "kernels"]
    assert kern and all(0 < r["dur_ns"] <= r["end_ns"] - r["start_ns"] for r in kern)
    by_span = {r["span"]: r for r in rows if r["timing"] == "measured"}
    for r in comp:
        parent = by_span[r["parent"]]
        assert parent["start_ns"] <= r["start_ns"] and r["end_ns"] <= parent["end_ns"]
        assert r["phase"] == parent["phase"]  # a compile's phase is its span's
        assert parent["self_ns"] < parent["dur_ns"] - r["dur_ns"] + 1
    # Chrome: its forward + backward slices are the measured rows (compiles have no
    # slice; kernels have one slice per kernel run, hooktrace.kernel)
    cats = _chrome_cats(compiled_file, tmp_path)
    measured = [r for r in rows if r["timing"] == "measured"
                and r["phase"] in ("forward", "backward")]
    assert len(measured) == cats["hooktrace.forward"] + cats["hooktrace.backward"] > 0
    assert cats["hooktrace.kernel"] > 0
    # and DuckDB sums the same
    con = duckdb.connect()
    con.register("spans", spans)
    q = con.sql("SELECT module, phase, mode, count(*), sum(dur_ns), sum(self_ns) "
                "FROM spans GROUP BY ALL").fetchall()
    assert {(m, p, md): (int(c), int(d), int(s)) for m, p, md, c, d, s in q} == expected


@pytest.mark.parametrize("which", ["run_file", "compiled_file"])
def test_summary_of_a_one_run_export_is_the_summary_of_its_trace(
        which: str, request: pytest.FixtureRequest, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``hooktrace summary X.parquet`` / ``summary DIR/`` of one run's export: the rows of
    ``summary run.htrace`` (key for key, in the same order), but the ones an export
    cannot hold, and the same step statistics; the footer says what is left out."""
    import math

    trace = request.getfixturevalue(which)
    capsys.readouterr()
    assert main(["summary", str(trace), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    keep = [r for r in want["rows"] if r["module"] != "<unattributed>" and not r.get("fused")]
    assert any(r["mode"] == "eval" for r in keep) or which == "compiled_file"
    assert any(r["timing"] == "kernels" for r in keep) or which == "run_file"
    for out, args in ((tmp_path / "one.parquet", []), (tmp_path / "tables", [])):
        assert main(["export", str(trace), "-o", str(out) + ("/" if out.suffix == "" else ""),
                     *args]) == 0
        capsys.readouterr()
        assert main(["summary", str(out), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert [(r["module"], r["mode"]) for r in got["rows"]] == [
            (r["module"], r["mode"]) for r in keep], out
        for g, w in zip(got["rows"], keep, strict=True):
            assert g.keys() == w.keys()
            for k, v in w.items():
                if k in ("step_p50_ns", "step_p99_ns") and out.suffix == ".parquet":
                    continue  # a spans-only file has no steps table
                if isinstance(v, float):  # (DuckDB's quantile_cont: the last bit may differ)
                    assert math.isclose(g[k], v, rel_tol=1e-12), (out, g["module"], k)
                else:
                    assert g[k] == v, (out, g["module"], k)
        if out.suffix == "":
            for k in ("steps", "compile_steps", "step_p50_ns", "step_p99_ns",
                      "dropped_events", "overwritten_events"):
                assert got["counts"][k] == want["counts"][k], k
        assert main(["summary", str(out)]) == 0
        text = capsys.readouterr().out
        assert "from a Parquet export: no <unattributed> autograd rows" in text
    # what only the .htrace holds: one line, no traceback
    assert main(["summary", str(tmp_path / "tables"), "--flops"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--flops" in err[0] and "hooktrace query" in err[0]


def test_every_table_in_a_directory_and_unsigned_types_nowhere(run_file: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "tables"
    assert main(["export", str(run_file), "-o", f"{out}/"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"{t}.parquet" for t in
                           ("spans", "steps", "modules", "memory", "numerics", "runs", "gpu"))
    for f in out.iterdir():
        schema = pq.read_schema(f)
        for field in schema:
            t = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
            assert not pa.types.is_unsigned_integer(t), (f.name, field)
    steps = pq.read_table(out / "steps.parquet").to_pylist()
    assert [s["step"] for s in steps if s["complete"]] == [0, 1, 2]
    runs = pq.read_table(out / "runs.parquet").to_pylist()
    assert len(runs) == 1 and runs[0]["path"] == str(run_file)


# -- many ranks: DuckDB, Spark, the pool --------------------------------------------


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-rank DDP job under torchrun (gloo), rank 2 slow in ``slow`` at step 1."""
    from test_ranks import torchrun

    out = tmp_path_factory.mktemp("ddp4")
    torchrun(out, "ddp", "--steps", "3", "--slow-rank", "2", "--slow-steps", "1", nproc=4)
    assert len(list(out.rglob("*.htrace"))) == 4
    return out


@pytest.fixture(scope="module")
def four_ranks_parquet(four_ranks: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pq") / "tables"
    assert main(["export", str(four_ranks), "-o", f"{out}/"]) == 0
    return out


@pytest.fixture(scope="module")
def spark() -> Any:
    pytest.importorskip("pyspark", reason="the spark extra (pyspark) is not installed")
    from hooktrace.data.spark import java_missing, session

    why = java_missing()
    if why is not None:
        pytest.skip(why)
    s = session("local[2]")
    yield s
    s.stop()


def test_the_dataset_reads_as_is_in_pyarrow_and_duckdb(four_ranks_parquet: Path) -> None:
    import pyarrow.dataset as ds

    d = ds.dataset(four_ranks_parquet / "spans", partitioning="hive")
    ranks = sorted(set(d.to_table(columns=["rank"]).column("rank").to_pylist()))
    assert ranks == [0, 1, 2, 3]
    n = duckdb.sql(f"SELECT count(*), count(DISTINCT rank) FROM read_parquet("
                   f"'{four_ranks_parquet}/spans/**/*.parquet', hive_partitioning=true)"
                   ).fetchall()
    assert n == [(d.count_rows(), 4)]


def test_duckdb_and_spark_give_identical_per_rank_module_totals(
        four_ranks: Path, four_ranks_parquet: Path, spark: Any) -> None:
    from hooktrace.data.engine import MODULE_TOTALS_SQL, connect
    from hooktrace.data.spark import module_totals, register, spark_summary
    from hooktrace.data.paths import analyze

    on_duckdb = connect(four_ranks).sql(MODULE_TOTALS_SQL).to_arrow_table().to_pylist()
    on_parquet = connect(four_ranks_parquet).sql(MODULE_TOTALS_SQL).to_arrow_table().to_pylist()
    register(spark, four_ranks_parquet)
    on_spark = module_totals(spark).to_pylist()
    assert {r["rank"] for r in on_duckdb} == {0, 1, 2, 3}
    assert any(r["module"].endswith("slow") for r in on_duckdb)  # (module.slow under DDP)
    assert on_spark == on_duckdb == on_parquet
    # the straggler tables: Spark = DuckDB over the Parquet export = the worker pool
    pool = json.loads(analyze([four_ranks]).to_json())
    for r in pool["ranks"]:
        r.pop("path")
    for report in (spark_summary(spark), analyze([four_ranks_parquet])):
        doc = json.loads(report.to_json())
        for r in doc["ranks"]:
            r.pop("path")
        assert doc == pool
    slow = [s for s in pool["stragglers"] if (s["module"] or "").endswith("slow")]
    # (rank 2's 30 ms sleep; on a busy machine another rank preempted inside the module
    # can be flagged too)
    assert (2, 1) in [(s["rank"], s["step"]) for s in slow]


def test_query_on_spark_from_the_command_line(four_ranks_parquet: Path, spark: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT rank, count(*) AS n FROM spans GROUP BY rank ORDER BY rank"
    capsys.readouterr()
    assert main(["query", str(four_ranks_parquet), sql, "--engine", "spark", "--json"]) == 0
    on_spark = json.loads(capsys.readouterr().out)
    assert main(["query", str(four_ranks_parquet), sql, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == on_spark and len(on_spark) == 4


def test_summary_of_a_parquet_dataset_is_the_summary_of_its_rank_files(
        four_ranks: Path, four_ranks_parquet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["summary", str(four_ranks), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["summary", str(four_ranks_parquet), "--json"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["rows"] == b["rows"] and a["stragglers"] == b["stragglers"]


def test_the_documented_queries_on_duckdb_and_spark(four_ranks: Path, four_ranks_parquet: Path,
                                                    spark: Any) -> None:
    from hooktrace.data.engine import query
    from hooktrace.data.spark import query as spark_query

    text = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    queries = [b.split("```")[0].strip() for b in text.split("```sql")[1:]]
    assert len(queries) == 3
    # this job has 3 steps (0-2): the first query's steps 1000-2000 become 0-2
    queries[0] = queries[0].replace("BETWEEN 1000 AND 2000", "BETWEEN 0 AND 2")
    for sql in queries:
        on_files = query(str(four_ranks), sql).to_pylist()
        on_parquet = query(str(four_ranks_parquet), sql).to_pylist()
        on_spark = spark_query(spark, four_ranks_parquet, sql).to_pylist()
        assert on_files and on_files == on_parquet, sql
        assert len(on_spark) == len(on_files), sql
        for a, b in zip(on_spark, on_files):
            assert a.keys() == b.keys()
            for k in a:  # (floats: the same to rounding)
                if isinstance(b[k], float):
                    assert a[k] == pytest.approx(b[k], rel=1e-12), (sql, k)
                else:
                    assert a[k] == b[k], (sql, k)


def test_the_extras_are_columns_where_recorded(tmp_path: Path) -> None:
    """flops, shapes, numerics and memory recorded: their spans columns are filled for the
    forward calls (null for the backward spans where a value is per forward call)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    with hooktrace.trace(model, flops=True, shapes=True, numerics=True, memory=True) as tr:
        for _ in range(2):
            model(x).sum().backward()
            tr.step()
    t = tr.result.to_arrow("spans")
    fwd = t.filter(pa.compute.equal(t.column("phase"), "forward")).to_pylist()
    linear = [r for r in fwd if r["type"] == "Linear"]
    assert linear and all(r["flops"] and r["flops"] > 0 for r in linear)
    assert all(r["in_shapes"] and "8" in r["in_shapes"] for r in fwd if r["module"] == "0")
    assert all(r["absmax"] is not None and r["nonfinite"] == 0 for r in fwd)
    assert all(r["mem_device"] == "cpu" and r["mem_peak_bytes"] is not None for r in fwd)
    assert t.column("gpu_dur_ns").null_count == t.num_rows  # not timed (no gpu=True)
    num = tr.result.to_arrow("numerics")
    assert num.num_rows > 0 and set(num.column("phase").to_pylist()) <= {"forward", "backward"}
    mem = tr.result.to_arrow("memory")
    assert mem.num_rows > 0 and set(mem.column("device").to_pylist()) == {"cpu"}


def test_gpu_phases_of_the_straggler_tables_on_spark_and_duckdb(tmp_path: Path,
                                                               spark: Any) -> None:
    """Device time in the SQL path (issue #29 with #28): a Parquet dataset of 3 CUDA ranks
    (conftest.gpu_trace: a kernel site without host span, rank 2's fc1 3 ms on the
    device) gives the worker pool's straggler tables, "gpu fwd"/"gpu bwd" rows included,
    on Spark and on DuckDB."""
    from conftest import gpu_trace

    from hooktrace.data.parquet import write_dataset
    from hooktrace.data.spark import register, spark_summary
    from hooktrace.analysis.rankset import RankFile
    from hooktrace.analysis.stragglers import _combine, reduce_rank
    from hooktrace.data.paths import analyze

    runs = {}
    for r, f in ((0, 400_000), (1, 420_000), (2, 3_400_000)):
        path = tmp_path / "ranks" / f"run.rank{r}.htrace"
        path.parent.mkdir(exist_ok=True)
        path.touch()  # (the runs are synthetic: write_dataset's load hands them over)
        runs[str(path)] = gpu_trace(fc1_gpu_ns=f, steps=3, rank=r, world_size=3)
    out = tmp_path / "tables"
    write_dataset([tmp_path / "ranks"], out, load=runs.__getitem__)
    pool = json.loads(_combine([reduce_rank(run, RankFile.from_trace(p, run))
                                for p, run in runs.items()], [], 0.5, 1_000_000).to_json())
    assert {(s["rank"], s["module"], s["phase"]) for s in pool["stragglers"]} == {
        (2, "fc1", "gpu fwd")}
    register(spark, out)
    for report in (spark_summary(spark), analyze([out])):
        assert json.loads(report.to_json()) == pool


def test_the_summary_benchmark_runs_and_finds_the_rows_equal() -> None:
    """benchmarks/summary_export.py (RESULTS.md) on a short run: it checks both paths'
    rows equal before it reports a time."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "summary_export.py"
    r = subprocess.run([sys.executable, str(script), "--steps", "20", "--rounds", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rows equal" in r.stdout and "parquet (duckdb)" in r.stdout, r.stdout
