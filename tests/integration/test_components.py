"""The recorder's components (hooktrace/record/component.py, issue #27): each recording
feature is one component; the recorder calls them in order, tears the installed ones
down in reverse order whatever happens, and leaves the model as it was."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.record import registry
from hooktrace.record.component import Component
from hooktrace.record.numerics import NumericsComponent
from hooktrace.record.options import RecordOptions


def _components(calls: list[str], fail_install: str | None = None) -> list[type[Component]]:
    def make(name: str) -> type[Component]:
        class Fake(Component):
            def prepare(self, session: Any, scope: Any) -> None:
                calls.append(f"prepare {name}")

            def install(self, session: Any, scope: Any) -> None:
                calls.append(f"install {name}")
                if name == fail_install:
                    raise RuntimeError(f"{name} cannot install")

            def before_step(self) -> None:
                calls.append(f"before_step {name}")

            def step(self, step_no: int) -> None:
                calls.append(f"step {name} {step_no}")

            def flush(self) -> None:
                calls.append(f"flush {name}")

            def teardown(self) -> None:
                calls.append(f"teardown {name}")

            def metadata(self, info: dict[str, Any]) -> None:
                info.setdefault("fake", []).append(name)

        return Fake

    return [make(n) for n in ("a", "b", "c")]


def _model_state(model: nn.Module) -> list[Any]:
    return [(m._forward_hooks.copy(), m._forward_pre_hooks.copy(), m._backward_hooks.copy(),
             dict(m.__dict__.get("_parameters", {})), type(m)) for m in model.modules()]


def test_components_run_in_order_and_tear_down_in_reverse(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(registry, "COMPONENTS", tuple(_components(calls)))
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with hooktrace.trace(model, steps=None) as tr:
        model(torch.randn(1, 2))
        tr.step()
    assert calls == ["prepare a", "prepare b", "prepare c",
                     "install a", "install b", "install c",
                     "before_step a", "before_step b", "before_step c",
                     "step a 1", "step b 1", "step c 1",
                     "flush c", "flush b", "flush a",
                     "teardown c", "teardown b", "teardown a"]
    assert tr.result.info["fake"] == ["a", "b", "c"]


def test_an_install_failing_midway_tears_down_what_was_installed_in_reverse(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(registry, "COMPONENTS", tuple(_components(calls, "b")))
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    before, call = _model_state(model), nn.Module.__call__
    with pytest.raises(RuntimeError, match="b cannot install"):
        with hooktrace.trace(model):
            raise AssertionError("the block must not run")
    # b's install did not return: only a is torn down (c was never installed)
    assert calls == ["prepare a", "prepare b", "prepare c", "install a", "install b",
                     "flush a", "teardown a"]
    assert _model_state(model) == before and nn.Module.__call__ is call
    # nothing is left recording: the same model traces again, normally
    monkeypatch.setattr(registry, "COMPONENTS", ())
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 2))
    assert len(tr.spans()) == 3


def test_a_failing_teardown_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    comps = _components(calls)

    class Broken(comps[1]):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
            calls.append("teardown b")
            raise ValueError("b broke")

    monkeypatch.setattr(registry, "COMPONENTS", (comps[0], Broken, comps[2]))
    model = nn.Linear(2, 2)
    before, call = _model_state(model), nn.Module.__call__
    with pytest.raises(RuntimeError, match="failed to end the trace.*b broke"):
        with hooktrace.trace(model):
            model(torch.randn(1, 2))
    assert calls[-3:] == ["teardown c", "teardown b", "teardown a"]
    assert _model_state(model) == before and nn.Module.__call__ is call


def test_numerics_refuses_a_nonfinite_dump_without_numerics() -> None:
    with pytest.raises(ValueError, match="dump_on='nonfinite' needs numerics=True"):
        NumericsComponent.check(RecordOptions(dump_on="nonfinite"))
    with pytest.raises(ValueError, match="dump_on='nonfinite' needs numerics=True"):
        hooktrace.trace(nn.Linear(2, 2), dump_on="nonfinite")


def test_only_enabled_components_are_composed() -> None:
    tr = hooktrace.trace(nn.Linear(2, 2), backward=False, shapes=True)
    names = [type(c).__name__ for c in tr._components]
    assert names == ["KernelMarksComponent", "ShapesComponent"]


def test_options_may_be_given_whole() -> None:
    options = RecordOptions(shapes=True, backward=False)
    model = nn.Linear(2, 2)
    with hooktrace.trace(model, options=options) as tr:
        model(torch.randn(1, 2))
    assert tr.options is options and "shape_signatures" in tr.result.info
    with pytest.raises(TypeError, match="options=RecordOptions"):
        hooktrace.trace(model, options=options, shapes=True)


def test_a_native_install_failure_releases_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    # Entry failing after the scope claimed the model but before the call was acquired
    # left the model claimed: every later trace of it said "already being traced".
    from hooktrace import _C

    def refuse(session: Any) -> None:
        raise RuntimeError("no backward today")

    model = nn.Sequential(nn.Linear(2, 2))
    monkeypatch.setattr(_C, "add_backward_session", refuse)
    with pytest.raises(RuntimeError, match="no backward today"):
        with hooktrace.trace(model):
            pass
    monkeypatch.undo()
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 2))
    assert len(tr.spans()) == 2


def test_a_trainer_callback_checks_option_values_when_made(tmp_path: Any) -> None:
    # (names were checked when the callback was made; values only at train begin)
    from hooktrace.integrations import TraceSession

    with pytest.raises(ValueError, match="numerics_every must be a positive integer"):
        TraceSession(tmp_path / "x.htrace", chrome=None, backward=True, capacity=1 << 20,
                     summary=False, numerics=True, numerics_every=0)
    with pytest.raises(TypeError, match="capacity must be an int"):
        TraceSession(tmp_path / "x.htrace", chrome=None, backward=True, capacity=2.5,
                     summary=False)


@pytest.mark.parametrize("scope", ["model", "process"])
@pytest.mark.parametrize("options", [
    {}, {"memory": True}, {"numerics": True, "numerics_every": 2}, {"shapes": True},
    {"flops": True}, {"emit_profiler": True}, {"dump_on": "exception"}, {"policy": "ring"},
    {"out": "stream.htrace"}], ids=repr)
def test_a_dropped_recorder_is_freed_at_once(scope: str, options: dict[str, Any],
                                             tmp_path: Any) -> None:
    # No reference cycle through the recorder (its components held it strongly after
    # #27's refactor): the session's buffers went only when the cyclic GC ran, and the
    # next recording page-faulted fresh ones (the global_trace A/B regression).
    import gc
    import weakref

    if "out" in options:
        options = {**options, "out": tmp_path / options["out"]}
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gc.collect()
    gc.disable()
    try:
        tr = hooktrace.trace(model, **options) if scope == "model" else \
            hooktrace.global_trace(**options)
        with tr:
            for _ in range(2):
                model(torch.randn(3, 2)).sum().backward()
                opt.step()
        assert len(tr.spans()) > 0
        alive = weakref.ref(tr)
        del tr
        assert alive() is None, "the recorder is in a reference cycle"
    finally:
        gc.enable()


def test_a_new_component_is_one_file_and_one_line(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Any) -> None:
    # A feature as a contributor adds it (record/component.py's docstring): its options
    # declared next to its code, one line in the registry; trace() takes the options,
    # the recorder composes it, the trainer callbacks pass them on.
    from hooktrace.integrations import TraceSession
    from hooktrace.record import options as options_module
    from hooktrace.record.component import Option, positive_int

    class ToyComponent(Component):
        OPTIONS = (
            Option("toy", False, "also record the toys", cli="switch"),
            Option("toy_every", 1, "with toy, every N steps", check=positive_int("steps"),
                   cli="int"),
        )

        @classmethod
        def enabled(cls, options: Any) -> bool:
            return options.toy

        def install(self, session: Any, scope: Any) -> None:
            self.steps: list[int] = []

        def step(self, step_no: int) -> None:
            if step_no % self.recorder.options.toy_every == 0:
                self.steps.append(step_no)

        def metadata(self, info: dict[str, Any]) -> None:
            info["toy"] = {"every": self.recorder.options.toy_every, "steps": self.steps}

    monkeypatch.setattr(registry, "COMPONENTS", (*registry.COMPONENTS, ToyComponent))
    options_module.refresh()
    try:
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        with hooktrace.trace(model, toy=True, toy_every=2, steps=None) as tr:
            for _ in range(4):
                model(torch.randn(1, 2))
                tr.step()
        assert tr.result.info["toy"] == {"every": 2, "steps": [2, 4]}
        with hooktrace.trace(model) as off:
            model(torch.randn(1, 2))
        assert "toy" not in off.result.info
        with pytest.raises(ValueError, match=r"^toy_every must be a positive integer \(steps\)"):
            hooktrace.trace(model, toy=True, toy_every=0)
        session = TraceSession(tmp_path / "t.htrace", chrome=None, backward=False,
                               capacity=1 << 16, summary=False, toy=True, toy_every=3)
        assert session.record.toy is True and session.record.toy_every == 3
        with pytest.raises(ValueError, match="toy_every must be a positive integer"):
            TraceSession(tmp_path / "t.htrace", chrome=None, backward=False,
                         capacity=1 << 16, summary=False, toy_every=0)
    finally:
        monkeypatch.undo()
        options_module.refresh()
    with pytest.raises(TypeError, match="unknown option 'toy'"):
        hooktrace.trace(nn.Linear(2, 2), toy=True)
