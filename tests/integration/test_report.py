"""The HTML report of a real run, opened in headless Chromium (skipped without it).

Two runs: the plain demo, and the demo recorded with FLOPs (the table's FLOP columns);
both record memory (the memory columns and the facts line).
The screenshots are kept as test artifacts under out/test-artifacts/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (apt-get install)")
def test_the_report_renders_in_headless_chromium(demo_report: tuple[Path, bool],
                                                 tmp_path: Path) -> None:
    report, flops = demo_report
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    # GIVEN a headless Chromium with no network features and a fresh profile
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
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
