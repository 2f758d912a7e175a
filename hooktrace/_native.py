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
import re
import sys
from types import ModuleType

from hooktrace.errors import HooktraceError

__all__ = ["TorchMismatchError", "load_native", "torch_mismatch"]

# in dependency order; the ones _C links (readelf -d hooktrace/_C*.so)
_TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so")


class TorchMismatchError(HooktraceError, ImportError):
    """The native core was built against another torch than the one it would load into
    (one line: the commands print it as ``hooktrace: error: ...``)."""


def load_native() -> ModuleType:
    """``hooktrace._C``, with torch's libraries loaded first; a :class:`TorchMismatchError`
    (one line naming both versions) when it was built against another torch."""
    native = sys.modules.get("hooktrace._C")
    if native is None:
        if "torch" not in sys.modules and not _load_torch_libs():
            import torch  # noqa: F401  (loads libc10/libtorch the usual way)
        native = importlib.import_module("hooktrace._C")
    # (checked once, also when a module imported hooktrace._C itself first)
    if not getattr(native, "_torch_checked", False):
        problem = torch_mismatch(getattr(native, "BUILT_TORCH_VERSION", ""), _running_torch())
        if problem:
            sys.modules.pop("hooktrace._C", None)  # (so that every later use says so too)
            raise TorchMismatchError(problem)
        native._torch_checked = True  # type: ignore[attr-defined]
    return native


def torch_mismatch(built: str, running: str | None) -> str | None:
    """The line saying the core cannot load when the torch it was ``built`` against is
    not the ``running`` one (their releases differ: ``+cpu``/``+cu126`` builds of one
    release share the ABI hooktrace uses); None when they agree or either is unknown
    (a core built before it recorded its torch).

    Example:
        >>> torch_mismatch("2.13.0+cpu", "2.13.0+cu126") is None
        True
        >>> print(torch_mismatch("2.13.0+cpu", "2.14.1"))
        the native core (hooktrace._C) was built against torch 2.13.0+cpu, and this is torch 2.14.1: rebuild it against this torch (pip install --no-build-isolation -e . in the checkout, or make build)
    """
    if not built or not running or built.split("+")[0] == running.split("+")[0]:
        return None
    return (f"the native core (hooktrace._C) was built against torch {built}, "
            f"and this is torch {running}: rebuild it against this torch (pip install "
            "--no-build-isolation -e . in the checkout, or make build)")


def _running_torch() -> str | None:
    """The version of the torch whose libraries are loaded: ``torch.__version__`` once
    torch is imported, else its ``version.py`` (read, not imported)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", "")) or None
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        with open(path, encoding="utf-8") as f:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except (ImportError, ValueError, OSError):
        return None
    return found.group(1) if found else None


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
