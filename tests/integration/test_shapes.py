"""Shapes on every forward span (issue #19): trace(model, shapes=True), run --shapes.

Checks: each call's input and output signatures equal a pure-Python reference taken
by forward hooks (positional and keyword tensors, nested tuples/lists/dicts/dataclasses
flattened in order, non-tensors passed over, integer and boolean dtypes); the exports'
span args carry them (JSON and .pftrace, read back); `summary --by-shape` splits a
module's row by input signature under `hooktrace run --shapes`; a streamed trace cut
before its footer still loads (shapes unknown, said in the cut note); a file whose
shape event names a signature outside its table is refused in one line.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import hooktrace
from hooktrace._events import SHAPES
from hooktrace.format import TraceFileError
from hooktrace.analysis.shapes import parse_signature, span_shapes
from hooktrace.reading import CAT_FORWARD, TraceData

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Out:
    hidden: torch.Tensor
    mask: torch.Tensor
    note: str


class Gate(nn.Module):
    def forward(self, x: torch.Tensor, scale: float, *, extra: dict[str, Any]) -> Out:
        return Out(x * scale + extra["bias"], x > 0, "n")


class Split(nn.Module):
    def forward(self, pair: tuple[torch.Tensor, list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        a, rest = pair
        return (a.half(), *rest, torch.arange(3))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gate = Gate()
        self.split = Split()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        o = self.gate(h, 0.5, extra={"bias": torch.zeros(8), "k": 3})
        outs = self.split((o.hidden, [o.mask, h[:1]]))
        return outs[0].float().sum() + outs[2].sum()


def _flat(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _flat(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _flat(o)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for o in vars(obj).values() for t in _flat(o)]
    return []


def _sig(tensors: list[torch.Tensor]) -> list[tuple[str, list[int]]]:
    return [(str(t.dtype).removeprefix("torch."), list(t.shape)) for t in tensors]


def _reference(model: nn.Module) -> tuple[dict[str, list[Any]], list[Any]]:
    """Per module name, per call: (input signature, output signature), from hooks."""
    seen: dict[str, list[Any]] = {}
    handles = []
    for name, m in model.named_modules():
        def hook(mod: nn.Module, args: Any, kwargs: Any, out: Any, name: str = name) -> None:
            seen.setdefault(name, []).append(
                (_sig(_flat(list(args)) + _flat(list(kwargs.values()))), _sig(_flat(out))))
        handles.append(m.register_forward_hook(hook, with_kwargs=True))
    return seen, handles


def test_signatures_equal_a_python_reference_per_call(tmp_path: Path) -> None:
    # GIVEN a model whose calls take keyword arguments, nested containers and
    # non-tensors, and return dataclasses and tuples of several dtypes
    model = Net()
    expected, handles = _reference(model)
    # WHEN it runs with shapes recorded, at two batch sizes
    with hooktrace.trace(model, shapes=True) as tr:
        for n in (2, 5, 2):
            model(torch.randn(n, 8)).backward()
    for h in handles:
        h.remove()
    # THEN every forward span's signatures are the reference's, call by call
    spans = tr.spans()
    in_sig, out_sig = span_shapes(tr)
    table = tr.info["shape_signatures"]
    fwd = np.flatnonzero(spans.cat == CAT_FORWARD)
    assert len(fwd) == 4 * 3
    got: dict[str, list[Any]] = {}
    for i in fwd[np.argsort(spans.start_ns[fwd], kind="stable")].tolist():
        name = tr.modules[int(spans.module[i])][0]
        assert in_sig[i] >= 0 and out_sig[i] >= 0
        got.setdefault(name, []).append(
            ([(d, list(s)) for d, s in parse_signature(table[in_sig[i]])],
             [(d, list(s)) for d, s in parse_signature(table[out_sig[i]])]))
    assert got == expected
    assert got["gate"][0][1] == [("float32", [2, 8]), ("bool", [2, 8])]
    assert got["split"][1][1][0] == ("float16", [5, 8]) and got["split"][1][1][-1] == ("int64", [3])
    # AND the JSON export's forward spans carry them as args
    tr.export_chrome(tmp_path / "t.json")
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
              if e.get("cat") == "hooktrace.forward"]
    assert len(events) == 12
    gate = [e["args"] for e in events if e["args"]["module"] == "gate"]
    assert [a["in_shapes"] for a in gate] == [[[2, 8], [8]], [[5, 8], [8]], [[2, 8], [8]]]
    assert gate[0]["in_dtypes"] == ["float32", "float32"]
    assert gate[1]["out_shapes"] == [[5, 8], [5, 8]] and gate[1]["out_dtypes"] == ["float32", "bool"]


def test_pftrace_carries_the_shape_args(tmp_path: Path) -> None:
    model = Net()
    with hooktrace.trace(model, shapes=True) as tr:
        model(torch.randn(3, 8)).backward()
    path = tmp_path / "t.pftrace"
    tr.export_perfetto(path)
    data = path.read_bytes()
    # debug annotation names and the int values are in the packets (decoded by
    # Perfetto itself in tests/integration/test_perfetto.py's check)
    for name in (b"in_shapes", b"in_dtypes", b"out_shapes", b"out_dtypes", b"float16"):
        assert name in data


def test_without_shapes_nothing_is_recorded() -> None:
    model = Net()
    with hooktrace.trace(model) as tr:
        model(torch.randn(3, 8)).backward()
    assert "shape_signatures" not in tr.info
    assert not (tr.events["kind"] == SHAPES).any()


def test_run_shapes_and_summary_by_shape(tmp_path: Path) -> None:
    # GIVEN an unmodified script whose sequence length changes between steps
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        emb, fc = nn.Embedding(50, 16), nn.Linear(16, 50)
        net = nn.Sequential(emb, fc)
        opt = torch.optim.SGD(net.parameters(), 0.1)
        for i in range(6):
            x = torch.randint(0, 50, (4, 8 if i % 2 == 0 else 16))
            net(x).sum().backward(); opt.step(); opt.zero_grad()
    """))
    out = tmp_path / "run.htrace"
    # WHEN it runs under hooktrace run --shapes
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--shapes", "-o", str(out),
                        str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    s = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(out), "--by-shape",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stderr
    rows = json.loads(s.stdout)["rows"]
    # THEN each module has one row per sequence length, 3 calls each, with backward
    by = {(r["module"], r["in_shapes"]): r for r in rows}
    assert set(by) == {("", "int64[4,8]"), ("", "int64[4,16]"), ("0", "int64[4,8]"),
                       ("0", "int64[4,16]"), ("1", "float32[4,8,16]"),
                       ("1", "float32[4,16,16]")}
    assert all(r["calls"] == 3 and r["bwd_calls"] == 3 for r in rows)
    assert by[("1", "float32[4,16,16]")]["out_shapes"] == "float32[4,16,50]"
    text = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(out), "--by-shape"],
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "float32[4,16,16]" in text.stdout
    # AND a run without shapes says so in one line
    plain = tmp_path / "plain.htrace"
    subprocess.run([sys.executable, "-m", "hooktrace", "run", "-o", str(plain), str(script)],
                   check=True, capture_output=True, cwd=tmp_path, timeout=300)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(plain), "--by-shape"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "no shapes recorded" in r.stderr


