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

And what a Parquet input says it is, below the tables layer (issue #48): the names of
hooktrace's tables, a file's ``hooktrace.table`` metadata (:func:`table_of`) and the
one-line :class:`ParquetInputError` of a file that cannot say, which
:mod:`hooktrace.analysis.inputs` asks to tell an export from an ``aggregate=`` part;
:func:`require`, the one line naming the extra to install. :mod:`hooktrace.data`,
:mod:`hooktrace.data.schema` and :mod:`hooktrace.data.validate` re-export them.
"""

from __future__ import annotations

import importlib
import os
import stat
from types import ModuleType
from typing import Any, BinaryIO

from hooktrace.errors import HooktraceError, InputPathError
from hooktrace.text import display_path, printable

__all__ = ["AGGREGATES", "ALL_TABLES", "DataExtraMissing", "ParquetInputError", "TABLES",
           "column_name", "fail", "file_kind", "file_name", "files_under", "meta_text",
           "open_input", "read_schema", "require", "table_of", "unreadable"]

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


# the tables of a trace (hooktrace.data.schema declares their columns, in this order)
TABLES = ("spans", "steps", "modules", "memory", "numerics", "runs", "gpu")
# not a table of a trace: what trace(aggregate=DIR) writes
AGGREGATES = "aggregates"
ALL_TABLES = (*TABLES, AGGREGATES)


class DataExtraMissing(HooktraceError):
    """pyarrow, duckdb or pyspark is not installed."""


_EXTRA = {"pyarrow": "data", "duckdb": "data", "pyspark": "spark", "pandas": "data"}


def require(module: str) -> ModuleType:
    """``import module``, or :class:`DataExtraMissing` naming the extra to install.

    Example:
        >>> require("pyarrow").__name__
        'pyarrow'
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        extra = _EXTRA.get(top, "data")
        raise DataExtraMissing(f"{top} is not installed ({e}); pip install "
                               f"hooktrace[{extra}]") from None


class ParquetInputError(InputPathError):
    """A Parquet input that is not what hooktrace writes (names the file and column)."""


def file_name(path: str) -> str:
    return printable(display_path(path))


def column_name(name: str) -> str:
    """A column name from a file, quoted, its control characters visible, cut short."""
    text = printable(repr(name))
    return text if len(text) <= 60 else text[:59] + "…"


def fail(path: str, what: str) -> ParquetInputError:
    return ParquetInputError(f"{file_name(path)}: {what}")


def read_schema(path: str) -> Any:
    pa: Any = require("pyarrow")
    pq: Any = require("pyarrow.parquet")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(path, "the file name is not UTF-8, which DuckDB cannot open: rename "
                         "the file") from None
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:  # not Parquet, empty, cut short, unreadable
        raise unreadable(path, e) from None


def unreadable(path: str, e: BaseException) -> ParquetInputError:
    """A file pyarrow could not read: the first line of what it said."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()),
                 type(e).__name__)
    return fail(path, f"not a readable Parquet file ({printable(first)})")


def meta_text(path: str, meta: dict[bytes, bytes], key: bytes) -> str | None:
    raw = meta.get(key)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise fail(path, f"metadata {key.decode()} is not UTF-8") from None


def table_of(path: str) -> str:
    """The table a single Parquet file holds: its ``hooktrace.table`` metadata (``spans``
    without one; ``aggregates`` for an ``aggregate=`` folder's part); :class:`ParquetInputError`
    for a file that cannot say."""
    meta = read_schema(path).metadata or {}
    name = meta_text(path, meta, b"hooktrace.table")
    if name is None:
        return "spans"
    if name not in ALL_TABLES:  # (an aggregate= folder's part: "aggregates")
        raise fail(path, f"metadata hooktrace.table {column_name(name)} is not a table of "
                         f"hooktrace ({', '.join(ALL_TABLES)})")
    return name
