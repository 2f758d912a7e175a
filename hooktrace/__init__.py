"""hooktrace: low-overhead per-module tracing for PyTorch models.

Example::

    import torch, hooktrace
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.randn(4, 8))
    tr.result.export_chrome("trace.json")   # open in https://ui.perfetto.dev
    print(tr.result.summary())

``import hooktrace`` imports neither torch nor the native core: the names below are
imported on first use (PEP 562), so the read-only command-line verbs (``summary``,
``diff``, ``report``, ...) start in a fraction of torch's import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hooktrace import _moved, errors
from hooktrace._version import __version__
from hooktrace.errors import HooktraceError

if TYPE_CHECKING:
    from hooktrace.record.flight import dump
    from hooktrace.integrations.scalars import log_to
    from hooktrace.record.profiling import profile
    from hooktrace.reading import TraceData
    from hooktrace.record import GlobalTrace, Trace, global_trace, trace, window_handler
    from hooktrace.result import TraceResult, load

# public name -> the module it comes from, imported on first use
_LAZY = {
    "TraceData": "hooktrace.reading", "TraceResult": "hooktrace.result",
    "load": "hooktrace.result", "profile": "hooktrace.record.profiling",
    "dump": "hooktrace.record.flight",
    "GlobalTrace": "hooktrace.record", "Trace": "hooktrace.record",
    "global_trace": "hooktrace.record", "trace": "hooktrace.record",
    "window_handler": "hooktrace.record", "log_to": "hooktrace.integrations.scalars",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hooktrace' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next look-up does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_moved.install()

__all__ = ["GlobalTrace", "HooktraceError", "Trace", "TraceData", "TraceResult", "__version__",
           "dump", "errors", "global_trace", "load", "log_to", "profile", "trace", "window_handler"]
