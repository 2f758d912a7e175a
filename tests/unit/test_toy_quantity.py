"""A new recorded quantity is one provider (issue #48): a made-up quantity ("bumps", one
per µs of a call, derived from the spans) declared only here, registered for a test by
a fixture, shows in the summary (text, its flag, JSON, the CLI), the report (table,
facts), the Parquet schema, spans table and its validation, docs/schema.md's tables,
the aggregates (written, checked and read back: the aggregate report) and the Chrome
and Perfetto exports (an argument of each span). Nothing else names it. (``hooktrace
diff`` compares times only.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import build_events, build_trace
from pftrace_decode import chrome_slices, decode

from hooktrace._events import ENTER, EXIT, STEP
from hooktrace.analysis.columns import (
    PROVIDERS,
    Column,
    ColumnProvider,
    SummaryPart,
    WindowGroup,
    measured_only,
)
from hooktrace.analysis.column_provider import ArgColumn
from hooktrace.analysis.summary import Summary
from hooktrace.cli import main
from hooktrace.reporters.html import render_report


class Bumps(ColumnProvider):
    """One bump per whole µs of a call."""

    name = "bumps"
    columns = (
        Column("bumps", "int64", "toy: whole µs of the call", check="nonnegative"),
        Column("bumps", "int64", "toy: whole µs of the calls", "aggregates",
               check="nonnegative", reduce="sum", title="bumps", tip="toy: bumps over the run",
               fact="bumps recorded"))
    text_flag = "bumps"
    flag_help = "add the toy's bumps per module"
    headers = {"bumps": ("bumps", "toy: whole µs of the forward calls")}

    def recorded(self, trace) -> bool:
        return True

    def summary(self, rows, trace, options) -> SummaryPart:
        for row in rows:
            row["bumps"] = row["total_ns"] // 1000 if row["calls"] else None
        return SummaryPart(("bumps",), ["toy: bumps = whole µs of the forward calls"])

    def text_columns(self, keys, rows, *, wide, backward):
        return [("bumps", "bumps")] if "bumps" in keys else []

    def format_cell(self, key, value):
        return f"{value}b" if key == "bumps" and value is not None else None

    def note_shown(self, note, shown):
        return "bumps" in shown if note.startswith("toy: bumps") else None

    def facts(self, root, columns):
        return [f"{root['bumps']} bumps"] if root is not None else []

    def json_extra(self, trace):
        return {"bumps_total": int(trace.spans().duration_ns.sum() // 1000)}

    def spans(self, trace, n, m):
        return {"bumps": measured_only(trace.spans().duration_ns // 1000, np.ones(n, bool), m)}

    def export_args(self, trace, spans):
        return [ArgColumn("bumps", (trace.spans().duration_ns // 1000)[spans].astype(np.int64))]

    def aggregate(self, trace, calls):
        def values(group: WindowGroup) -> dict[str, list]:
            return {"bumps": (group.groups.total // 1000).tolist()}

        return values


@pytest.fixture()
def bumps() -> Iterator[Bumps]:
    """The toy in PROVIDERS for the test only."""
    toy = Bumps()
    PROVIDERS.append(toy)
    try:
        yield toy
    finally:
        PROVIDERS.remove(toy)


def _trace():
    # root 0 -> 5000 with fc 1000 -> 3000 inside, a step; root 6000 -> 7000, a step
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 1000), (1, EXIT, 1, 3000),
                       (1, EXIT, 0, 5000), (1, STEP, 0, 5000),
                       (1, ENTER, 0, 6000), (1, EXIT, 0, 7000), (1, STEP, 0, 7000)])
    return build_trace(ev, [("", "Net"), ("fc", "Linear")])


def test_the_summary_shows_it(bumps: Bumps, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    s = Summary.from_trace(_trace())
    by = {r["module"]: r for r in s.rows}
    assert by[""]["bumps"] == 6 and by["fc"]["bumps"] == 2  # (5000 + 1000 ns; 2000 ns)
    # the narrow table shows it when its flag is given; the wide one always
    assert "bumps" not in s.to_text()
    narrow = s.to_text(bumps=True).splitlines()
    assert narrow[0].split()[-1] == "bumps" and narrow[1].endswith(" 6b"), narrow
    assert "toy: bumps = whole µs of the forward calls" in s.to_text(bumps=True)
    assert s.to_text(wide=True).splitlines()[0].split()[-1] == "bumps"
    with pytest.raises(TypeError, match="'bunps'"):
        s.to_text(bunps=True)
    assert [r["bumps"] for r in json.loads(s.to_json())["rows"]] == [6, 2]
    assert s.to_csv().splitlines()[0].endswith(",bumps")
    # the command line: its flag (the provider's), its --json extra
    path = tmp_path / "run.htrace"
    _trace().save(str(path))
    assert main(["summary", str(path), "--bumps"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(" 6b")
    assert main(["summary", str(path), "--bumps", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bumps_total"] == 8 and doc["rows"][0]["bumps"] == 6
    with pytest.raises(SystemExit):
        main(["summary", "--help"])
    out = capsys.readouterr().out
    assert "--bumps" in out and "add the toy's bumps per module" in out


def test_the_report_shows_it(bumps: Bumps) -> None:
    page = render_report(_trace())
    assert 'title="toy: whole µs of the forward calls; click to sort">bumps</th>' in page
    assert '<td data-v="6" class=n>6b</td>' in page
    facts = page.split('<div class="facts">', 1)[1].split("</div>", 1)[0]
    assert facts.endswith(" · 6 bumps"), facts


def test_the_parquet_spans_table_and_its_checks_have_it(bumps: Bumps, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from hooktrace.data.schema import describe, schema

    field = schema("spans").field("bumps")
    assert str(field.type) == "int64" and field.nullable
    assert field.metadata[b"doc"] == b"toy: whole \xc2\xb5s of the call"
    assert "| `bumps` | int64 | yes | toy: whole µs of the calls |" in describe()
    path = tmp_path / "run.htrace"
    _trace().save(str(path))
    assert main(["export", str(path), "-o", str(tmp_path / "x.parquet")]) == 0
    t = pq.read_table(tmp_path / "x.parquet")
    assert sorted(zip(t["start_ns"].to_pylist(), t["bumps"].to_pylist())) == [
        (0, 5), (1000, 2), (6000, 1)]
    assert main(["summary", str(tmp_path / "x.parquet")]) == 0
    # its declared check: a negative count is refused, naming the file and column
    t = t.set_column(t.schema.get_field_index("bumps"), "bumps", pa.array([-1, 2, 1], "int64"))
    pq.write_table(t, tmp_path / "bad.parquet")
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "bad.parquet")]) == 1
    assert "bad.parquet: column bumps is negative" in capsys.readouterr().err


def test_the_aggregates_write_and_read_it_back(bumps: Bumps, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from hooktrace.analysis.aggregates import reduce_window
    from hooktrace.data.aggregates import aggregate_rows, load_aggregates
    from hooktrace.data.schema import AGGREGATES, schema
    from hooktrace.reporters.aggregate import render_aggregate_report

    # two windows written as trace(aggregate=DIR) writes a part (hooktrace.record.aggregate)
    declared = schema(AGGREGATES)
    parts = tmp_path / "agg" / "aggregates"
    parts.mkdir(parents=True)
    for no, first in enumerate((0, 1)):
        rows = reduce_window(first, _trace(), [5.0, 2.0])
        assert rows["bumps"][-1] is None  # (the step row)
        n = len(rows["step"])
        rows |= {"rank": [None] * n, "window": [None] * n, "run": ["r"] * n}
        pq.write_table(pa.table({f.name: pa.array(rows[f.name], pa.string()).dictionary_encode()
                                 if pa.types.is_dictionary(f.type) else pa.array(rows[f.name], f.type)
                                 for f in declared}).cast(declared), parts / f"part-r-{no:05d}.parquet")
    table = load_aggregates(tmp_path / "agg")  # (checked as its declaration says)
    assert table["bumps"].to_pylist()[:2] == [6, 2]
    got = {(r["module"], r["mode"]): r["bumps"] for r in aggregate_rows(table)[0]}
    assert got == {("<root>", "forward"): 12, ("fc", "forward"): 4, ("<step>", "step"): None}
    page = render_aggregate_report(table, [])
    assert 'title="toy: bumps over the run; click to sort">bumps</th>' in page
    assert " · bumps recorded" in page.split('<div class="facts">', 1)[1].split("</div>")[0]


def test_the_exports_write_it_on_each_span(bumps: Bumps, tmp_path: Path) -> None:
    path = tmp_path / "run.htrace"
    _trace().save(str(path))
    assert main(["export", str(path), "-o", str(tmp_path / "t.json")]) == 0
    assert main(["export", str(path), "-o", str(tmp_path / "t.pftrace")]) == 0
    chrome = chrome_slices((tmp_path / "t.json").read_bytes())
    perfetto = decode((tmp_path / "t.pftrace").read_bytes())["slices"]
    for slices in (chrome, perfetto):
        bumps_of = {(s[1], s[3]): dict(s[5]).get("bumps") for s in slices
                    if s[2] == "hooktrace.forward"}  # (the module calls: not the steps)
        assert bumps_of == {("Net", 0): 5, ("fc", 1000): 2, ("Net", 6000): 1}, bumps_of


def test_unregistered_it_is_gone() -> None:
    pytest.importorskip("pyarrow")
    from hooktrace.data.schema import AGGREGATES, schema

    assert "bumps" not in schema("spans").names and "bumps" not in schema(AGGREGATES).names
    assert "bumps" not in Summary.from_trace(_trace()).columns
    with pytest.raises(SystemExit):
        main(["summary", "x.htrace", "--bumps"])
