"""What a recording hands back and what ``hooktrace.load`` returns: a
:class:`~hooktrace.reading.TraceData` with the outputs as methods.

The data class itself knows nothing of exporters or the summary (they import it,
not the other way round); :class:`TraceResult` sits above both and joins them for
the user: ``result.summary()``, ``result.export_chrome(path)``,
``result.export_perfetto(path)``.

Example::

    import hooktrace
    run = hooktrace.load("run.htrace")
    print(run.summary())
    run.export_perfetto("run.pftrace", steps=(3, 5))
"""

from __future__ import annotations

import os
from typing import Any

from hooktrace.analysis._filters import Filters
from hooktrace.analysis.device_time import gpu_spans
from hooktrace.exporters.chrome import export_chrome
from hooktrace.exporters.perfetto import export_perfetto
from hooktrace.reading import GpuSpans, TraceData
from hooktrace.reading import load as load_data
from hooktrace.analysis.summary import Summary


class TraceResult(TraceData):
    """A recorded run (:class:`~hooktrace.reading.TraceData`) with its outputs."""

    @classmethod
    def of(cls, data: TraceData) -> TraceResult:
        """``data`` as a ``TraceResult`` (the arrays are shared, not copied)."""
        return data if isinstance(data, cls) else data.as_type(cls)

    def export_chrome(self, path: str | os.PathLike[str], *, nodes: bool = False) -> None:
        """Write a Chrome/Perfetto trace JSON; gzip-compressed when ``path`` ends in ``.gz``.

        ``nodes=True`` adds one event per attributed autograd node (unattributed
        nodes are always written); see ``hooktrace.exporters.chrome``.
        """
        export_chrome(self, path, nodes=nodes)

    def export_perfetto(self, path: str | os.PathLike[str], *, nodes: bool = False,
                        start: float | None = None, end: float | None = None,
                        max_depth: int | None = None, steps: tuple[int, int] | None = None) -> None:
        """Write a Perfetto protobuf trace (``.pftrace``): the Chrome export's
        slices and rows at about 1/3 of its size; see ``hooktrace.exporters.perfetto``.

        ``start``/``end`` (seconds after the run's first event), ``steps=(a, b)``
        and ``max_depth`` cut the run down first (``hooktrace.analysis._filters``).
        """
        export_perfetto(self, path, nodes=nodes, filters=Filters(
            start=start, end=end, max_depth=max_depth, steps=steps))

    def export_parquet(self, path: str | os.PathLike[str], table: str = "spans") -> int:
        """Write ``table`` (docs/schema.md; default ``spans``) as a Parquet file, row group
        by row group; returns the rows written. Needs ``pip install hooktrace[data]``."""
        from hooktrace.exporters.parquet import export_parquet

        return export_parquet(self, path, table)

    def to_arrow(self, table: str = "spans") -> Any:
        """``table`` (``spans``, ``steps``, ``modules``, ``memory``, ``numerics`` or
        ``runs``; docs/schema.md) as a ``pyarrow.Table`` (``rank`` from the run's
        metadata, ``window`` null: one file). Needs ``pip install hooktrace[data]``."""
        from hooktrace.data.tables import Where, to_arrow

        return to_arrow(self, table, Where.of(self))

    def to_pandas(self, table: str = "spans") -> Any:
        """``table`` as a pandas DataFrame (:meth:`to_arrow`'s, converted; the string
        columns are categoricals)."""
        from hooktrace.data import require

        require("pandas")
        return self.to_arrow(table).to_pandas()

    def gpu_spans(self) -> GpuSpans:
        """The run's device time per module call (``trace(gpu=True)``; empty when none
        was recorded): :func:`hooktrace.analysis.device_time.gpu_spans`."""
        return gpu_spans(self)

    def summary(self, *, peak_tflops: float | None = None) -> Summary:
        """Per-module call statistics (see ``hooktrace.analysis.summary.Summary``); ``peak_tflops``
        gives MFU for a run recorded with ``flops=True``."""
        return Summary.from_trace(self, peak_tflops=peak_tflops)


def load(path: str | os.PathLike[str], *, mmap: bool = False) -> TraceResult:
    """Load a ``.htrace`` file (see :func:`hooktrace.reading.load` for the errors and
    ``mmap``) as a :class:`TraceResult`."""
    return TraceResult.of(load_data(path, mmap=mmap))
