"""Every Parquet file a verb reads, checked against :mod:`hooktrace.data.schema` before
any SQL touches it (issue #35: a trace file must never act).

A Parquet file is data from someone else: its column names, its key-value metadata,
the folder names of a dataset (``rank=N/``) and its values are all chosen by whoever
wrote it. :func:`check_table` refuses, in one :class:`ParquetInputError` line naming
the file and the column, anything ``hooktrace export`` (or ``trace(aggregate=...)``)
does not write:

* the file: not Parquet, a name that is not UTF-8 (DuckDB opens UTF-8 names only);
* the metadata: ``hooktrace.table`` naming another table or not UTF-8,
  ``hooktrace.schema_version`` other than :data:`~hooktrace.data.schema.SCHEMA_VERSION`;
* the columns: an empty or duplicate name, a name the table does not have, a column it
  needs missing, a type of another kind (an integer column must hold integers; the
  width and the string encoding may differ: the views cast to the schema's types);
* the folders of a dataset: only ``rank=N`` and ``window=K`` (N, K integers), the same
  keys for every file of a table;
* the values (:func:`check_rows`): what the ``.htrace`` reader refuses too: a NULL where
  the schema has none, a negative duration or count, a self time above its total, an
  end before its start, a phase, mode or timing no recorder writes, NaN in an aggregate.

Only then do column names reach SQL, and as the schema's names, not the file's.

Example:
    >>> import os, tempfile
    >>> f = os.path.join(tempfile.mkdtemp(), "x.parquet")
    >>> pq.write_table(pa.table({'a" FROM x; COPY': [1]}), f)
    >>> check_table("spans", [f])
    Traceback (most recent call last):
    ...
    hooktrace._input.ParquetInputError: ...x.parquet: column 'a" FROM x; COPY' is not a column of the spans table ...
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hooktrace.data import require
from hooktrace.data.schema import (
    LATER_AGGREGATE_COLUMNS,
    AGGREGATES,
    PARTITION_COLUMNS,
    SCHEMA_VERSION,
    pa,
    schema,
)
# (ParquetInputError and table_of: below the tables layer, issue #48; re-exported here)
from hooktrace._input import ParquetInputError, table_of
from hooktrace._input import column_name as _col, fail as _fail, file_name as _name
from hooktrace._input import meta_text as _meta_text, read_schema as _read_schema
from hooktrace._input import unreadable as _unreadable
from hooktrace.analysis.calls import MODES, PHASES, TIMINGS, phase_label
from hooktrace.text import printable

__all__ = ["ParquetInputError", "check_rows", "check_schema", "check_table", "partition_keys",
           "table_of"]

pq: Any = require("pyarrow.parquet")
pc: Any = require("pyarrow.compute")

_BATCH_ROWS = 1 << 20  # rows read at once per file: one batch of the checked columns
_FOLDER = re.compile(r"(rank|window)=(-?[0-9]{1,18})")
# what trace(aggregate=...) writes in the mode column (hooktrace.record.aggregate)
# the aggregates' modes: a (phase, mode) as hooktrace.analysis.calls names it, or "step"
_AGGREGATE_MODES = (*(phase_label(cat, is_eval) for is_eval in (False, True)
                      for cat in range(len(PHASES))), "step")



def _kind(t: Any) -> str:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_signed_integer(t) or (pa.types.is_unsigned_integer(t) and t.bit_width <= 32):
        return "integer"  # (a uint64 does not fit the int64 of the views)
    if pa.types.is_floating(t):
        return "floating-point"
    return str(t)


def partition_keys(path: str, base: str) -> tuple[str, ...]:
    """The hive keys of ``path`` below the dataset folder ``base`` (``rank``, ``window``),
    or :class:`ParquetInputError` for a folder that is not ``rank=N`` / ``window=K``."""
    rel = os.path.relpath(os.path.dirname(path), base)
    if rel == os.curdir:
        return ()
    keys: list[str] = []
    for part in rel.split(os.sep):
        m = _FOLDER.fullmatch(part)
        if m is None:
            raise _fail(path, f"the folder {_col(part)} is not rank=N or window=K (N, K "
                              "integers): only those partition a hooktrace dataset")
        if m.group(1) in keys:
            raise _fail(path, f"{m.group(1)}= appears twice in its folders")
        keys.append(m.group(1))
    return tuple(keys)


def check_schema(path: str, table: str, keys: Sequence[str] = ()) -> list[str]:
    """``path``'s metadata and columns against ``table``'s schema (see the module
    docstring); ``keys``: the hive keys its folders give (then not columns). Returns
    its column names."""
    s = _read_schema(path)
    meta = s.metadata or {}
    version = _meta_text(path, meta, b"hooktrace.schema_version")
    if version is not None and version.strip() != str(SCHEMA_VERSION):
        raise _fail(path, f"hooktrace.schema_version {_col(version)}: this hooktrace reads "
                          f"version {SCHEMA_VERSION} (export the run again with it)")
    named = _meta_text(path, meta, b"hooktrace.table")
    if named is not None and named != table and table != AGGREGATES:
        raise _fail(path, f"metadata hooktrace.table {_col(named)}, in the {table} table's "
                          "files")
    want = {f.name: f for f in schema(table)}
    seen: set[str] = set()
    for f in s:
        if f.name == "":
            raise _fail(path, "a column with an empty name")
        if f.name in seen:
            raise _fail(path, f"column {_col(f.name)} appears twice")
        seen.add(f.name)
        if f.name not in want:
            raise _fail(path, f"column {_col(f.name)} is not a column of the {table} table "
                              "(docs/schema.md)")
        if f.name in keys:
            raise _fail(path, f"column {f.name} is also a folder name ({f.name}=)")
        if _kind(f.type) != _kind(want[f.name].type):
            raise _fail(path, f"column {f.name} is {f.type}; the {table} table's is "
                              f"{_kind(want[f.name].type)}")
    # (aggregate parts an older hooktrace wrote lack the later columns: null; the reader
    # names the run from the part's file name)
    missing = [n for n in want if n not in seen and n not in PARTITION_COLUMNS
               and not (table == AGGREGATES and n in LATER_AGGREGATE_COLUMNS)]
    if missing:
        raise _fail(path, f"column {missing[0]} of the {table} table is missing"
                          + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return list(s.names)


def check_table(table: str, files: Sequence[str], base: str | None = None, *,
                threads: int = 1) -> set[str]:
    """Every file of ``table`` (a hive dataset below ``base``, or plain files when None):
    its folder names and its schema (:func:`check_schema`); returns the partition
    columns (``rank``, ``window``) the files have, as folders or columns."""
    first: tuple[str, tuple[str, ...]] | None = None
    checks = []
    for f in files:
        keys = () if base is None else partition_keys(f, base)
        if first is None:
            first = (f, keys)
        elif set(keys) != set(first[1]):
            raise _fail(f, f"its folders give {'/'.join(keys) or 'no'} partition keys, "
                           f"{_name(first[0])}'s {'/'.join(first[1]) or 'none'}")
        checks.append((f, keys))
    with ThreadPoolExecutor(max(1, min(threads, len(checks)))) as pool:
        names = list(pool.map(lambda a: check_schema(a[0], table, a[1]), checks))
    return ({k for k in PARTITION_COLUMNS if first is not None and k in first[1]}
            | {k for n in names for k in n if k in PARTITION_COLUMNS})


# -- values ------------------------------------------------------------------------

# A rule: the column it names, what a bad row is, and the bad rows of a batch (a
# boolean array; null counts as not bad).
Rule = tuple[str, str, Callable[[Any], Any]]


def _negative(col: str) -> Rule:
    return col, "is negative", lambda b: pc.less(b[col], 0)


def _above(col: str, other: str) -> Rule:
    return col, f"is above {other}", lambda b: pc.greater(b[col], b[other])


def _before(col: str, other: str) -> Rule:
    return col, f"is before {other}", lambda b: pc.less(b[col], b[other])


def _longer_than_span(col: str) -> Rule:
    def bad(b: Any) -> Any:
        try:
            span = pc.subtract_checked(b["end_ns"].cast(pa.int64()), b["start_ns"].cast(pa.int64()))
        except pa.ArrowInvalid:  # (an overflow: no recorder writes such times)
            return pa.array([True] * len(b))
        return pc.greater(b[col], span)

    return col, "is above end_ns - start_ns", bad


def _not_finite(col: str) -> Rule:
    def bad(b: Any) -> Any:
        x = b[col].cast(pa.float64())
        return pc.or_(pc.invert(pc.is_finite(x)), pc.less(x, 0))

    return col, "is NaN, infinite or negative", bad


_DURATION = [_negative("dur_ns"), _before("end_ns", "start_ns"), _longer_than_span("dur_ns"),
             _negative("self_ns"), _above("self_ns", "dur_ns")]


def _rules(table: str) -> list[Rule]:
    """``table``'s rules: its own columns', then its recorded quantities' (their
    providers' declared checks, hooktrace.analysis.column_provider.Column: ``check``,
    ``at_most``), in the table's order."""
    from hooktrace.analysis.columns import declared

    checks = {"nonnegative": _negative, "finite": _not_finite}
    return _RULES.get(table, []) + [rule for c in declared(table) for rule in (
        *([checks[c.check](c.name)] if c.check else []),
        *([_above(c.name, c.at_most)] if c.at_most else []))]


