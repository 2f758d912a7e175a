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
group per batch, so memory holds one batch of Arrow data however large the run, and
through a temporary file (``.<name>.<pid>.<thread>.tmp``: datasets skip it) renamed once
whole; each file's key-value metadata carries ``hooktrace.schema_version`` and
``hooktrace.table``.
Ranks are converted one at a time (``threads`` at once): one rank's events in memory each.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, Any

from hooktrace._output import open_output
from hooktrace.analysis.inputs import Input
from hooktrace.data import require
from hooktrace.data.schema import TABLES, file_schema
from hooktrace.data.tables import DEFAULT_BATCH_ROWS, Where, batches
from hooktrace.reading import TraceData

__all__ = ["DatasetResult", "process_key", "process_ranks", "rank_where", "write_dataset",
           "write_run", "write_table"]

pq: Any = require("pyarrow.parquet")
_DELTA = ("start_ns", "end_ns", "t_ns", "span", "call")


def write_table(trace: TraceData, table: str, out: str | os.PathLike[str] | IO[bytes],
                where: Where | None = None, *, batch_rows: int = DEFAULT_BATCH_ROWS,
                compression: str = "zstd") -> int:
    """Write ``table`` of ``trace`` to ``out`` (a path or a binary file), one row group
    per batch of ``batch_rows`` rows; returns the rows written. ``where``: default
    :meth:`Where.of` the run (its metadata's rank)."""
    if isinstance(out, (str, os.PathLike)):
        # opened here (pyarrow opens UTF-8 names only), through a temporary file renamed
        # once whole (hooktrace._output): a killed or failed export leaves no file cut
        # short under its name (issue #35)
        with open_output(out, gzip_by_name=False) as f:
            return write_table(trace, table, f, where, batch_rows=batch_rows,
                               compression=compression)
    if where is None:
        where = Where.of(trace)
    schema = file_schema(table, partitioned=where.partitioned)
    rows = 0
    # Times and indices rise within a thread: delta-encoded they take a few bits a row
    # (measured: a synthetic rank's spans file 38x smaller, its scan 3x faster); the
    # other columns repeat few values, for the dictionary.
    delta = [n for n in _DELTA if n in schema.names]
    with ExitStack() as stack:
        # a path is written through a temporary file renamed once whole (hooktrace._output):
        # a killed or failed export leaves no file cut short under its name (issue #35)
        target = out if hasattr(out, "write") else stack.enter_context(
            open_output(out, gzip_by_name=False))  # type: ignore[arg-type]
        with pq.ParquetWriter(target, schema, compression=compression,
                              use_dictionary=[n for n in schema.names if n not in delta],
                              column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED")) as w:
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


def rank_where(info: dict[str, Any], index: int, path: str) -> tuple[int | None, int | None]:
    """(rank, first step of its window) of a file from its metadata; None for either
    when it has none (:func:`process_ranks` numbers the processes without a rank)."""
    rank = info.get("rank")
    window = info.get("window")
    first = window.get("first_step") if isinstance(window, dict) else None
    return (rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            first if isinstance(first, int) else None)


def process_key(info: dict[str, Any]) -> str:
    """Who wrote a file: ``hostname:pid`` (a process's windows share it)."""
    return f"{info.get('hostname', '')}:{info.get('pid', '')}"


def process_ranks(files: Sequence[tuple[int | None, str]]) -> list[int]:
    """The ``rank`` of each file given (its metadata's rank or None, its process): its
    rank, else its process's index among the processes without one, in file order (a
    process's schedule windows are one rank).

    Example:
        >>> process_ranks([(None, "h:2"), (None, "h:1"), (None, "h:2")])
        [0, 1, 0]
    """
    order: dict[str, int] = {}
    out = []
    for rank, proc in files:
        if rank is None:
            rank = order.setdefault(proc, len(order))
        out.append(rank)
    return out


@dataclass
class DatasetResult:
    """What :func:`write_dataset` wrote: files per rank, rows per table, problems."""

    directory: str
    ranks: list[int]
    rows: dict[str, int]
    files: int
    problems: list[str]


def write_dataset(inputs: Sequence[str | os.PathLike[str] | Input],
                  directory: str | os.PathLike[str],
                  *, tables: Sequence[str] = TABLES, single: bool = False,
                  batch_rows: int = DEFAULT_BATCH_ROWS, threads: int = 1,
                  load: Callable[[str], TraceData] | None = None) -> DatasetResult:
    """The ``.htrace`` files under ``inputs`` (rank files or schedule windows) as one
    hive-partitioned dataset at ``directory`` (see the module docstring). ``single``:
    ``tables`` is one table, written at ``directory`` itself. A file that cannot be read
    is a line in ``problems``; the others are written. An input may be
    :func:`~hooktrace.analysis.inputs.resolve`'s answer for its path."""
    from hooktrace.errors import HooktraceError
    from hooktrace.analysis.rankset import RankSetError, find_rank_files
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

    def convert(i: int, path: str) -> tuple[int, dict[str, Any] | str]:
        try:
            run = reader(path)
        except (HooktraceError, OSError) as e:
            text = str(e)
            return i, text if text.startswith(path) else f"{path}: {text}"
        rank, first = rank_where(run.info, i, path)
        proc = process_key(run.info)
        label = str(rank) if rank is not None else f"process{i}"  # renumbered below
        r = _write_rank(run, directory, tables, single, label, first, i, path, batch_rows)
        r["__process__"] = (rank, proc)
        return i, r

    with ThreadPoolExecutor(max(threads, 1)) as pool:
        results = list(pool.map(lambda a: convert(*a), enumerate(paths)))
    done: list[tuple[int, dict[str, Any]]] = [(i, r) for i, r in results
                                              if not isinstance(r, str)]
    problems += [r for _, r in results if isinstance(r, str)]
    ranks = process_ranks([r["__process__"] for _, r in done])
    renames: dict[str, int] = {}
    for (i, r), rank in zip(done, ranks):
        for t, n in r.items():
            if t in rows:
                rows[t] += n
        written.append(rank)
        if r["__process__"][0] is None:
            renames[f"process{i}"] = rank
    _number_ranks(directory, tables, single, renames)
    _number_windows(directory, tables, single)
    return DatasetResult(directory, sorted(set(written)), rows, len(written), problems)


def _write_rank(run: TraceData, directory: str, tables: Sequence[str], single: bool, rank: str,
                first_step: int | None, index: int, path: str, batch_rows: int
                ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    where = Where(rank=None, window=None, path=path, partitioned=True)
    for t in tables:
        base = directory if single else os.path.join(directory, t)
        part = os.path.join(base, f"rank={rank}")
        if first_step is not None:  # renamed to its index by _number_windows
            part = os.path.join(part, f"window=first{first_step}")
        os.makedirs(part, exist_ok=True)
        out[t] = write_table(run, t, os.path.join(part, f"part-{index}.parquet"), where,
                             batch_rows=batch_rows)
    return out


def _number_ranks(directory: str, tables: Iterable[str], single: bool,
                  renames: dict[str, int]) -> None:
    """``rank=processI`` directories (files without a rank) -> ``rank=K``, merged with the
    other windows of the same process."""
    for t in tables:
        base = directory if single else os.path.join(directory, t)
        for label, rank in renames.items():
            src = os.path.join(base, f"rank={label}")
            dst = os.path.join(base, f"rank={rank}")
            if not os.path.isdir(src):
                continue
            if not os.path.exists(dst):
                os.rename(src, dst)
                continue
            for d, _, names in os.walk(src):  # another window of the same process
                rel = os.path.relpath(d, src)
                os.makedirs(os.path.join(dst, rel), exist_ok=True)
                for n in names:
                    os.rename(os.path.join(d, n), os.path.join(dst, rel, n))
            shutil.rmtree(src)


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
