"""trace() entry in O(model) (issue #31): the torch.compile() wrappers of the traced
modules come from a registry the OptimizedModule hook fills as they are made, not from a
walk of the whole heap (73 ms on an HF GPT-2 process). Only a wrapper made before
hooktrace could watch (torch.compile() before hooktrace was imported) costs one heap walk,
on the first trace(), once per process. Each case runs in a fresh process: the order of
imports is what is tested."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PRELUDE = """
import gc, sys, warnings
import torch
from torch import nn
def no_heap_walk():
    raise AssertionError("the heap was walked")
model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
x = torch.randn(2, 4)
"""

TRACE = """
def traced(forbid_walk):
    if forbid_walk:
        gc.get_objects = no_heap_walk
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hooktrace.trace(model, backward=False) as tr:
            out = compiled(x)
    assert torch.equal(out, expected)
    # the wrapper's call is the model's one span; the warning names it
    assert [tr.modules[m][0] for m in tr.spans().module] == [""], tr.spans().module
    assert any("'<root>' compiled before the trace" in str(w.message) for w in caught)
"""


def _run(code: str, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_a_wrapper_made_after_hooktrace_is_found_without_a_heap_walk(tmp_path: Path) -> None:
    _run(PRELUDE + """
import hooktrace
hooktrace.trace  # the recorder imported: the hook watches from here
compiled = torch.compile(model)   # Dynamo imported after hooktrace
expected = compiled(x)
""" + TRACE + """
traced(forbid_walk=True)
traced(forbid_walk=True)
print("ok")
""", tmp_path)


def test_dynamo_imported_before_hooktrace_without_a_compile_needs_no_walk(
        tmp_path: Path) -> None:
    # as transformers does: Dynamo imported (and torch.compiler.disable used) first
    _run(PRELUDE + """
import torch._dynamo
torch.compiler.disable(lambda: None)
import hooktrace
hooktrace.trace
compiled = torch.compile(model)
expected = compiled(x)
""" + TRACE + """
traced(forbid_walk=True)
print("ok")
""", tmp_path)


def test_a_wrapper_made_before_hooktrace_is_found_by_one_walk(tmp_path: Path) -> None:
    _run(PRELUDE + """
compiled = torch.compile(model)   # before hooktrace is imported: the hook cannot see it
expected = compiled(x)
import hooktrace
hooktrace.trace
""" + TRACE + """
traced(forbid_walk=False)         # the one walk
traced(forbid_walk=True)          # never again
print("ok")
""", tmp_path)
