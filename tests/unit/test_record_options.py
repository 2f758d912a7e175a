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
    # (issue #35: 123 was accepted, and tested as file descriptor 123)
    with pytest.raises(TypeError, match="^dump_dir must be a folder path, got int 123$"):
        RecordOptions(dump_dir=123)


@pytest.mark.parametrize("timeout", [0, -1.0, "5", True, float("inf")])
def test_hang_timeout(timeout: Any) -> None:
    with pytest.raises(ValueError, match="hang_timeout must be a positive number of seconds"):
        RecordOptions(hang_timeout=timeout)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                                 signal.SIGILL, signal.SIGABRT, True, 1.0, 9999])
def test_dump_signal(sig: Any) -> None:
    # (issue #35: SIGSEGV was accepted; its handler cannot run before the fault repeats)
    with pytest.raises(ValueError, match="dump_signal must be a signal a Python handler can "
                                         "serve"):
        RecordOptions(dump_signal=sig)
    assert RecordOptions(dump_signal=signal.SIGUSR2).dump_signal == signal.SIGUSR2


@pytest.mark.parametrize("size", ["99999999999T", 1 << 64, "1e3T"])
def test_max_disk_has_a_ceiling(size: Any) -> None:
    # (issue #35: beyond 2**64 bytes it was a pybind11 TypeError traceback when recording)
    with pytest.raises(ValueError, match="^max_disk must be .*, got "):
        RecordOptions(max_disk=size)
    assert RecordOptions(max_disk="1048576T").max_disk == 1 << 60


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

    from hooktrace.record.launch import add_options

    p = argparse.ArgumentParser()
    add_options(p)
    helps = {a.dest: a.help for a in p._actions}
    for option in ("flops", "memory", "numerics", "shapes", "capacity"):
        assert helps[option] == OPTION_HELP[option]


@pytest.mark.parametrize("argv, message", [
    (["--capacity", "0"], "--capacity must be between 1 and 2**40 events, got 0"),
    (["--numerics-every", "0"], "--numerics-every must be a positive integer (steps), got 0"),
    (["--hang-timeout", "-1"], "--hang-timeout must be a positive number of seconds, got -1.0"),
    (["--max-disk", "99999999999T"], "--max-disk must be at most 1048576T (2**60 bytes), got "
                                     "'99999999999T'"),
    (["--dump-on", "crash"], "--dump-on: dump_on: unknown ['crash']"),
])
def test_run_reports_record_options_errors_as_flags(argv: list[str], message: str,
                                                    tmp_path: Path) -> None:
    import argparse

    from hooktrace.errors import OptionError
    from hooktrace.record.launch import add_options, options_from_args

    p = argparse.ArgumentParser()
    add_options(p)
    args = p.parse_args(["-o", os.fspath(tmp_path / "a.htrace"), *argv])
    with pytest.raises(OptionError) as e:
        options_from_args(args)
    assert str(e.value).startswith(message)


# -- options are declared by the components (record/component.py) ------------------------


def test_every_option_is_declared_by_exactly_one_declarer() -> None:
    from hooktrace.record import registry

    fields = [f.name for f in dataclasses.fields(RecordOptions)]
    for name in fields:
        owners = [d.__name__ for d in registry.declarers() if name in {o.name for o in d.OPTIONS}]
        assert len(owners) == 1, (name, owners)
    assert fields == [o.name for o in RecordOptions.declared()]
    assert RecordOptions.declarers() == registry.declarers()


def test_an_option_declared_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from hooktrace.record import options, registry
    from hooktrace.record.component import Component, Option

    class Twin(Component):
        OPTIONS = (Option("memory", False, "memory again"),)

    monkeypatch.setattr(registry, "COMPONENTS", (*registry.COMPONENTS, Twin))
    with pytest.raises(ValueError, match="'memory' is declared by MemoryComponent and Twin"):
        options.refresh()
    monkeypatch.undo()
    options.refresh()
    assert "memory" in {f.name for f in dataclasses.fields(RecordOptions)}