def test_nested_tensors_get_a_signature_that_says_so(tmp_path: Path) -> None:
    # GIVEN a script whose module takes and returns a strided nested tensor (reading its
    # sizes throws a C++ exception) and a jagged one
    script = tmp_path / "nested.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x): return x * 2
        for layout in (torch.strided, torch.jagged):
            x = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)],
                                           layout=layout)
            print(M()(x).is_nested)
    """))
    out = tmp_path / "run.htrace"
    # WHEN it runs under hooktrace run --shapes (it exited 134: SIGABRT)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--shapes", "-o", str(out),
                        str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    # THEN it runs as it does untraced, and the signatures name the nested tensor
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"]
    assert hooktrace.load(out).info["shape_signatures"] == ["float32[nested]"]  # both layouts
    assert parse_signature("float32[nested]") == [("float32", ["nested"])]


def test_a_cut_stream_loads_with_unknown_shapes(tmp_path: Path) -> None:
    # GIVEN a streamed trace whose signatures are first seen after the stream began
    model = Net()
    path = tmp_path / "s.htrace"
    with hooktrace.trace(model, shapes=True, out=path) as tr:
        model(torch.randn(7, 8)).backward()
    whole = hooktrace.load(path)
    assert (span_shapes(whole)[0] >= 0).sum() == 4
    # WHEN the footer is lost (the process killed before it was written)
    data = path.read_bytes()
    footer = data.rfind(b"\x06\x00\x00\x00\x00\x00\x00\x00")  # BLOCK_FOOTER's header
    assert footer > 0
    cut = tmp_path / "cut.htrace"
    cut.write_bytes(data[:footer])
    # THEN it loads, its spans keep no shapes, and the cut note says why
    t = hooktrace.load(cut)
    assert len(t.spans()) == len(whole.spans())
    assert (span_shapes(t)[0] < 0).all()
    assert "shape signatures" in t.info["cut"]
    assert tr.info["shape_signatures"]


def test_a_signature_out_of_range_is_refused_in_one_line(tmp_path: Path) -> None:
    model = Net()
    with hooktrace.trace(model, shapes=True) as tr:
        model(torch.randn(3, 8)).backward()
    info = dict(tr.info)
    info["shape_signatures"] = info["shape_signatures"][:1]
    bad = TraceData(tr.events, tr.modules, tr.node_names, tr.clock, info)
    path = tmp_path / "bad.htrace"
    bad.save(path)
    with pytest.raises(TraceFileError, match=r"bad.htrace.*shape signature \d+ out of range"):
        hooktrace.load(path)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "summary", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
