"""Forward recording with the compiled core on real modules."""

from __future__ import annotations

import collections
import copy
import gc
import inspect
import io
import pickle
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import hooktrace
from hooktrace.reading import CAT_FORWARD, SPAN_ERROR
from models import Boom, ConvNet, DataclassOut, Shared, tiny_bert, tiny_llama

# One way to record a call since issue #16 ("wrap" and "hooks" are refused).
MODES = ["auto"]


def reference_calls(model: nn.Module, run: Callable[[], Any]) -> list[tuple[str, str | None, int]]:
    """(name, parent name, call index) of every module call, in start order, via plain Python hooks."""
    names = {m: n for n, m in model.named_modules()}
    stack: list[str] = []
    counts: collections.Counter[str] = collections.Counter()
    calls: list[tuple[str, str | None, int]] = []

    def pre(m: nn.Module, args: Any) -> None:
        name = names[m]
        calls.append((name, stack[-1] if stack else None, counts[name]))
        counts[name] += 1
        stack.append(name)

    def post(m: nn.Module, args: Any, out: Any) -> None:
        stack.pop()

    handles = []
    for m in names:
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return calls


def traced_calls(tr: hooktrace.Trace) -> list[tuple[str, str | None, int]]:
    s = tr.spans()
    fwd = [i for i in range(len(s)) if s.cat[i] == CAT_FORWARD]
    fwd.sort(key=lambda i: (int(s.start_ns[i]), int(s.depth[i])))
    out = []
    for i in fwd:
        p = int(s.parent[i])
        parent = tr.modules[int(s.module[p])][0] if p >= 0 else None
        out.append((tr.modules[int(s.module[i])][0], parent, int(s.call[i])))
    return out


def state_snapshot(model: nn.Module) -> dict[str, Any]:
    """Everything tracing could leave behind on a model."""
    return {
        name: (
            dict(m.__dict__.get("_forward_hooks", {})),
            dict(m.__dict__.get("_forward_pre_hooks", {})),
            dict(m._backward_hooks),
            sorted(m.__dict__),
            m.__dict__.get("forward"),
        )
        for name, m in model.named_modules()
    }


CASES = {
    "convnet-inplace": (lambda: ConvNet(), lambda: torch.randn(2, 3, 8, 8)),
    "shared-loop-dataclass": (lambda: Shared(), lambda: torch.randn(2, 4)),
    "llama": (tiny_llama, lambda: torch.randint(0, 64, (1, 8))),
    "bert": (tiny_bert, lambda: torch.randint(0, 64, (1, 8))),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_calls_match_python_hook_reference(case: str, mode: str) -> None:
    # GIVEN a real model and a reference list of calls from plain Python hooks
    make_model, make_input = CASES[case]
    model = make_model()
    x = make_input()
    expected = reference_calls(model, lambda: model(x))
    before = state_snapshot(model)
    with torch.no_grad():
        ref_out = model(x)

    # WHEN the same forward runs under hooktrace (twice: call indices continue)
    with hooktrace.trace(model, mode=mode) as tr:
        out = model(x)
        model(x)

    # THEN every call is a span with the right parent and call index
    n_modules = {name for name, _ in model.named_modules()}
    got = traced_calls(tr)
    second = [(n, p, c + sum(1 for e in expected if e[0] == n)) for n, p, c in expected]
    assert got == expected + second
    assert {name for name, _, _ in got} <= n_modules
    assert tr.spans().unfinished == 0 and tr.spans().orphan_exits == 0
    assert tr.dropped_events == 0
    # and the model is exactly as before: outputs, state, no hooks or attributes left
    assert state_snapshot(model) == before
    with torch.no_grad():
        again = model(x)
    for a, b in zip(_tensors(ref_out), _tensors(again)):
        assert torch.equal(a, b)
    assert len(_tensors(out)) == len(_tensors(ref_out))


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _tensors(v)]
    if hasattr(out, "__dataclass_fields__") or hasattr(out, "to_tuple"):
        return [t for v in vars(out).values() for t in _tensors(v)]
    return []


@pytest.mark.parametrize("mode", MODES)
def test_exception_in_forward_closes_span_as_error(mode: str) -> None:
    model = Boom()
    before = state_snapshot(model)
    with pytest.raises(RuntimeError):
        with hooktrace.trace(model, mode=mode) as tr:
            model(torch.randn(2, 4))
    s = tr.spans()
    by_name = {tr.modules[int(s.module[i])][0]: i for i in range(len(s))}
    assert set(by_name) == {"", "ok", "bad"}
    assert s.flags[by_name["bad"]] & SPAN_ERROR
    assert s.flags[by_name[""]] & SPAN_ERROR
    assert not s.flags[by_name["ok"]] & SPAN_ERROR
    assert s.unfinished == 0 and s.orphan_exits == 0
    assert state_snapshot(model) == before


