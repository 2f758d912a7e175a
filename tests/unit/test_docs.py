"""The docs (issue #30): the site builds strictly with zero warnings, the CLI reference
lists every verb and flag, and the examples of docs/*.md and README.md run.

Examples (docs/contributing.md says the same to writers):
- every ```python block runs, page by page in order in one namespace per page, in a
  temporary folder of its own, after PRELUDE below (docs/contributing.md includes it);
- every line of a ```sh / ```bash / ```console block that starts with ``hooktrace `` or
  ``python -m hooktrace`` runs in that page's folder, after its Python blocks, with
  FIXTURES' files there, and must exit 0; other lines (make, pip, torchrun) are not run;
- ``<!-- docs-test: skip (why) -->`` on the line before a block keeps it from running.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("*/*.md")) + [
    ROOT / "README.md"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                reason="mkdocs is not installed (make test installs it)")

# The names every page's Python examples may use (docs/contributing.md shows this part).
PRELUDE = '''
# --8<-- [start:prelude]
import torch, hooktrace

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
x = torch.randn(32, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train(steps=2):
    """A few training steps of `model` (each optimizer step ends a hooktrace step)."""
    for _ in range(steps):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
# --8<-- [end:prelude]
'''

# The script the console examples profile: two top-level models, as in the naming docs
TRAIN_PY = '''
import torch
from torch import nn

class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    def forward(self, x):
        return self.main(x)

class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    def forward(self, x):
        return self.main(x)

g, d = Generator(), Discriminator()
opt = torch.optim.SGD(list(g.parameters()) + list(d.parameters()), lr=0.01)
for _ in range(3):
    loss = nn.functional.binary_cross_entropy_with_logits(d(g(torch.randn(8, 16))),
                                                          torch.ones(8, 1))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''

SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b")
FENCE = re.compile(r"^```(\w*)[^\n]*$")
CONSOLE = {"sh", "bash", "console", "shell"}
RUNS = re.compile(r"^(\$ )?(hooktrace|python -m hooktrace)\s")


def blocks(page: Path) -> list[tuple[int, str, str, bool]]:
    """(line, language, code, skipped) of each fenced block at column 0."""
    out, lines, i = [], page.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, lang = i, m.group(1)
        skipped = start > 0 and SKIP.search(lines[start - 1]) is not None
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        out.append((start + 1, lang, "\n".join(body), skipped))
    return out


def env() -> dict[str, str]:
    # HOOKTRACE_GPU_TIMER=host: on a machine without CUDA the GPU page's examples run on
    # the host-clock timer (hooktrace/record/gpu_time.py's test seam): the same code path
    # to the table, with host timestamps as the device's
    e = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1",
             HOOKTRACE_PROGRESS="0", HOOKTRACE_GPU_TIMER="host")
    e.pop("HOOKTRACE", None)
    return e


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in (r.stdout + r.stderr).splitlines() if "WARNING" in line]
    assert warnings == []
    return out


def page_text(site: Path, name: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", (site / name).read_text(encoding="utf-8")))


def test_the_site_builds_strictly_with_zero_warnings(site: Path) -> None:
    # every page of the nav was written, the generated parts included
    for name in ("index.html", "getting-started.html", "reference/api.html",
                 "reference/cli.html", "format.html", "overhead.html", "contributing.html"):
        assert (site / name).is_file(), name
    assert "class TraceResult" in page_text(site, "reference/api.html") or \
        "TraceResult" in page_text(site, "reference/api.html")
    # the overhead page is benchmarks/RESULTS.md itself, and format.md the reader's layouts
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    last_heading = [line for line in results.splitlines() if line.startswith("## ")][-1]
    assert last_heading[3:].replace("`", "") in page_text(site, "overhead.html")
    assert "kNumericsValue" in page_text(site, "format.html")
    assert "u32 crc32 of block header bytes 0-19" in page_text(site, "format.html")


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_short_and_its_links_resolve() -> None:
    from markdown.extensions.toc import slugify

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 15 * 1024  # issue #30: the details live in docs/
    broken = []
    for target in LINK.findall(readme):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path
        if not file.is_file():
            broken.append(target)
        elif anchor:
            headings = [slugify(h.lstrip("#").strip().replace("`", ""), "-")
                        for h in file.read_text(encoding="utf-8").splitlines()
                        if h.startswith("#")]
            if anchor not in headings:
                broken.append(target)
    assert broken == []


def test_the_readmes_queries_are_the_ones_run_on_duckdb_and_spark() -> None:
    """Issue #29: the README shows three queries people ask. They are docs/data.md's,
    word for word, which tests/integration/test_data_runs.py runs on DuckDB (from the
    .htrace files and from Parquet) and on Spark."""
    def sql_blocks(name: str) -> list[str]:
        text = (ROOT / name).read_text(encoding="utf-8")
        return [b.split("```")[0].strip() for b in text.split("```sql")[1:]]

    readme = sql_blocks("README.md")
    assert len(readme) == 3
    assert readme == sql_blocks("docs/data.md")


def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    import importlib

    import hooktrace

    page = (site / "reference" / "api.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="([\w.]+)"', page))

    def documented(obj: object) -> bool:
        # an entry whose path resolves to this very object (trace is the class Trace)
        for entry in ids:
            path, _, attr = entry.rpartition(".")
            if not path.startswith("hooktrace"):
                continue  # a heading's id
            try:
                if getattr(importlib.import_module(path), attr, None) is obj:
                    return True
            except ImportError:  # a member's id: Class.method
                continue
        return False

    missing = [name for name in hooktrace.__all__
               if name != "__version__" and not documented(getattr(hooktrace, name))]
    assert missing == []


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_cli_reference_has_every_verb_and_every_flag(site: Path) -> None:
    from hooktrace.cli import build_parser

    text = page_text(site, "reference/cli.html")
    parser = build_parser()
    verbs = _subparsers(parser)
    assert len(verbs) >= 9
    missing = []
    for name, sub in [("", parser), *verbs.items()]:
        if name and f"hooktrace {name}" not in text:
            missing.append(f"verb {name}")
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in text:
                    missing.append(f"{name or 'hooktrace'} {flag}")
    assert missing == []


def _python_pages() -> list[tuple[Path, list[tuple[int, str]]]]:
    pages = []
    for page in PAGES:
        code = [(line, src) for line, lang, src, skipped in blocks(page)
                if lang == "python" and not skipped and "--8<" not in src]
        if code:
            pages.append((page, code))
    return pages


def _console_lines(page: Path) -> list[tuple[int, str]]:
    out = []
    for line, lang, src, skipped in blocks(page):
        if lang in CONSOLE and not skipped:
            for k, text in enumerate(src.splitlines()):
                if RUNS.match(text):
                    out.append((line + 1 + k, text.removeprefix("$ ")))
    return out


# Runs each page's Python blocks in its folder, in one namespace after the prelude;
# writes {page: "ok" | "<label>: traceback"} to argv[2].
DRIVER = r'''
import json, os, sys, traceback
pages = json.load(open(sys.argv[1]))
results = {}
for page in pages:
    os.chdir(page["dir"])
    ns = {"__name__": "__main__"}
    try:
        exec(compile(page["prelude"], "<prelude>", "exec"), ns)
        for label, code in page["blocks"]:
            exec(compile(code, label, "exec"), ns)
        results[page["name"]] = "ok"
    except BaseException:
        results[page["name"]] = traceback.format_exc(limit=6)
json.dump(results, open(sys.argv[2], "w"))
'''


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train.py, mypackage/train.py and the traces the console examples read (run.htrace,
    baseline/new.htrace, ranks/)."""
    d = tmp_path_factory.mktemp("fixtures")
    (d / "train.py").write_text(TRAIN_PY)
    (d / "mypackage").mkdir()
    (d / "mypackage" / "__init__.py").write_text("")
    (d / "mypackage" / "train.py").write_text(TRAIN_PY)
    r = subprocess.run([sys.executable, "-m", "hooktrace", "run", "--memory", "--flops",
                        "--shapes", "--numerics", "-o", "run.htrace", "train.py"],
                       cwd=d, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    shutil.copy(d / "run.htrace", d / "baseline.htrace")
    shutil.copy(d / "run.htrace", d / "new.htrace")
    (d / "ranks").mkdir()  # a rank directory (of one rank) for the data page
    shutil.copy(d / "run.htrace", d / "ranks" / "run.htrace")
    return d


def test_the_examples_run(fixtures: Path, tmp_path: Path) -> None:
    dirs = {}
    for page in PAGES:
        dirs[page] = tmp_path / page.relative_to(ROOT).as_posix().replace("/", "_")
        shutil.copytree(fixtures, dirs[page])
    prelude = "\n".join(line for line in PRELUDE.splitlines() if "--8<" not in line)
    python_pages = _python_pages()
    assert python_pages, "no Python example found"
    spec: list[dict[str, Any]] = [
        {"name": page.relative_to(ROOT).as_posix(), "dir": str(dirs[page]), "prelude": prelude,
         "blocks": [(f"{page.relative_to(ROOT).as_posix()}:{line}", src) for line, src in code]}
        for page, code in python_pages]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "driver.py").write_text(DRIVER)
    r = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "spec.json"),
                        str(tmp_path / "results.json")], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    failed = {k: v for k, v in json.loads((tmp_path / "results.json").read_text()).items()
              if v != "ok"}
    assert failed == {}, "\n".join(f"{k}:\n{v}" for k, v in failed.items())

    # the console lines, each page's in its folder after its Python blocks
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=tmp_path, env=env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    failures, ran = [], 0
    try:
        for page in PAGES:
            for line, command in _console_lines(page):
                ran += 1
                err = tmp_path / "stderr.txt"
                argv = _plain_argv(command)
                if argv is None:  # shell syntax (a pipe, a glob): bash runs it
                    shell = (f'hooktrace() {{ "{sys.executable}" -m hooktrace "$@"; }}\n'
                             f'python() {{ "{sys.executable}" "$@"; }}\n')
                    r = subprocess.run(["bash", "-c", shell + command], cwd=dirs[page],
                                       env=env(), capture_output=True, text=True, timeout=300)
                    code, stderr = r.returncode, r.stderr
                else:
                    server.stdin.write(json.dumps({"cwd": str(dirs[page]), "argv": argv,
                                                   "err": str(err)}) + "\n")
                    server.stdin.flush()
                    code = json.loads(server.stdout.readline())
                    stderr = err.read_text(errors="replace")
                # a gate's verdict (exit 1, "hooktrace: diff: ...") is an answer, not an error
                verdict = ("--fail-above" in command and code == 1
                           and "hooktrace: diff:" in stderr and "error" not in stderr)
                if code != 0 and not verdict:
                    failures.append(f"{page.relative_to(ROOT)}:{line}: {command}\n"
                                    f"  exit {code}: {stderr.strip()[-800:]}")
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    assert ran >= 10
    assert failures == [], "\n".join(failures)


