"""The HTML report of a real run, opened in headless Chromium (skipped without it).

Two runs: the plain demo, and the demo recorded with FLOPs (the table's FLOP columns);
both record memory (the memory columns and the facts line).
The screenshots are kept as test artifacts under out/test-artifacts/.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from hooktrace.demo import run_demo

pytest.importorskip("plotly")
webdriver = pytest.importorskip("selenium.webdriver")

ARTIFACTS = Path(__file__).resolve().parents[2] / "out" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "flops"])
def demo_report(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    flops = request.param
    result = run_demo(tmp_path_factory.mktemp("demo"), steps=2, flops=flops)
    assert result.report is not None, result.report_error
    return result.report, flops


def _chromium(tmp_path: Path) -> Any:
    """A headless Chromium with no network features, a fresh profile and the browser's
    console log kept."""
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver: make browser (apt-get install "
           "chromium chromium-driver)")


@NEEDS_CHROMIUM
def test_the_report_renders_in_headless_chromium(demo_report: tuple[Path, bool],
                                                 tmp_path: Path) -> None:
    report, flops = demo_report
    # GIVEN a headless Chromium with no network features and a fresh profile
    driver = _chromium(tmp_path)
    try:
        # WHEN it opens the demo's report
        driver.get(report.as_uri())
        labels = driver.execute_script(
            "return Array.from(document.querySelectorAll('#icicle text'))"
            ".map(e => e.textContent)")
        rows = driver.execute_script(
            "return document.querySelectorAll('#summary tbody tr').length")
        step_bars = driver.execute_script(
            "return document.querySelectorAll('#steps .bars path').length")
        # and sorts the table by calls (a click on its header)
        driver.execute_script("document.querySelectorAll('#summary th')[2].click()")
        first_calls = driver.execute_script(
            "return document.querySelector('#summary tbody tr').cells[2].textContent")
        headers = driver.execute_script(
            "return Array.from(document.querySelectorAll('#summary th'))"
            ".map(e => e.textContent)")
        facts = driver.execute_script("return document.querySelector('.facts').textContent")
        # what the page looks like at 1400 px: nothing wider than the window, and the
        # colours the charts were drawn in (the SVG's own fills)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth")
        icicle_fills = driver.execute_script(
            "var out = {}; document.querySelectorAll('#icicle g.slice').forEach(function (g) {"
            " var t = g.querySelector('text'), p = g.querySelector('path');"
            " if (t && p) out[t.textContent] = getComputedStyle(p).fill; }); return out")
        bar_fills = driver.execute_script(
            "return Array.from(document.querySelectorAll('#steps g.trace.bars')).map("
            "function (g) { return getComputedStyle(g.querySelector('path')).fill; })")
        # and, with FLOPs, sorts by TFLOP/s (ascending: blanks last)
        tflops = []
        if "TFLOP/s" in headers:
            col = headers.index("TFLOP/s")
            driver.execute_script(f"document.querySelectorAll('#summary th')[{col}].click()")
            tflops = driver.execute_script(
                "return Array.from(document.querySelectorAll('#summary tbody tr'))"
                f".map(r => r.cells[{col}].textContent)")
        log = driver.get_log("browser")
        shot = tmp_path / "report.png"
        driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / ("report-flops.png" if flops else "report.png"))
    # THEN nothing went wrong on the console, and the chart shows the model's modules
    errors = [e for e in log if e.get("level") in ("SEVERE", "WARNING")]
    assert not errors, errors
    # THEN the page fits 1400 px (the table scrolls in its own box), and forward and
    # backward have one colour each, the same in the icicle and the step chart
    assert overflow <= 0, overflow
    forward, backward = "rgb(255, 127, 14)", "rgb(31, 119, 180)"
    assert icicle_fills.get("forward") == forward and icicle_fills.get("backward") == backward, \
        icicle_fills
    assert bar_fills[:2] == [forward, backward], bar_fills
    assert {"run", "forward", "backward", "<root>", "blocks", "head", "ln_f"} <= set(labels)
    assert rows >= 20 and step_bars >= 2
    assert first_calls == "1" or int(first_calls) <= 2  # ascending: the fewest calls first
    # THEN the demo records memory: its columns are there and the facts line says it
    assert {"mem_net", "mem_peak", "bwd_mem_net", "bwd_mem_peak"} <= set(headers), headers
    assert "CPU memory: forward peak +" in facts
    # THEN a run with FLOPs has the FLOP columns, filled, and the model's TFLOP/s on top;
    # a run without has none
    flop_headers = {"flops", "bwd_flops", "TFLOP/s", "bwd_TFLOP/s"}
    if not flops:
        assert not flop_headers & set(headers) and "TFLOP/s" not in facts
        return
    assert flop_headers <= set(headers), headers
    assert "TFLOP/s forward" in facts and "TFLOP/s backward" in facts
    values = [float(v) for v in tflops if v]
    assert len(values) >= 10 and all(v > 0 for v in values)
    assert values == sorted(values) and tflops[:len(values)] == [v for v in tflops if v]


@NEEDS_CHROMIUM
def test_the_report_of_an_aggregate_folder_renders_in_headless_chromium(
        tmp_path: Path) -> None:
    import torch
    from torch import nn

    import hooktrace
    from hooktrace.cli import main

    # GIVEN an aggregate= folder of 12 steps, recorded with FLOPs, a step kept every 5
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    with hooktrace.trace(model, aggregate=tmp_path / "agg", flops=True, aggregate_interval=0,
                         detail="every=5"):
        for _ in range(12):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    # WHEN hooktrace report writes its page, in another folder than the aggregates
    (tmp_path / "html").mkdir()
    page = tmp_path / "html" / "agg.html"
    assert main(["report", str(tmp_path / "agg"), "-o", str(page)]) in (0, None)
    driver = _chromium(tmp_path)
    try:
        driver.get(page.as_uri())
        headers = driver.execute_script(
            "return Array.from(document.querySelectorAll('#summary th'))"
            ".map(e => e.textContent)")
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('#summary tbody tr'))"
            ".map(r => Array.from(r.cells).map(c => c.textContent))")
        traces = driver.execute_script(
            "return document.getElementById('steps').data.map("
            "t => [t.name, t.x.length])")
        drawn = driver.execute_script(
            "return document.querySelectorAll('#steps .scatterlayer .trace').length")
        kept = driver.execute_script(
            "return Array.from(document.querySelectorAll('#kept li a'))"
            ".map(a => [a.textContent, a.href])")
        # a click on calls sorts ascending: the fewest calls first
        col = headers.index("calls")
        driver.execute_script(f"document.querySelectorAll('#summary th')[{col}].click()")
        first_calls = driver.execute_script(
            f"return document.querySelector('#summary tbody tr').cells[{col}].textContent")
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth")
        log = driver.get_log("browser")
        shot = tmp_path / "agg.png"
        driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report-aggregate.png")
    # THEN no console error, the page fits, and the step chart has a point per step
    # (aggregate_interval=0: a window per step) and the 3 kept steps marked
    errors = [e for e in log if e.get("level") in ("SEVERE", "WARNING")]
    assert not errors, errors
    assert overflow <= 0, overflow
    assert traces == [["mean step", 12], ["longest step", 12], ["kept whole", 3]]
    assert drawn == 3
    # THEN the table: the step row first, each module in both modes, 12 calls each,
    # and the FLOP/s column filled for the Linear layers
    assert rows[0][:3] == ["<step>", "step", "12"]
    by = {(r[0], r[1]): dict(zip(headers, r, strict=True)) for r in rows}
    for module in ("<root>", "0", "1", "2"):
        assert by[(module, "forward")]["calls"] == "12"
    assert "TFLOP/s" in headers
    assert float(by[("0", "forward")]["TFLOP/s"]) > 0
    assert float(by[("2", "backward")]["TFLOP/s"]) > 0
    assert by[("1", "forward")]["TFLOP/s"] == ""  # ReLU: no FLOPs counted
    assert first_calls == "12"
    # THEN the kept steps are listed with links that reach their files
    assert [name.split("_")[0] for name, _ in kept] == ["step-0", "step-5", "step-10"]
    from urllib.parse import unquote, urlparse

    assert all(Path(unquote(urlparse(href).path)).is_file() for _, href in kept)
