"""The global mode in-process (hooktrace.record, issue #10): what it
records, how it names modules, and that it leaves nn.Module exactly as it was."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.record import global_trace
from hooktrace.reading import CAT_FORWARD
from test_run import calls_per_module


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a module made inside forward: not a child, named under its caller
        y = nn.ReLU()(self.fc(x))
        return self.extra(y) if hasattr(self, "extra") else y


def test_restores_module_call_exactly_even_after_an_error() -> None:
    original = nn.Module.__dict__["__call__"]
    with pytest.raises(ZeroDivisionError):
        with global_trace():
            assert nn.Module.__dict__["__call__"] is not original
            1 / 0
    assert nn.Module.__dict__["__call__"] is original
    assert nn.Linear(2, 2).__call__.__func__ is original


def test_one_global_trace_at_a_time() -> None:
    with global_trace():
        with pytest.raises(RuntimeError, match="already recording"):
            global_trace().__enter__()
    with global_trace():  # the first one's exit freed the place
        pass


def test_names_children_added_later_temporaries_and_instance_forwards() -> None:
    block = Block()
    plain = nn.Linear(4, 4)
    plain.forward = lambda x: x * 2  # type: ignore[method-assign]  # an instance attribute
    x = torch.ones(1, 4)
    with global_trace(backward=False) as tr:
        for _ in range(3):
            block(x)
        block.extra = nn.Identity()  # added after the model's first call
        block(x)
        plain(x)
    calls = calls_per_module(tr)
    # Block is the main model (it has submodules): its names are named_modules()'s; the
    # other top-level module is prefixed with its class
    assert calls[""] == 4 and calls["fc"] == 4
    assert calls["extra"] == 1  # found among its caller's children
    assert calls["(ReLU)"] == 4  # four temporaries, one row
    assert calls["Linear"] == 1  # its forward is an instance attribute: recorded anyway
    assert len(tr.modules) == len(set(tr.modules))
    assert tr.info["top_level_modules"] == ["Block", "Linear"]
    assert tr.info["main_module"] == "Block"


def test_deep_nesting_and_exceptions_are_flagged() -> None:
    model: nn.Module = nn.Identity()
    for _ in range(80):
        model = nn.Sequential(model)

    class Fails(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("inside")

    failing = nn.Sequential(Fails())
    with global_trace() as tr:
        model(torch.ones(1))
        with pytest.raises(ValueError):
            failing(torch.ones(1))
        model(torch.ones(1))
    spans = tr.spans()
    assert spans.unfinished == 0 and spans.orphan_exits == 0
    errors = {tr.modules[int(m)][0] for m, f in zip(spans.module, spans.flags) if f & 1}
    assert errors == {"Sequential#2", "Sequential#2.0"}
    calls = calls_per_module(tr)
    # the first Sequential is the main model (no prefix); the second is Sequential#2
    assert calls[""] == 2 and calls[".".join(["0"] * 80)] == 2
    assert int(spans.depth.max()) == 80


def test_gradients_and_outputs_bit_identical() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 2))
    x = torch.randn(5, 8)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]

    before = grads()
    with global_trace() as tr:
        during = grads()
    assert all(torch.equal(a, b) for a, b in zip(before, during))
    assert len(tr.spans().nodes) > 0
    assert tr.modules[0] == ("", "Sequential")


def test_threads_trace_and_a_per_model_trace_inside_records_too() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with global_trace(backward=False) as tr:
        with hooktrace.trace(model, backward=False) as inner:
            model(torch.ones(1, 2))
        worker = threading.Thread(target=lambda: model(torch.ones(1, 2)))
        worker.start()
        worker.join()
    assert calls_per_module(tr) == {"": 2, "0": 2, "1": 2}
    spans = tr.spans()
    assert len(set(spans.tid[spans.cat == CAT_FORWARD].tolist())) == 2
    assert len(inner.spans()) == 3


def test_a_rebuilt_model_reuses_its_rows() -> None:
    with global_trace(backward=False) as tr:
        for _ in range(3):
            model = nn.Sequential(nn.Linear(2, 2))
            model(torch.ones(1, 2))
            del model
            gc.collect()
    assert tr.modules == [("", "Sequential"), ("0", "Linear")]
    assert calls_per_module(tr) == {"": 3, "0": 3}


def test_modules_called_by_their_owners_method_are_named_in_its_tree() -> None:
    # GIVEN a Lightning-style module whose training_step calls its children directly
    # (its forward never runs; issue #38: rows read "<root>", "0", "Sequential#2.2")
    class Lit(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
            self.decoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

        def training_step(self, x: torch.Tensor) -> torch.Tensor:
            return self.decoder(self.encoder(x)).pow(2).mean()

    lit = Lit()
    with global_trace(backward=False) as tr:
        for _ in range(2):
            lit.training_step(torch.ones(2, 4))
    # THEN the names are the owner's named_modules()', as trace(lit) names them
    calls = calls_per_module(tr)
    assert {n: c for n, c in calls.items() if c} == {
        "encoder": 2, "encoder.0": 2, "encoder.1": 2, "encoder.2": 2,
        "decoder": 2, "decoder.0": 2, "decoder.1": 2, "decoder.2": 2}, calls
    assert tr.info["top_level_modules"] == ["Lit"]


def test_a_recording_begun_inside_a_forward_names_modules_as_named_modules() -> None:
    # GIVEN a model whose call is open when recording begins (hooktrace attach lands in
    # the middle of a step; it once named the rest of that step's modules "ReLU",
    # "Linear#2", and the model itself "Sequential#2")
    recording = global_trace(backward=False)
    begin = [True]

    class Begin(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if begin[0]:
                begin[0] = False
                recording.__enter__()
            return x

    model = nn.Sequential(nn.Linear(4, 4), Begin(), nn.ReLU(),
                          nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
    try:
        for _ in range(3):
            model(torch.ones(2, 4))
    finally:
        recording.__exit__(None, None, None)
    # THEN every module has named_modules()' name: the first step's rest, then two whole
    calls = calls_per_module(recording)
    assert {n: c for n, c in calls.items() if c} == {
        "": 2, "0": 2, "1": 2, "2": 3, "3": 3, "3.0": 3, "3.1": 3}, calls
    assert recording.info["top_level_modules"] == ["Sequential"]
