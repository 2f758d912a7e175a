"""Opening an input file for reading: every reader of traces goes through :func:`open_input`.

Only a regular file is read. A FIFO, a socket, a character or block device (``/dev/zero``)
or a directory is refused with one :class:`~hooktrace.errors.InputPathError` line naming
it: opening a FIFO with no writer blocks forever, and a device never ends. The file is
opened with ``O_NONBLOCK`` first, so even a FIFO swapped in after a check cannot hang
the open; the flag is cleared once the file is known to be regular.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); fifo = os.path.join(d, "p"); os.mkfifo(fifo)
    >>> open_input(fifo)
    Traceback (most recent call last):
    ...
    hooktrace.errors.InputPathError: ...: is a FIFO (named pipe), not a regular file; ...
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from hooktrace.errors import InputPathError

__all__ = ["open_input"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def open_input(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file (see the module
    docstring); a missing or unreadable file raises the ``OSError`` of ``open``."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputPathError(f"{name}: is {_kind(mode)}, not a regular file; give a "
                                 "trace file (save a stream to a file first)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