_RULES: dict[str, list[Rule]] = {
    "spans": [*_DURATION, _negative("call"), _negative("depth"),
              ("slot", "is below -1", lambda b: pc.less(b["slot"], -1))],
    "steps": [_negative("dur_ns"), _before("end_ns", "start_ns"), _longer_than_span("dur_ns"),
              _negative("outside_ns"), _above("outside_ns", "dur_ns")],
    "modules": [_negative("slot"), _negative("depth")],
    "memory": [_negative("bytes"), _negative("peak_bytes")],
    "numerics": [_negative("step"), _negative("call"), _negative("nonfinite")],
    "runs": [_negative("events"), _negative("dropped_events"), _negative("overwritten_events"),
             _negative("clock_offset_uncertainty_ns")],
    "gpu": [*_DURATION, _negative("device")],
    AGGREGATES: [_negative("calls"), _negative("steps"), _not_finite("total_ms"),
                 _not_finite("p50_ms"), _not_finite("max_ms"), _negative("total_ns"),
                 _negative("self_ns"), _above("self_ns", "total_ns")],
}

# The words a column may hold (a recorder writes no others: an unknown phase would be
# counted as recompute).
_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "spans": {"phase": PHASES, "mode": MODES, "timing": TIMINGS},
    "numerics": {"phase": ("forward", "backward"), "mode": MODES},
    "gpu": {"phase": PHASES, "mode": MODES, "timing": ("measured", "kernels")},
    AGGREGATES: {"mode": _AGGREGATE_MODES},
}


