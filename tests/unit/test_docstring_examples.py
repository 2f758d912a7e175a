"""Every ``>>>`` example in hooktrace's docstrings runs and prints what it says.

The API reference (docs/api.md, mkdocstrings) shows these examples to users; until this
test nothing ran them, and a module split (97ca624) had broken four of them (an import
cut in two without its ``...`` continuation: a SyntaxError for anyone who pasted it).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import hooktrace
from hooktrace.data import DataExtraMissing

# Some modules and examples need an optional extra (hooktrace[data], the trainer
# integrations); make test installs every one, the torch-floor run (tests/unit on torch
# 2.5 without extras) does not: there a module whose import or examples need a missing
# one is skipped, saying which, and every other module's examples run.
_OPTIONAL = ("pyarrow", "duckdb", "pyspark", "pandas", "lightning", "transformers")
MISSING = [m for m in _OPTIONAL if importlib.util.find_spec(m) is None]
HAVE_DATA = not {"pyarrow", "duckdb"} & set(MISSING)

# Modules whose import acts: the CLI's entry point, and the HOOKTRACE=1 switch (importing
# it starts tracing the process: the test run itself would be traced and a trace file
# written into the working folder at exit). Neither has examples.
_ACTS_ON_IMPORT = {"hooktrace.__main__", "hooktrace._autostart"}
MODULES = sorted(m.name for m in pkgutil.walk_packages(hooktrace.__path__, "hooktrace.")
                 if m.name not in _ACTS_ON_IMPORT)


def _examples(name: str) -> list[doctest.DocTest]:
    """The examples of ``name``'s own docstrings (the finder leaves out what the module
    imports from elsewhere: each example is run once, where it lives)."""
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder().find(module, name) if t.examples]


def test_the_examples_are_found() -> None:
    # the check itself: a walk or finder that found nothing would pass vacuously
    assert len(MODULES) > 100
    names = {t.name for t in _examples("hooktrace.reading")}
    assert {"hooktrace.reading", "hooktrace.reading.TraceData", "hooktrace.reading.load"} <= names
    if HAVE_DATA:
        assert sum(len(_examples(m)) for m in MODULES) >= 60


@pytest.mark.parametrize("name", MODULES)
def test_every_docstring_example_runs(name: str) -> None:
    try:
        tests = _examples(name)
    except (ImportError, DataExtraMissing) as e:
        needs = [m for m in MISSING if m in str(e)]
        if needs:
            pytest.skip(f"{name} needs {needs[0]}, not installed here")
        raise
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for t in tests:
        runner.run(t, out=report.append)
    text = "".join(report)
    needs = [m for m in MISSING if m in text]
    if runner.failures and needs:
        pytest.skip(f"{name}'s examples need {needs[0]}, not installed here")
    assert not runner.failures, text
