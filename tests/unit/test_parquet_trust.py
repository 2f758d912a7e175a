"""A trace file must never act (issue #35): a Parquet file's names are data, never SQL;
every Parquet file a verb reads is checked against the schema (names, types, metadata,
folders, values) with one line naming the file and the column; ``query --read-only``
locks DuckDB down; names with control characters print visibly; ``query -o`` does not
overwrite its input."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import build_events, build_trace

from hooktrace._events import ENTER, EXIT
from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")

HOSTILE = ["root", "fc\x1b]0;TITLE-SET-BY-TRACE\x07evil", "x\nfc1 forward: +0,0% (all good)\x1b[2K"]


def _trace(names: list[str]) -> Any:
    """A root calling each other module once (forward), 3 times."""
    rows = []
    t = 1_000
    for _ in range(3):
        rows.append((1, ENTER, 0, t))
        for m in range(1, len(names)):
            rows += [(1, ENTER, m, t + 10), (1, EXIT, m, t + 50)]
            t += 60
        rows.append((1, EXIT, 0, t + 10))
        t += 100
    return build_trace(build_events(rows), [("" if i == 0 else n, "Linear")
                                            for i, n in enumerate(names)])


@pytest.fixture()
def export(tmp_path: Path) -> Path:
    """One run's tables: DIR/<table>.parquet."""
    run = tmp_path / "run.htrace"
    _trace(["", "a", "b"]).save(str(run))
    assert main(["export", str(run), "-o", f"{tmp_path / 'tables'}/"]) == 0
    return tmp_path / "tables"


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hooktrace: error: "), err
    return err[0]


# -- 1: names are data -----------------------------------------------------------------


def test_a_column_name_that_is_sql_runs_nothing(export: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """shared/repro/trust/parquet_colname_injection_quiet.py: the file's column name
    closes the identifier and COPYs to a file. Before the fix each verb wrote it and
    exited 0."""
    target = tmp_path / "PWNED.sh"
    evil = ('module" FROM (SELECT \'a\' AS "module"); '
            f"COPY (SELECT 'echo ran' AS l) TO '{target}' (FORMAT csv, HEADER false); "
            'CREATE VIEW "zz" AS SELECT 1 AS "y')
    x = tmp_path / "x.parquet"
    pq.write_table(pa.table({evil: [1]}), x)
    shutil.copy(x, export / "steps.parquet")
    for argv in (["query", str(x), "SELECT 1"], ["summary", str(x)], ["summary", str(export)],
                 ["query", str(export), "SELECT count(*) FROM spans"]):
        assert main(argv) == 1, argv
        err = _one_error(capsys)
        assert "x.parquet" in err or "steps.parquet" in err
        assert "is not a column of the" in err and "'module\"" in err
        assert not target.exists(), argv


def test_the_connection_is_locked_once_the_views_exist(export: Path, tmp_path: Path) -> None:
    """What hooktrace's own SQL runs on: no file written or read but the inputs, no
    setting changed back."""
    from hooktrace.data.engine import connect

    con = connect(export)
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(9,)]
    for sql in (f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'",
                "SELECT * FROM read_text('/etc/hostname')",
                "SET enable_external_access = true", f"ATTACH '{tmp_path / 'x.db'}'"):
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.db").exists()


def test_views_name_the_schemas_columns_quoted() -> None:
    from hooktrace.data.engine import view_sql

    sql = view_sql(["/d/it's.parquet"], False, "steps")
    assert "'/d/it''s.parquet'" in sql and 'CAST("dur_ns" AS BIGINT) AS "dur_ns"' in sql
    assert 'CAST(NULL AS BIGINT) AS "rank"' in sql and len(duckdb.extract_statements(sql)) == 1


# -- 2: query --read-only --------------------------------------------------------------


