"""Seeded fuzzing of every verb that reads Parquet (issue #35: a trace file must never act).

Hostile but valid Parquet files and datasets, made from a real export by one mutation
each (a column name that is SQL, an empty or duplicate name, no columns, a column of
another type, NULL where the schema has none, metadata that is not UTF-8 or names
schema_version 999, a folder ``rank=abc``, ``runs.info`` not JSON, a junk part beside
good ones, schema drift between ranks, a file name that is not UTF-8, negative
durations, self above total, unknown phases, NaN in an aggregate part), given to
``query`` (plain and ``--read-only``), ``summary``, ``diff`` and ``report``. Every run
must end one of two ways: exit 0, or exit 1 with one ``hooktrace: error:`` line; never
a traceback, and never a file written: the folder of the case holds the same files
after every verb, and the path the hostile names aim a ``COPY ... TO`` at stays absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")

REPO = Path(__file__).resolve().parents[2]
N_FILE_CASES = 36
N_DATASET_CASES = 24


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_ranks", REPO / "benchmarks" / "ranks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks' traces, exported as a dataset (DIR/<table>/rank=N/), as one run's
    tables (one/<table>.parquet) and as X.parquet; and an aggregate= folder."""
    d = tmp_path_factory.mktemp("fuzz_base")
    bench = _bench()
    ranks = d / "ranks"
    ranks.mkdir()
    for r in range(2):
        bench.write_rank(ranks / f"run.rank{r}.htrace", r, 2, 1200)
    assert main(["export", str(ranks), "-o", f"{d / 'dataset'}/"]) == 0
    assert main(["export", str(ranks / "run.rank0.htrace"), "-o", f"{d / 'one'}/"]) == 0
    assert main(["export", str(ranks / "run.rank0.htrace"), "-o", str(d / "x.parquet")]) == 0
    from hooktrace.data.schema import AGGREGATES, file_schema

    agg = d / "agg" / AGGREGATES
    agg.mkdir(parents=True)
    s = file_schema(AGGREGATES, partitioned=True)
    rows = {"step": [0, 0, 0], "steps": [5, 5, 5], "module": ["<root>", "fc", "<step>"],
            "mode": ["forward", "forward", "step"], "calls": [5, 5, 5],
            "total_ms": [2.0, 1.0, 3.0], "p50_ms": [0.4, 0.2, 0.6], "max_ms": [0.5, 0.3, 0.7]}
    table = pa.table({f.name: pa.array(rows.get(f.name, [None] * 3), f.type) for f in s},
                     schema=pa.schema(list(s)))
    pq.write_table(table, agg / "part-00001.parquet")
    return d


# -- mutations of one table ------------------------------------------------------------

Mutation = Callable[[Any, random.Random, str], Any]
INJECT = ('module" FROM (SELECT 1 AS "module"); COPY (SELECT \'pwned\' AS l) TO \'{target}\' '
          '(FORMAT csv, HEADER false); CREATE VIEW "zz" AS SELECT 1 AS "y')


def _rename(t: Any, rng: random.Random, target: str) -> Any:
    names = list(t.column_names)
    i = rng.randrange(len(names))
    names[i] = rng.choice([INJECT.format(target=target), "", names[(i + 1) % len(names)],
                           "fc\x1b]0;title\x07\n", 'a"b', "rank"])
    return t.rename_columns(names)


def _retype(t: Any, rng: random.Random, target: str) -> Any:
    i = rng.randrange(t.num_columns)
    col = t.column(i)
    new = rng.choice(["string", "float", "bool", "uint64"])
    if new == "string":
        arr = pa.array([str(v) for v in col.to_pylist()], pa.string())
    elif new == "float":
        arr = pa.array([1.5] * len(col), pa.float64())
    elif new == "bool":
        arr = pa.array([True] * len(col), pa.bool_())
    else:
        arr = pa.array([2**63 + 5] * len(col), pa.uint64())
    return t.set_column(i, t.field(i).name, arr)


