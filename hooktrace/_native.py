"""The native core (``hooktrace._C``), loaded without importing torch when torch is
not imported yet.

``_C`` links torch's shared libraries (libc10, libtorch_cpu, libtorch_python); the
usual way to load them is ``import torch`` (~2 s). Reading and writing trace files
needs none of torch's Python side, so when torch is not imported yet those libraries
are loaded from torch's ``lib`` folder directly (~0.3 s), without importing torch:
``hooktrace summary`` and the other read-only verbs start that much sooner. When
that fails (another torch layout), torch is imported as before. A later
``import torch`` finds the libraries already loaded.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["load_native"]

# in dependency order; the ones _C links (readelf -d hooktrace/_C*.so)
_TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so")


def load_native() -> ModuleType:
    """``hooktrace._C``, with torch's libraries loaded first."""
    if "hooktrace._C" in sys.modules:
        return sys.modules["hooktrace._C"]
    if "torch" not in sys.modules and not _load_torch_libs():
        import torch  # noqa: F401  (loads libc10/libtorch the usual way)
    return importlib.import_module("hooktrace._C")


def _load_torch_libs() -> bool:
    """Load torch's shared libraries by path, without importing torch; False when
    they are not where a pip/conda torch keeps them."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    try:
        for name in _TORCH_LIBS:
            path = os.path.join(lib, name)
            if os.path.exists(path):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            elif name != "libtorch.so":
                return False
    except OSError:
        return False
    return True
