"""What a path is (issue #37): the one input resolver every verb asks.

:func:`resolve` looks at a path without loading any trace and says which
:class:`Kind` it is:

* ``TRACE``: one trace file (``.htrace``, a stream being written or cut, a profiler
  JSON): the verbs load it (hooktrace.reading.load says what is wrong inside);
* ``TRACES``: several trace files, a run's ranks or its schedule windows: a folder of
  ``.htrace`` files (searched recursively), or the name given to ``hooktrace run -o
  NAME`` under torchrun, which stands for its ``NAME_rank<R>.htrace`` files;
* ``EXPORT``: a Parquet export (``hooktrace export RUN -o X.parquet`` or ``-o DIR/``);
* ``AGGREGATE``: an ``aggregate=`` folder, its ``aggregates/`` folder or one of its parts;
* ``MISSING``: nothing there (``problem`` says so);
* ``EMPTY``: a folder with neither trace files nor Parquet in it (``problem``).

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> resolve(os.path.join(d, "nothing.htrace")).kind
    <Kind.MISSING: 'missing'>
    >>> open(os.path.join(d, "run_rank0.htrace"), "wb").close()
    >>> open(os.path.join(d, "run_rank1.htrace"), "wb").close()
    >>> r = resolve(os.path.join(d, "run.htrace"))
    >>> r.kind, [os.path.basename(f) for f in r.files]
    (<Kind.TRACES: 'traces'>, ['run_rank0.htrace', 'run_rank1.htrace'])
    >>> resolve(d).kind, resolve(os.path.join(d, "run_rank0.htrace")).kind
    (<Kind.TRACES: 'traces'>, <Kind.TRACE: 'trace'>)
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from hooktrace._input import files_under
from hooktrace._naming import is_aggregate_dir, rank_files_of

__all__ = ["Input", "Kind", "resolve"]


class Kind(enum.Enum):
    TRACE = "trace"
    TRACES = "traces"
    EXPORT = "export"
    AGGREGATE = "aggregate"
    MISSING = "missing"
    EMPTY = "empty"


@dataclass(frozen=True)
class Input:
    """A resolved path: its :class:`Kind`, the trace files it stands for (``TRACE``:
    itself; ``TRACES``: each, sorted; else none) and, for ``MISSING``/``EMPTY``, the
    one line that says what is wrong."""

    path: str
    kind: Kind
    files: tuple[str, ...] = ()
    problem: str = ""


def resolve(path: str | os.PathLike[str]) -> Input:
    """What ``path`` is (see the module docstring). A ``.parquet`` file or a folder of
    Parquet files needs the data extra (its one-line error names it)."""
    name = os.fspath(path)
    if os.path.isdir(name):
        return _folder(name)
    if os.path.exists(name):
        if name.endswith(".parquet") and os.path.isfile(name):
            return Input(name, Kind.AGGREGATE if _aggregate_part(name) else Kind.EXPORT)
        return Input(name, Kind.TRACE, (name,))
    ranks = rank_files_of(name)  # hooktrace run -o NAME under torchrun
    if ranks:
        return Input(name, Kind.TRACES, tuple(ranks))
    return Input(name, Kind.MISSING, problem=f"{name}: no such file or directory")


def _folder(name: str) -> Input:
    if is_aggregate_dir(name):
        return Input(name, Kind.AGGREGATE)
    traces = files_under(name, (".htrace",))  # (never through a directory symlink)
    parquet = files_under(name, (".parquet",))
    if traces and (not parquet or not _export_layout(name)):
        return Input(name, Kind.TRACES, tuple(traces))
    if parquet:
        top = sorted(f for f in os.listdir(name) if f.endswith(".parquet")
                     and os.path.isfile(os.path.join(name, f)))
        if top and _aggregate_part(os.path.join(name, top[0])):  # DIR/aggregates itself
            return Input(name, Kind.AGGREGATE)
        return Input(name, Kind.EXPORT)
    return Input(name, Kind.EMPTY, problem=f"{name}: a directory with no .htrace file in it")


def _export_layout(name: str) -> bool:
    """Whether a folder holds an export's tables by name (``DIR/spans/``, ``DIR/spans.parquet``,
    ...): with trace files beside them, the folder is the export."""
    from hooktrace._input import TABLES

    return any(os.path.exists(os.path.join(name, t)) or os.path.exists(
        os.path.join(name, f"{t}.parquet")) for t in TABLES)


def _aggregate_part(path: str) -> bool:
    """Whether a ``.parquet`` file's metadata names the aggregates table."""
    from hooktrace._input import AGGREGATES, table_of

    return table_of(path) == AGGREGATES
