"""RecordOptions (hooktrace/record/options.py, issue #27): every recording option checked
once, one rule per test, with the errors trace()/global_trace() have always raised."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from hooktrace.errors import OutputPathError
from hooktrace.record.options import (
    DEFAULT_CAPACITY,
    OPTION_HELP,
    STREAM_CAPACITY,
    RecordOptions,
)


def test_defaults_are_resolved() -> None:
    o = RecordOptions()
    assert o.capacity == DEFAULT_CAPACITY and o.policy == "drop" and o.backward is True
    assert o.dump_on == frozenset() and o.numerics_every == 1 and o.out is None


def test_streaming_capacity_default(tmp_path: Path) -> None:
    o = RecordOptions(out=tmp_path / "a.htrace")
    assert o.capacity == STREAM_CAPACITY and o.out == str(tmp_path / "a.htrace")


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RecordOptions().capacity = 5  # type: ignore[misc]


@pytest.mark.parametrize("policy, error", [("rings", ValueError), (1, TypeError)])
def test_policy(policy: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="policy must be one of 'drop', 'ring'"):
        RecordOptions(policy=policy)


@pytest.mark.parametrize("flag", ["backward", "emit_profiler", "flops", "memory", "numerics",
                                  "shapes"])
def test_flags_are_bools(flag: str) -> None:
    with pytest.raises(TypeError, match=f"{flag} must be True or False, got int 1"):
        RecordOptions(**{flag: 1})
    import numpy as np

    assert getattr(RecordOptions(**{flag: np.bool_(True)}), flag) is True


@pytest.mark.parametrize("every", [0, -1, True, 1.5, "2"])
def test_numerics_every(every: Any) -> None:
    with pytest.raises(ValueError, match="numerics_every must be a positive integer"):
        RecordOptions(numerics=True, numerics_every=every)


def test_steps() -> None:
    with pytest.raises(ValueError, match="steps must be 'optimizer' or None"):
        RecordOptions(steps="epoch")  # type: ignore[arg-type]


def test_dump_on() -> None:
    with pytest.raises(ValueError, match="dump_on: unknown"):
        RecordOptions(dump_on="crash")
    with pytest.raises(TypeError, match="dump_on must be a string or a sequence"):
        RecordOptions(dump_on=3)
    assert RecordOptions(dump_on=["hang", "signal"]).dump_on == {"hang", "signal"}


def test_dump_dir_must_be_a_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        RecordOptions(dump_dir=tmp_path / "f")


@pytest.mark.parametrize("timeout", [0, -1.0, "5"])
def test_hang_timeout(timeout: Any) -> None:
    with pytest.raises(ValueError, match="hang_timeout must be a positive number of seconds"):
        RecordOptions(hang_timeout=timeout)


def test_dump_signal() -> None:
    with pytest.raises(ValueError, match="dump_signal must be a signal that can be handled"):
        RecordOptions(dump_signal=signal.SIGKILL)


@pytest.mark.parametrize("capacity, error, message", [
    (0, ValueError, "capacity must be between 1 and 2\\*\\*40 events, got 0"),
    ((1 << 40) + 1, ValueError, "capacity must be between 1"),
    (4096.0, TypeError, "capacity must be an int.*float"),
    (True, TypeError, "capacity must be an int"),
])
def test_capacity(capacity: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RecordOptions(capacity=capacity)


def test_schedule_must_be_callable() -> None:
    with pytest.raises(TypeError, match="schedule must be a torch.profiler.schedule"):
        RecordOptions(schedule=3)  # type: ignore[arg-type]


def test_on_window_needs_a_schedule() -> None:
    with pytest.raises(TypeError, match="on_window needs a schedule"):
        RecordOptions(on_window=print)


@pytest.mark.parametrize("other", [{"policy": "ring"}, {"out": "x.htrace"}])
def test_schedule_refuses_ring_and_out(other: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="schedule= records windows"):
        RecordOptions(schedule=lambda step: None, **other)


def test_out(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="out= cannot be combined with policy='ring'"):
        RecordOptions(out=tmp_path / "a.htrace", policy="ring")
    with pytest.raises(OutputPathError, match="-: a stream is read back"):
        RecordOptions(out="-")
    with pytest.raises(TypeError, match="out must be a file path"):
        RecordOptions(out=3)  # type: ignore[arg-type]
    with pytest.raises(OutputPathError, match="is a directory"):
        RecordOptions(out=tmp_path)


def test_from_kwargs_names_an_unknown_option() -> None:
    with pytest.raises(TypeError, match="unknown option 'numeric'"):
        RecordOptions.from_kwargs(numeric=True)
    assert RecordOptions.from_kwargs(shapes=True).shapes is True


def test_every_option_has_its_help_once() -> None:
    fields = {f.name for f in dataclasses.fields(RecordOptions)}
    assert set(OPTION_HELP) == fields
    assert all(text and "\n" not in text for text in OPTION_HELP.values())


def test_run_flags_read_the_help_table() -> None:
    import argparse

    from hooktrace.launch import add_options

    p = argparse.ArgumentParser()
    add_options(p)
    helps = {a.dest: a.help for a in p._actions}
    for option in ("flops", "memory", "numerics", "shapes", "capacity"):
        assert helps[option] == OPTION_HELP[option]


@pytest.mark.parametrize("argv, message", [
    (["--capacity", "0"], "--capacity must be between 1 and 2**40 events, got 0"),
    (["--numerics-every", "0"], "--numerics-every must be a positive integer (steps), got 0"),
    (["--hang-timeout", "-1"], "--hang-timeout must be a positive number of seconds, got -1.0"),
    (["--dump-on", "crash"], "--dump-on: dump_on: unknown ['crash']"),
])
def test_run_reports_record_options_errors_as_flags(argv: list[str], message: str,
                                                    tmp_path: Path) -> None:
    import argparse

    from hooktrace.errors import OptionError
    from hooktrace.launch import add_options, options_from_args

    p = argparse.ArgumentParser()
    add_options(p)
    args = p.parse_args(["-o", os.fspath(tmp_path / "a.htrace"), *argv])
    with pytest.raises(OptionError) as e:
        options_from_args(args)
    assert str(e.value).startswith(message)
