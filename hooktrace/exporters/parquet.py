"""Parquet output of ``hooktrace export`` (issue #29): a run's ``spans`` table (or
another, ``table=``) as one Parquet file, written row group by row group.

The tables, their layout on disk and the datasets of many ranks are
:mod:`hooktrace.data` 's (docs/schema.md); this module is the exporter face the
suffix table (:mod:`hooktrace.exporters.formats`) and :class:`~hooktrace.result.TraceResult`
use. Needs the ``data`` extra (``pip install hooktrace[data]``).

Example::

    import hooktrace
    hooktrace.load("run.htrace").export_parquet("spans.parquet")
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any

from hooktrace.errors import HooktraceError

if TYPE_CHECKING:
    from hooktrace.analysis._filters import Filters
    from hooktrace.reading import TraceData

__all__ = ["export_parquet", "write_parquet"]


def export_parquet(trace: TraceData, out: str | os.PathLike[str] | IO[bytes],
                   table: str = "spans", *, batch_rows: int | None = None) -> int:
    """Write ``table`` of ``trace`` to ``out``; returns the rows written."""
    from hooktrace.data.parquet import write_table
    from hooktrace.data.tables import DEFAULT_BATCH_ROWS

    return write_table(trace, table, out, batch_rows=batch_rows or DEFAULT_BATCH_ROWS)


def write_parquet(trace: TraceData, out: Any, nodes: bool, filters: Filters,
                  table: str = "spans") -> None:
    """The ``.parquet`` writer of the suffix table (``out``: a binary file). The cuts of
    ``hooktrace export`` (``--steps``, ``--start``/``--end``, ``--max-depth``) are a
    query's job: refused here, naming ``hooktrace query``."""
    if filters.active:
        raise HooktraceError("--steps, --start/--end and --max-depth cut Chrome and Perfetto "
                             "exports only; a Parquet export holds the whole run: select in "
                             "SQL (hooktrace query RUN \"SELECT ... WHERE step BETWEEN ...\")")
    export_parquet(trace, out, table)
