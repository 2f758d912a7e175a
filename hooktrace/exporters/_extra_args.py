"""Per-call span args beyond the fixed ones (issue #19): what the exporters append to
forward spans recorded with ``shapes=True`` (``in_shapes``, ``in_dtypes``,
``out_shapes``, ``out_dtypes``: :mod:`hooktrace.analysis.shapes`) or ``numerics=True``
(``absmax``, ``rms``, ``nonfinite`` of the call's output: :mod:`hooktrace.analysis.numerics`).

:func:`extra_args` gives, per written span, an index into a list of arg dicts (-1:
none); spans with equal args share one entry, so a shapes-only export holds one dict
per distinct pair of signatures. The Chrome writer appends each as a JSON fragment,
the Perfetto writer as encoded debug annotations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hooktrace.analysis.numerics import Numerics, numerics_info, number_for_json
from hooktrace.reading import TraceData
from hooktrace.analysis.shapes import shape_args, shapes_recorded, signatures, span_shapes

__all__ = ["extra_args"]


def extra_args(trace: TraceData, index: np.ndarray) -> tuple[np.ndarray, list[dict[str, Any]]] | None:
    """``(per written span: an index into the dicts or -1, the dicts)`` for the spans
    ``index`` of ``trace.spans()``; None when the run recorded neither."""
    has_shapes = shapes_recorded(trace)
    has_numerics = numerics_info(trace.info) is not None
    if not (has_shapes or has_numerics) or not len(index):
        return None
    n = len(trace.spans())
    in_sig = out_sig = np.full(n, -1, np.int64)
    if has_shapes:
        in_sig, out_sig = span_shapes(trace)
    num = np.full(n, -1, np.int64)  # per span: its forward numerics event
    if has_numerics:
        nm = Numerics.from_trace(trace)
        fwd = np.flatnonzero((nm.span >= 0) & ~nm.backward)
        num[nm.span[fwd]] = fwd
    table = signatures(trace)
    keys = np.stack([in_sig[index], out_sig[index], num[index]], axis=1)
    has = (keys >= 0).any(axis=1)
    out = np.full(len(index), -1, np.int64)
    if not has.any():
        return out, []
    uniq, inverse = np.unique(keys[has], axis=0, return_inverse=True)
    out[has] = inverse.reshape(-1)
    dicts: list[dict[str, Any]] = []
    for i_sig, o_sig, k in uniq.tolist():
        d: dict[str, Any] = {}
        if i_sig >= 0:
            d.update(shape_args(table[i_sig], "in"))
        if o_sig >= 0:
            d.update(shape_args(table[o_sig], "out"))
        if k >= 0 and not (nm.skipped[k] or nm.failed[k]):
            d["absmax"] = number_for_json(float(nm.absmax[k]))
            d["rms"] = number_for_json(float(nm.rms[k]))
            d["nonfinite"] = int(nm.nonfinite[k])
        dicts.append(d)
    return out, dicts
