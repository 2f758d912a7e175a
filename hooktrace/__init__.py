"""hooktrace: low-overhead per-module tracing for PyTorch models.

Example::

    import torch, hooktrace
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.randn(4, 8))
    tr.result.export_chrome("trace.json")   # open in https://ui.perfetto.dev
    print(tr.result.summary())
"""

import torch as _torch  # noqa: F401  (loads libc10/libtorch before the native core)

from hooktrace._version import __version__  # noqa: E402

from hooktrace import _moved, errors  # noqa: E402
from hooktrace.errors import HooktraceError  # noqa: E402
from hooktrace.reading import TraceData  # noqa: E402
from hooktrace.result import TraceResult, load  # noqa: E402
from hooktrace.profiling import profile  # noqa: E402
from hooktrace.record import GlobalTrace, Trace, global_trace, trace, window_handler  # noqa: E402
from hooktrace.flight import dump  # noqa: E402

_moved.install()

__all__ = ["GlobalTrace", "HooktraceError", "Trace", "TraceData", "TraceResult", "__version__",
           "dump", "errors", "global_trace", "load", "profile", "trace", "window_handler"]
