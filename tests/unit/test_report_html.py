"""The HTML report's content, without a browser (tests/integration/test_report.py opens it)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import backward_trace
from test_diff import run

pytest.importorskip("plotly")

from hooktrace.cli import main  # noqa: E402
from hooktrace.reporters.html import (  # noqa: E402
    ICICLE_OPTIONS,
    OTHER_MEANS,
    icicle_data,
    render_report,
    steps_figure,
)


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


def _flops_run():
    from test_span_flops import flops_trace

    return flops_trace(0)


def test_a_run_with_flops_has_the_flop_columns() -> None:
    # GIVEN a run recorded with FLOPs, and one without
    with_flops = render_report(_flops_run(), source="f.htrace")
    without = render_report(backward_trace(0), source="b.htrace")
    headers = re.findall(r'<th data-col="\d+" data-key="(\w+)"[^>]*>([^<]*)</th>', with_flops)
    shown = dict(headers)
    # THEN the first has the FLOP columns, titled as `hooktrace summary --flops` does,
    # MFU only with a peak, and the model's TFLOP/s among the facts
    assert {k: shown.get(k) for k in ("flops", "bwd_flops", "tflops", "bwd_tflops")} == {
        "flops": "flops", "bwd_flops": "bwd_flops", "tflops": "TFLOP/s",
        "bwd_tflops": "bwd_TFLOP/s"}
    assert "mfu" not in shown and "MFLOP" in with_flops
    assert re.search(r"model [0-9.e+-]+ TFLOP/s forward, [0-9.e+-]+ TFLOP/s backward", with_flops)
    assert "TFLOP/s" not in without.split("<script>", 2)[-1].split("var ice")[0]
    assert "data-key=\"tflops\"" not in without
    # AND with a peak, MFU
    peaked = render_report(_flops_run(), source="f.htrace", peak_tflops=100.0)
    assert 'data-key="mfu"' in peaked and re.search(r"MFU \d+\.\d%", peaked)
    # AND the icicle's hover text gives a module's FLOPs and TFLOP/s
    ice = json.loads(re.search(r"var ice = (\{.*?\});\n", with_flops).group(1))
    assert any("FLOP per call" in h and "TFLOP/s" in h for h in ice["hover"])


def test_the_report_command_takes_a_peak(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    import hooktrace

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with hooktrace.trace(model, flops=True) as tr:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
    src, out = tmp_path / "f.htrace", tmp_path / "r.html"
    tr.save(src)
    assert main(["report", str(src), "-o", str(out), "--peak-tflops", "50"]) == 0
    assert 'data-key="mfu"' in out.read_text()
    assert main(["report", str(src), "-o", str(out), "--peak-tflops", "0"]) == 1
    assert "--peak-tflops must be a positive number" in capsys.readouterr().err


def test_each_phase_has_one_colour_whatever_the_run_holds() -> None:
    # a forward-only run and one with backward: forward boxes are the same colour in both,
    # and the step chart uses the same two colours (plotly's own order would swap them)
    from hooktrace.reporters.html import BACKWARD_COLOR, FORWARD_COLOR, OTHER_COLOR

    for trace in (run(), backward_trace(3)):
        ice = icicle_data(trace.summary())
        for id_, color in zip(ice["ids"], ice["colors"]):
            if id_.startswith("run/forward"):
                assert color == FORWARD_COLOR, id_
            elif id_.startswith("run/backward"):
                assert color == BACKWARD_COLOR, id_
        page = render_report(trace)
        assert "marker: {colors: ice.colors}" in page
        fig = steps_figure([{"step": 0, "forward_ns": 1, "backward_ns": 1, "duration_ns": 3}])
        assert [(d["meta"], d["marker"]["color"]) for d in fig["data"]] == [
            ("forward", FORWARD_COLOR), ("backward", BACKWARD_COLOR), ("other", OTHER_COLOR)]
        assert 'Plotly.newPlot("steps", s.data, s.layout, config)' in page


def test_time_headers_name_no_unit_the_cells_do_not_show() -> None:
    page = render_report(run())
    headers = dict(re.findall(r'<th data-col="\d+" data-key="(\w+)"[^>]*>([^<]*)</th>', page))
    assert headers["total_ns"] == "total (time)" and headers["p50_ns"] == "p50 (time)"
    assert not any(h.endswith("_ns") for h in headers.values())
    assert '<div class="scroll"><table id="summary">' in page


def _page_json(page: str, var: str) -> dict:
    """The JSON a page's script assigns to ``var`` (``var NAME = {...};``)."""
    start = page.index(f"var {var} = ") + len(f"var {var} = ")
    return json.JSONDecoder().raw_decode(page[start:])[0]