def _nulls(t: Any, rng: random.Random, target: str) -> Any:
    i = rng.randrange(t.num_columns)
    f = t.field(i)
    typ = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
    arr = pa.array([None] * t.num_rows, typ)
    return t.set_column(i, pa.field(f.name, typ, nullable=True), arr)


def _no_columns(t: Any, rng: random.Random, target: str) -> Any:
    return pa.table({}) if rng.random() < 0.5 else t.drop_columns([t.column_names[-1]])


def _extra_column(t: Any, rng: random.Random, target: str) -> Any:
    return t.append_column(INJECT.format(target=target), pa.array([1] * t.num_rows))


def _metadata(t: Any, rng: random.Random, target: str) -> Any:
    meta = dict(t.schema.metadata or {})
    key, value = rng.choice([(b"hooktrace.table", b"sp\xffans"), (b"hooktrace.table", b"nodes"),
                             (b"hooktrace.schema_version", b"999"),
                             (b"hooktrace.schema_version", b"\xfe\xff"),
                             (b"hooktrace.table", INJECT.format(target=target).encode())])
    meta[key] = value
    return t.replace_schema_metadata(meta)


def _value(t: Any, rng: random.Random, target: str) -> Any:
    """A value no recorder writes: negative, above its total, huge, an unknown word."""
    names = t.column_names
    i = rng.randrange(t.num_columns)
    f = t.field(i)
    typ = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
    vals = t.column(i).to_pylist()
    if not vals:
        return t
    k = rng.randrange(len(vals))
    if pa.types.is_integer(typ):
        vals[k] = rng.choice([-5, -(2**62), 2**62, 2**63 - 1])
    elif pa.types.is_floating(typ):
        vals[k] = rng.choice([float("nan"), float("inf"), -1.0])
    elif pa.types.is_string(typ):
        vals[k] = rng.choice(["sideways", "", "x\x1b[2K\nfc1 forward: +0,0% (all good)"])
    else:
        return t
    if "self_ns" in names and rng.random() < 0.3:  # self above total, on every row
        j = names.index("self_ns")
        dur = t.column("dur_ns" if "dur_ns" in names else "total_ns").to_pylist()
        return t.set_column(j, t.field(j), pa.array([None if d is None else d + 1 for d in dur],
                                                    pa.int64()))
    return t.set_column(i, f, pa.array(vals, f.type))


MUTATIONS: list[Mutation] = [_rename, _retype, _nulls, _no_columns, _extra_column, _metadata,
                             _value]


def _mutate_file(path: Path, rng: random.Random, target: str) -> None:
    t = pq.read_table(path)
    t = rng.choice(MUTATIONS)(t, rng, target)
    path.unlink()
    pq.write_table(t, path)


# -- running the verbs -----------------------------------------------------------------


def _files(d: Path) -> set[str]:
    return {os.path.relpath(os.path.join(r, n), d) for r, _, ns in os.walk(d) for n in ns}


def _run_verbs(case: Path, inputs: list[Path], target: Path, capsys: pytest.CaptureFixture[str],
               what: str) -> None:
    before = _files(case)
    verbs: list[list[str]] = []
    for p in inputs:
        verbs += [["query", str(p), "SELECT count(*) AS n, sum(dur_ns) FROM spans"],
                  ["query", str(p), "SELECT * FROM runs", "--read-only"],
                  ["query", str(p), "SELECT * FROM aggregates"],
                  ["summary", str(p)], ["diff", str(p), str(p)]]
    verbs.append(["report", str(inputs[0]), "-o", str(case.parent / f"{case.name}.html")])
    for argv in verbs:
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as e:  # (argparse)
            code = e.code
        except Exception as e:  # noqa: BLE001  (the finding: a traceback)
            pytest.fail(f"{what}: {argv[0]} raised {type(e).__name__}: {e}")
        err = capsys.readouterr().err
        assert code in (0, 1), (what, argv, code, err)
        if code:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("hooktrace: error: "), (what, argv, err)
            assert "\x1b" not in err and "\x07" not in err, (what, argv, err)
        assert not target.exists(), (what, argv, "a file ran SQL")
        assert _files(case) == before, (what, argv, "a file was written in the input")
    html = case.parent / f"{case.name}.html"
    if html.exists():
        html.unlink()


