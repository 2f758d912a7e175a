"""Test modules are imported by basename (no packages): two with one name break collection."""

from collections import Counter
from pathlib import Path


def test_test_module_names_are_unique() -> None:
    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
