"""The Trace object before, during and after its with block (issue #7)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import hooktrace


def test_repr_works_in_every_state() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    tr = hooktrace.trace(model)
    assert repr(tr) == "<Trace of Sequential: not started>"
    with tr:
        assert repr(tr) == "<Trace of Sequential: recording>"
        model(torch.randn(1, 2))
    # the recorder hands back a result; it does not become it
    assert re.match(r"<Trace done: <\w+ 4 events, 2 modules, pid ", repr(tr)), repr(tr)
    assert repr(tr.result).startswith(f"<{type(tr.result).__name__} 4 events, 2 modules, pid ")


@pytest.mark.parametrize("read", ["summary", "save", "export_chrome", "spans", "events", "pid"])
def test_reading_before_the_block_ends_is_one_clear_error(read: str, tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    tr = hooktrace.trace(model)

    def attempt() -> None:
        attr = getattr(tr, read)
        if callable(attr):
            attr(tmp_path / "x") if read in ("save", "export_chrome") else attr()

    with pytest.raises(RuntimeError, match="not started.*read it after the with block"):
        attempt()
    with tr:
        with pytest.raises(RuntimeError, match="still recording.*read it after the with block"):
            attempt()
    attempt()  # after the block: works
    assert not list(tmp_path.glob("*.tmp"))


def test_snapshot_reads_the_events_so_far_while_recording_goes_on() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 2))
        first = tr.snapshot()
        model(torch.randn(1, 2))
        second = tr.snapshot()
    assert [len(s.spans()) for s in (first, second, tr)] == [3, 6, 6]
    assert first.info["stop_unix_ns"] <= second.info["stop_unix_ns"] <= tr.info["stop_unix_ns"]
    # a snapshot's clock is measured up to its moment: the same spans at the same
    # times, to the conversion's precision (both map the same ticks, ~100 ns)
    diff = first.spans().start_ns - tr.spans().start_ns[:3]
    assert abs(diff).max() < 1000
    assert tr.snapshot() is tr.result  # done: the snapshot is the result
