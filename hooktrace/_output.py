"""Writing an output file without clobbering anything on failure.

``open_output(path)`` is how every exporter writes:

* a regular file (or a new one) is written to a temporary file in the same
  folder and renamed over ``path`` only once complete, so an error or Ctrl-C
  leaves the previous file (or nothing) rather than a truncated one;
* a FIFO, a character device (``/dev/null``, ``/dev/stdout``) or ``"-"``
  (standard output) is written directly: renaming over them would replace the
  device node or pipe with a regular file;
* a directory, a path inside a missing folder, or a path that is one of the
  command's inputs is refused up front with :class:`OutputPathError`.

``path`` ending in ``.gz`` is gzip-compressed.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open_output(os.path.join(d, "out.json")) as f:
    ...     _ = f.write(b"{}")
    >>> os.listdir(d)
    ['out.json']
    >>> check_output_path(d)
    Traceback (most recent call last):
    ...
    hooktrace.errors.OutputPathError: ... is a directory; give a file name inside it
"""

from __future__ import annotations

import errno
import gzip
import os
import secrets
import stat
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import IO

from hooktrace.errors import OutputPathError

__all__ = ["check_output_path", "disk_of", "failure_reason", "open_output", "write_failure"]

PathLike = str | os.PathLike[str]


def _is_stream(st: os.stat_result) -> bool:
    return stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISSOCK(st.st_mode)


def check_output_path(path: PathLike, inputs: Sequence[PathLike] = ()) -> None:
    """Raise :class:`OutputPathError` if ``path`` cannot be an output file.

    Refuses a directory (or a name ending in a path separator), a path whose
    folder does not exist, and a path that is the same file as one of ``inputs``.
    """
    name = os.fspath(path)
    if name == "-":
        return
    if name.endswith(("/", os.sep)) or os.path.isdir(name):
        raise OutputPathError(f"{name}: is a directory; give a file name inside it")
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        raise OutputPathError(f"{name}: the folder {folder} does not exist")
    if os.path.exists(name):
        for inp in inputs:
            try:
                same = os.path.samefile(name, inp)
            except OSError:
                same = False
            if same:
                raise OutputPathError(f"{name}: is also an input ({os.fspath(inp)}); "
                                      "write the output to another file")


@contextmanager
def open_output(path: PathLike, *, compresslevel: int = 1, inputs: Sequence[PathLike] = (),
                gzip_by_name: bool = True) -> Iterator[IO[bytes]]:
    """A binary file to write ``path`` through (see the module docstring).

    ``gzip_by_name=False`` writes plain bytes whatever the name (``.htrace``).
    """
    check_output_path(path, inputs)
    name = os.fspath(path)
    gz = gzip_by_name and name.endswith(".gz")
    if name == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    try:
        direct = _is_stream(os.stat(name))
    except FileNotFoundError:
        direct = False
    if direct:
        with open(name, "wb") as raw, _maybe_gzip(raw, gz, compresslevel) as f:
            yield f
        return
    tmp, fd = _new_temp(name)
    try:
        with open(fd, "wb") as raw, _maybe_gzip(raw, gz, compresslevel) as f:
            yield f
        os.replace(tmp, name)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _new_temp(name: str) -> tuple[str, int]:
    """A temporary file beside ``name``, created by this call (``O_EXCL``, never through
    a link): its name is unguessable, so another user sharing the folder can neither
    plant a link there to have the output written through it nor clobber it."""
    folder, base = os.path.split(os.path.abspath(name))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = os.path.join(folder, f".{base}.{secrets.token_hex(8)}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:  # (taken: another name)
            continue


@contextmanager
def _maybe_gzip(raw: IO[bytes], gz: bool, compresslevel: int) -> Iterator[IO[bytes]]:
    if not gz:
        yield raw
        return
    # mtime=0: the same trace gives the same bytes (reproducible outputs).
    with gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=compresslevel,
                       mtime=0) as f:
        yield f  # type: ignore[misc]


# The errors that mean "no room": a full disk, a quota reached
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def disk_of(path: PathLike) -> str:
    """The disk holding ``path``, in words: its mount point and its free space
    (``/data: 0 B free of 3.0 MiB``), for the message of a write the disk refused
    (issue #46: "raise --capacity" was said of a full disk)."""
    where = os.path.abspath(os.fspath(path))
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    mount = where
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    try:
        st = os.statvfs(where)
    except OSError:
        return mount
    return f"{mount}: {_size(st.f_bavail * st.f_frsize)} free of {_size(st.f_blocks * st.f_frsize)}"


def write_failure(path: PathLike, error: BaseException | str) -> str:
    """One line for a write of ``path`` that failed: the file and
    :func:`failure_reason`."""
    return f"{os.fspath(path)}: {failure_reason(path, error)}"


def failure_reason(path: PathLike, error: BaseException | str) -> str:
    """Why a write of ``path`` failed, and for no room (a full disk, a quota) which disk
    (:func:`disk_of`)."""
    if isinstance(error, OSError):
        code, what = error.errno, error.strerror or str(error)
    else:
        what = str(error)
        code = next((c for c in _NO_ROOM if os.strerror(c) in what), None)
    if code in _NO_ROOM:
        what += f" (no room on the disk holding it, {disk_of(path)} now)"
    return what
