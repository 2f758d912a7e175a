"""hooktrace: low-overhead per-module tracing for PyTorch models.

Example::

    import torch, hooktrace
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with hooktrace.trace(model) as tr:
        model(torch.randn(4, 8))
    tr.export_chrome("trace.json")   # open in https://ui.perfetto.dev
    print(tr.summary())
"""

import torch as _torch  # noqa: F401  (loads libc10/libtorch before the native core)

__version__ = "0.1.0"

from hooktrace import errors  # noqa: E402
from hooktrace.errors import HooktraceError  # noqa: E402
from hooktrace.reading import TraceData, load  # noqa: E402
from hooktrace.merge import profile  # noqa: E402
from hooktrace.recording import Trace, trace, window_handler  # noqa: E402
from hooktrace.flight import dump  # noqa: E402
from hooktrace.global_recording import GlobalTrace, global_trace  # noqa: E402

__all__ = ["GlobalTrace", "HooktraceError", "Trace", "TraceData", "__version__", "dump", "errors",
           "global_trace", "load", "profile", "trace", "window_handler"]
