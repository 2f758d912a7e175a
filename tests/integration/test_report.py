"""The HTML report of a real run, opened in headless Chromium (skipped without it).

The screenshot is kept as a test artifact under out/test-artifacts/.
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


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_demo(tmp_path_factory.mktemp("demo"), steps=2)
    assert result.report is not None, result.report_error
    return result.report


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (apt-get install)")
def test_the_report_renders_in_headless_chromium(demo_report: Path, tmp_path: Path) -> None:
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
        driver.get(demo_report.as_uri())
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
        log = driver.get_log("browser")
        shot = tmp_path / "report.png"
        driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report.png")
    # THEN nothing went wrong on the console, and the chart shows the model's modules
    errors = [e for e in log if e.get("level") in ("SEVERE", "WARNING")]
    assert not errors, errors
    assert {"run", "forward", "backward", "<root>", "blocks", "head", "ln_f"} <= set(labels)
    assert rows >= 20 and step_bars >= 2
    assert first_calls == "1" or int(first_calls) <= 2  # ascending: the fewest calls first
