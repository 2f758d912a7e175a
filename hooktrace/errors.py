"""hooktrace's own error types: each names what was wrong and where.

Every malformed input or unusable path ends in a :class:`HooktraceError` (a
``ValueError``), which the command line prints as one line (exit code 1).

Example:
    >>> issubclass(OutputPathError, HooktraceError) and issubclass(HooktraceError, ValueError)
    True
"""

from __future__ import annotations

__all__ = ["AttachError", "HooktraceError", "InputPathError", "NoDeviceError", "OptionError", "OutputPathError"]


class HooktraceError(ValueError):
    """Base of hooktrace's errors about inputs, outputs and arguments."""


class InputPathError(HooktraceError):
    """An input path that cannot be read as a file (a FIFO, a device, a directory)."""


class OutputPathError(HooktraceError):
    """An output path that cannot be written (a directory, an input, a missing folder)."""


class OptionError(HooktraceError):
    """A bad option of a traced launch (``hooktrace run``, ``HOOKTRACE_OPTIONS``)."""


class NoDeviceError(HooktraceError):
    """An option that needs an accelerator on a machine without one (``gpu=True``
    without CUDA)."""


class AttachError(HooktraceError):
    """``hooktrace attach`` cannot attach to a process (no such process, not CPython, no
    ptrace rights, no gdb, a hooktrace it cannot import): nothing was done to it."""