def test_step_chart_legend_clears_the_toolbar_and_says_what_other_is() -> None:
    page = render_report(run(steps=3), source="r.htrace")
    fig = _page_json(page, "s")
    layout = fig["layout"]
    # the legend: one row above the plot, on the left (plotly's toolbar is top right),
    # with room above the plot for it
    assert layout["legend"]["orientation"] == "h"
    assert layout["legend"]["y"] >= 1 and layout["legend"]["yanchor"] == "bottom"
    assert layout["legend"]["x"] == 0 and layout["legend"]["xanchor"] == "left"
    assert layout["margin"]["t"] >= 30
    # "other" says what it is: in the legend, its hover and the caption
    other = next(d for d in fig["data"] if d["meta"] == "other")
    assert other["name"].startswith("other (optimizer")
    assert "optimizer step" in other["hovertemplate"]
    assert "optimizer step" in OTHER_MEANS and html_text(OTHER_MEANS) in page
    assert [d["meta"] for d in fig["data"]] == ["forward", "backward", "other"]
    assert len(fig["data"][0]["x"]) == 3


def html_text(text: str) -> str:
    import html

    return html.escape(text)


def test_forward_is_left_of_backward_whichever_is_larger() -> None:
    # GIVEN runs where backward takes 4-10x forward's time (plotly's default, sorting
    # siblings by value, drew backward on the left)
    for trace in (backward_trace(3), backward_trace(5)):
        page = render_report(trace)
        ice = _page_json(page, "ice")
        # THEN the icicle keeps the data's order (plotly would sort siblings by value)
        assert ICICLE_OPTIONS["sort"] is False and '"sort": false' in page
        tops = [i for i, p in zip(ice["ids"], ice["parents"]) if p == "run"]
        assert tops == ["run/forward", "run/backward"]


def test_a_bracketed_name_with_a_dot_is_one_box() -> None:
    # GIVEN a compile row (module "<torch.compile>", issue #38: a box "<torch" held a
    # child "compile>")
    summary = run().summary()
    row = dict(next(r for r in summary.rows if r["module"] == "b"), module="<torch.compile>",
               type="torch.compile")
    summary.rows.append(row)
    ice = icicle_data(summary)
    labels = dict(zip(ice["ids"], ice["labels"]))
    parent = dict(zip(ice["ids"], ice["parents"]))
    assert labels["run/forward/<torch.compile>"] == "<torch.compile>"
    assert parent["run/forward/<torch.compile>"] == "run/forward/<root>"  # (as "b")
    assert not any("<torch" in i and i != "run/forward/<torch.compile>" for i in ice["ids"])


def test_eval_calls_have_their_own_branch_in_the_chart() -> None:
    """Issue #38: the chart left out eval calls (12.5 s of nanoGPT's evaluation was
    invisible). They get a branch of their own beside forward and backward, as wide as
    the eval calls' total, in their own colour."""
    import torch
    from torch import nn

    import hooktrace

    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hooktrace.trace(model) as tr:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                model(torch.randn(2, 4))
            model.train()
    summary = tr.result.summary()
    ice = icicle_data(summary)
    value = dict(zip(ice["ids"], ice["values"]))
    parent = dict(zip(ice["ids"], ice["parents"]))
    color = dict(zip(ice["ids"], ice["colors"]))

    def width(i: str) -> float:
        return value[i] + sum(width(c) for c, p in parent.items() if p == i)

    evals = {r["module"]: r for r in summary.rows if r.get("mode") == "eval"}
    assert parent["run/eval"] == "run" and evals[""]["calls"] == 2
    assert width("run/eval/<root>") == pytest.approx(evals[""]["total_ns"] / 1e3, abs=1e-2)
    assert width("run/eval/1") == pytest.approx(evals["1"]["total_ns"] / 1e3, abs=1e-2)
    assert parent["run/eval/1.0"] == "run/eval/1"
    assert color["run/eval/1.0"] != color["run/forward/1.0"]
    # the training calls' branch is as before: their own totals, not the eval calls'
    train = {r["module"]: r for r in summary.rows if r.get("mode") != "eval"}
    assert width("run/forward/<root>") == pytest.approx(train[""]["total_ns"] / 1e3, abs=1e-2)