def _toy_component() -> type:
    from hooktrace.record.component import Component, Flag, Option, one_of, positive_int

    def kinds(name: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, (tuple, list)) or not all(isinstance(k, str) for k in value):
            raise TypeError(f"{name} must be a sequence of names, got {value!r}")
        return tuple(value)

    class ToyComponent(Component):
        """A feature written as a contributor would: one file, one line in COMPONENTS."""

        OPTIONS = (
            Option("toy", False, "also record the toys", cli="switch"),
            Option("toy_every", 1, "with toy, record steps 0, N, 2N, ... only",
                   check=positive_int("steps"), cli="int",
                   flag_help="with --toy, record steps 0, N, 2N, ... only"),
            Option("toy_mode", "fast", "how the toys are recorded", check=one_of("fast", "slow"),
                   cli=Flag("choice", choices={"fast": "fast", "slow": "slow"})),
            Option("toy_kinds", (), "which toys (comma-separated)", type=tuple, check=kinds,
                   cli=Flag("list", metavar="KINDS")),
            Option("toy_secret", 0, "not a flag, not for the callbacks", callbacks=False),
        )

        @classmethod
        def enabled(cls, options: Any) -> bool:
            return bool(options.toy)

    return ToyComponent


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The registry with a toy component added (one line), RecordOptions made again."""
    from hooktrace.record import options, registry

    component = _toy_component()
    monkeypatch.setattr(registry, "COMPONENTS", (*registry.COMPONENTS, component))
    options.refresh()
    yield component
    monkeypatch.undo()
    options.refresh()


def test_a_toy_components_options_are_record_options(toy: Any) -> None:
    o = RecordOptions(toy=True, toy_every=3, toy_kinds=["a", "b"])
    assert (o.toy, o.toy_every, o.toy_mode, o.toy_kinds) == (True, 3, "fast", ("a", "b"))
    assert RecordOptions().toy is False and RecordOptions.from_kwargs(toy_mode="slow").toy_mode == "slow"
    assert OPTION_HELP["toy_every"] == "with toy, record steps 0, N, 2N, ... only"
    assert dataclasses.replace(o, toy_every=4).toy_every == 4
    with pytest.raises(TypeError, match="^toy must be True or False, got int 1$"):
        RecordOptions(toy=1)
    with pytest.raises(ValueError, match=r"^toy_every must be a positive integer \(steps\), got 0$"):
        RecordOptions(toy_every=0)
    with pytest.raises(ValueError, match="^toy_mode must be one of 'fast', 'slow'; got 'medium'$"):
        RecordOptions(toy_mode="medium")
    with pytest.raises(TypeError, match="unknown option 'toys'"):
        RecordOptions.from_kwargs(toys=True)


def _run_parser() -> Any:
    import argparse

    from hooktrace.record.launch import add_options

    p = argparse.ArgumentParser(prog="hooktrace run")
    add_options(p)
    return p


def test_a_toy_components_options_are_run_flags(toy: Any, tmp_path: Path) -> None:
    from hooktrace.errors import OptionError
    from hooktrace.record.launch import options_from_args

    p = _run_parser()
    text = " ".join(p.format_help().split())
    assert "--toy also record the toys" in text
    assert "--toy-every N with --toy, record steps 0, N, 2N, ... only" in text
    assert "--toy-mode {fast,slow}" in text and "--toy-kinds KINDS" in text
    assert "--toy-secret" not in text
    out = os.fspath(tmp_path / "a.htrace")
    record = options_from_args(p.parse_args(["-o", out])).record
    assert (record.toy, record.toy_every, record.toy_mode, record.toy_kinds) == (False, 1, "fast", ())
    record = options_from_args(p.parse_args(
        ["-o", out, "--toy", "--toy-every", "5", "--toy-mode", "slow", "--toy-kinds", "a, b"])).record
    assert (record.toy, record.toy_every, record.toy_mode, record.toy_kinds) == (True, 5, "slow", ("a", "b"))
    with pytest.raises(OptionError) as e:
        options_from_args(p.parse_args(["-o", out, "--toy-every", "0"]))
    assert str(e.value) == "--toy-every must be a positive integer (steps), got 0"


def test_a_toy_components_options_are_environment_options(toy: Any, tmp_path: Path) -> None:
    from hooktrace.errors import OptionError
    from hooktrace.record.launch import options_from_env

    env = {"HOOKTRACE_OUT": os.fspath(tmp_path / "e.htrace"),
           "HOOKTRACE_OPTIONS": "--toy --toy-every 2 --no-backward"}
    record = options_from_env(env).record
    assert record.toy is True and record.toy_every == 2 and record.backward is False
    with pytest.raises(OptionError, match="^--toy-every must be a positive integer"):
        options_from_env({**env, "HOOKTRACE_OPTIONS": "--toy-every -3"})


def test_a_toy_components_options_are_the_callbacks_keywords(toy: Any) -> None:
    from hooktrace.integrations import trace_options

    accepted = trace_options()
    assert {"toy", "toy_every", "toy_mode", "toy_kinds"} <= accepted
    assert "toy_secret" not in accepted
    assert {"numerics", "numerics_every", "shapes", "memory", "flops", "dump_on", "dump_dir",
            "hang_timeout"} <= accepted
    assert not {"capacity", "backward", "steps", "out", "policy", "schedule"} & accepted


def test_run_streams_with_the_stream_capacity(tmp_path: Path) -> None:
    # hooktrace run streams its .htrace: the capacity's default is the stream's (1 Mi
    # events in flight), not the in-memory trace's 8 Mi (as before issue #27)
    from hooktrace.record.launch import options_from_args

    p = _run_parser()
    out = tmp_path / "s.htrace"
    record = options_from_args(p.parse_args(["-o", os.fspath(out)])).record
    assert record.out == os.path.abspath(out) and record.capacity == STREAM_CAPACITY
    record = options_from_args(p.parse_args(["-o", os.fspath(out), "--ring"])).record
    assert record.out is None and record.policy == "ring" and record.capacity == DEFAULT_CAPACITY
    record = options_from_args(p.parse_args(["-o", os.fspath(out), "--capacity", "4096"])).record
    assert record.capacity == 4096


def test_dump_on_nonfinite_turns_numerics_on(tmp_path: Path) -> None:
    from hooktrace.record.launch import options_from_args

    p = _run_parser()
    record = options_from_args(p.parse_args(["-o", os.fspath(tmp_path / "n.htrace"),
                                             "--dump-on", "nonfinite,hang"])).record
    assert record.numerics is True and record.dump_on == {"nonfinite", "hang"}


def test_a_declaration_is_checked_when_written() -> None:
    from hooktrace.record.component import Flag, Option

    with pytest.raises(ValueError, match="help must be one line"):
        Option("x", False, "two\nlines")
    with pytest.raises(ValueError, match="not a public identifier"):
        Option("_x", False, "private")
    with pytest.raises(ValueError, match="needs Flag\\(value=...\\)"):
        Option("mode", "a", "a mode", cli="switch")
    with pytest.raises(ValueError, match="a choice needs"):
        Option("mode", "a", "a mode", cli=Flag("choice"))
    assert Option("backward", True, "b", cli="switch").flag_name() == "--no-backward"
    assert Option("gpu_every", 1, "g", cli="int").flag_name() == "--gpu-every"


def test_the_typed_fields_mypy_sees_are_the_declared_options() -> None:
    """RecordOptions' fields are made at import from the declarations; mypy reads the
    typed list under TYPE_CHECKING instead (issue #37). The two must name the same
    options in the same order, or mypy checks attributes that do not exist."""
    import ast
    import inspect

    from hooktrace.record import options as options_module

    tree = ast.parse(inspect.getsource(options_module.RecordOptions))
    guard = next(n for n in ast.walk(tree) if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    typed = [n.target.id for n in guard.body if isinstance(n, ast.AnnAssign)
             and isinstance(n.target, ast.Name) and n.target.id != "__dataclass_fields__"]
    assert typed == [o.name for o in options_module.RecordOptions.declared()]