def _show(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return printable(repr(v))[:80]


def _check_batch(path: str, table: str, b: Any, rules: list[Rule]) -> None:
    for f in schema(table):
        if not f.nullable and f.name in b.schema.names and b.column(f.name).null_count:
            raise _fail(path, f"column {f.name} holds NULL; hooktrace writes none there")
    for col, words in _WORDS.get(table, {}).items():
        found = [w for w in pc.unique(b.column(col)).to_pylist() if w is not None and w not in words]
        if found:
            raise _fail(path, f"column {col} holds {_show(found[0])}; hooktrace writes "
                              f"{', '.join(words)}")
    for col, what, bad in rules:
        try:
            mask = bad(b).fill_null(False)
        except KeyError:  # a column an older hooktrace did not write (read as null)
            continue
        if pc.any(mask).as_py():
            first = b.column(col).filter(mask)[0].as_py()
            raise _fail(path, f"column {col} {what} ({_show(first)} in "
                              f"{pc.sum(mask.cast(pa.int64())).as_py()} rows); hooktrace "
                              "writes no such row")
    if table == "runs":
        for info in b.column("info").to_pylist():
            try:
                ok = isinstance(json.loads(info), dict)
            except ValueError:
                ok = False
            if not ok:
                raise _fail(path, "column info is not a JSON object; hooktrace writes the "
                                  "run's metadata there")


def _check_file_rows(path: str, table: str) -> None:
    f = pq.ParquetFile(path)
    names = set(f.schema_arrow.names)
    from hooktrace.analysis.columns import declared

    rules = _rules(table)
    cols = {c for c, _, _ in rules} | set(_WORDS.get(table, {}))
    cols |= {"end_ns", "start_ns", "dur_ns", "self_ns", "outside_ns"} & names
    cols |= {c.at_most for c in declared(table) if c.at_most}  # (what _above compares with)
    cols |= {x.name for x in schema(table) if not x.nullable}
    if table == "runs":
        cols.add("info")
    try:
        for b in f.iter_batches(batch_size=_BATCH_ROWS, columns=sorted(cols & names)):
            _check_batch(path, table, b, rules)
    except (pa.ArrowException, OSError) as e:  # a data page cut short or corrupt
        raise _unreadable(path, e) from None


def check_rows(table: str, files: Sequence[str], *, threads: int = 1) -> None:
    """The values of every file of ``table`` (see the module docstring), ``threads``
    files at once; the files' schemas were checked (:func:`check_table`)."""
    with ThreadPoolExecutor(max(1, min(threads, len(files)))) as pool:
        list(pool.map(lambda f: _check_file_rows(f, table), files))
