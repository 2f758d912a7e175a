"""What a column provider answers (issue #37): the reading side of one recorded
quantity (device time, FLOPs, memory, numerics, shapes), asked by every view that shows
it. The registry, in the order the views show the columns, is
:data:`hooktrace.analysis.columns.PROVIDERS`.

A provider lives in its feature's analysis module (``analysis/<feature>.py``) and
subclasses :class:`ColumnProvider`; each view loops over the registry:

* the schema (:mod:`hooktrace.data.schema`): :attr:`ColumnProvider.columns`, its
  :class:`Column` declarations (name, Arrow type, table, help, checks, how the
  aggregates reduce it over a run); the spans table's and the aggregates' quantity
  columns, their validation (:mod:`hooktrace.data.validate`), the aggregates read back
  (:func:`hooktrace.data.aggregates.aggregate_rows`, the aggregate report) and
  docs/schema.md are these;
* the summary (:meth:`hooktrace.analysis.summary.Summary.from_trace`, and the report,
  which shows the summary's rows): :meth:`ColumnProvider.summary` fills the provider's
  keys into the rows and returns a :class:`SummaryPart` (its columns, notes, whether
  they lead the table, the Summary attributes it sets); :meth:`ColumnProvider.unrecorded`
  is what it says when the run did not record it (device time: host times are launch
  times on CUDA);
* the Parquet ``spans`` table (:mod:`hooktrace.data.tables`): :meth:`ColumnProvider.spans`,
  per row of the table, ``{column: (values, valid[, dictionary])}``, of its declared
  ``spans`` columns;
* the summary's terminal table (:meth:`hooktrace.analysis.summary.Summary.to_text`):
  :meth:`ColumnProvider.text_columns` (its (title, key) columns, in the wide table or
  when asked for by :attr:`text_flag`: ``hooktrace summary``'s flag too, its help
  :attr:`flag_help`), :meth:`ColumnProvider.format_cell` (how a cell of its keys reads),
  :meth:`ColumnProvider.text_layout` (device time's go first), which notes explain its
  columns (:meth:`ColumnProvider.note_shown`) and its footer lines; the JSON's extras
  (:meth:`ColumnProvider.summary_json`, :meth:`ColumnProvider.json_extra`); the
  report's table uses the same cells and :attr:`headers` (title, tooltip), its icicle
  :meth:`ColumnProvider.hover`, its facts line :meth:`ColumnProvider.facts`;
* the aggregates (:func:`hooktrace.analysis.aggregates.reduce_window`):
  :meth:`ColumnProvider.aggregate` gives, for one window, a function from a
  :class:`WindowGroup` (one mode's calls, grouped by module) to its declared
  ``aggregates`` columns' values.
* the Chrome and Perfetto exports: :meth:`ColumnProvider.export_args`, its arguments on
  the written spans (:class:`ArgColumn`).

A view asks a part only of the providers whose :meth:`ColumnProvider.recorded` is true
(the summary asks the others :meth:`ColumnProvider.unrecorded`); a declared column a
provider leaves out is null.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls
    from hooktrace.analysis.groups import Groups
    from hooktrace.reading import TraceData

__all__ = ["ArgColumn", "Column", "ColumnProvider", "SpanColumn", "SummaryPart", "TextColumn",
           "WindowGroup", "measured_only"]

# one column of the spans table: (values over the rows, valid mask) or, for a string
# column, (indices, valid mask, dictionary)
SpanColumn = tuple[Any, ...]
# one column of the summary's terminal table: (header, row key)
TextColumn = tuple[str, str]


@dataclass(frozen=True)
class Column:
    """One column of a recorded quantity in a table of :mod:`hooktrace.data.schema`:
    ``name``, ``type`` (an Arrow type by name: int64, int32, float64, float32, bool, or
    string, dictionary-encoded), ``table`` (``spans`` or ``aggregates``; nullable: null
    where not recorded) and ``help`` (the schema's doc, docs/schema.md's meaning);
    ``order``: its place among its table's quantity columns (sorted, then in the
    registry's order: a new quantity's go last, the default).

    What :mod:`hooktrace.data.validate` refuses in a file: ``check`` "nonnegative" (a
    value below 0) or "finite" (NaN, infinite or negative), ``at_most`` (a value above
    that column's).

    An aggregates column, read back over a run (:func:`hooktrace.data.aggregates.aggregate_rows`,
    the aggregate report): ``reduce`` "sum", "max", "per_step" (the sum over the steps
    aggregated, row key ``<name>_per_step``) or "weighted" (each window's weighted by its
    ``weight`` column's time, ``total_ms`` where null); the report's column ``title`` and
    ``tip``, and its ``fact`` (the facts line's, when a row has a value)."""

    name: str
    type: str
    help: str
    table: str = "spans"
    order: int = 100
    check: str = ""
    at_most: str = ""
    reduce: str = ""
    weight: str = ""
    title: str = ""
    tip: str = ""
    fact: str = ""

    @property
    def key(self) -> str:
        """Its key in the aggregates read back (:attr:`reduce` "per_step": per step)."""
        return self.name + "_per_step" if self.reduce == "per_step" else self.name


class ArgColumn(NamedTuple):
    """One argument of the exported spans (:meth:`ColumnProvider.export_args`): its
    ``name`` (letters, digits, ``_``) and per written span its ``values``, an int64
    (absent where < 0), float64 (absent where not finite) or bool (absent where False)
    array; None: the run did not record it (absent on every span)."""

    name: str
    values: np.ndarray | None


@dataclass
class SummaryPart:
    """What a provider adds to the summary: its ``columns`` (row keys, in order), the
    ``notes`` under the table, whether its columns ``lead`` (after module, type, mode,
    timing: device time's, which also sort the rows), and the Summary ``attributes`` it
    sets (``time_kind``, ``first_nonfinite``)."""

    columns: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    lead: bool = False
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowGroup:
    """One mode's calls of an aggregate window, grouped by module: ``mode`` (the row's:
    ``phase_label(cat, is_eval)``), the span category ``cat`` and ``is_eval``, ``sel``
    (their rows in the window's :class:`~hooktrace.analysis.calls.Calls`), ``groups``
    (``Groups`` of them by module: ``starts`` of each module's calls, sorted by module)
    and ``modules`` (the module slot of each output row, in row order)."""

    mode: str
    cat: int
    is_eval: bool
    sel: np.ndarray
    groups: Groups
    modules: list[int]


class ColumnProvider:
    """The reading side of one recorded quantity (see the module docstring). The
    defaults add nothing: a provider overrides the views it has columns in."""

    name = ""
    # its columns of the spans table and the aggregates (hooktrace.data.schema's)
    columns: tuple[Column, ...] = ()
    # to_text's keyword (and hooktrace summary's flag) that shows its text columns in
    # the narrow table ("flops": to_text(flops=True), --flops); the wide one has them
    text_flag = ""
    # the flag's help (hooktrace summary --FLAG): what it adds
    flag_help = ""
    # per summary row key it fills: (title, what it is), the terminal table's and the
    # report's headers (the report's tooltip)
    headers: Mapping[str, tuple[str, str]] = {}

    @property
    def span_columns(self) -> tuple[str, ...]:
        """The spans table's columns it fills."""
        return tuple(c.name for c in self.columns if c.table == "spans")

    @property
    def aggregate_columns(self) -> tuple[str, ...]:
        """The aggregates' columns it fills."""
        return tuple(c.name for c in self.columns if c.table == "aggregates")

    def recorded(self, trace: TraceData) -> bool:
        """Whether ``trace`` recorded the quantity (then the views ask its parts)."""
        return False

    def summary(self, rows: list[dict[str, Any]], trace: TraceData,
                options: Mapping[str, Any]) -> SummaryPart:
        """Fill its keys into the summary's ``rows`` (it may add rows and sort them);
        ``options``: the summary's (``peak_tflops``)."""
        return SummaryPart()

    def note_shown(self, note: str, shown: Collection[str]) -> bool | None:
        """Whether the terminal table says its summary ``note`` when the columns
        ``shown`` are (a note explaining its columns: only with them); None for a note
        not its own, or one always said."""
        return None

    def unrecorded(self, trace: TraceData) -> SummaryPart:
        """What the summary says of a run that did not record it."""
        return SummaryPart()

    def text_columns(self, keys: Collection[str], rows: Sequence[dict[str, Any]], *,
                     wide: bool, backward: bool) -> list[TextColumn]:
        """Its columns in the summary's terminal table, asked in the wide table or when
        :attr:`text_flag` is; ``keys``: the summary's row keys, ``backward``: whether
        any row has backward calls."""
        return []

    def format_cell(self, key: str, value: Any) -> str | None:
        """How a cell of one of its keys reads in the terminal table (a value, not
        None); None for a key not its own (then the table's default: ``format_ns`` for
        a key ending in ``_ns``, else ``str``)."""
        return None

    def text_layout(self, columns: list[TextColumn], keys: Collection[str], *,
                    wide: bool, backward: bool) -> list[TextColumn]:
        """The terminal table's columns once every provider's are in (device time puts
        its own first); by default as they are."""
        return columns

    def hover(self, row: Mapping[str, Any], prefix: str) -> str:
        """What the report's icicle says of a module's box (HTML, each part after a
        ``<br>``), from its summary ``row``: the forward's (``prefix`` "") or the
        backward's (``prefix`` "bwd_")."""
        return ""

    def facts(self, root: Mapping[str, Any] | None, columns: Collection[str]) -> list[str]:
        """What the report's facts line says of it (short phrases), from the summary's
        ``columns`` and the model's training row ``root`` (None when the run has none)."""
        return []

    def footer(self, summary: Any) -> list[str]:
        """The lines it ends the summary's terminal table with, from the
        :class:`~hooktrace.analysis.summary.Summary` (its columns, the attributes its
        part set)."""
        return []

    def summary_json(self, summary: Any) -> dict[str, Any]:
        """What it adds to the summary's JSON document (``Summary.to_json``)."""
        return {}

    def json_extra(self, trace: TraceData) -> dict[str, Any]:
        """What ``hooktrace summary --FLAG --json`` (its :attr:`text_flag`) adds to the
        JSON document, beside the rows."""
        return {}

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        """Its columns of the spans table, over its ``n`` measured spans then ``m``
        kernel-derived and compile rows (:func:`measured_only` pads the latter)."""
        return {}

    def aggregate(self, trace: TraceData, calls: Calls
                  ) -> Callable[[WindowGroup], dict[str, list[Any]]] | None:
        """For the window ``trace`` (its per-call table ``calls``): per group, its
        columns' values (one per module row); None: all null in this window."""
        return None

    def export_args(self, trace: TraceData, spans: np.ndarray) -> list[ArgColumn]:
        """Its arguments on the exported spans ``spans`` (indices into ``trace.spans()``),
        which the Chrome and Perfetto exports write after each span's own, in order
        (the native writers' argument columns, csrc/slice_columns.h). Asked of every
        provider, recorded or not: one that did not record gives its columns with values
        None, so that a Perfetto file interns the same argument names either way."""
        return []


def measured_only(values: np.ndarray, valid: np.ndarray, m: int) -> SpanColumn:
    """A spans-table column of the measured spans only: ``values``/``valid`` padded
    with ``m`` null rows (the kernel-derived and compile rows)."""
    return (np.r_[values, np.zeros(m, values.dtype)], np.r_[valid, np.zeros(m, bool)])
