"""Backward spans with the compiled core on real modules (issue #3)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hooktrace
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, CAT_RECOMPUTE
from models import ConvNet, DataclassOut, Shared, tiny_llama

# Which module class must own an autograd node of each kind.
OWNER_TYPE = {
    "AddmmBackward0": {"Linear"},
    "ConvolutionBackward0": {"Conv2d"},
    "NativeBatchNormBackward0": {"BatchNorm2d"},
    "CudnnBatchNormBackward0": {"BatchNorm2d"},
    "ReluBackward0": {"ReLU"},
    "TanhBackward0": {"Shared", "Tanh"},
}


def node_owners(tr: hooktrace.Trace) -> list[tuple[str, str | None, str | None]]:
    """(node name, owning module name, owning module type) per autograd node."""
    s = tr.spans()
    out = []
    for name_id, span in zip(s.nodes.name.tolist(), s.nodes.span.tolist()):
        if span < 0:
            out.append((tr.node_names[name_id], None, None))
        else:
            name, typ = tr.modules[int(s.module[span])]
            out.append((tr.node_names[name_id], name, typ))
    return out


def assert_nodes_owned_by_right_modules(tr: hooktrace.Trace) -> Counter[str]:
    seen: Counter[str] = Counter()
    for node, _, typ in node_owners(tr):
        if node in OWNER_TYPE:
            assert typ in OWNER_TYPE[node], (node, typ)
            seen[node] += 1
    return seen


def backward_calls(tr: hooktrace.Trace) -> Counter[tuple[str, int]]:
    s = tr.spans()
    return Counter(
        (tr.modules[int(s.module[i])][0], int(s.call[i])) for i in range((len(s))) if s.cat[i] == CAT_BACKWARD
    )


def forward_calls(tr: hooktrace.Trace) -> Counter[tuple[str, int]]:
    s = tr.spans()
    return Counter(
        (tr.modules[int(s.module[i])][0], int(s.call[i])) for i in range(len(s)) if s.cat[i] == CAT_FORWARD
    )


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["auto"])
def test_inplace_resnet_block_backward_and_identical_gradients(mode: str) -> None:
    # GIVEN a conv net with ReLU(inplace=True) and `out += identity` (full backward hooks crash here)
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    model(x).sum().backward()
    expected = grads(model)
    model.zero_grad()
    # WHEN forward and backward run traced
    with hooktrace.trace(model, mode=mode) as tr:
        model(x).sum().backward()
    # THEN gradients are bit-identical
    got = grads(model)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in got)
    # every conv / bn / relu / linear node belongs to a module of that type
    seen = assert_nodes_owned_by_right_modules(tr)
    assert seen["ConvolutionBackward0"] == 5 and seen["AddmmBackward0"] == 1
    # each module call that made nodes has exactly one backward span, same module and call
    fwd, bwd = forward_calls(tr), backward_calls(tr)
    assert set(bwd) <= set(fwd)
    assert all(n == 1 for n in bwd.values())
    made_nodes = {name for name, m in model.named_modules() if list(m.parameters(recurse=False))}
    assert {n for n, _ in bwd} >= made_nodes
    # and the loss and AccumulateGrad nodes are counted, unattributed
    unattributed = Counter(node for node, owner, _ in node_owners(tr) if owner is None)
    assert unattributed["SumBackward0"] == 1
    assert sum(v for k, v in unattributed.items() if "AccumulateGrad" in k) == len(expected)


def test_backward_spans_nest_inside_parent_backward_spans() -> None:
    model = ConvNet()
    with hooktrace.trace(model) as tr:
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    s = tr.spans()
    for i in range(len(s)):
        if s.cat[i] == CAT_BACKWARD and s.parent[i] >= 0:
            p = int(s.parent[i])
            assert s.cat[p] == CAT_BACKWARD and s.module[p] != s.module[i]
            assert s.start_ns[p] <= s.start_ns[i] and s.end_ns[i] <= s.end_ns[p]
            assert s.self_ns[i] >= 0


def test_any_output_type_and_inputs_without_grad() -> None:
    # dict, dataclass and tuple outputs; input does not require grad
    model = Shared()
    x = torch.randn(2, 4)
    out = model(x)
    (out.hidden.sum() + out.extra["y"].sum()).backward()
    expected = grads(model)
    model.zero_grad()
    with hooktrace.trace(model) as tr:
        out = model(x)
        (out.hidden.sum() + out.extra["y"].sum()).backward()
    got = grads(model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    bwd = backward_calls(tr)
    # the shared Linear ran three times: three backward spans, calls 0..2
    assert sorted(c for n, c in bwd if n == "shared") == [0, 1, 2]
    assert {("loop.0", 0), ("loop.2", 0), ("out.inner.lin", 0), ("out", 0), ("", 0)} <= set(bwd)
    assert_nodes_owned_by_right_modules(tr)


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)) for _ in range(3)
        )
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=self.use_reentrant)
        return self.head(x)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_recompute_spans(use_reentrant: bool) -> None:
    torch.manual_seed(0)
    model = Checkpointed(use_reentrant)
    x = torch.randn(4, 8, requires_grad=True)
    model(x).sum().backward()
    expected = grads(model)
    model.zero_grad()
    with hooktrace.trace(model) as tr:
        model(x).sum().backward()
    assert all(torch.equal(grads(model)[k], expected[k]) for k in expected)
    s = tr.spans()
    names = [tr.modules[int(m)][0] for m in s.module]
    # forward calls are counted once; the re-runs are recompute spans of the same call
    assert Counter(n for n, c in zip(names, s.cat) if c == CAT_FORWARD)["blocks.1.0"] == 1
    rec = Counter(n for n, c in zip(names, s.cat) if c == CAT_RECOMPUTE)
    assert rec["blocks.0"] == rec["blocks.1.0"] == rec["blocks.2.2"] == 1
    assert all(int(s.call[i]) == 0 for i in range(len(s)) if s.cat[i] == CAT_RECOMPUTE)
    # every Linear in a checkpointed block gets its backward span and its addmm nodes
    bwd = backward_calls(tr)
    for i in range(3):
        assert bwd[(f"blocks.{i}.0", 0)] == 1 and bwd[(f"blocks.{i}.2", 0)] == 1
    seen = assert_nodes_owned_by_right_modules(tr)
    assert seen["AddmmBackward0"] == 7


def test_transformers_gradient_checkpointing() -> None:
    model = tiny_llama().train()
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 64, (1, 8))
    with hooktrace.trace(model) as tr:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    s = tr.spans()
    names = [tr.modules[int(m)][0] for m in s.module]
    rec = {n for n, c in zip(names, s.cat) if c == CAT_RECOMPUTE}
    # Newer transformers 5 (5.23 here) checkpoint the layer's class-level forward from
    # inside the layer's call, so the layer's children are what re-runs in backward;
    # older ones (5.17, issue #26) checkpoint the layer's __call__: the layer re-runs too.
    from transformers.modeling_layers import GradientCheckpointingLayer

    checkpoints_the_call = "__call__" in vars(GradientCheckpointingLayer)
    assert "model.layers.0.self_attn" in rec and "model.layers.1.self_attn.q_proj" in rec
    assert ("model.layers.0" in rec) == checkpoints_the_call, rec
    bwd = backward_calls(tr)
    assert bwd[("model.layers.1.self_attn.q_proj", 0)] == 1
    assert bwd[("model.layers.0.mlp.down_proj", 0)] == 1
    assert Counter(n for n, c in zip(names, s.cat) if c == CAT_FORWARD)["model.layers.0"] == 1


def test_retain_graph_two_passes_and_autograd_grad() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(3, 4)
    with hooktrace.trace(model) as tr:
        loss = model(x).sum()
        loss.backward(retain_graph=True)
        loss.backward(retain_graph=True)
        torch.autograd.grad(loss, list(model.parameters()))
    bwd = backward_calls(tr)
    assert bwd[("0", 0)] == 3 and bwd[("2", 0)] == 3 and bwd[("", 0)] == 3


def test_gradient_accumulation_links_each_forward_call() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with hooktrace.trace(model) as tr:
        losses = [model(torch.randn(3, 4)).sum() for _ in range(3)]
        sum(losses).backward()
    bwd = backward_calls(tr)
    assert {c for n, c in bwd if n == "0"} == {0, 1, 2}
    assert all(v == 1 for v in bwd.values())


def test_double_backward() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(3, 4, requires_grad=True)
    with hooktrace.trace(model) as tr:
        (gx,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        gx.pow(2).sum().backward()
    s = tr.spans()
    assert (s.cat == CAT_BACKWARD).any()
    assert s.unfinished == 0 and s.orphan_exits == 0
    assert model[0].weight.grad is not None


def test_backward_on_another_thread() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    tids: list[int] = []
    with hooktrace.trace(model) as tr:
        loss = model(torch.randn(3, 4)).sum()

        def run() -> None:
            tids.append(threading.get_native_id())
            loss.backward()

        t = threading.Thread(target=run)
        t.start()
        t.join()
    s = tr.spans()
    bwd = s.cat == CAT_BACKWARD
    assert set(s.tid[bwd].tolist()) == {tids[0]}
    assert set(s.tid[s.cat == CAT_FORWARD].tolist()) == {threading.get_native_id()}
    assert backward_calls(tr)[("0", 0)] == 1
    assert_nodes_owned_by_right_modules(tr)


def test_backward_after_the_block_and_a_second_trace() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with hooktrace.trace(model) as tr:
        loss = model(torch.randn(3, 4)).sum()
    loss.backward()  # after the trace: not recorded, nothing breaks
    assert not (tr.spans().cat == CAT_BACKWARD).any()
    assert len(tr.spans().nodes.start_ns) == 0
    with hooktrace.trace(model) as tr2:
        model(torch.randn(3, 4)).sum().backward()
    assert backward_calls(tr2)[("2", 0)] == 1


def test_backward_disabled() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with hooktrace.trace(model, backward=False) as tr:
        model(torch.randn(3, 4)).sum().backward()
    assert not (tr.spans().cat == CAT_BACKWARD).any()
    assert tr.info["backward"] is False


def test_dataclass_output_model_backward() -> None:
    model = DataclassOut()
    with hooktrace.trace(model) as tr:
        model(torch.randn(2, 4)).hidden.sum().backward()
    assert backward_calls(tr)[("inner.lin", 0)] == 1


def test_llama_backward_spans_for_every_linear() -> None:
    model = tiny_llama().train()
    ids = torch.randint(0, 64, (1, 8))
    with hooktrace.trace(model) as tr:
        model(input_ids=ids, labels=ids).loss.backward()
    bwd = backward_calls(tr)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    missing = [n for n in linears if bwd[(n, 0)] != 1]
    assert not missing


def test_backward_trace_round_trips_through_the_file(tmp_path: Any) -> None:
    model = ConvNet()
    with hooktrace.trace(model) as tr:
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    path = tmp_path / "run.htrace"
    tr.save(path)
    run = hooktrace.load(path)
    a, b = tr.spans(), run.spans()
    assert (b.cat == CAT_BACKWARD).sum() == (a.cat == CAT_BACKWARD).sum() > 0
    for field in ("start_ns", "end_ns", "module", "call", "cat", "parent"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist()
    assert a.nodes.span.tolist() == b.nodes.span.tolist()
    assert run.node_names == tr.node_names


def test_module_backward_hooks_are_inside_its_backward_span() -> None:
    # Issue #16: a module's backward span covers its backward hooks, as its forward
    # span covers its forward hooks. The engine runs them outside every autograd node:
    # register_full_backward_pre_hook's before the module's first node, and
    # register_full_backward_hook's and tensor hooks as node hooks.
    class Blk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).relu()

    model = nn.Sequential(nn.Linear(8, 8), Blk(), nn.Linear(8, 1))
    marks: list[tuple[str, int, int]] = []

    def slow(tag: str) -> Any:
        def hook(*_: Any) -> None:
            t0 = time.time_ns()
            time.sleep(0.003)
            marks.append((tag, t0, time.time_ns()))
        return hook

    model[1].register_full_backward_pre_hook(slow("pre"))
    model[1].register_full_backward_hook(slow("post"))
    def on_output(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        out.register_hook(slow("tensor"))  # as FSDP2 registers its pre-backward

    model[2].register_forward_hook(on_output)
    with hooktrace.trace(model) as tr:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    s = tr.spans()
    bwd = {tr.modules[int(s.module[i])][0]: (int(s.start_ns[i]), int(s.end_ns[i]))
           for i in range(len(s)) if s.cat[i] == CAT_BACKWARD}
    assert set(bwd) == {"", "0", "1", "1.lin", "2"}
    owner = {"pre": "1", "post": "1", "tensor": "2"}
    for tag, t0, t1 in marks:
        inside = [name for name, (a, b) in bwd.items() if a <= t0 and t1 <= b]
        assert sorted(inside) == sorted(["", owner[tag]]), (tag, inside)
