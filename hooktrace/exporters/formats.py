"""Which output format a file name asks for: one table from suffix to exporter.

:data:`OUTPUT_FORMATS` maps each accepted suffix to an :class:`OutputFormat` (its name,
its size per written slice, its writer); a new exporter (Parquet, say) joins by adding
its suffixes there. :func:`output_format` refuses any other suffix, or none, with one
:class:`~hooktrace.errors.OutputPathError` line naming the accepted ones; ``-``
(standard output) and an existing FIFO or device without a known suffix get Chrome
JSON (they have no name to go by).

Example:
    >>> output_format("run.json.gz").name, output_format("run.pftrace").name
    ('Chrome JSON', 'Perfetto protobuf')
    >>> output_format("spans.parquet").name
    'Parquet'
    >>> output_format("run.csv")
    Traceback (most recent call last):
    ...
    hooktrace.errors.OutputPathError: run.csv: unknown output suffix '.csv'; ...
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hooktrace.errors import OutputPathError

if TYPE_CHECKING:
    from hooktrace.analysis._filters import Filters
    from hooktrace.reading import TraceData

__all__ = ["CHROME", "OUTPUT_FORMATS", "OutputFormat", "PARQUET", "PERFETTO", "output_format"]

# Measured on real and synthetic exports (benchmarks/RESULTS.md): bytes per
# written slice, for the progress bar's total and the size warning.
JSON_BYTES_PER_SLICE = 160
PFTRACE_BYTES_PER_SLICE = 50
PARQUET_BYTES_PER_SLICE = 12  # zstd, measured on the benchmarks' synthetic ranks


def _write_chrome(trace: TraceData, out: Any, nodes: bool, filters: Filters) -> None:
    from hooktrace.exporters.chrome import write_chrome

    write_chrome(trace, out, nodes=nodes, filters=filters)


def _write_perfetto(trace: TraceData, out: Any, nodes: bool, filters: Filters) -> None:
    from hooktrace.exporters.perfetto import write_perfetto

    write_perfetto(trace, out, nodes=nodes, filters=filters)


def _write_parquet(trace: TraceData, out: Any, nodes: bool, filters: Filters) -> None:
    from hooktrace.exporters.parquet import write_parquet

    write_parquet(trace, out, nodes, filters)


@dataclass(frozen=True)
class OutputFormat:
    """One output format of ``hooktrace export``: how it is named, its size per slice (for the
    progress bar and the size warning) and its writer ``(trace, out, nodes, filters)``."""

    name: str
    bytes_per_slice: int
    write: Callable[[TraceData, Any, bool, Filters], None]
    browser_json: bool = False  # loaded whole by browser viewers: warn when huge


CHROME = OutputFormat("Chrome JSON", JSON_BYTES_PER_SLICE, _write_chrome, browser_json=True)
PERFETTO = OutputFormat("Perfetto protobuf", PFTRACE_BYTES_PER_SLICE, _write_perfetto)
PARQUET = OutputFormat("Parquet", PARQUET_BYTES_PER_SLICE, _write_parquet)
# Output suffix -> format (a ".gz" suffix is gzip-compressed by open_output). A new
# exporter joins by adding its suffixes here.
OUTPUT_FORMATS: dict[str, OutputFormat] = {
    ".json": CHROME, ".json.gz": CHROME,
    ".pftrace": PERFETTO, ".pftrace.gz": PERFETTO,
    ".perfetto-trace": PERFETTO, ".perfetto-trace.gz": PERFETTO,
    ".parquet": PARQUET,
}


def output_format(path: str) -> OutputFormat:
    """The format ``path`` asks for by its suffix; :class:`OutputPathError` naming the
    accepted suffixes for any other. ``-`` and an existing FIFO or device with no known suffix
    are written Chrome JSON (they have no name to go by)."""
    for suffix in sorted(OUTPUT_FORMATS, key=len, reverse=True):
        if path.endswith(suffix) and len(path) > len(suffix):
            return OUTPUT_FORMATS[suffix]
    if path == "-" or _is_stream(path):
        return CHROME
    ext = os.path.splitext(os.path.basename(path))[1]
    what = f"unknown output suffix '{ext}'" if ext else "no output suffix"
    raise OutputPathError(f"{path}: {what}; give a name ending in "
                          f"{', '.join(OUTPUT_FORMATS)} (or - for standard output)")


def _is_stream(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)
