"""Parquet out (issue #29): one table of one run, every table of a run, or a directory
of rank files (or schedule windows) as one hive-partitioned dataset.

Layouts:

* ``write_table(run, "spans", "spans.parquet")``: one file; ``rank``/``window`` are
  columns (null for a single run).
* ``write_run(run, "DIR")``: ``DIR/<table>.parquet`` for every table.
* ``write_dataset(["ranks/"], "DIR", tables)``: ``DIR/<table>/rank=N/part-I.parquet``
  (``rank=N/window=K/`` when the files are schedule windows), ``rank`` and ``window``
  taken from the directory names: ``pyarrow.dataset.dataset("DIR/spans",
  partitioning="hive")``, ``duckdb.read_parquet("DIR/spans/**/*.parquet",
  hive_partitioning=true)`` and ``spark.read.parquet("DIR/spans")`` read each table as is.
  ``write_dataset(..., single="X.parquet")`` writes the one table at ``X.parquet/rank=N/``.

Every file is written batch by batch (:func:`hooktrace.data.tables.batches`), one row
group per batch, so memory holds one batch of Arrow data however large the run; each
file's key-value metadata carries ``hooktrace.schema_version`` and ``hooktrace.table``.
Ranks are converted one at a time (``threads`` at once): one rank's events in memory each.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from hooktrace.data import require
from hooktrace.data.schema import TABLES, file_schema
from hooktrace.data.tables import DEFAULT_BATCH_ROWS, Where, batches
from hooktrace.reading import TraceData

__all__ = ["DatasetResult", "rank_where", "write_dataset", "write_run", "write_table"]

pq: Any = require("pyarrow.parquet")


def write_table(trace: TraceData, table: str, out: str | os.PathLike[str] | IO[bytes],
                where: Where | None = None, *, batch_rows: int = DEFAULT_BATCH_ROWS,
                compression: str = "zstd") -> int:
    """Write ``table`` of ``trace`` to ``out`` (a path or a binary file), one row group
    per batch of ``batch_rows`` rows; returns the rows written."""
    schema = file_schema(table, partitioned=where.partitioned)
    rows = 0
    with pq.ParquetWriter(out, schema, compression=compression) as w:
        for b in batches(trace, table, where, batch_rows=batch_rows):
            w.write_batch(b, row_group_size=max(batch_rows, 1))
            rows += b.num_rows
    return rows


def write_run(trace: TraceData, directory: str | os.PathLike[str], where: Where | None = None, *,
              tables: Sequence[str] = TABLES, batch_rows: int = DEFAULT_BATCH_ROWS
              ) -> dict[str, int]:
    """Every table of one run as ``DIRECTORY/<table>.parquet``; rows per table."""
    os.makedirs(directory, exist_ok=True)
    return {t: write_table(trace, t, os.path.join(directory, f"{t}.parquet"), where,
                           batch_rows=batch_rows) for t in tables}


def rank_where(info: dict[str, Any], index: int, path: str) -> tuple[int, int | None]:
    """(rank, first step of its window or None) of a file: its metadata's rank, else its
    index among the inputs."""
    rank = info.get("rank")
    window = info.get("window")
    first = window.get("first_step") if isinstance(window, dict) else None
    return (rank if isinstance(rank, int) and not isinstance(rank, bool) else index,
            first if isinstance(first, int) else None)


@dataclass
class DatasetResult:
    """What :func:`write_dataset` wrote: files per rank, rows per table, problems."""

    directory: str
    ranks: list[int]
    rows: dict[str, int]
    files: int
    problems: list[str]


def write_dataset(inputs: Sequence[str | os.PathLike[str]], directory: str | os.PathLike[str],
                  *, tables: Sequence[str] = TABLES, single: bool = False,
                  batch_rows: int = DEFAULT_BATCH_ROWS, threads: int = 1,
                  load: Callable[[str], TraceData] | None = None) -> DatasetResult:
    """The ``.htrace`` files under ``inputs`` (rank files or schedule windows) as one
    hive-partitioned dataset at ``directory`` (see the module docstring). ``single``:
    ``tables`` is one table, written at ``directory`` itself. A file that cannot be read
    is a line in ``problems``; the others are written."""
    from hooktrace.errors import HooktraceError
    from hooktrace.rankset import RankSetError, find_rank_files
    from hooktrace.reading import load as load_data

    reader = load or load_data
    paths, problems = find_rank_files(inputs)
    if not paths:
        raise RankSetError("no rank trace to write: " + "; ".join(problems))
    directory = os.fspath(directory)
    if single and len(tables) != 1:
        raise ValueError("single=True writes one table")
    rows = dict.fromkeys(tables, 0)
    written: list[int] = []

    def convert(i: int, path: str) -> tuple[int, dict[str, int] | str]:
        try:
            run = reader(path)
        except (HooktraceError, OSError) as e:
            text = str(e)
            return i, text if text.startswith(path) else f"{path}: {text}"
        rank, first = rank_where(run.info, i, path)
        return i, _write_rank(run, directory, tables, single, rank, first, i, path,
                              batch_rows)

    with ThreadPoolExecutor(max(threads, 1)) as pool:
        results = list(pool.map(lambda a: convert(*a), enumerate(paths)))
    for _, r in results:
        if isinstance(r, str):
            problems.append(r)
            continue
        for t, n in r.items():
            if t in rows:
                rows[t] += n
        written.append(r["__rank__"])
    _number_windows(directory, tables, single)
    return DatasetResult(directory, sorted(set(written)), rows, len(written), problems)


def _write_rank(run: TraceData, directory: str, tables: Sequence[str], single: bool, rank: int,
                first_step: int | None, index: int, path: str, batch_rows: int
                ) -> dict[str, int]:
    out: dict[str, int] = {"__rank__": rank}
    where = Where(rank=rank, window=None, path=path, partitioned=True)
    for t in tables:
        base = directory if single else os.path.join(directory, t)
        part = os.path.join(base, f"rank={rank}")
        if first_step is not None:  # renamed to its index by _number_windows
            part = os.path.join(part, f"window=first{first_step}")
        os.makedirs(part, exist_ok=True)
        out[t] = write_table(run, t, os.path.join(part, f"part-{index}.parquet"), where,
                             batch_rows=batch_rows)
    return out


def _number_windows(directory: str, tables: Iterable[str], single: bool) -> None:
    """``window=firstS`` directories -> ``window=K``, K the window's index in its rank's
    step order (as ``hooktrace diff DIR:K`` numbers them)."""
    for t in tables:
        base = directory if single else os.path.join(directory, t)
        if not os.path.isdir(base):
            continue
        for rank_dir in os.listdir(base):
            full = os.path.join(base, rank_dir)
            if not os.path.isdir(full):
                continue
            firsts = sorted(int(d[len("window=first"):]) for d in os.listdir(full)
                            if d.startswith("window=first"))
            for k, s in enumerate(firsts):
                os.rename(os.path.join(full, f"window=first{s}"), os.path.join(full, f"window={k}"))