def _plain_argv(command: str) -> list[str] | None:
    """``hooktrace``'s arguments for a line without shell syntax, else None."""
    if any(c in command.split("#")[0] for c in "|&;<>*?$`(){}"):
        return None
    words = shlex.split(command, comments=True)
    if words[:3] == ["python", "-m", "hooktrace"]:
        return words[3:]
    return words[1:] if words[:1] == ["hooktrace"] else None


# Runs `hooktrace ARGV` as `python -m hooktrace ARGV` would, without paying for a python
# and a torch import per line: torch is imported once, then a forked child per line
# (stdout to /dev/null, stderr to a file) calls the CLI and runs the atexit handlers.
SERVER = r'''
import atexit, json, os, sys, traceback
import torch  # noqa: F401  (once, before the forks)
import hooktrace.cli
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            sys.path[0] = job["cwd"]
            out = os.open(os.devnull, os.O_WRONLY)
            err = os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.argv = ["hooktrace", *job["argv"]]
            try:
                code = hooktrace.cli.main(job["argv"])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)
'''


def test_make_test_says_how_to_run_the_browser_tests_it_would_skip(tmp_path: Path) -> None:
    """issue #47: `make test` on the README's path skipped the report's 3 browser tests
    (no chromium-driver, which pip cannot install) without a word; CI installs it."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    # GIVEN the line `make test` runs first, and `make browser`
    dry = subprocess.run([make, "-n", "test", "-o", "venv"], cwd=ROOT, text=True,
                         capture_output=True, check=True).stdout.splitlines()
    check = next(line for line in dry if "chromedriver" in line)
    browser = subprocess.run([make, "-n", "browser"], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout
    assert "apt-get install -y -qq chromium chromium-driver" in browser
    # THEN without chromium and chromedriver on PATH it says so, naming make browser
    empty = tmp_path / "empty"
    empty.mkdir()
    bash = shutil.which("bash") or "/bin/bash"
    said = subprocess.run([bash, "-c", check], env={"PATH": str(empty)}, text=True,
                          capture_output=True).stdout
    assert "browser tests will skip; make browser" in said
    # and with both there it says nothing
    found = tmp_path / "found"
    found.mkdir()
    for name in ("chromium", "chromedriver"):
        (found / name).write_text("#!/bin/sh\n")
        (found / name).chmod(0o755)
    assert subprocess.run([bash, "-c", check], env={"PATH": str(found)}, text=True,
                          capture_output=True).stdout == ""
    # THEN the README's two commands say it too
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make browser" in readme and "chromium-driver" in readme
