"""The straggler tables and diff of any path (issue #48): :mod:`hooktrace.analysis` reads
``.htrace`` files and never imports this package (``hooktrace.data`` sits above it), so
the entry points that also take a Parquet export (``hooktrace export DIR -o OUT/``) are
here: DuckDB (:mod:`hooktrace.data.engine`) reduces the export, hooktrace.analysis
anything else. Each path is classified once (:func:`hooktrace.analysis.inputs.resolve`),
and only an export needs the data extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hooktrace.analysis import stragglers
from hooktrace.analysis._diff_inputs import window_of
from hooktrace.analysis._diff_parts import Part, part_from_tables
from hooktrace.analysis.diff import Diff
from hooktrace.analysis.diff import compare_paths as compare_files
from hooktrace.analysis.inputs import Input, Kind, resolve
from hooktrace.analysis.rankset import RankFile
from hooktrace.errors import HooktraceError

__all__ = ["analyze", "compare_paths", "dataset_parts"]


def analyze(inputs: Sequence[str | os.PathLike[str]], *,
            profilers: Sequence[str | os.PathLike[str]] = (),
            threshold: float = stragglers.DEFAULT_THRESHOLD,
            min_excess_ns: int = stragglers.DEFAULT_MIN_EXCESS_NS,
            workers: int | None = None) -> stragglers.RanksSummary:
    """:func:`hooktrace.analysis.stragglers.analyze` of ``inputs``; one directory of Parquet
    tables (``hooktrace export`` of the ranks) is reduced by DuckDB, as SQL: the same
    tables."""
    stragglers.check_limits(threshold, min_excess_ns)
    resolved = [resolve(p) for p in inputs]
    if len(resolved) == 1 and resolved[0].kind is Kind.EXPORT and os.path.isdir(inputs[0]):
        from hooktrace.data.engine import connect, find_source, sql_errors, straggler_tables

        src = find_source(resolved[0])
        if src.parquet:
            con = connect(src)
            try:
                with sql_errors(src.path):
                    parts = [straggler_tables(con)]
            finally:
                con.close()
            return stragglers.summary_from_tables(parts, profilers=profilers,
                                                  threshold=threshold,
                                                  min_excess_ns=min_excess_ns)
    return stragglers.analyze(resolved, profilers=profilers, threshold=threshold,
                              min_excess_ns=min_excess_ns, workers=workers)


def compare_paths(a: str, b: str, *, workers: int | None = None) -> Diff:
    """:func:`hooktrace.analysis.diff.compare_paths`; ``a`` or ``b`` may also be a Parquet
    export of the files (``hooktrace export DIR -o OUT/``): DuckDB reduces it
    (:func:`hooktrace.data.engine.diff_tables`)."""
    return compare_files(a, b, workers=workers, export=dataset_parts)


def dataset_parts(inp: Input) -> dict[str, tuple[RankFile, Part]] | None:
    """Per file of the Parquet export of trace files ``inp`` (:func:`resolve`'s answer;
    ``OUT/spans/...``, ``OUT/runs/...``), keyed by its ``runs.path``: its metadata and
    numbers, as diff reads them from the file itself (SQL over the dataset on DuckDB);
    None when ``inp`` is no such export."""
    if inp.kind is not Kind.EXPORT or not os.path.isdir(inp.path):
        return None
    try:
        from hooktrace.data.engine import dataset_diff_tables, find_source

        src = find_source(inp)
    except (ImportError, HooktraceError):
        return None
    if "spans" not in src.parquet or "runs" not in src.parquet:
        return None
    out = {}
    keep: Any = lambda info: info.get("window") is not None  # noqa: E731
    for row, gpu, t in dataset_diff_tables(src, keep):
        f, info = row["path"], row["info"]
        meta = replace(RankFile.from_runs_row(row, info), window=window_of(f, info))
        out[f] = (meta, part_from_tables(t, info, gpu, meta.window is not None))
    return out