@pytest.mark.parametrize("mode", MODES)
def test_exception_caught_inside_model_keeps_nesting(mode: str) -> None:
    class Catcher(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.boom = Boom()
            self.after = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                self.boom(x)
            except RuntimeError:
                pass
            return self.after(x)

    model = Catcher()
    with hooktrace.trace(model, mode=mode) as tr:
        model(torch.randn(2, 4))
    calls = traced_calls(tr)
    assert calls == [("", None, 0), ("boom", "", 0), ("boom.ok", "boom", 0),
                     ("boom.bad", "boom", 0), ("after", "", 0)]


def test_model_is_untouched_while_tracing() -> None:
    # The one recorder replaces nn.Module.__call__ (the class attribute), never an
    # attribute of the model: forward, signature and copies are the user's own.
    model = ConvNet()
    blk = model.layers[0]
    sig = inspect.signature(blk)
    before = {name: dict(m.__dict__) for name, m in model.named_modules()}
    original_call = nn.Module.__dict__["__call__"]
    x = torch.randn(1, 3, 8, 8)
    with hooktrace.trace(model) as tr:
        assert {name: dict(m.__dict__) for name, m in model.named_modules()} == before
        f = blk.forward
        assert type(f).__name__ == "method" and f.__func__ is type(blk).forward
        assert inspect.signature(blk) == sig
        call = nn.Module.__dict__["__call__"]
        assert type(call).__name__ == "ModuleCall" and call.__wrapped__ is original_call
        assert call.__name__ == original_call.__name__
        # copies made while tracing are plain, untraced models that compute the same
        for clone in (
            copy.deepcopy(model),
            pickle.loads(pickle.dumps(model)),
            torch.load(_saved(model), weights_only=False),
        ):
            assert set(clone.layers[0].__dict__) == set(blk.__dict__)
            with torch.no_grad():
                assert torch.equal(clone.eval()(x), model.eval()(x))
        model.train()
    assert nn.Module.__dict__["__call__"] is original_call
    assert {name: dict(m.__dict__) for name, m in model.named_modules()} == before
    # the clones' calls were not recorded: only the model's own (eval) call is
    # the model's three eval calls are recorded, the clones' calls are not
    assert traced_calls(tr) == reference_calls(model, lambda: [model(x) for _ in range(3)])


def _saved(model: nn.Module) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return buf


def test_a_forward_replaced_by_another_library_is_left_alone() -> None:
    # GIVEN a module whose forward another library already replaced (accelerate does)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    lin = model[0]
    original = lin.forward

    def patched(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs) * 2

    lin.forward = patched
    x = torch.randn(2, 4)
    expected = model(x)
    # WHEN traced
    with hooktrace.trace(model) as tr:
        assert lin.__dict__["forward"] is patched
        assert torch.equal(model(x), expected)
    # THEN that attribute was never touched, and the call was recorded
    assert lin.__dict__["forward"] is patched
    assert "forward" not in model.__dict__
    assert [c[0] for c in traced_calls(tr)] == ["", "0", "1"]


def test_same_model_twice_is_a_clear_error() -> None:
    model = ConvNet()
    with hooktrace.trace(model):
        with pytest.raises(RuntimeError, match="already being traced"):
            with hooktrace.trace(model):
                pass
        with pytest.raises(RuntimeError, match="already being traced.*'layers.0'"):
            with hooktrace.trace(model.layers[0]):
                pass
    # and after the first trace ends, tracing again works
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 3, 8, 8))
    assert len(tr.spans()) > 0


def test_models_are_held_weakly() -> None:
    model = ConvNet()
    ref = weakref.ref(model)
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 3, 8, 8))
    del model
    gc.collect()
    assert ref() is None
    assert len(tr.spans()) > 0  # the recording outlives the model


def test_model_dropped_inside_the_block() -> None:
    model = ConvNet()
    ref = weakref.ref(model)
    with hooktrace.trace(model) as tr:
        model(torch.randn(1, 3, 8, 8))
        del model
        gc.collect()
        assert ref() is None
    assert len(tr.spans()) > 0


