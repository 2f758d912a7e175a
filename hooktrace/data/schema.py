"""The versioned Arrow schema of a run's tables (issue #29); docs/schema.md explains it.

Seven tables: ``spans`` (one row per forward, backward, recompute and kernel-derived
span; its last columns are the recorded quantities', declared by their column providers:
:mod:`hooktrace.analysis.columns`), ``steps``, ``modules``, ``memory`` (samples), ``numerics``, ``runs`` (one row
per file, with its metadata) and ``gpu`` (one row per device interval,
``trace(gpu=True)``: what ``spans.gpu_dur_ns`` sums per host span, plus the kernel
sites of compiled regions, which have no host span). Types every engine reads: int64 for every count and
time (Spark has no unsigned integers), times in Unix ns on rank 0's clock (the file's
``clock_offset_ns`` subtracted) so ranks line up, strings dictionary-encoded, and
nullable columns where a run did not record the value.

``rank`` and ``window`` are columns of every table; in a partitioned dataset
(``rank=N/window=K/`` directories) they come from the directory names instead and
are left out of the files (:func:`file_schema`), as Hive, DuckDB, Spark and
pyarrow.dataset expect.

Every Parquet file carries ``SCHEMA_VERSION`` (and the table's name) in its key-value
metadata under ``hooktrace.schema_version`` / ``hooktrace.table``.

Example:
    >>> s = schema("spans")
    >>> s.field("dur_ns").type, s.field("gpu_dur_ns").nullable
    (DataType(int64), True)
    >>> "rank" in file_schema("steps", partitioned=True).names
    False
"""

from __future__ import annotations

from typing import Any

from hooktrace._input import AGGREGATES, ALL_TABLES, TABLES, require

pa: Any = require("pyarrow")

__all__ = ["AGGREGATES", "ALL_TABLES", "LATER_AGGREGATE_COLUMNS", "PARTITION_COLUMNS", "SCHEMA_VERSION", "TABLES",
           "file_schema", "metadata",
           "schema"]

SCHEMA_VERSION = 1
PARTITION_COLUMNS = ("rank", "window")

_STR = pa.dictionary(pa.int32(), pa.string())
_I64 = pa.int64()
_F64 = pa.float64()
_BOOL = pa.bool_()


def _f(name: str, type_: Any, nullable: bool, doc: str) -> Any:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


_PART = [
    _f("rank", _I64, True, "the process's rank (torchrun RANK; its file's order among "
                           "files without one); null for a single run"),
    _f("window", _I64, True, "schedule window index in step order; null when the file is "
                             "not a window"),
]

