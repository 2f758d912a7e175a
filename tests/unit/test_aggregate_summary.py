"""``hooktrace summary DIR`` of an ``aggregate=`` folder, on parts written with known values
(issue #47 items 7 and 8): its p50 is the median step's time weighted by steps, its
column says so, and its module names are cut as every table cuts them (never into a
string that is not a name), with --wide and COLUMNS giving them room."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hooktrace.cli import main

pa = pytest.importorskip("pyarrow", reason="the data extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")


def write_part(folder: Path, rows: dict[str, list[Any]], name: str = "part-r-00001") -> Path:
    """An aggregate= folder's part holding ``rows`` (the other columns null), as the
    recorder writes it."""
    from hooktrace.data.schema import AGGREGATES, file_schema, metadata

    parts = folder / "aggregates"
    parts.mkdir(parents=True, exist_ok=True)
    s = file_schema(AGGREGATES, partitioned=True).with_metadata(metadata(AGGREGATES))
    n = len(rows["step"])
    rows = {"run": ["r"] * n, **rows}
    path = parts / f"{name}.parquet"
    pq.write_table(pa.Table.from_pydict({f.name: rows.get(f.name, [None] * n) for f in s},
                                        schema=s), path)
    return path


def windows(per_window: list[tuple[int, float, float]], module: str = "fc") -> dict[str, list]:
    """Rows of windows, each ``(steps, ms per step, median call in ms)``: a forward row of
    ``module`` (one call per step) and the step row."""
    rows: dict[str, list[Any]] = {k: [] for k in (
        "step", "steps", "module", "mode", "calls", "total_ms", "p50_ms", "max_ms",
        "total_ns", "self_ns")}
    first = 0
    for steps, ms, p50 in per_window:
        for module_, mode in ((module, "forward"), ("<step>", "step")):
            rows["step"].append(first)
            rows["steps"].append(steps)
            rows["module"].append(module_)
            rows["mode"].append(mode)
            rows["calls"].append(steps)
            rows["total_ms"].append(ms * steps)
            rows["p50_ms"].append(p50)
            rows["max_ms"].append(p50)
            rows["total_ns"].append(round(ms * steps * 1e6))
            rows["self_ns"].append(None if mode == "step" else round(ms * steps * 1e6))
        first += steps
    return rows


def test_p50_is_the_median_step_weighted_by_steps(tmp_path: Path) -> None:
    from hooktrace.data.aggregates import aggregate_summary, aggregate_summary_data

    # GIVEN 1-second windows: two of one slow step each (143 ms, a compile, a validation)
    # and one of 17 steps at 55 ms: the windows' medians are 143, 143 and 55
    write_part(tmp_path / "agg", windows([(1, 143.0, 143.0), (1, 143.0, 143.0),
                                          (17, 55.0, 55.0)]))
    data = aggregate_summary_data(tmp_path / "agg")
    step = next(r for r in data["rows"] if r["mode"] == "step")
    fc = next(r for r in data["rows"] if r["module"] == "fc")
    # THEN p50 is the median of the 19 steps (55 ms), not the windows' median (143 ms)
    assert step["p50_ms_per_step"] == pytest.approx(55.0)
    assert fc["p50_ms_per_step"] == pytest.approx(55.0)
    assert step["ms_per_step"] == pytest.approx((2 * 143 + 17 * 55) / 19)  # the mean
    # THEN the column says what it is
    text = aggregate_summary(tmp_path / "agg").splitlines()
    assert "p50 ms/step" in text[1]
    assert any(line.startswith("p50 ms/step: the median step's") and "weighted by its "
               "steps" in line for line in text)
    row = next(line.split() for line in text if line.startswith("<step>"))
    assert "55.000" in row and "143.000" in row  # p50 55; the longest step 143


def test_p50_with_a_window_per_step_is_the_exact_median(tmp_path: Path) -> None:
    from hooktrace.data.aggregates import aggregate_summary_data, weighted_medians

    write_part(tmp_path / "agg", windows([(1, ms, ms) for ms in (5.0, 1.0, 4.0, 2.0)]))
    rows = aggregate_summary_data(tmp_path / "agg")["rows"]
    assert {r["mode"]: r["p50_ms_per_step"] for r in rows} == {"forward": 3.0, "step": 3.0}
    # (the weighted median: an even split of the weights takes the middle two's mean)
    assert weighted_medians([0, 0, 1], [1.0, 3.0, 7.0], [2, 2, 5], 3).tolist()[:2] == [2.0, 7.0]


def test_the_report_of_an_aggregate_folder_has_the_same_p50(tmp_path: Path) -> None:
    from hooktrace.data.aggregates import aggregate_rows, load_aggregates

    write_part(tmp_path / "agg", windows([(1, 143.0, 143.0), (1, 143.0, 143.0),
                                          (17, 55.0, 55.0)]))
    rows, steps = aggregate_rows(load_aggregates(tmp_path / "agg"))
    assert steps == 19
    assert {r["mode"]: r["p50_ms_per_step"] for r in rows} == {"forward": 55.0, "step": 55.0}


LORA = [f"base_model.model.model.layers.{i}.self_attn.{p}_proj.{part}.default"
        for i in range(3) for p in "qv" for part in ("lora_A", "lora_B", "lora_dropout")]


def reads_as(cut: str, names: list[str]) -> list[str]:
    """The names a printed cell can be: itself, or those an elided cell (``head.….tail``,
    whole dotted parts left out) fits."""
    if "…" not in cut:
        return [n for n in names if n == cut]
    head, tail = cut.split("…")
    assert head == "" or head.endswith("."), cut
    assert tail.startswith("."), cut
    return [n for n in names if n.startswith(head) and n.endswith(tail)
            and len(n) > len(head) + len(tail)]


@pytest.mark.parametrize("columns", ["60", "120", "200"])
def test_aggregate_names_are_names_or_visibly_cut_and_stay_apart(
        tmp_path: Path, columns: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a LoRA model's 18 adapter modules, which differ in the layer, the projection
    # and the adapter part (issue #47: cut at 39 characters, 18 rows read as 3 labels)
    rows = windows([(2, 1.0, 1.0)], LORA[0])
    for name in LORA[1:]:
        more = windows([(2, 1.0, 1.0)], name)
        for k in rows:
            rows[k].append(more[k][0])
    write_part(tmp_path / "agg", rows)
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["summary", str(tmp_path / "agg")]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [line.split()[0] for line in lines[2:] if " forward " in line]
    # THEN each printed name is one module's name, or a cut that fits that module only
    assert len(cells) == len(LORA)
    for cell in cells:
        assert len(reads_as(cell, LORA)) == 1, cell
    assert len(set(cells)) == len(LORA)
    # THEN the leaf is always there, and a footer says how to see the names whole
    assert all(c.endswith(("lora_A.default", "lora_B.default", "lora_dropout.default"))
               for c in cells)
    cut = any("…" in c for c in cells)
    assert cut == (columns != "200")
    assert any(line.startswith("…: whole dotted parts of a name left out") for line in lines) \
        == cut
    # THEN --wide prints them whole
    assert main(["summary", str(tmp_path / "agg"), "--wide"]) == 0
    wide = capsys.readouterr().out
    assert all(name in wide for name in LORA) and "…" not in wide


def test_aggregate_diff_names_are_names_or_visibly_cut(tmp_path: Path) -> None:
    from hooktrace.data.aggregates import aggregate_diff

    rows = windows([(2, 1.0, 1.0)], LORA[0])
    for name in LORA[1:]:
        more = windows([(2, 1.0, 1.0)], name)
        for k in rows:
            rows[k].append(more[k][0])
    write_part(tmp_path / "a", rows)
    write_part(tmp_path / "b", rows)
    text, failed = aggregate_diff(tmp_path / "a", tmp_path / "b", width=60)
    cells = [line.split()[0] for line in text.splitlines()[2:] if " forward " in line]
    assert len(cells) == len(LORA) and failed == []
    for cell in cells:
        assert len(reads_as(cell, LORA)) == 1, cell
    assert re.search(r"^…: whole dotted parts", text, re.M)
