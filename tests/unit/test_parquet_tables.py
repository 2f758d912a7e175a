"""What a Parquet file holds names its table (issue #38 items 4 and 5): ``summary`` of a
file that is not a spans export gives the right table or one line, and ``query`` names
the tables by the files' ``hooktrace.table`` metadata and folders, saying in one line
which tables a source has when a query names another."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_events, build_trace

from hooktrace._events import ENTER, EXIT
from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb", reason="the data extra (duckdb) is not installed")


def _part(folder: Path) -> Path:
    """An aggregate= folder's part, as the recorder writes it (metadata included)."""
    from hooktrace.data.schema import AGGREGATES, file_schema, metadata

    folder.mkdir(parents=True)
    s = file_schema(AGGREGATES, partitioned=True).with_metadata(metadata(AGGREGATES))
    rows = {"step": [0, 0], "steps": [5, 5], "module": ["<root>", "<step>"],
            "mode": ["forward", "step"], "calls": [5, 5], "total_ms": [2.0, 3.0],
            "p50_ms": [0.4, 0.6], "max_ms": [0.5, 0.7], "run": ["r", "r"]}
    path = folder / "part-00001.parquet"
    pq.write_table(pa.Table.from_pydict({f.name: rows.get(f.name, [None] * 2) for f in s},
                                        schema=s), path)
    return path


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hooktrace: error: "), err
    return err[0]


def test_summary_of_an_aggregate_part_is_the_aggregate_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = _part(tmp_path / "agg" / "aggregates")
    for path in (part, part.parent):  # the part file, the aggregates/ folder
        assert main(["summary", str(path)]) == 0, path
        out = capsys.readouterr().out
        assert out.startswith(f"{path}: 5 steps aggregated, 2 rows"), out
        assert "<root>" in out and "forward" in out


def test_summary_of_another_table_is_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run.htrace"
    build_trace(build_events([(1, ENTER, 0, 1000), (1, EXIT, 0, 5000)]), [("", "Net")]).save(
        str(run))
    assert main(["export", str(run), "-o", f"{tmp_path / 'tables'}/"]) == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "tables" / "steps.parquet")]) == 1
    assert "steps.parquet: holds the steps table, not spans" in _one_error(capsys)


def test_query_names_tables_by_what_the_files_hold(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    part = _part(tmp_path / "agg" / "aggregates")
    for path in (tmp_path / "agg", part.parent, part):
        assert main(["query", str(path), "SELECT count(*) AS n FROM aggregates", "--json"]) == 0
        assert capsys.readouterr().out.strip() == '[{"n": 2}]', path
        # a table the source lacks: one line saying what it has, not 0 rows
        assert main(["query", str(path), "select count(*) from Spans"]) == 1
        assert _one_error(capsys).endswith(": no spans table there; it holds aggregates")


def test_named_tables_reads_from_and_join_lists() -> None:
    from hooktrace.data.engine import named_tables

    assert named_tables('SELECT 1 FROM spans s, "Steps" AS t, x JOIN runs USING (rank)') == [
        "spans", "steps", "runs"]
    assert named_tables("select steps from aggregates") == ["aggregates"]  # (a column)
