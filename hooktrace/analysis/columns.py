"""The column providers (issue #37): one per recorded quantity, asked by every view that
shows it. The summary (and the report, which shows its rows), the Parquet ``spans``
table and the aggregates loop over :data:`PROVIDERS` and name no feature; a new
recorded quantity visible everywhere is its component and its provider (what a
provider answers: :mod:`hooktrace.analysis.column_provider`).

Example:
    >>> [p.name for p in PROVIDERS]
    ['device time', 'kernel time', 'FLOPs', 'memory', 'numerics', 'shapes']
"""

from __future__ import annotations

from typing import Any

from hooktrace.analysis.column_provider import (
    Column,
    ColumnProvider,
    SpanColumn,
    SummaryPart,
    WindowGroup,
    measured_only,
)
from hooktrace.analysis.device_time import DeviceTimeColumns
from hooktrace.analysis.flops import FlopColumns
from hooktrace.analysis.kernel_time import KernelTimeColumns
from hooktrace.analysis.memory import MemoryColumns
from hooktrace.analysis.numerics import NumericsColumns
from hooktrace.analysis.shapes import ShapeColumns

__all__ = ["PROVIDERS", "Column", "ColumnProvider", "SpanColumn", "SummaryPart", "WindowGroup",
           "cell_text", "declared", "measured_only"]

# In the order the views show their columns: the summary's device time leads (and sorts
# the rows), then FLOPs, memory and numerics; shapes are Parquet columns only.
PROVIDERS: list[ColumnProvider] = [
    DeviceTimeColumns(),
    KernelTimeColumns(),
    FlopColumns(),
    MemoryColumns(),
    NumericsColumns(),
    ShapeColumns(),
]


def declared(table: str) -> list[Column]:
    """The recorded quantities' columns of ``table`` (``spans`` or ``aggregates``) as
    their providers declare them (:class:`Column`), in the table's order: by
    :attr:`Column.order`, then the registry's.

    Example:
        >>> [c.name for c in declared("aggregates")]
        ['gpu_ms', 'kernel_ms', 'mem_peak_bytes', 'tflops', 'nonfinite', 'absmax']
    """
    return sorted((c for p in PROVIDERS for c in p.columns if c.table == table),
                  key=lambda c: c.order)


def cell_text(key: str, value: Any) -> str | None:
    """How a recorded quantity's cell reads (a value, not None), as its provider says
    (:meth:`ColumnProvider.format_cell`): the terminal table's and the report's; None for
    a key no provider formats."""
    for p in PROVIDERS:
        text = p.format_cell(key, value)
        if text is not None:
            return text
    return None
