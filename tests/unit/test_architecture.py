"""The package's shape: module-level imports form no cycle, and the core never
imports the command line, exporters or adapters (they import it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hooktrace"
CORE = {"hooktrace.recording", "hooktrace.global_recording", "hooktrace._naming",
        "hooktrace.reading", "hooktrace.tracefile", "hooktrace._events",
        "hooktrace.errors", "hooktrace._output"}
EDGE_PREFIXES = ("hooktrace.commands", "hooktrace.cli", "hooktrace.exporters",
                 "hooktrace.reporters", "hooktrace.integrations")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path) -> set[str]:
    """hooktrace modules imported at module level (not inside functions or TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("hooktrace"))
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "hooktrace"):
                out.add(node.module)
                for a in node.names:  # `from hooktrace import _C, errors`
                    if (PACKAGE / f"{a.name}.py").exists() and node.module == "hooktrace":
                        out.add(f"hooktrace.{a.name}")
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                for extra in ("orelse", "finalbody", "handlers"):
                    for sub in getattr(node, extra, []):
                        visit(sub.body if isinstance(sub, ast.ExceptHandler) else [sub])
    visit(tree.body)
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    g = {name: {m for m in module_level_imports(p) if m in modules and m != name}
         for name, p in modules.items()}
    # importing hooktrace.x.y runs hooktrace.x's __init__ first, but that is not a
    # dependency of x.y's code: leave package inits out as targets of their children
    for name in g:
        g[name] = {m for m in g[name] if not name.startswith(m + ".")}
    return g


def test_module_level_imports_have_no_cycle() -> None:
    g = graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def dfs(n: str, path: list[str]) -> bool:
        state[n] = 1
        for m in sorted(g[n]):
            if state.get(m) == 1:
                cycle.extend(path[path.index(m):] + [m] if m in path else [n, m])
                return True
            if m not in state and dfs(m, path + [m]):
                return True
        state[n] = 2
        return False

    for n in sorted(g):
        if n not in state and dfs(n, [n]):
            break
    assert not cycle, " -> ".join(cycle)


def test_the_core_does_not_import_the_edges() -> None:
    g = graph()
    for core in CORE:
        bad = {m for m in g[core] if m.startswith(EDGE_PREFIXES)}
        assert not bad, f"{core} imports {bad} at module level"
