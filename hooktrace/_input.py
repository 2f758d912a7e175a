"""Opening an input file for reading: every reader of traces goes through :func:`open_input`,
and every search of a folder for inputs through :func:`files_under`.

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

__all__ = ["file_kind", "files_under", "open_input"]

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def file_kind(path: str | os.PathLike[str]) -> str:
    """What ``path`` is when it is no regular file (``a FIFO (named pipe)``, ...), for
    messages; ``a regular file`` or ``missing``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    return "a regular file" if stat.S_ISREG(mode) else _kind(mode)


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


def files_under(folder: str | os.PathLike[str], suffixes: tuple[str, ...], *,
                recursive: bool = True) -> list[str]:
    """The regular files under ``folder`` (recursively unless not ``recursive``, sorted)
    whose names end in one of ``suffixes``. A directory symlink is never followed, out of
    the folder or back into it (two links to the folder itself made every verb that read
    it walk 2**40 paths: issue #46); a link to a file is read as that file. What is no
    regular file (a FIFO, a device) is no input: opening a FIFO hangs, a device never
    ends.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp(); open(os.path.join(d, "a.htrace"), "wb").close()
        >>> os.symlink(".", os.path.join(d, "loop"))
        >>> [os.path.relpath(f, d) for f in files_under(d, (".htrace",))]
        ['a.htrace']
    """
    found = []
    for root, dirs, names in os.walk(os.fspath(folder)):  # (followlinks=False)
        dirs.sort()
        paths = (os.path.join(root, name) for name in sorted(names) if name.endswith(suffixes))
        # (file_kind: "missing" for a dangling link, or a file gone since listed)
        found += [path for path in paths if file_kind(path) == "a regular file"]
        if not recursive:
            break
    return found