_TABLES: dict[str, list[Any]] = {
    "spans": [
        _f("module", _STR, False, "qualified module name ('' for the root)"),
        _f("slot", _I64, False, "module slot: the module's row in the modules table (an "
                                "integer key, cheaper to group by than the name); -1 for a "
                                "compile row"),
        _f("type", _STR, False, "module class name"),
        _f("phase", _STR, False, "forward, backward or recompute"),
        _f("mode", _STR, False, "train, or eval (grad off or the module in eval mode)"),
        _f("timing", _STR, False, "measured (a module call), kernels (derived from the "
                                  "kernels of a compiled region), or compile (a torch.compile "
                                  "compile: module '<torch.compile>')"),
        _f("call", _I64, False, "ordinal of the forward call among the module's calls"),
        _f("step", _I64, True, "step number the span starts in; null outside every step"),
        _f("thread", _I64, False, "OS thread id"),
        _f("start_ns", _I64, False, "Unix ns, on rank 0's clock"),
        _f("end_ns", _I64, False, "Unix ns, on rank 0's clock"),
        _f("dur_ns", _I64, False, "end_ns - start_ns; a kernel-derived row: the summed "
                                  "time of its kernels (at most end_ns - start_ns)"),
        _f("self_ns", _I64, False, "dur_ns minus the direct children's (backward: the time "
                                   "of the autograd nodes attributed to it)"),
        _f("depth", _I64, False, "nesting depth (the root module is 0)"),
        _f("span", _I64, True, "index of the span in the run (hooktrace.load(f).spans()); "
                               "a kernel-derived row: its compiled region's span; null for "
                               "a compile row"),
        _f("parent", _I64, True, "span index of the parent call in the same phase; a "
                                 "compile row: the span it ran in; null for none"),
        _f("error", _BOOL, False, "the forward call raised"),
        _f("unfinished", _BOOL, False, "no exit was recorded: end_ns is a lower bound"),
    ],
    "steps": [
        _f("step", _I64, False, "step number (the recorder's: lost steps show as gaps)"),
        _f("start_ns", _I64, False, "Unix ns, on rank 0's clock"),
        _f("end_ns", _I64, False, "Unix ns, on rank 0's clock"),
        _f("dur_ns", _I64, False, "end_ns - start_ns; a kernel-derived row: the summed "
                                  "time of its kernels (at most end_ns - start_ns)"),
        _f("complete", _BOOL, False, "ended by a step mark (false: the last, cut step)"),
        _f("outside_ns", _I64, False, "time of the step outside every top-level forward or "
                                      "backward span (waiting, data loading, optimizer)"),
    ],
    "modules": [
        _f("slot", _I64, False, "module slot (index in the run's module table)"),
        _f("module", _STR, False, "qualified name ('' for the root)"),
        _f("type", _STR, False, "class name"),
        _f("depth", _I64, False, "dots in the name, +1 (the root is 0)"),
    ],
    "memory": [
        _f("device", _STR, False, "cpu or cuda:N"),
        _f("t_ns", _I64, False, "Unix ns, on rank 0's clock"),
        _f("bytes", _I64, False, "bytes allocated at the sample"),
        _f("peak_bytes", _I64, False, "cpu: highest since the previous sample; cuda: the "
                                      "device's high-water mark"),
        _f("thread", _I64, False, "OS thread id"),
        _f("owner", _STR, False, "the event the sample follows: enter, exit, node_begin, "
                                 "node_end"),
    ],
    "numerics": [
        _f("module", _STR, False, "qualified module name"),
        _f("type", _STR, False, "module class name"),
        _f("phase", _STR, False, "forward (outputs) or backward (gradients)"),
        _f("mode", _STR, False, "train or eval"),
        _f("step", _I64, False, "step number (0 without step marks)"),
        _f("call", _I64, False, "among the module's calls of that phase in that step"),
        _f("t_ns", _I64, False, "Unix ns, on rank 0's clock"),
        _f("thread", _I64, False, "OS thread id"),
        _f("absmax", _F64, False, "max |x|"),
        _f("rms", _F64, False, "root mean square"),
        _f("nonfinite", _I64, False, "NaN/Inf count"),
        _f("skipped", _BOOL, False, "no floating-point tensor"),
        _f("failed", _BOOL, False, "a reduction raised"),
        _f("recompute", _BOOL, False, "a forward call recomputed in backward"),
        _f("span", _I64, True, "forward: the call's span index; null when not found"),
    ],
    "runs": [
        _f("path", pa.string(), False, "the .htrace file"),
        _f("hostname", pa.string(), False, "host that recorded it"),
        _f("pid", _I64, False, "process id"),
        _f("world_size", _I64, True, "torchrun WORLD_SIZE"),
        _f("backend", pa.string(), True, "torch.distributed backend"),
        _f("clock_offset_ns", _I64, False, "the rank's clock minus rank 0's (subtracted from "
                                           "every time in the tables)"),
        _f("clock_offset_uncertainty_ns", _I64, False, "bound on the offset's error"),
        _f("clock_aligned", _BOOL, False, "whether an offset was measured"),
        _f("start_ns", _I64, False, "recording start, Unix ns on rank 0's clock"),
        _f("stop_ns", _I64, False, "recording stop"),
        _f("events", _I64, False, "events in the file"),
        _f("dropped_events", _I64, False, "events the recorder could not store"),
        _f("overwritten_events", _I64, False, "events a ring buffer overwrote"),
        _f("cut", pa.string(), True, "why a stream was cut before its footer; null when "
                                     "whole"),
        _f("first_step", _I64, True, "a schedule window's first step"),
        _f("last_step", _I64, True, "a schedule window's last step"),
        _f("hooktrace_version", pa.string(), True, "version that recorded it"),
        _f("info", pa.string(), False, "the file's whole metadata, JSON"),
    ],
    "gpu": [
        _f("slot", _I64, False, "module slot (the modules table's row)"),
        _f("module", _STR, False, "qualified module name"),
        _f("type", _STR, False, "module class name"),
        _f("phase", _STR, False, "forward, backward or recompute: the phase it ran in"),
        _f("mode", _STR, False, "train, or eval (its host span's: grad off or the module in "
                                "eval mode)"),
        _f("timing", _STR, False, "measured (a module call's interval), or kernels (a "
                                  "kernel site of a compiled region: no host span)"),
        _f("step", _I64, True, "step number of its host span (a kernel site: the step its "
                               "device start falls in); null outside every step"),
        _f("span", _I64, True, "index of the host span it times (spans.span); null for a "
                               "kernel site"),
        _f("device", _I64, False, "accelerator index"),
        _f("stream", _I64, False, "stream id on the device"),
        _f("start_ns", _I64, False, "device start, aligned to the host clock: Unix ns on "
                                    "rank 0's clock"),
        _f("end_ns", _I64, False, "device end, Unix ns on rank 0's clock"),
        _f("dur_ns", _I64, False, "end_ns - start_ns"),
        _f("self_ns", _I64, False, "dur_ns minus the intervals nested in it on its stream"),
    ],
}

