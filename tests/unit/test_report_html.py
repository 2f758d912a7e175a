"""The HTML report's content, without a browser (tests/integration/test_report.py opens it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import backward_trace
from test_diff import run

pytest.importorskip("plotly")

from hooktrace.cli import main  # noqa: E402
from hooktrace.reporters.html import icicle_data, render_report  # noqa: E402


def test_forward_widths_are_the_modules_totals() -> None:
    trace = run()
    ice = icicle_data(trace.summary())
    rows = {r["module"]: r for r in trace.summary().rows}
    value = dict(zip(ice["ids"], ice["values"]))
    parent = dict(zip(ice["ids"], ice["parents"]))
    # the width of a box is its own value plus its descendants' (branchvalues "remainder")
    def width(i: str) -> float:
        return value[i] + sum(width(c) for c, p in parent.items() if p == i)
    assert width("run/forward/<root>") == pytest.approx(rows[""]["total_ns"] / 1e3)
    assert width("run/forward/b") == pytest.approx(rows["b"]["total_ns"] / 1e3)
    assert parent["run/forward/b"] == "run/forward/<root>"
    assert "run/backward" not in value  # a forward-only run


def test_backward_boxes_cover_every_module_with_backward_time() -> None:
    trace = backward_trace(3)
    summary = trace.summary()
    ice = icicle_data(summary)
    value = dict(zip(ice["ids"], ice["values"]))
    parent = dict(zip(ice["ids"], ice["parents"]))
    def width(i: str) -> float:
        return value[i] + sum(width(c) for c, p in parent.items() if p == i)
    for r in summary.rows:
        if r["bwd_calls"] and r["module"] not in ("", "<unattributed>"):
            box = "run/backward/" + r["module"]
            assert width(box) >= r["bwd_total_ns"] / 1e3 - 1e-3
    assert "run/backward/<unattributed>" in value
    assert all(v >= 0 for v in ice["values"])


def test_the_page_is_self_contained(tmp_path: Path) -> None:
    text = render_report(run(), source="x.htrace")
    # no resource is fetched: no src/href to anything but the page itself
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)=""", text)
    assert "https://" not in text.split("<script>", 2)[-1].split("</script>")[-1]
    assert text.count("<table id=\"summary\">") == 1 and "hooktrace export x.htrace" in text
    ice = json.loads(re.search(r"var ice = (\{.*?\});\n", text).group(1))
    assert "run/forward/b" in ice["ids"]


def test_the_report_command_writes_the_file(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "run.htrace", tmp_path / "r.html"
    run().save(src)
    assert main(["report", str(src), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(src), "-o", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
