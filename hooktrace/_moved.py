"""Old import paths of modules that moved in the layering of issues #16 and #37.

``import hooktrace.tracefile`` (now ``hooktrace.format``), ``hooktrace.recording``
and ``hooktrace.global_recording`` (now ``hooktrace.record``) (issue #16), and the
modules that left the package's top for the layers' folders (issue #37: the analysis
in ``hooktrace.analysis``, the recording side in ``hooktrace.record``, the profiler
trace readers in ``hooktrace.format``) keep working: the old name is the new module,
with a ``DeprecationWarning`` naming the new spelling, the issue that moved it
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

__all__ = ["MOVED", "MOVED_BY", "REMOVED_IN", "install", "message"]

# The release that drops every alias below (and this module).
REMOVED_IN = "0.3"

# old name -> (new name, the issue that moved it)
MOVED_BY: dict[str, tuple[str, int]] = {
    "hooktrace.tracefile": ("hooktrace.format", 16),
    "hooktrace.recording": ("hooktrace.record.recorder", 16),
    "hooktrace.global_recording": ("hooktrace.record.recorder", 16),
    # issue #37: the layers as folders
    **{f"hooktrace.{m}": (f"hooktrace.analysis.{m}", 37) for m in (
        "summary", "diff", "_diff_inputs", "attribution", "rankset", "stragglers",
        "_filters", "memory", "flops", "kernels", "numerics", "shapes", "device_time")},
    "hooktrace.launch": ("hooktrace.record.launch", 37),
    "hooktrace.distributed": ("hooktrace.record.distributed", 37),
    "hooktrace.profiling": ("hooktrace.record.profiling", 37),
    "hooktrace.flight": ("hooktrace.record.flight", 37),  # was a re-export of it
    "hooktrace._windows": ("hooktrace.record.windows", 37),
    "hooktrace._attach": ("hooktrace.record.attach", 37),
    "hooktrace._attach_agent": ("hooktrace.record.attach_agent", 37),
    "hooktrace._kineto": ("hooktrace.format._kineto", 37),
    "hooktrace._profiler_events": ("hooktrace.format._profiler_events", 37),
    "hooktrace.record.aggregate_folder": ("hooktrace.data.aggregates", 48),
}
MOVED = {old: new for old, (new, _) in MOVED_BY.items()}


def message(old: str) -> str:
    """The warning an import of the old name ``old`` gives."""
    new, issue = MOVED_BY[old]
    return (f"{old} moved to {new} (issue #{issue}) and is removed in hooktrace "
            f"{REMOVED_IN}; import {new} instead")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(message(spec.name), DeprecationWarning, stacklevel=3)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module is already executed


def install() -> None:
    # First on the path: it answers only the old names, and a file still found under one
    # (an earlier install's leftover, another checkout's editable install) must not
    # shadow the new module.
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