def test_two_threads_trace_two_models_at_once() -> None:
    models = [ConvNet(), Shared()]
    inputs = [torch.randn(1, 3, 8, 8), torch.randn(2, 4)]
    expected = [reference_calls(m, lambda m=m, x=x: m(x)) for m, x in zip(models, inputs)]
    traces: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        with hooktrace.trace(models[i]) as tr:
            barrier.wait()
            for _ in range(20):
                models[i](inputs[i])
        traces[i] = tr

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        got = traced_calls(traces[i])
        assert len(got) == 20 * len(expected[i])
        assert [(n, p) for n, p, _ in got[: len(expected[i])]] == [(n, p) for n, p, _ in expected[i]]
        assert len(set(traces[i].spans().tid.tolist())) == 1


def test_one_model_called_from_several_threads() -> None:
    model = Shared()
    per_call = len(reference_calls(model, lambda: model(torch.randn(2, 4))))
    with hooktrace.trace(model) as tr:
        threads = [
            threading.Thread(target=lambda: [model(torch.randn(2, 4)) for _ in range(10)])
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s = tr.spans()
    assert len(s) == 30 * per_call
    assert len(set(s.tid.tolist())) == 3
    assert s.unfinished == 0 and s.orphan_exits == 0
    # call indices of the shared Linear are 0..89 across threads, each once
    slot = [n for n, _ in tr.modules].index("shared")
    assert sorted(s.call[s.module == slot].tolist()) == list(range(90))


def test_full_buffer_drops_are_counted() -> None:
    model = nn.Sequential(*[nn.Identity() for _ in range(99)])  # 100 modules: 200 events a call
    with hooktrace.trace(model, capacity=1000, backward=False) as tr:
        for _ in range(10):
            model(torch.zeros(1))
    assert len(tr.events) == 1000
    assert tr.dropped_events == 1000
    assert tr.overwritten_events == 0
    s = tr.spans()
    assert (s.module == 0).sum() == 5  # the first five calls are complete
    assert s.unfinished == 0
    assert "dropped" in str(tr.summary())


def test_ring_policy_keeps_the_newest_events() -> None:
    # GIVEN 10 calls of 200 events each into a 700-event flight recorder
    model = nn.Sequential(*[nn.Identity() for _ in range(99)])
    with hooktrace.trace(model, capacity=700, policy="ring", backward=False) as tr:
        for _ in range(10):
            model(torch.zeros(1))
    # THEN two 700-event chunks (capacity plus the ring's spare) filled, the oldest
    # recycled once: the newest 1300 events remain, the tail of call 3 from its 50th
    # child's exit (that exit and the root's are orphans), then calls 4-9 whole
    assert tr.info["capacity"] == 700
    assert tr.dropped_events == 0
    assert tr.overwritten_events == 700
    assert len(tr.events) == 1300
    s = tr.spans()
    assert s.orphan_exits == 2
    assert s.unfinished == 0
    assert (s.module == 0).sum() == 6
    assert len(s) == 6 * 100 + 49


def test_compiled_model_is_one_span_with_a_warning() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    compiled = torch.compile(model)
    x = torch.randn(2, 4)
    expected = compiled(x)
    with pytest.warns(UserWarning, match="compiled before the trace: recorded as one span each"):
        with hooktrace.trace(compiled) as tr:
            out = compiled(x)
    assert torch.equal(out, expected)
    assert [(n, p) for n, p, _ in traced_calls(tr)] == [("", None)]
    assert tr.modules[0] == ("", "Sequential")  # named for the module, not the wrapper
    assert "forward" not in compiled._orig_mod.__dict__


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act, self.fc = nn.ReLU(), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(x))


def test_module_compile_is_traced_at_its_boundary() -> None:
    # (Dynamo does not compile nn.Sequential's own call: a user class, as real models.)
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), _Block())
    model[1].compile()
    compiled_impl = model[1].__dict__["_compiled_call_impl"]
    x = torch.randn(2, 4)
    # compiled on its first call, inside the trace: no "compiled before" warning, and
    # the modules inside get kernel-derived rows (issue #18)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hooktrace.trace(model) as tr:
            model(x)
            model(x)
    assert not [w for w in caught if "hooktrace" in str(w.message)]
    assert [n for n, _, _ in traced_calls(tr)] == ["", "0", "1"] * 2
    assert model[1].__dict__["_compiled_call_impl"] is compiled_impl
    rows = {r["module"]: r for r in tr.summary().rows}
    assert rows["1.fc"]["timing"] == "kernels" and rows["1.fc"]["calls"] == 2
    assert rows["1"]["timing"] == "measured"


