"""Issue #27 item 2: what used to be reached through private names, through public ones."""

from __future__ import annotations

import pytest
import torch

import hooktrace
from hooktrace.exporters._chrome_json import micros
from hooktrace.exporters.merged import MergeError, as_run


def test_one_micros_with_the_sign() -> None:
    # merge.py had its own copy without the sign: -1500 ns came out "-2.500"
    assert [micros(n) for n in (0, 1, 1500, -1, -1500, -999_999)] == [
        "0.000", "0.001", "1.500", "-0.001", "-1.500", "-999.999"]
    import hooktrace.exporters.chrome as chrome
    import hooktrace.exporters.merged as merged
    import hooktrace.exporters.ranks as ranks

    for m in (chrome, merged, ranks):
        assert all(getattr(m, n) is micros for n in vars(m) if n.lstrip("_") == "micros"), m


def test_recorder_done_and_as_run() -> None:
    model = torch.nn.Linear(2, 2)
    tr = hooktrace.trace(model)
    assert tr.done is False
    with tr:
        model(torch.randn(1, 2))
        assert tr.done is False
        with pytest.raises(MergeError, match="has not exited yet"):
            as_run(tr)
    assert tr.done is True
    run = as_run(tr)
    assert run.events is tr.result.events
    assert as_run(run) is run


def test_merge_keeps_its_public_names() -> None:
    import hooktrace.exporters.merged as merged
    import hooktrace.merge as old

    for name in old.__all__:
        assert getattr(old, name) is getattr(merged, name)
