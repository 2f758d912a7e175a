"""The trace writers' columns (csrc/slice_columns.h): given by name, checked once, and a
wrong column is a one-line ValueError naming it (issue #27); the argument columns, which
name no quantity the writers know, are written generically (issue #48)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from hooktrace._native import load_native

_C = load_native()

N = 3


def chrome_columns() -> dict[str, np.ndarray]:
    return {
        "start_ns": np.array([0, 10, 20], np.int64), "end_ns": np.array([30, 15, 25], np.int64),
        "module": np.zeros(N, np.uint32), "tid": np.ones(N, np.uint32),
        "call": np.arange(N, dtype=np.uint32), "flags": np.zeros(N, np.uint8),
        "cat": np.zeros(N, np.uint8),
    }


def write_chrome(columns: dict[str, Any], args: Any = ()) -> bytes:
    out = io.BytesIO()
    _C.write_chrome_events(out.write, columns, names_json=['"Net"'],
                           args_json=['{"module":"","type":"Net"'], cat_names=["fwd"],
                           extra_json=[], base_ns=0, pid=1, chunk_bytes=1 << 16, args=args)
    return out.getvalue()


def perfetto_columns() -> dict[str, np.ndarray]:
    return {
        "start_ns": np.array([0, 10, 20], np.int64), "end_ns": np.array([30, 15, 25], np.int64),
        "track": np.zeros(N, np.uint32), "name": np.zeros(N, np.uint32),
        "cat": np.zeros(N, np.uint8), "flags": np.zeros(N, np.uint8),
        "str_a": np.zeros(N, np.int64), "str_b": np.full(N, -1, np.int64),
        "int_a": np.arange(N, dtype=np.int64), "int_b": np.full(N, -1, np.int64),
    }


def write_perfetto(columns: dict[str, Any], args: Any = (), out: Any = None) -> dict[str, int]:
    out = out or io.BytesIO()
    return _C.write_perfetto_slices(
        out.write, columns, track_uuid=np.array([2], np.uint64), names=["Net"],
        strings=["Net"], cat_names=["fwd"], extra_annotations=[], first_sequence_id=1,
        chunk_bytes=1 << 16, args=args)


def test_the_writers_read_their_columns_by_name() -> None:
    text = write_chrome(chrome_columns()).decode()
    assert text.count('"ph":"X"') == N and '"call":2' in text
    assert write_perfetto(perfetto_columns()) == {"slices": N, "not_nested": 0}
    # an optional column may be left out, None or empty: no node counts then
    for nodes in (None, np.zeros(0, np.int64)):
        assert write_chrome({**chrome_columns(), "nodes": nodes}) == write_chrome(chrome_columns())
    with_nodes = write_chrome({**chrome_columns(), "nodes": np.array([5, -1, 7], np.int64)})
    assert with_nodes.decode().count('"nodes":') == 2


ARGS = [("count", np.array([5, -1, 0], np.int64)), ("rate", np.array([np.nan, 2.5, np.inf])),
        ("marked", np.array([True, False, True]))]


def test_argument_columns_are_written_where_present_in_order() -> None:
    # GIVEN three argument columns (int, float, bool) and a clipped, counted slice
    cols = {**chrome_columns(), "nodes": np.array([1, -1, -1], np.int64),
            "flags": np.array([4, 0, 0], np.uint8)}
    # WHEN written to Chrome JSON
    events = write_chrome(cols, ARGS).decode().split(",\n")[1:]
    # THEN each is written after the span's own args, before "clipped", where present
    # (absent: int < 0, float not finite, bool false)
    assert events[0].endswith('"call":0,"nodes":1,"count":5,"marked":true,"clipped":true}}')
    assert events[1].endswith('"call":1,"rate":2.5}}')
    assert events[2].endswith('"call":2,"count":0,"marked":true}}')
    # AND a column given as None or empty is absent everywhere
    assert write_chrome(cols, [(n, None) for n, _ in ARGS]) == write_chrome(cols)
    assert write_chrome(cols, [("count", np.zeros(0, np.int64))]) == write_chrome(cols)


def test_perfetto_interns_argument_names_only_where_they_are_used() -> None:
    def pftrace(args: Any, kernel: bool = False) -> bytes:
        out = io.BytesIO()
        cols = perfetto_columns()
        if kernel:  # (a kernel slice: module, type, kernel = strings[int_a])
            cols.update(flags=np.array([0, 0x40, 0], np.uint8), str_b=np.zeros(N, np.int64),
                        int_a=np.zeros(N, np.int64))
        write_perfetto(cols, args, out)
        return out.getvalue()

    assert b"count" in pftrace(ARGS) and b"marked" in pftrace(ARGS)
    # without values, the names are not interned: the file is the one without columns
    assert pftrace([(n, None) for n, _ in ARGS]) == pftrace([])
    # with kernel slices they are (before "kernel", "derived"), values or not
    assert b"count" in pftrace([(n, None) for n, _ in ARGS], kernel=True)
    assert b"count" not in pftrace([], kernel=True)


@pytest.mark.parametrize("args, message", [
    ([("count", np.zeros(N, np.int32))], r"^write_\w+: argument column 'count' must be a "
     r"C-contiguous 1-D int64, float64 or bool array, got int32 array of shape \(3,\)$"),
    ([("count", np.zeros(N + 1, np.int64))],
     r"^write_\w+: argument column 'count' has 4 rows but start_ns has 3$"),
    ([("a b", None)], r"^write_\w+: argument column name 'a b' is not letters, digits and '_'$"),
    ([("count", None), ("count", None)], r"^write_\w+: argument column 'count' is given twice$"),
    (["count"], r"^write_\w+: an argument column must be a \(name, array\) pair, got str$"),
])
@pytest.mark.parametrize("write, columns", [(write_chrome, chrome_columns),
                                            (write_perfetto, perfetto_columns)])
def test_a_wrong_argument_column_is_named_in_one_line(write: Any, columns: Any, args: Any,
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write(columns(), args)


@pytest.mark.parametrize("write, columns", [(write_chrome, chrome_columns),
                                            (write_perfetto, perfetto_columns)])
@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(cat=c["cat"].astype(np.int32)),
     r"^write_\w+: column 'cat' must be a C-contiguous 1-D uint8 array, got int32 array of "
     r"shape \(3,\)$"),
    (lambda c: c.update(end_ns=np.zeros(2 * N, np.int64)[::2]),
     r"^write_\w+: column 'end_ns' must be a C-contiguous 1-D int64 array, got int64 array "
     r"of shape \(3,\), not contiguous$"),
    (lambda c: c.update(end_ns=[1, 2, 3]),
     r"^write_\w+: column 'end_ns' must be a C-contiguous 1-D int64 array, got list$"),
    (lambda c: c.update(flags=np.zeros(N + 1, np.uint8)),
     r"^write_\w+: column 'flags' has 4 rows but start_ns has 3$"),
    (lambda c: c.update(extra=np.zeros(N - 1, np.int64)),
     r"^write_\w+: column 'extra' has 2 rows but start_ns has 3$"),
    (lambda c: c.pop("flags"), r"^write_\w+: column 'flags' is missing$"),
    (lambda c: c.update(lanes=np.zeros(N, np.uint32)), r"^write_\w+: unknown column 'lanes'$"),
])
def test_a_wrong_column_is_named_in_one_line(write: Any, columns: Any, change: Any,
                                             message: str) -> None:
    cols = columns()
    change(cols)
    with pytest.raises(ValueError, match=message):
        write(cols)


def test_one_writers_column_is_not_the_others() -> None:
    with pytest.raises(ValueError, match=r"^write_perfetto_slices: unknown column 'tid'$"):
        write_perfetto({**perfetto_columns(), "tid": np.ones(N, np.uint32)})
    with pytest.raises(TypeError, match=r"columns must be a dict of numpy arrays, got list"):
        write_chrome([])  # type: ignore[arg-type]


def test_the_node_writer_reads_its_columns_by_name() -> None:
    columns = {"start_ns": np.array([0, 5], np.int64), "end_ns": np.array([4, 9], np.int64),
               "name": np.zeros(2, np.uint32), "tid": np.ones(2, np.uint32),
               "seq": np.array([3, 2], np.uint64), "pass_id": np.array([0, 2**32 - 1], np.uint32),
               "span_module": np.array([0, -1], np.int64)}

    def write(cols: dict[str, Any]) -> str:
        out = io.BytesIO()
        _C.write_chrome_nodes(out.write, cols, node_names_json=['"MmBackward0"'],
                              module_names_json=['"fc"'], cat="node", base_ns=0, pid=1,
                              chunk_bytes=1 << 16)
        return out.getvalue().decode()

    text = write(columns)
    assert '"args":{"seq":3,"module":"fc","pass":0}' in text
    assert '"args":{"seq":2,"module":"","pass":null}' in text
    assert '"clipped":true' in write({**columns, "flags": np.array([0, 4], np.uint8)})
    with pytest.raises(ValueError, match=r"^write_chrome_nodes: column 'seq' must be a "
                                         r"C-contiguous 1-D uint64 array, got int64 array"):
        write({**columns, "seq": columns["seq"].astype(np.int64)})
    with pytest.raises(ValueError, match=r"^write_chrome_nodes: unknown column 'module'$"):
        write({**columns, "module": columns["span_module"]})