def test_module_compiled_and_run_before_the_trace_is_one_span_with_a_warning() -> None:
    torch._dynamo.reset()  # else the marked code the test above compiled is reused
    model = nn.Sequential(nn.Linear(4, 4), _Block())
    model[1].compile()
    x = torch.randn(2, 4)
    model(x)  # compiled here, before the trace: its code is kept, unmarked
    with pytest.warns(UserWarning, match="'1' compiled before the trace"):
        with hooktrace.trace(model) as tr:
            model(x)
    assert [n for n, _, _ in traced_calls(tr)] == ["", "0", "1"]
    s = tr.summary()
    assert [r["module"] for r in s.rows if r["timing"] != "measured"] == []
    assert any("1: compiled before the trace" in n for n in s.notes)


def test_tracing_a_model_compiled_before_records_its_wrapper() -> None:
    # torch.compile(model) made before trace(model): calls go through the wrapper,
    # which runs the module's compiled code without calling the module; the wrapper's
    # call is the model's span.
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    compiled = torch.compile(model)
    x = torch.randn(2, 4)
    expected = compiled(x)
    with pytest.warns(UserWarning, match="'<root>'"):
        with hooktrace.trace(model) as tr:
            out = compiled(x)
    assert torch.equal(out, expected)
    assert [n for n, _, _ in traced_calls(tr)] == [""]


def test_dataclass_and_dict_outputs_pass_through_unchanged() -> None:
    model = DataclassOut()
    x = torch.randn(2, 4)
    with hooktrace.trace(model):
        out = model(x)
    assert type(out).__name__ == "Output" and set(out.extra) == {"y", "skip"}


@pytest.mark.parametrize("scope", ["trace", "global"])
def test_call_machinery_overridden_or_patched_is_what_runs(scope: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # hooktrace's __call__ does nn.Module._wrapped_call_impl's work in C only when the
    # class would run exactly that function; anything else must run as it would untraced.
    seen: list[str] = []

    class OwnWrapped(nn.Linear):
        # not what nn.Module.__call__ runs (bound at class creation), traced or not
        def _wrapped_call_impl(self, *args: Any, **kwargs: Any) -> Any:
            seen.append("own _wrapped_call_impl")
            return super()._wrapped_call_impl(*args, **kwargs) + 1

    original_call_impl = nn.Module._call_impl

    def patched_call_impl(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        seen.append(f"patched _call_impl {type(self).__name__}")
        return original_call_impl(self, *args, **kwargs)

    torch.manual_seed(0)
    model = nn.Sequential(OwnWrapped(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    with monkeypatch.context() as m:
        m.setattr(nn.Module, "_call_impl", patched_call_impl)
        expected = model(x)
        untraced, seen[:] = list(seen), []
        with (hooktrace.trace(model) if scope == "trace" else hooktrace.global_trace()) as tr:
            got = model(x)
    assert torch.equal(got, expected) and seen == untraced == [
        "patched _call_impl Sequential", "patched _call_impl OwnWrapped",
        "patched _call_impl ReLU"]
    assert len(tr.result.spans()) == 3


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("scope", ["trace", "global"])
def test_call_machinery_errors_are_torchs_own(scope: str) -> None:
    # GIVEN a module whose __init__ never ran (no _compiled_call_impl, no _modules):
    # torch's own error, and no complaint from hooktrace naming it
    class NoInit(nn.Module):
        def __init__(self) -> None:  # deliberately skips nn.Module.__init__
            pass

    bare, other = NoInit(), nn.Linear(2, 2)
    with pytest.raises(AttributeError) as untraced:
        bare(1)
    with (hooktrace.trace(other) if scope == "trace" else hooktrace.global_trace()):
        with pytest.raises(AttributeError) as traced:
            bare(1)
    assert str(traced.value) == str(untraced.value)


def test_a_traceback_through_a_traced_call_names_the_users_frames() -> None:
    # The frames a user reads (theirs and forward) are all there, in order.
    model = Boom()
    with pytest.raises(RuntimeError) as untraced:
        model(torch.randn(2, 4))
    with pytest.raises(RuntimeError) as traced:
        with hooktrace.trace(model):
            model(torch.randn(2, 4))

    def user_frames(e: pytest.ExceptionInfo[RuntimeError]) -> list[str]:
        return [f.name for f in e.traceback if "torch/nn/modules/module.py" not in str(f.path)]

    assert user_frames(traced)[-3:] == user_frames(untraced)[-3:]
    assert "forward" in user_frames(traced)
