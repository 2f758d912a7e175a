"""The column providers (issue #37, item 2): one extension point, hooktrace.analysis.columns,
that the summary, the Parquet spans table and the aggregates all ask. A toy provider
registered for one test shows up in all three views (and the terminal table); every registered provider is
asked by all three; and the views' code names no feature any more."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from conftest import build_events, build_trace

from hooktrace._events import ENTER, EXIT, STEP
from hooktrace.analysis.columns import (
    PROVIDERS,
    Column,
    ColumnProvider,
    SummaryPart,
    WindowGroup,
    measured_only,
)
from hooktrace.analysis.summary import Summary
from hooktrace.analysis.aggregates import reduce_window
from hooktrace.reporters.html import _table_html, render_report


def _trace():
    # root 0 -> 5000 with fc 1000 -> 3000 inside, a step mark; then root 6000 -> 7000
    ev = build_events([(1, ENTER, 0, 0), (1, ENTER, 1, 1000), (1, EXIT, 1, 3000),
                       (1, EXIT, 0, 5000), (1, STEP, 0, 5000),
                       (1, ENTER, 0, 6000), (1, EXIT, 0, 7000), (1, STEP, 0, 7000)])
    return build_trace(ev, [("", "Net"), ("fc", "Linear")])


class DurUs(ColumnProvider):
    """A quantity nothing records natively: each call's duration in µs, derived from the
    spans. Summary: the mean forward call per row; spans table: per call; aggregates:
    the group's total."""

    name = "toy dur_us"
    columns = (Column("dur_us", "float64", "toy: the call's duration, µs"),
               Column("dur_us", "float64", "toy: the calls' total, µs", "aggregates"))

    def __init__(self) -> None:
        self.asked: list[str] = []

    def recorded(self, trace) -> bool:
        return True

    def summary(self, rows, trace, options) -> SummaryPart:
        self.asked.append("summary")
        for row in rows:
            row["dur_us"] = None if not row["calls"] else row["total_ns"] / row["calls"] / 1e3
        return SummaryPart(("dur_us",), ["toy: dur_us = mean forward call, µs"])

    def spans(self, trace, n, m):
        self.asked.append("spans")
        return {"dur_us": measured_only(trace.spans().duration_ns / 1e3, np.ones(n, bool), m)}

    def aggregate(self, trace, calls):
        self.asked.append("aggregate")

        def values(group: WindowGroup) -> dict[str, list]:
            return {"dur_us": (group.groups.total / 1e3).tolist()}

        return values

    headers = {"dur_us": ("dur µs", "toy: the mean forward call")}

    def text_columns(self, keys, rows, *, wide, backward):
        return [(self.headers["dur_us"][0], "dur_us")] if "dur_us" in keys else []

    def format_cell(self, key, value):
        return f"{value:.1f} us" if key == "dur_us" else None

    def facts(self, root, columns):
        return [f"toy: the model's mean call {root['dur_us']:.1f} µs"] if "dur_us" in columns else []


@contextmanager
def registered(*providers: ColumnProvider) -> Iterator[None]:
    """``providers`` in PROVIDERS (the list the views loop over) for the block only."""
    saved = PROVIDERS[:]
    PROVIDERS[:] = [*saved, *providers]
    try:
        yield
    finally:
        PROVIDERS[:] = saved


def test_a_new_provider_shows_in_the_summary_and_the_aggregates_and_goes_again():
    trace = _trace()
    toy = DurUs()
    with registered(toy):
        s = Summary.from_trace(trace)
        rows = reduce_window(0, trace, [5.0, 2.0])
        wide, narrow = s.to_text(wide=True).splitlines(), s.to_text().splitlines()
        page = _table_html(s)
        report = render_report(trace)
    assert s.columns[-1] == "dur_us" and "toy: dur_us = mean forward call, µs" in s.notes
    by = {r["module"]: r for r in s.rows}
    assert by[""]["dur_us"] == 3.0 and by["fc"]["dur_us"] == 2.0  # (5000 + 1000) / 2; 2000
    assert s.to_csv().splitlines()[0].endswith(",dur_us")
    # the terminal table: in the wide one, titled and formatted as the provider says;
    # not in the narrow one, which shows a quantity when its text_flag is asked for
    assert wide[0].endswith("dur µs") and wide[1].endswith("3.0 us"), wide[:2]
    assert "dur" not in narrow[0]
    # the report's table: the provider's title and tooltip, its cells
    assert 'title="toy: the mean forward call; click to sort">dur µs</th>' in page
    assert '<td data-v="3.0" class=n>3.0 us</td>' in page
    # the report's facts line: what the provider says of the model's row
    facts = report.split('<div class="facts">', 1)[1].split("</div>", 1)[0]
    assert facts.endswith(" · toy: the model&#x27;s mean call 3.0 µs"), facts
    # the aggregates: a column of its own, null in the "step" row
    got = dict(zip(zip(rows["module"], rows["mode"]), rows["dur_us"], strict=True))
    assert got == {("<root>", "forward"): 6.0, ("fc", "forward"): 2.0, ("<step>", "step"): None}
    assert toy.asked == ["summary", "aggregate", "summary"]  # (the report: its summary)
    # unregistered: gone from every view
    s = Summary.from_trace(trace)
    assert "dur_us" not in s.columns and all("dur_us" not in r for r in s.rows)
    assert "dur_us" not in reduce_window(0, trace, [5.0, 2.0])
    assert "toy:" not in render_report(trace)


