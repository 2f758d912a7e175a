"""The schema's quantity columns come from the column providers (issue #48): each
provider declares its columns (hooktrace.analysis.column_provider.Column) and
hooktrace/data/schema.py generates the spans table's and the aggregates' quantity
columns from them. The generated schema is the one hooktrace wrote before (pinned here
as it was, column by column, its docs and its metadata): same version, order, types."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("pyarrow")

from hooktrace.analysis.columns import PROVIDERS, declared  # noqa: E402
from hooktrace.data.schema import ALL_TABLES, AGGREGATES, SCHEMA_VERSION, schema  # noqa: E402

# the schema as hooktrace 45acc5c wrote it (before the providers declared their columns):
# sha256 of every table's (name, type, nullable, doc) and metadata
PINNED = "a51520cedb2f819473413fa156a86313921354b9d9460bc2c825f3b163012c16"

SPANS = [("rank", "int64"), ("window", "int64"), ("module", "str"), ("slot", "int64"),
         ("type", "str"), ("phase", "str"), ("mode", "str"), ("timing", "str"),
         ("call", "int64"), ("step", "int64"), ("thread", "int64"), ("start_ns", "int64"),
         ("end_ns", "int64"), ("dur_ns", "int64"), ("self_ns", "int64"), ("depth", "int64"),
         ("span", "int64"), ("parent", "int64"), ("error", "bool"), ("unfinished", "bool"),
         ("gpu_dur_ns", "int64"), ("gpu_self_ns", "int64"), ("kernel_ns", "int64"),
         ("kernel_self_ns", "int64"), ("kernels", "int64"), ("kernel_idle_ns", "int64"),
         ("flops", "int64"), ("in_shapes", "str"), ("out_shapes", "str"),
         ("absmax", "double"), ("rms", "double"), ("nonfinite", "int64"),
         ("mem_device", "str"), ("mem_enter_bytes", "int64"), ("mem_exit_bytes", "int64"),
         ("mem_peak_bytes", "int64")]
AGGREGATE_COLUMNS = [
    ("rank", "int64"), ("window", "int64"), ("step", "int64"), ("steps", "int32"),
    ("module", "str"), ("mode", "str"), ("calls", "int64"), ("total_ms", "float"),
    ("p50_ms", "float"), ("max_ms", "float"), ("gpu_ms", "float"), ("kernel_ms", "float"),
    ("mem_peak_bytes", "int64"), ("tflops", "float"), ("nonfinite", "int64"),
    ("absmax", "float"), ("total_ns", "int64"), ("self_ns", "int64"), ("run", "str")]


def _fields(table: str) -> list[tuple[str, str]]:
    return [(f.name, "str" if str(f.type).startswith("dictionary<values=string")
             else str(f.type)) for f in schema(table)]


def fingerprint() -> str:
    doc = {t: [(f.name, str(f.type), f.nullable, (f.metadata or {}).get(b"doc", b"").decode())
               for f in schema(t)]
           + [sorted((k.decode(), v.decode()) for k, v in schema(t).metadata.items())]
           for t in ALL_TABLES}
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def test_the_generated_schema_is_the_one_written_before():
    assert SCHEMA_VERSION == 1
    assert _fields("spans") == SPANS
    assert _fields(AGGREGATES) == AGGREGATE_COLUMNS
    assert fingerprint() == PINNED


def test_the_quantity_columns_are_the_providers_declarations():
    for table, first in (("spans", "gpu_dur_ns"), (AGGREGATES, "gpu_ms")):
        names = schema(table).names
        at = names.index(first)
        mine = declared(table)
        assert names[at:at + len(mine)] == [c.name for c in mine]
        assert all(schema(table).field(c.name).nullable for c in mine)
        # each column is one provider's
        owners = [p.name for p in PROVIDERS for c in p.columns if c.table == table]
        assert len(owners) == len(mine) == len({c.name for c in mine})


def test_docs_schema_md_tables_are_generated_from_the_schema():
    """docs/schema.md's tables are describe() (the providers' declarations among them):
    regenerate them with the command in the comment above them."""
    from pathlib import Path

    from hooktrace.data.schema import describe

    doc = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
    assert doc[doc.index("### spans"):].rstrip("\n") == describe().rstrip("\n")
