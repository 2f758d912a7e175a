"""Output names for hooktrace run and the trainer adapters (hooktrace._naming)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from hooktrace._naming import env_rank, output_path


def test_default_name_has_host_pid_and_rank_when_known() -> None:
    base = f"hooktrace-{socket.gethostname()}_{os.getpid()}"
    assert output_path(None, ".htrace", None) == Path(base + ".htrace")
    assert output_path(None, ".json", 3) == Path(base + "_rank3.json")


def test_folder_gets_the_default_name(tmp_path: Path) -> None:
    assert output_path(str(tmp_path), ".htrace", 0).parent == tmp_path
    assert output_path("new/", ".htrace", None).parent == Path("new")


@pytest.mark.parametrize(("template", "rank", "expected"), [
    ("run.htrace", None, "run.htrace"),
    ("out/run.htrace", 1, "out/run_rank1.htrace"),
    ("t.json.gz", 2, "t_rank2.json.gz"),
    ("noext", 0, "noext_rank0.htrace"),  # a rank's file gets the suffix it lacked
    ("r{rank}/run.htrace", 5, "r5/run.htrace"),   # {rank} given: nothing added
    ("run-{rank}.htrace", None, "run-0.htrace"),
])
def test_rank_goes_into_every_name(template: str, rank: int | None, expected: str) -> None:
    assert output_path(template, ".htrace", rank).as_posix() == expected


def test_env_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert env_rank() is None
    monkeypatch.setenv("RANK", "7")
    assert env_rank() == 7
    monkeypatch.setenv("RANK", "x")
    assert env_rank() is None
