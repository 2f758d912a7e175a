"""Old import paths of modules that moved in the layering of issue #16.

``import hooktrace.tracefile`` (now ``hooktrace.format``), ``hooktrace.recording``
and ``hooktrace.global_recording`` (now ``hooktrace.record``) keep working: the
old name is the new module, with a ``DeprecationWarning`` naming the new spelling
and the version that removes the old names (``REMOVED_IN``; tests/unit/
test_architecture.py fails once ``hooktrace.__version__`` reaches it while
``MOVED`` still holds them).
Installed by ``hooktrace/__init__.py``; imports nothing of hooktrace until an old
name is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "REMOVED_IN", "install"]

# The release that drops every alias below (and this module).
REMOVED_IN = "0.3"

MOVED = {
    "hooktrace.tracefile": "hooktrace.format",
    "hooktrace.recording": "hooktrace.record.recorder",
    "hooktrace.global_recording": "hooktrace.record.recorder",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new} (issue #16) and is removed in hooktrace "
                      f"{REMOVED_IN}; import {new} instead", DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module is already executed


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
