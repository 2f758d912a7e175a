"""The package's shape (issue #16): every module sits in one layer, imports go only
down (or sideways within a layer), the whole graph has no cycle, and nothing but the
command line imports ``hooktrace.commands``.

Every import counts: module level, inside functions (a lazy import is still a
dependency) and under ``TYPE_CHECKING``. A new module must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hooktrace"

# Bottom to top. A module may import modules of its own layer or any layer below.
LAYERS: list[tuple[str, set[str]]] = [
    ("leaf: constants, errors and formatting helpers", {
        "hooktrace._events", "hooktrace.errors", "hooktrace._naming", "hooktrace._output",
        "hooktrace._progress", "hooktrace.text", "hooktrace._version", "hooktrace._moved",
        "hooktrace._native", "hooktrace._input", "hooktrace._args"}),
    ("file formats", {
        "hooktrace.format", "hooktrace.format.meta", "hooktrace.format.v2",
        "hooktrace.format.stream", "hooktrace._kineto", "hooktrace._profiler_events"}),
    ("data", {"hooktrace.reading"}),
    ("analysis", {
        "hooktrace.summary", "hooktrace.diff", "hooktrace._diff_inputs", "hooktrace.attribution",
        "hooktrace.rankset", "hooktrace.stragglers", "hooktrace._filters", "hooktrace.memory",
        "hooktrace.flops", "hooktrace.distributed", "hooktrace.kernels", "hooktrace.numerics",
        "hooktrace.shapes"}),
    ("outputs", {
        "hooktrace.exporters", "hooktrace.exporters._layout", "hooktrace.exporters.chrome",
        "hooktrace.exporters.perfetto", "hooktrace.exporters.ranks", "hooktrace.exporters._extra_args",
        "hooktrace.exporters.formats",
        "hooktrace.reporters",
        "hooktrace.reporters.html", "hooktrace.merge", "hooktrace.result"}),
    ("recording", {
        "hooktrace.record", "hooktrace.record.dispatch", "hooktrace.record.scopes",
        "hooktrace.record.recorder", "hooktrace.record.kernels",
        "hooktrace._windows", "hooktrace.flight", "hooktrace.profiling", "hooktrace.launch",
        "hooktrace._autostart", "hooktrace.integrations", "hooktrace.integrations.hf",
        "hooktrace.integrations.lightning", "hooktrace.demo"}),
    ("commands", {
        "hooktrace.cli", "hooktrace.__main__", "hooktrace.commands",
        *(f"hooktrace.commands.{p.stem}" for p in (PACKAGE / "commands").glob("*.py")
          if p.stem != "__init__")}),
    ("the package's public names", {"hooktrace"}),
]
LAYER = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, modules: set[str]) -> set[str]:
    """Every hooktrace module ``path`` imports, anywhere in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            # the longest known module a dotted name starts with
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("hooktrace") and name != me:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    g = {name: imports(p, set(modules)) for name, p in modules.items()}
    # hooktrace.x.y's import runs hooktrace.x's __init__ first, but that is not a
    # dependency of x.y's code: leave package inits out as targets of their children
    return {n: {m for m in deps if not n.startswith(m + ".")} for n, deps in g.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = dfs(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []

    for n in sorted(g):
        if n not in state:
            found = dfs(n)
            if found:
                return found
    return []


def test_every_module_has_a_layer() -> None:
    missing = sorted(set(all_modules()) - set(LAYER))
    assert not missing, f"give these modules a layer in LAYERS: {missing}"
    gone = sorted(set(LAYER) - set(all_modules()))
    assert not gone, f"LAYERS names modules that do not exist: {gone}"


def test_imports_go_only_down() -> None:
    upward = [f"{a} ({LAYERS[LAYER[a]][0]}) imports {b} ({LAYERS[LAYER[b]][0]})"
              for a, deps in sorted(graph().items()) for b in sorted(deps)
              if a in LAYER and b in LAYER and LAYER[b] > LAYER[a]]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(graph())
    assert not cycle, " -> ".join(cycle)


def test_only_the_command_line_imports_commands() -> None:
    commands = LAYER["hooktrace.cli"]
    bad = [f"{a} imports {b}" for a, deps in graph().items() for b in deps
           if b.startswith("hooktrace.commands") and LAYER.get(a, 0) < commands]
    assert not bad, bad


@pytest.mark.parametrize("edit", ["upward", "cycle"])
def test_the_checks_fail_on_a_bad_import(edit: str) -> None:
    # The checks themselves, on a copy of the graph with one bad edge added.
    g = graph()
    if edit == "upward":
        g["hooktrace.reading"].add("hooktrace.exporters.chrome")
        assert any(LAYER[b] > LAYER[a] for a, deps in g.items() for b in deps
                   if a in LAYER and b in LAYER)
    else:
        g["hooktrace._events"].add("hooktrace.errors")
        g["hooktrace.errors"].add("hooktrace._events")
        assert find_cycle(g)


@pytest.mark.parametrize("old", ["hooktrace.tracefile", "hooktrace.recording",
                                 "hooktrace.global_recording"])
def test_old_module_paths_still_import_with_a_pointer(old: str) -> None:
    import importlib
    import subprocess
    import sys

    from hooktrace._moved import MOVED, REMOVED_IN

    # a fresh interpreter: the old name must not be cached by an earlier import
    code = (f"import warnings; warnings.simplefilter('always')\n"
            f"with warnings.catch_warnings(record=True) as w:\n"
            f"    import {old} as m\n"
            f"print(m.__name__); print(w[0].message)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == MOVED[old] == importlib.import_module(MOVED[old]).__name__
    assert out[1] == (f"{old} moved to {MOVED[old]} (issue #16) and is removed in hooktrace "
                      f"{REMOVED_IN}; import {MOVED[old]} instead")


def _release(version: str) -> tuple[int, ...]:
    """``"0.3"``, ``"0.3.0rc1"`` -> (0, 3, 0): the release a version string names."""
    import re

    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def _shims_overdue(version: str, removed_in: str, moved: dict[str, str]) -> bool:
    return _release(version) >= _release(removed_in) and bool(moved)


def test_old_module_paths_are_gone_by_the_version_their_warning_names() -> None:
    from hooktrace import __version__
    from hooktrace._moved import MOVED, REMOVED_IN

    assert not _shims_overdue(__version__, REMOVED_IN, MOVED), (
        f"hooktrace {__version__} still has the old import paths {sorted(MOVED)}, which "
        f"their warning says are removed in {REMOVED_IN}: delete hooktrace/_moved.py")
    # (the check itself fires at and after the removal version, not before)
    assert _shims_overdue("0.3.0", "0.3", MOVED) and _shims_overdue("1.0", "0.3", MOVED)
    assert not _shims_overdue("0.2.9", "0.3", MOVED) and not _shims_overdue("0.3", "0.3", {})


def test_moved_names_say_where_they_went() -> None:
    from conftest import build_events, build_trace

    import hooktrace.merge
    from hooktrace._events import Clock
    from hooktrace.reading import TraceData
    from hooktrace.result import TraceResult

    with pytest.raises(AttributeError, match=r"^hooktrace.merge.profile moved to "
                                             r"hooktrace.profiling.profile"):
        hooktrace.merge.profile  # noqa: B018
    data = build_trace(build_events([]), [("", "Net")], clock=Clock(0, 0, 1.0), cls=TraceData,
                       pid=1, hostname="h")
    with pytest.raises(AttributeError, match=r"TraceData.summary\(\) is a method of "
                                             r"hooktrace.TraceResult"):
        data.summary()
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        data.nothing  # noqa: B018
    result = TraceResult.of(data)
    assert result.events is data.events and result.modules == data.modules
    assert type(result.summary()).__name__ == "Summary"


def test_every_package_is_installed() -> None:
    # pyproject.toml lists the packages a wheel holds; a folder missing there works in
    # the editable install and is absent from a real one.
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    on_disk = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert listed == on_disk