# Not a table of a trace: what ``trace(aggregate=DIR)`` writes (hooktrace.record.aggregate,
# DIR/aggregates/part-*.parquet), per window of steps, module and mode; ``hooktrace query
# DIR`` reads it as the view ``aggregates``. Its files have ``rank`` (null without one) and
# ``run`` (the runs and ranks that share a folder, issue #35); ``window`` is null.
_F32 = pa.float32()
_AGGREGATE_HEAD = [
    _f("step", _I64, True, "the window's first step"),
    _f("steps", pa.int32(), True, "steps in the window"),
    _f("module", _STR, True, "qualified module name ('<root>' for the root; '<step>' "
                             "in a mode 'step' row)"),
    _f("mode", _STR, True, "forward, backward, recompute, eval (forward calls under "
                           "no_grad or in eval mode; eval backward, eval recompute), or "
                           "step (the steps' wall times)"),
    _f("calls", _I64, True, "calls in the window"),
    _f("total_ms", _F32, True, "time of the calls (a step row: of the steps), ms"),
    _f("p50_ms", _F32, True, "median call (a step row: median step), ms"),
    _f("max_ms", _F32, True, "longest call (a step row: longest step), ms"),
]
_AGGREGATE_TAIL = [
    _f("total_ns", _I64, True, "time of the calls, ns: the summary's total (a step row: "
                               "of the steps); null in a folder an older hooktrace wrote"),
    _f("self_ns", _I64, True, "self time of the calls, ns: the summary's self; null in a "
                              "step row and in a folder an older hooktrace wrote"),
    _f("run", _STR, True, "the run that wrote the row, <host>_<pid>[_rank<R>]_<random> (a "
                          "folder may hold several runs and ranks)"),
]
# the aggregates' columns a part written by an older hooktrace may lack (read as null):
# run (before runs sharing a folder were told apart), total_ns and self_ns (before the
# one per-call table, issue #37)
LATER_AGGREGATE_COLUMNS = ("run", "total_ns", "self_ns")
_TYPES = {"int64": _I64, "int32": pa.int32(), "float64": _F64, "float32": _F32, "bool": _BOOL,
          "string": _STR}


def _columns(table: str) -> list[Any]:
    """``table``'s columns after rank and window: its own, and in spans and the aggregates
    the recorded quantities' (their providers', hooktrace.analysis.columns: nullable)."""
    from hooktrace.analysis.columns import declared

    quantities = [_f(c.name, _TYPES[c.type], True, c.help) for c in declared(table)]
    if table == AGGREGATES:
        return _AGGREGATE_HEAD + quantities + _AGGREGATE_TAIL
    return _TABLES[table] + quantities


def _check(table: str) -> None:
    if table not in ALL_TABLES:
        from hooktrace.errors import HooktraceError

        raise HooktraceError(f"no table {table!r}; the tables are {', '.join(ALL_TABLES)}")


def schema(table: str) -> Any:
    """The Arrow schema of ``table`` with ``rank`` and ``window`` first (a single file, or
    a table in memory), carrying :func:`metadata`."""
    _check(table)
    return pa.schema(_PART + _columns(table), metadata=metadata(table))


def file_schema(table: str, *, partitioned: bool) -> Any:
    """The schema of ``table``'s files: without ``rank``/``window`` in a partitioned
    dataset (the directory names hold them)."""
    s = schema(table)
    if partitioned:
        for name in PARTITION_COLUMNS:
            s = s.remove(s.get_field_index(name))
    return s


def metadata(table: str) -> dict[bytes, bytes]:
    """The Parquet key-value metadata of ``table``'s files."""
    return {b"hooktrace.schema_version": str(SCHEMA_VERSION).encode(),
            b"hooktrace.table": table.encode()}


def describe() -> str:
    """The schema as Markdown tables (docs/schema.md's column lists are this)."""
    lines = []
    for table in ALL_TABLES:
        lines += [f"### {table}", "", "| column | type | nullable | meaning |",
                  "|---|---|---|---|"]
        for fld in schema(table):
            t = "string" if pa.types.is_dictionary(fld.type) else str(fld.type)
            doc = (fld.metadata or {}).get(b"doc", b"").decode()
            lines.append(f"| `{fld.name}` | {t} | {'yes' if fld.nullable else 'no'} | {doc} |")
        lines.append("")
    return "\n".join(lines)
