"""What ``hooktrace top`` reads and draws (issue #51), on live files written here: the
slowest rank per row, the change against the first look, the screen fitted to the
terminal with hostile module names escaped, and the keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hooktrace.analysis.live import Watch
from hooktrace.commands.top import _Ui, render


def live(folder: Path, run: str, rank: int | None, rows: dict[str, float],
         step_ms: float, steps: int = 2, gpu: bool = False, **more: Any) -> None:
    """A live file of ``steps`` steps: ``rows`` module -> forward ms per step (and as
    much kernel busy time and a 3 MiB memory peak, with ``gpu``)."""
    names = [*rows, "<step>"]
    (folder / "live").mkdir(exist_ok=True)
    (folder / "live" / f"{run}.json").write_text(json.dumps({
        "run": run, "rank": rank, "ended": False, "steps": 100, "dropped_events": 0, **more,
        "rows": {"steps": [steps] * len(names), "module": names,
                 "mode": ["forward"] * len(rows) + ["step"], "calls": [steps] * len(names),
                 "total_ms": [v * steps for v in [*rows.values(), step_ms]],
                 **({"kernel_ms": [v * steps for v in rows.values()] + [None],
                     "mem_peak_bytes": [3 << 20] * len(rows) + [None]} if gpu else {})}}))


def test_each_row_is_its_slowest_rank_and_changes_against_the_first_look(tmp_path: Path) -> None:
    live(tmp_path, "a", 0, {"<root>": 8.0, "fc": 2.0}, 10.0)
    live(tmp_path, "b", 1, {"<root>": 6.0, "fc": 5.0}, 12.0)
    watch = Watch(tmp_path)
    first = watch.look()
    assert first is not None
    assert {(r.module, r.ms, r.source) for r in first.rows} == {("<root>", 8.0, "rank 0"),
                                                                ("fc", 5.0, "rank 1")}
    assert (first.step_ms, first.sources) == (12.0, ["rank 0", "rank 1"])
    assert all(r.change == 0.0 for r in first.rows)
    live(tmp_path, "b", 1, {"<root>": 6.0, "fc": 7.5}, 12.0)
    later = watch.look()
    assert later is not None
    assert {r.module: r.change for r in later.rows} == {"<root>": 0.0, "fc": 50.0}
    # a live file being replaced (cut short) is not read
    (tmp_path / "live" / "c.json").write_text('{"run": "c", "rows": {"st')
    assert watch.look() is not None


def test_the_screen_fits_the_terminal_and_escapes_names(tmp_path: Path) -> None:
    long = "enc." + "very_long_layer_name." * 4 + "fc"
    live(tmp_path, "a", None, {"<root>": 8.0, "x\x1b]0;pwned\x07": 3.0, long: 2.0,
                               **{f"m{i}": 0.1 for i in range(30)}}, 10.0, dropped_events=7)
    view = Watch(tmp_path).look()
    assert view is not None
    screen = render(view, "job\x1b[31m", _Ui(), 70, 12)
    assert len(screen) <= 12 and all(len(line) <= 70 for line in screen)
    text = "\n".join(screen)
    assert "\x1b" not in text and "\x07" not in text
    assert "x\\x1b]0;pwned\\x07 " in text
    cut = next(line.split()[0] for line in screen if line.startswith("enc."))
    assert "…" in cut and cut.endswith(".fc")  # (shortened as the summary does)
    assert any(line.startswith("... ") and "more rows" in line for line in screen)
    assert "events dropped" in text
    assert "gpu/step" not in text and "mem peak" not in text  # (not recorded)
    live(tmp_path, "a", None, {"<root>": 8.0}, 10.0, gpu=True)
    with_gpu = render(Watch(tmp_path).look(), "job", _Ui(), 100, 20)  # type: ignore[arg-type]
    assert "gpu/step" in with_gpu[3] and "8.00 ms" in with_gpu[4].split("forward")[1]
    assert "mem peak" in with_gpu[3] and "3.00 MiB" in with_gpu[4]
    # the filter shows only what matches; the step line holds the step time
    filtered = render(view, "job", _Ui(filter="LAYER"), 200, 50)
    assert filtered[4].split()[0] == long and filtered[5] == ""
    assert filtered[0] == "hooktrace top: step 10.0 ms, 100 steps/s, 100 steps - job"


def test_the_keys() -> None:
    ui = _Ui()
    assert [(ui.key("s"), ui.sort)[1] for _ in range(4)] == ["calls", "change", "name", "time"]
    for k in "/fc\x7fx\r":
        assert ui.key(k)
    assert (ui.filter, ui.typing) == ("fx", False)
    assert ui.key("p") and ui.paused and ui.key(" ") and not ui.paused
    assert ui.key("\x1b") and ui.filter == ""
    assert not ui.key("q")