def test_read_only_query_refuses_copy_and_read_text(export: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.csv"
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    assert main(["query", str(export), "SELECT count(*) AS n FROM spans", "--read-only",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 9}]
    for sql in (f"COPY (SELECT 1) TO '{out}'",
                f"SELECT * FROM read_text('{secret}')",
                f"SELECT 1; COPY (SELECT 1) TO '{out}'",
                "SET enable_external_access = true",
                f"ATTACH '{tmp_path / 'x.db'}'"):
        assert main(["query", str(export), sql, "--read-only"]) == 1, sql
        err = _one_error(capsys)
        assert "secret" not in err.replace(str(secret), "")
    assert not out.exists() and not (tmp_path / "x.db").exists()
    # without it, the SQL is the user's own: DuckDB's full powers (docs/data.md)
    assert main(["query", str(export), f"SELECT content FROM read_text('{secret}')",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"content": "secret"}]


# -- 3: control characters print visibly ------------------------------------------------


def test_control_characters_in_module_names_print_visibly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """shared/repro/trust/ansi_module_names.py: an OSC sequence and an embedded newline
    reached the terminal raw from summary, diff and query."""
    run = tmp_path / "ansi.htrace"
    _trace(HOSTILE).save(str(run))
    for argv in (["summary", str(run)], ["diff", str(run), str(run)],
                 ["query", str(run), "SELECT DISTINCT module FROM spans"]):
        capsys.readouterr()
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out, argv
        assert not any(line.startswith("fc1 forward") for line in out.splitlines()), argv
        assert "\\x1b]0;TITLE-SET-BY-TRACE\\x07evil" in out and "x\\nfc1 forward" in out


def test_an_error_line_stays_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a\n\x1b[2Kb": [1]}), x)
    assert main(["query", str(x), "SELECT 1"]) == 1
    err = _one_error(capsys)
    assert "\x1b" not in err and "a\\n\\x1b[2Kb" in err


# -- 8: query -o its own input --------------------------------------------------------


def test_query_does_not_overwrite_its_input(export: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """shared/repro/trust/query_overwrites_input.sh."""
    x = tmp_path / "x.parquet"
    shutil.copy(export / "spans.parquet", x)
    before = x.read_bytes()
    assert main(["query", str(x), "SELECT count(*) AS n FROM spans", "-o", str(x)]) == 1
    assert "is also an input" in _one_error(capsys)
    target = export / "steps.parquet"
    assert main(["query", str(export), "SELECT 1 AS n", "-o", str(target)]) == 1
    assert "is also an input" in _one_error(capsys)
    assert x.read_bytes() == before and pq.read_table(target).num_rows == 0
    assert main(["query", str(x), "SELECT count(*) AS n FROM spans", "-o",
                 str(tmp_path / "n.parquet")]) == 0


# -- 11, 12: every file checked against the schema ----------------------------------


def _with(t: Any, name: str, values: Any) -> Any:
    i = t.column_names.index(name)
    return t.set_column(i, pa.field(name, values.type, nullable=True), values)


def _hostile_spans(t: Any, case: str) -> tuple[Any, dict[bytes, bytes] | None, str]:
    """The spans table changed one way; its metadata; what the error must say."""
    n = t.num_rows
    meta = dict(t.schema.metadata)
    if case == "null slot":
        return _with(t, "slot", pa.nulls(n, pa.int64())), None, "column slot holds NULL"
    if case == "string dur_ns":
        return (_with(t, "dur_ns", pa.array(["1"] * n)), None,
                "column dur_ns is string; the spans table's is integer")
    if case == "duplicate":
        return (pa.Table.from_arrays(t.columns + [t.column("slot")],
                                     names=t.column_names + ["slot"]), None,
                "column 'slot' appears twice")
    if case == "empty name":
        return t.append_column("", pa.array([1] * n)), None, "a column with an empty name"
    if case == "no columns":
        return pa.table({}), None, "column module of the spans table is missing"
    if case == "table not UTF-8":
        meta[b"hooktrace.table"] = b"sp\xffans"
        return t, meta, "metadata hooktrace.table is not UTF-8"
    if case == "schema_version 999":
        meta[b"hooktrace.schema_version"] = b"999"
        return t, meta, "hooktrace.schema_version '999': this hooktrace reads version 1"
    if case == "negative dur_ns":
        dur = t.column("dur_ns").to_pylist()
        return _with(t, "dur_ns", pa.array([-5] + dur[1:])), None, "column dur_ns is negative"
    if case == "self above total":
        dur = t.column("dur_ns").to_pylist()
        return (_with(t, "self_ns", pa.array([d + 1 for d in dur])), None,
                "column self_ns is above dur_ns")
    assert case == "unknown phase"
    return (_with(t, "phase", pa.array(["sideways"] * n)), None,
            "column phase holds 'sideways'; hooktrace writes forward, backward, recompute")


@pytest.mark.parametrize("case", ["null slot", "string dur_ns", "duplicate", "empty name",
                                  "no columns", "table not UTF-8", "schema_version 999",
                                  "negative dur_ns", "self above total", "unknown phase"])
def test_a_hostile_spans_file_is_one_line_naming_file_and_column(
        case: str, export: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """shared/repro/trust/parquet_no_validation.sh and issue #35's list: before, these
    were tracebacks or read without a word (negative durations, self > total, an unknown
    phase counted as recompute, schema_version 999)."""
    t, meta, words = _hostile_spans(pq.read_table(export / "spans.parquet"), case)
    x = export.parent / "x.parquet"
    pq.write_table(t.replace_schema_metadata(meta) if meta else t, x)
    for argv in (["summary", str(x)], ["query", str(x), "SELECT sum(dur_ns) FROM spans"]):
        assert main(argv) == 1, (case, argv)
        err = _one_error(capsys)
        assert "x.parquet: " in err and words in err, (case, err)


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    """Two ranks' files as a hive dataset (DIR/<table>/rank=N/)."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in range(2):
        _trace(["", "a", "b"]).save(str(ranks / f"run.rank{r}.htrace"))
        import hooktrace

        run = hooktrace.load(str(ranks / f"run.rank{r}.htrace"))
        run.info["rank"] = r
        run.save(str(ranks / f"run.rank{r}.htrace"))
    assert main(["export", str(ranks), "-o", f"{tmp_path / 'ds'}/"]) == 0
    return tmp_path / "ds"


def _part(d: Path, table: str, rank: int) -> Path:
    return next((d / table / f"rank={rank}").glob("*.parquet"))


@pytest.mark.parametrize("case", ["rank=abc", "junk part", "drift", "info not JSON",
                                  "not UTF-8 name"])
def test_a_hostile_dataset_is_one_line_naming_the_file(
        case: str, dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(dataset), str(dataset)]) == 0
    capsys.readouterr()
    if case == "rank=abc":
        (dataset / "spans" / "rank=abc").mkdir()
        shutil.copy(_part(dataset, "spans", 0), dataset / "spans" / "rank=abc" / "p.parquet")
        words = "the folder 'rank=abc' is not rank=N or window=K"
    elif case == "junk part":
        (dataset / "spans" / "rank=1" / "junk.parquet").write_bytes(b"PAR1 junk")
        words = "junk.parquet: not a readable Parquet file"
    elif case == "drift":
        p = _part(dataset, "steps", 1)
        t = pq.read_table(p)
        pq.write_table(_with(t, "dur_ns", pa.array(np.zeros(t.num_rows), pa.float64())), p)
        words = "column dur_ns is double; the steps table's is integer"
    elif case == "info not JSON":
        p = _part(dataset, "runs", 1)
        t = pq.read_table(p)
        pq.write_table(_with(t, "info", pa.array(["{not json"] * t.num_rows)), p)
        words = "column info is not a JSON object"
    else:
        p = _part(dataset, "spans", 1)
        os.rename(os.fsencode(p), os.fsencode(p.parent) + b"/p\xff.parquet")
        words = "p\\xff.parquet: the file name is not UTF-8"
    for argv in (["summary", str(dataset)], ["diff", str(dataset), str(dataset)],
                 ["query", str(dataset), "SELECT count(*) FROM spans, steps, runs"]):
        assert main(argv) == 1, (case, argv)
        err = _one_error(capsys)
        assert words in err, (case, argv, err)


def test_nan_in_an_aggregate_part_is_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from hooktrace.data.schema import AGGREGATES, file_schema

    folder = tmp_path / "agg" / AGGREGATES
    folder.mkdir(parents=True)
    s = file_schema(AGGREGATES, partitioned=True)
    rows = {"step": [0, 0], "steps": [5, 5], "module": ["<root>", "<step>"],
            "mode": ["forward", "step"], "calls": [5, 5], "total_ms": [float("nan"), 3.0],
            "p50_ms": [0.4, 0.6], "max_ms": [0.5, 0.7]}
    pq.write_table(pa.table({f.name: pa.array(rows.get(f.name, [None] * 2), f.type) for f in s}),
                   folder / "part-00001.parquet")
    for argv in (["summary", str(tmp_path / "agg")],
                 ["query", str(tmp_path / "agg"), "SELECT sum(total_ms) FROM aggregates"]):
        assert main(argv) == 1, argv
        err = _one_error(capsys)
        assert "part-00001.parquet: column total_ms is NaN, infinite or negative" in err


@pytest.mark.parametrize("bad, words", [
    ({"gpu_ms": [-1.0, None]}, "column gpu_ms is NaN, infinite or negative"),
    ({"mem_peak_bytes": [-3, None]}, "column mem_peak_bytes is negative"),
    # (issue #48: a table's own columns are checked before its quantities', which come
    # from their providers' declarations)
    ({"tflops": [float("nan"), None], "total_ns": [-1, 5]}, "column total_ns is negative")])
def test_an_aggregate_parts_quantities_are_checked_as_their_providers_declare(
        bad: dict[str, list[object]], words: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from hooktrace.data.schema import AGGREGATES, file_schema

    folder = tmp_path / "agg" / AGGREGATES
    folder.mkdir(parents=True)
    s = file_schema(AGGREGATES, partitioned=True)
    rows = {"step": [0, 0], "steps": [5, 5], "module": ["<root>", "<step>"],
            "mode": ["forward", "step"], "calls": [5, 5], "total_ms": [1.0, 3.0],
            "p50_ms": [0.4, 0.6], "max_ms": [0.5, 0.7], **bad}
    pq.write_table(pa.table({f.name: pa.array(rows.get(f.name, [None] * 2), f.type) for f in s}),
                   folder / "part-00001.parquet")
    assert main(["summary", str(tmp_path / "agg")]) == 1
    assert f"part-00001.parquet: {words}" in _one_error(capsys)


# -- 15: file names that are not UTF-8, a FIFO ------------------------------------------


def test_parquet_names_that_are_not_utf8_and_a_fifo(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """shared/repro/trust/nonutf8_parquet.sh: exports wrote tracebacks; ``query
    fifo.parquet`` said "no such file"."""
    d = os.fsencode(tmp_path)
    run = d + b"/r\xff.htrace"
    _trace(["", "a"]).save(os.fsdecode(run))
    out = os.fsdecode(d + b"/o\xfe.parquet")
    assert main(["export", os.fsdecode(run), "-o", out]) == 0
    assert main(["export", os.fsdecode(run), "-o", f"{tmp_path / 'out'}/"]) == 0
    assert main(["query", os.fsdecode(run), "SELECT path FROM runs", "--json"]) == 0
    capsys.readouterr()
    assert main(["query", str(tmp_path / "out"), "SELECT path FROM runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"path": f"{tmp_path}/r\\xff.htrace"}]
    assert main(["query", out, "SELECT 1"]) == 1
    assert "o\\xfe.parquet: the file name is not UTF-8" in _one_error(capsys)
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    assert main(["query", str(fifo), "SELECT 1"]) == 1
    assert "fifo.parquet: is a FIFO" in _one_error(capsys)