@pytest.mark.parametrize("seed", range(N_FILE_CASES))
def test_a_hostile_table_file_never_acts(seed: int, base: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN an export (X.parquet, one run's DIR/, or an aggregate folder) with one file
    # mutated
    rng = random.Random(seed)
    target = tmp_path / "PWNED.sh"
    case = tmp_path / "case"
    kind = rng.choice(["x.parquet", "one", "agg"])
    if kind == "x.parquet":
        case.mkdir()
        shutil.copy(base / "x.parquet", case / "x.parquet")
        victim, inp = case / "x.parquet", case / "x.parquet"
    else:
        shutil.copytree(base / kind, case)
        victim = rng.choice(sorted(case.rglob("*.parquet")))
        inp = case
    _mutate_file(victim, rng, str(target))
    # WHEN every verb reads it THEN one line or a result, nothing written
    _run_verbs(case, [inp], target, capsys, f"seed {seed}: {kind} {victim.name}")


def _dataset_case(rng: random.Random, case: Path, target: str) -> str:
    """A dataset (DIR/<table>/rank=N/) with one hostile change; what it is."""
    parts = sorted(case.rglob("*.parquet"))
    choice = rng.randrange(7)
    if choice == 0:  # a folder that is not rank=N
        src = rng.choice(parts)
        bad = src.parent.parent / rng.choice(["rank=abc", "rank=1=2", "junk", "window=x"])
        bad.mkdir(exist_ok=True)
        shutil.copy(src, bad / "part-9.parquet")
        return f"folder {bad.name}"
    if choice == 1:  # a junk part beside good ones
        rng.choice(parts).with_name("part-junk.parquet").write_bytes(b"PAR1 not really")
        return "junk part"
    if choice == 2:  # schema drift between ranks: one rank's file with a column retyped
        victim = rng.choice(parts)
        pq.write_table(_retype(pq.read_table(victim), rng, target), victim)
        return f"drift {victim}"
    if choice == 3:  # runs.info not JSON (or not an object)
        victim = rng.choice(sorted((case / "runs").rglob("*.parquet")))
        t = pq.read_table(victim)
        info = pa.array([rng.choice(["{not json", "[1, 2]", "\xff"])] * t.num_rows)
        pq.write_table(t.set_column(t.column_names.index("info"), "info", info), victim)
        return "runs.info"
    if choice == 4:  # a file name that is not UTF-8
        victim = rng.choice(parts)
        os.rename(os.fsencode(victim), os.fsencode(victim.parent) + b"/part-\xff.parquet")
        return "non-UTF-8 name"
    if choice == 5:  # a rank's part from another table (metadata and columns)
        a, b = rng.sample(parts, 2)
        shutil.copy(a, b)
        return f"{a} as {b}"
    victim = rng.choice(parts)  # any mutation of one part
    _mutate_file(victim, rng, target)
    return f"mutated {victim}"


@pytest.mark.parametrize("seed", range(N_DATASET_CASES))
def test_a_hostile_dataset_never_acts(seed: int, base: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(1000 + seed)
    target = tmp_path / "PWNED.sh"
    case = tmp_path / "case"
    shutil.copytree(base / "dataset", case)
    what = _dataset_case(rng, case, str(target))
    _run_verbs(case, [case], target, capsys, f"seed {seed}: {what}")


def test_the_unmutated_exports_read(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fuzz's bases are good: every verb answers on them (the mutations are the
    only reason for an error above)."""
    for argv in (["query", str(base / "dataset"), "SELECT count(*) FROM spans"],
                 ["summary", str(base / "x.parquet")], ["summary", str(base / "dataset")],
                 ["diff", str(base / "dataset"), str(base / "dataset")],
                 ["summary", str(base / "agg")], ["query", str(base / "agg"),
                                                  "SELECT count(*) FROM aggregates"]):
        capsys.readouterr()
        assert main(argv) == 0, (argv, capsys.readouterr().err)


def test_one_resolver_says_what_each_input_is(base: Path, tmp_path: Path) -> None:
    """Issue #37: one input resolver (hooktrace.analysis.inputs) tells every verb what a
    path is; here each kind the verbs above read."""
    from hooktrace.analysis.inputs import Kind, resolve

    from hooktrace.data.schema import AGGREGATES, file_schema

    ranks = sorted(str(p) for p in (base / "ranks").glob("*.htrace"))
    (tmp_path / "empty").mkdir()
    # an aggregate= folder as the recorder writes it: its parts' metadata names the table
    shutil.copytree(base / "agg", tmp_path / "agg")
    part = tmp_path / "agg" / "aggregates" / "part-00001.parquet"
    meta = file_schema(AGGREGATES, partitioned=True).metadata
    pq.write_table(pq.read_table(part).replace_schema_metadata(meta), part)
    for path, kind, files in [
            (base / "ranks" / "run.rank0.htrace", Kind.TRACE, ranks[:1]),
            (base / "ranks", Kind.TRACES, ranks),
            (base / "x.parquet", Kind.EXPORT, []), (base / "one", Kind.EXPORT, []),
            (base / "dataset", Kind.EXPORT, []),
            (tmp_path / "agg", Kind.AGGREGATE, []),
            (tmp_path / "agg" / "aggregates", Kind.AGGREGATE, []), (part, Kind.AGGREGATE, []),
            (tmp_path / "nothing.htrace", Kind.MISSING, []),
            (tmp_path / "empty", Kind.EMPTY, [])]:
        got = resolve(path)
        assert (got.kind, list(got.files)) == (kind, files), path
        assert bool(got.problem) == (kind in (Kind.MISSING, Kind.EMPTY))
    # the name given to `hooktrace run -o NAME` under torchrun stands for its rank files
    for r in range(2):
        shutil.copy(ranks[r], tmp_path / f"job_rank{r}.htrace")
    got = resolve(tmp_path / "job.htrace")
    assert got.kind is Kind.TRACES and [os.path.basename(f) for f in got.files] == [
        "job_rank0.htrace", "job_rank1.htrace"]


def test_an_aggregate_folder_an_older_hooktrace_wrote_still_reads(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]
                                                                   ) -> None:
    """Parts written before the run column (issue #35) and before total_ns/self_ns (issue
    #37) read with those columns null, alone and beside a newer part: the summary gives
    float ms there and no exact ns; query sees nulls."""
    from hooktrace.data.schema import AGGREGATES, LATER_AGGREGATE_COLUMNS, file_schema
    from hooktrace.data.aggregates import aggregate_summary_data

    s = file_schema(AGGREGATES, partitioned=True)
    rows = {"step": [0, 0, 0], "steps": [5, 5, 5], "module": ["<root>", "fc", "<step>"],
            "mode": ["forward", "forward", "step"], "calls": [5, 5, 5],
            "total_ms": [2.0, 1.0, 3.0], "p50_ms": [0.4, 0.2, 0.6], "max_ms": [0.5, 0.3, 0.7]}
    old = [f for f in s if f.name not in LATER_AGGREGATE_COLUMNS]
    folder = tmp_path / "agg"
    (folder / "aggregates").mkdir(parents=True)
    pq.write_table(pa.table({f.name: pa.array(rows.get(f.name, [None] * 3), f.type) for f in old},
                            schema=pa.schema(old, metadata=s.metadata)),
                   folder / "aggregates" / "part-00001.parquet")
    data = aggregate_summary_data(folder)
    fc = next(r for r in data["rows"] if r["module"] == "fc")
    assert (fc["calls"], fc["total_ms"], fc["total_ns"], fc["self_ns"]) == (5, 1.0, None, None)
    assert main(["query", str(folder), "SELECT count(*) AS n FROM aggregates WHERE total_ns "
                 "IS NULL AND self_ns IS NULL AND run IS NULL", "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)[0]["n"] == 3
    # beside a part with the later columns: both read, the sums no longer exact
    new = {**rows, "total_ns": [2_000_000, 1_000_000, 3_000_000], "self_ns": [1_000_000,
                                                                              1_000_000, None],
           "run": ["r2"] * 3}
    pq.write_table(pa.table({f.name: pa.array(new.get(f.name, [None] * 3), f.type) for f in s},
                            schema=pa.schema(list(s), metadata=s.metadata)),
                   folder / "aggregates" / "part-00002.parquet")
    data = aggregate_summary_data(folder)
    fc = next(r for r in data["rows"] if r["module"] == "fc")
    assert (fc["calls"], fc["total_ms"], fc["total_ns"]) == (10, 2.0, None)
    assert main(["summary", str(folder)]) in (0, None)
    assert "fc" in capsys.readouterr().out


def test_a_summary_of_an_export_with_extreme_values_is_a_result_or_one_line(
        base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The export's summary groups the spans table in numpy (issue #37): a slot of 2**62
    is one module, not a table of 2**62 names; durations whose sum passes int64 are one
    line naming the column, not a wrapped (negative) total."""
    t = pq.read_table(base / "x.parquet")
    slot = t.column("slot").to_pylist()
    slot[0] = 2**62
    big = tmp_path / "slot.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("slot"), t.schema.field("slot"),
                                pa.array(slot, pa.int64())), big)
    assert main(["summary", str(big), "--json"]) in (0, None)
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sum(r["calls"] + r["bwd_calls"] for r in rows) == t.num_rows - sum(
        1 for p in t.column("phase").cast(pa.string()).to_pylist() if p == "recompute")
    huge = tmp_path / "huge.parquet"
    cols = {n: t.column(n).to_pylist() for n in ("start_ns", "end_ns", "dur_ns", "self_ns")}
    for k in range(3):
        cols["start_ns"][k], cols["end_ns"][k] = 0, 2**62
        cols["dur_ns"][k] = cols["self_ns"][k] = 2**62
    for n, v in cols.items():
        t = t.set_column(t.schema.get_field_index(n), t.schema.field(n), pa.array(v, pa.int64()))
    pq.write_table(t, huge)
    assert main(["summary", str(huge)]) not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dur_ns sums past int64" in err[0], err


def test_aggregate_sums_past_int64_are_one_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Arrow's grouped sums wrap silently: an aggregates column whose values sum past
    int64 is one line naming it, not a negative total."""
    from hooktrace.data.schema import AGGREGATES, file_schema

    s = file_schema(AGGREGATES, partitioned=True)
    rows = {"step": [0, 1, 1], "steps": [1, 1, 1], "module": ["fc", "fc", "<step>"],
            "mode": ["forward", "forward", "step"], "calls": [1, 1, 1],
            "total_ms": [1.0, 1.0, 2.0], "p50_ms": [1.0, 1.0, 1.0], "max_ms": [1.0, 1.0, 1.0],
            "total_ns": [2**62, 2**62, 2], "self_ns": [1, 1, None], "run": ["r"] * 3}
    (tmp_path / "agg" / "aggregates").mkdir(parents=True)
    pq.write_table(pa.table({f.name: pa.array(rows.get(f.name, [None] * 3), f.type) for f in s},
                            schema=pa.schema(list(s), metadata=s.metadata)),
                   tmp_path / "agg" / "aggregates" / "part-00001.parquet")
    assert main(["summary", str(tmp_path / "agg")]) not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column total_ns of the aggregates sums past int64" in err[0], err