def test_a_new_provider_fills_its_column_of_the_parquet_spans_table():
    """The spans table's schema has a provider's declared columns (hooktrace/data/schema.py
    generates them from the declarations); a column it fills undeclared is refused."""
    pytest.importorskip("pyarrow")
    from hooktrace.data.schema import schema
    from hooktrace.data.tables import to_arrow

    class Undeclared(DurUs):
        columns = ()

    trace = _trace()
    with registered(Undeclared()):
        with pytest.raises(ValueError, match=r"\['dur_us'\] not declared"):
            to_arrow(trace, "spans")
    toy = DurUs()
    with registered(toy):
        assert schema("spans").names[-1] == "dur_us"
        t = to_arrow(trace, "spans")
    assert toy.asked == ["spans"]
    by = sorted(zip(t.column("start_ns").to_pylist(), t.column("dur_us").to_pylist(),
                    strict=True))
    assert [d for _, d in by] == [5.0, 2.0, 1.0]
    assert t.column("dur_us").to_pylist() == (t.column("dur_ns").to_numpy() / 1e3).tolist()
    assert "dur_us" not in to_arrow(trace, "spans").column_names
    assert "dur_us" not in schema("spans").names


class Spy(ColumnProvider):
    """A registered provider, watched: which views asked it whether it was recorded."""

    def __init__(self, inner: ColumnProvider, asked: dict[str, set[str]]) -> None:
        self.inner, self.asked = inner, asked
        self.name = inner.name
        self.columns = inner.columns

    def recorded(self, trace) -> bool:
        view = next(f.function for f in inspect.stack()[1:]
                    if f.function in ("from_trace", "_extras", "reduce_window"))
        self.asked.setdefault(self.name, set()).add(view)
        return self.inner.recorded(trace)

    def unrecorded(self, trace) -> SummaryPart:
        return self.inner.unrecorded(trace)


def test_every_provider_is_asked_by_every_view():
    pytest.importorskip("pyarrow")
    from hooktrace.data.tables import to_arrow

    trace = _trace()
    asked: dict[str, set[str]] = {}
    saved = PROVIDERS[:]
    PROVIDERS[:] = [Spy(p, asked) for p in saved]
    try:
        Summary.from_trace(trace)
        to_arrow(trace, "spans")
        reduce_window(0, trace, [5.0, 2.0])
    finally:
        PROVIDERS[:] = saved
    names = [p.name for p in PROVIDERS]
    assert names == ["device time", "kernel time", "FLOPs", "memory", "numerics", "shapes"]
    assert asked == {name: {"from_trace", "_extras", "reduce_window"} for name in names}


def test_the_providers_declare_the_schemas_optional_columns_once():
    """Each optional column of the spans table and the aggregates is one provider's."""
    pytest.importorskip("pyarrow")
    from hooktrace.data.schema import AGGREGATES, schema

    for table, declared in (("spans", [c for p in PROVIDERS for c in p.span_columns]),
                            (AGGREGATES, [c for p in PROVIDERS for c in p.aggregate_columns])):
        assert len(declared) == len(set(declared)), table
    spans = schema("spans").names
    optional = spans[spans.index("unfinished") + 1:]  # (after the calls table's own)
    assert sorted(optional) == sorted(c for p in PROVIDERS for c in p.span_columns)
    aggregates = schema(AGGREGATES).names
    optional = aggregates[aggregates.index("max_ms") + 1:aggregates.index("total_ns")]
    assert sorted(optional) == sorted(c for p in PROVIDERS for c in p.aggregate_columns)


def test_the_views_name_no_feature():
    """Summary.from_trace, the spans table and reduce_window loop over PROVIDERS: no
    feature's name, function or column is in their code (the feature's own module has
    them, beside its provider)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "hooktrace"

    def source(path: str, *names: str) -> str:
        """A class's or function's code, read from the file (not imported: the spans
        table's module needs the data extra, which the torch-floor run lacks)."""
        text = (package / path).read_text()
        tree = ast.parse(text)
        for name in names:
            tree = next(n for n in ast.walk(tree)
                        if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name)
        return ast.get_source_segment(text, tree) or ""

    features = re.compile(r"gpu|flop|mem_|memory|numeric|absmax|nonfinite|rms|shape|launch"
                          r"|device", re.I)
    # (each view, and how it asks the providers: looping over PROVIDERS, or a cell
    # through cell_text, which does)
    for code, asks in ((source("analysis/summary.py", "Summary", "from_trace"), "PROVIDERS"),
                       (source("analysis/summary.py", "Summary", "to_text"), "PROVIDERS"),
                       (source("analysis/summary.py", "_cell"), "cell_text("),
                       (source("reporters/html.py", "_cell"), "cell_text("),
                       (source("analysis/columns.py", "cell_text"), "PROVIDERS"),
                       (source("data/tables.py", "_SpanColumns"), "PROVIDERS"),
                       (source("analysis/aggregates.py", "reduce_window"), "PROVIDERS"),
                       (source("data/aggregates.py", "aggregate_rows"), "declared("),
                       (source("reporters/aggregate.py", "_table_html"), "declared("),
                       (source("reporters/aggregate.py", "_cell"), "cell_text("),
                       (source("reporters/aggregate.py", "render_aggregate_report"),
                        "declared(")):
        # (the docstring may say what the providers add; peak_tflops is an option of the
        # summary's, handed to every provider)
        body = code.split('"""', 2)[-1].replace("peak_tflops", "")
        assert asks in body
        assert not features.findall(body), features.findall(body)