def _compiled_run(step_ns: tuple[int, ...] = (25_000_000_000, 58_000_000, 58_000_000,
                                                 60_000_000)) -> Any:
    """A run of 4 steps whose first compiled (25 s, as torch.compile's first call), the
    others 58-60 ms: the root and its one child called once per step."""
    from conftest import build_trace, events_from

    from hooktrace._events import ENTER, EXIT, STEP

    rows, t = [], 1_000
    for n, d in enumerate(step_ns):
        rows += [(1, ENTER, 0, t + 50, 0), (1, ENTER, 1, t + 60, 0), (1, EXIT, 1, t + d // 2, 0),
                 (1, EXIT, 0, t + d - 100, 0), (1, STEP, 0, t + d, n)]
        t += d
    ev = events_from(rows, ("tid", "kind", "id", "t", "seq"), rf_tid=1)
    return build_trace(ev, [("", "Net"), ("fc", "Linear")],
                       compiles=[[2_000, 20_000_000_000, 1]])


def _facts(page: str) -> str:
    return html.unescape(re.search(r'<div class="facts">(.*?)</div>', page, re.S).group(1))


def test_report_of_a_compiled_run_leaves_its_compile_step_out_by_default(tmp_path: Path) -> None:
    # GIVEN a run whose first step compiled for 25 s and whose others took ~58 ms
    run_path = tmp_path / "run.htrace"
    _compiled_run().save(run_path)
    pages = {}
    for extra in ([], ["--steps", "all"], ["--steps", "2:3"]):
        out = tmp_path / f"r{len(extra)}{'-'.join(extra)}.html"
        assert main(["report", str(run_path), "-o", str(out), *extra]) == 0
        pages[" ".join(extra)] = out.read_text(encoding="utf-8")
    # THEN by default the report covers the steps after it, and says so
    facts = _facts(pages[""])
    assert "step 0 compiled (torch.compile, 25.00 s): left out of this report" in facts
    assert "--steps all" in facts
    steps = json.loads(re.search(r"var s = (\{.*?\});\n", pages[""], re.S).group(1))
    assert steps["data"][0]["x"] == [1, 2, 3]
    assert max(steps["data"][0]["y"]) < 100  # no 25 s bar: the chart's scale is the steps'
    # THEN --steps all is the whole run, --steps 2:3 those two steps
    assert "left out of this report" not in _facts(pages["--steps all"])
    whole = json.loads(re.search(r"var s = (\{.*?\});\n", pages["--steps all"],
                                 re.S).group(1))
    assert whole["data"][0]["x"] == [0, 1, 2, 3]
    assert "steps 2 to 3 only (--steps 2:3)" in _facts(pages["--steps 2:3"])


def test_cut_steps_covers_the_steps_it_keeps() -> None:
    from hooktrace.analysis._filters import cut_steps, leading_compile_steps

    trace = _compiled_run()
    assert leading_compile_steps(trace) == 1
    s = trace.steps()
    cut = cut_steps(trace, int(s.end_ns[0]), None)
    rows = {r["module"]: r for r in cut.summary().rows}
    assert rows[""]["calls"] == 3 and rows[""]["total_ns"] == (58_000_000 * 2 + 60_000_000
                                                                - 3 * 150)
    assert cut.summary().counts["compile_steps"] == 0
    assert cut.info["compiles"] == []
    # a run without compiles, or one that compiled in every step, keeps every step
    assert leading_compile_steps(_compiled_run()) == 1
    plain = _compiled_run()
    plain.info["compiles"] = []
    assert leading_compile_steps(plain) == 0


def test_report_steps_out_of_range_is_one_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run_path = tmp_path / "run.htrace"
    _compiled_run().save(run_path)
    assert main(["report", str(run_path), "-o", str(tmp_path / "r.html"), "--steps",
                 "7:9"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps 7:9: no step in 7..9: the trace has steps 0 to 3" in err[0]
