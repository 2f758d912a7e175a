"""The package's shape, beyond imports (issue #37): no module reaches into another's
private attributes. ``x._name`` (``x`` not ``self``/``cls``) is refused where ``_name``
is a private attribute some *other* hooktrace module defines (an attribute it assigns on
``self``, or a method it defines) and this module does not: that is reading or calling
another class's internals across a module boundary. The seam is a public property or
method on the owner (e.g. ``Recorder.scope``, ``FlightRecorder.dump_if_asked``).

Private names of other libraries (``torch``'s ``_orig_mod``, ``sys._getframe``) are
not hooktrace's to fix and are not counted: no hooktrace module defines them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hooktrace"


def _private_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines as attributes of its own objects."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_"):
            out.add(n.name)
        elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            out.add(n.attr)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)  # (a class body's declared attribute)
    return {name for name in out if name.startswith("_") and not name.startswith("__")}


def reaches(package: Path) -> list[str]:
    trees = {p: ast.parse(p.read_text()) for p in sorted(package.rglob("*.py"))}
    defined = {p: _private_defined(t) for p, t in trees.items()}
    out = []
    for p, tree in trees.items():
        others = set().union(*(d for q, d in defined.items() if q != p)) - defined[p]
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and n.attr in others):
                continue
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                continue
            out.append(f"{p.relative_to(package.parent)}:{n.lineno}: {ast.unparse(n)}")
    return out


def test_no_module_reaches_into_another_modules_privates() -> None:
    found = reaches(PACKAGE)
    assert not found, "private attributes of another module's class:\n" + "\n".join(found)


def test_the_check_finds_a_reach(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "owner.py").write_text("class Owner:\n    def __init__(self):\n"
                                  "        self._state = 'new'\n")
    (pkg / "user.py").write_text("def peek(owner):\n    return owner._state\n")
    (pkg / "ok.py").write_text("import sys\ndef frame():\n    return sys._getframe()\n")
    assert reaches(pkg) == ["pkg/user.py:2: owner._state"]


def test_a_verb_never_calls_another_verb() -> None:
    """Issue #37: ``export`` ran ``merge-ranks`` with a made-up argparse namespace. Verbs
    share helpers in ``hooktrace/commands/__init__.py``; no verb module imports another."""
    commands = PACKAGE / "commands"
    verbs = {p.stem for p in commands.glob("*.py") if p.stem != "__init__"}
    found = []
    for p in sorted(commands.glob("*.py")):
        if p.stem == "__init__":
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module == "hooktrace.commands":
                found += [f"{p.name} imports {a.name}" for a in n.names if a.name in verbs]
            elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
                    "hooktrace.commands."):
                found.append(f"{p.name} imports {n.module}")
    assert not found, found


def test_one_grouped_percentile_function() -> None:
    """Issue #37: summary and diff each had their own copy of the grouped percentile
    (and diff a third, hand-written median). One definition, in analysis/groups.py
    (``Groups.percentile``/``self_percentile``: the one reduction's, calling it)."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.FunctionDef) and "percentile" in n.name:
                found.append(f"{p.relative_to(PACKAGE.parent)}: {n.name}")
    assert found == ["hooktrace/analysis/groups.py: group_percentile",
                     "hooktrace/analysis/groups.py: percentile",
                     "hooktrace/analysis/groups.py: self_percentile"], found
