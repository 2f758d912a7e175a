"""Shapes per module call (issue #19): ``trace(model, shapes=True)``,
``hooktrace run --shapes``.

The recorder (csrc/shapes.h) writes one SHAPES event after each forward call's EXIT:
the *signatures* of the call's tensor inputs (positional, then keyword arguments
after the module) and of its tensor outputs, nested tuples, lists, dicts and
dataclasses flattened in order. A signature is an index into
``info["shape_signatures"]``, whose entries read ``"float32[2,16,64];int64[2,16]"``
(``""``: no tensor; ``?`` a symbolic size; ``...+N`` N tensors past the first 32).

:func:`span_shapes` gives each forward span its two signatures; :func:`shape_args`
turns one into the exports' span args (``in_shapes``, ``in_dtypes``, ``out_shapes``,
``out_dtypes``); ``hooktrace summary --by-shape`` splits each module's row by its
input signature (dynamic sequence lengths, bucketed batches); :class:`ShapeColumns`,
the column provider (hooktrace.analysis.columns), gives the spans table's ``in_shapes``
and ``out_shapes``.

Example:
    >>> parse_signature("float32[2,16,64];int64[2,16]")
    [('float32', [2, 16, 64]), ('int64', [2, 16])]
    >>> shape_args("float32[2,3]", "in")
    {'in_shapes': [[2, 3]], 'in_dtypes': ['float32']}
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from hooktrace._events import SHAPE_UNKNOWN, SHAPES
from hooktrace.analysis.column_provider import Column, ColumnProvider, SpanColumn, measured_only
from hooktrace.reading import TraceData, forward_span_before

__all__ = ["UNKNOWN", "ShapeColumns", "ShapeTable", "parse_signature", "shape_args", "shapes_recorded", "signatures",
           "span_shapes"]

UNKNOWN = "?"  # a signature not in the table (SHAPE_UNKNOWN, or cut off a stream)
_TENSOR = re.compile(r"([A-Za-z0-9_.]+)\[([0-9?,]*|nested|unreadable)\]")


def shapes_recorded(trace: TraceData) -> bool:
    """True when the run recorded shapes (trace(shapes=True))."""
    return isinstance(trace.info.get("shape_signatures"), list)


def signatures(trace: TraceData) -> list[str]:
    """The run's signature table (empty without shapes)."""
    table = trace.info.get("shape_signatures")
    return list(table) if isinstance(table, list) else []


def parse_signature(text: str) -> list[tuple[str, list[int | str]]]:
    """``(dtype, sizes)`` per tensor of a signature, in order (a symbolic size is "?")."""
    out: list[tuple[str, list[int | str]]] = []
    for part in text.split(";") if text else []:
        m = _TENSOR.fullmatch(part)
        if m is None:  # "...+N": tensors past the first 32, counted only
            continue
        sizes: list[int | str] = [int(d) if d.isdigit() else d
                                  for d in m.group(2).split(",") if d]
        out.append((m.group(1), sizes))
    return out


def shape_args(text: str, prefix: str) -> dict[str, Any]:
    """Span args for one signature: ``{prefix}_shapes`` and ``{prefix}_dtypes``."""
    parsed = parse_signature(text)
    return {f"{prefix}_shapes": [s for _, s in parsed],
            f"{prefix}_dtypes": [d for d, _ in parsed]}


def span_shapes(trace: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """Per span of ``trace.spans()``: the input and output signature index of its call
    (int64; -1 for spans without one: backward spans, calls that raised, runs
    without shapes, unknown signatures)."""
    return trace.derived("span_shapes", lambda: _span_shapes(trace))


def _span_shapes(trace: TraceData) -> tuple[np.ndarray, np.ndarray]:
    spans = trace.spans()
    in_sig = np.full(len(spans), -1, np.int64)
    out_sig = np.full(len(spans), -1, np.int64)
    ev = trace.events
    sel = np.flatnonzero(ev["kind"] == SHAPES)
    if len(sel) and len(spans):
        e = ev[sel]
        t = trace.clock.to_unix_ns(e["t"]).astype(np.int64)
        span = forward_span_before(trace, e["tid"].astype(np.int64), e["id"].astype(np.int64), t)
        ok = span >= 0
        seq = e["seq"].astype(np.uint64)
        n = len(signatures(trace))
        for arr, half in ((in_sig, seq & np.uint64(0xFFFFFFFF)), (out_sig, seq >> np.uint64(32))):
            h = half.astype(np.int64)
            known = ok & (half != SHAPE_UNKNOWN) & (h < n)
            arr[span[known]] = h[known]
    return in_sig, out_sig


class ShapeColumns(ColumnProvider):
    """Shapes' columns (``trace(shapes=True)``) in the spans table: the input and output
    signatures of each forward call (the summary splits rows by shape on request,
    ``--by-shape``: :class:`ShapeTable`)."""

    name = "shapes"
    columns = (Column("in_shapes", "string", "input shape signature (shapes=True)", order=40),
               Column("out_shapes", "string", "output shape signature (shapes=True)", order=40))

    def recorded(self, trace: TraceData) -> bool:
        return shapes_recorded(trace)

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        sigs = signatures(trace)
        in_sig, out_sig = span_shapes(trace)
        return {"in_shapes": (*measured_only(np.maximum(in_sig, 0), in_sig >= 0, m), sigs),
                "out_shapes": (*measured_only(np.maximum(out_sig, 0), out_sig >= 0, m), sigs)}


class ShapeTable:
    """``hooktrace summary --by-shape``: one row per (module, mode, input signature):
    forward calls, total, p50 and p99, and the backward time of those calls (their
    backward spans), sorted by forward + backward total, descending."""

    COLUMNS = ("module", "type", "mode", "in_shapes", "out_shapes", "calls", "total_ns",
               "mean_ns", "p50_ns", "p99_ns", "bwd_calls", "bwd_total_ns")
    # with device time (trace(gpu=True), hooktrace.analysis.device_time): after the shapes, and the
    # rows sorted by gpu_total + gpu_bwd_total
    GPU_COLUMNS = ("gpu_calls", "gpu_total_ns", "gpu_p50_ns", "gpu_bwd_total_ns")

    def __init__(self, rows: list[dict[str, Any]], recorded: bool, gpu: bool = False) -> None:
        self.rows = rows
        self.recorded = recorded
        self.gpu = gpu

    @property
    def columns(self) -> tuple[str, ...]:
        """The row keys, in CSV order."""
        return (self.COLUMNS[:5] + self.GPU_COLUMNS + self.COLUMNS[5:] if self.gpu
                else self.COLUMNS)

    @classmethod
    def from_trace(cls, trace: TraceData) -> ShapeTable:
        from hooktrace.analysis.device_time import gpu_recorded, span_gpu
        from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, SPAN_EVAL

        if not shapes_recorded(trace):
            return cls([], False)
        spans = trace.spans()
        in_sig, out_sig = span_shapes(trace)
        table = signatures(trace)
        fwd = np.flatnonzero((spans.cat == CAT_FORWARD) & (in_sig >= 0))
        # a backward span has its forward call's (module, call): its signature is that one's
        call_key = spans.module.astype(np.int64) * (int(spans.call.max(initial=0)) + 1) \
            + spans.call.astype(np.int64)
        sig_of_call = dict(zip(call_key[fwd].tolist(), fwd.tolist()))
        bwd = np.flatnonzero(spans.cat == CAT_BACKWARD)
        bwd_fwd = np.array([sig_of_call.get(k, -1) for k in call_key[bwd].tolist()], np.int64)
        dur = spans.duration_ns
        gpu = gpu_recorded(trace)
        gpu_ns, _, timed = span_gpu(trace) if gpu else (dur, dur, np.zeros(len(dur), bool))
        groups: dict[tuple[int, bool, int], dict[str, Any]] = {}
        for i in fwd.tolist():
            key = (int(spans.module[i]), bool(spans.flags[i] & SPAN_EVAL), int(in_sig[i]))
            g = groups.setdefault(key, {"durs": [], "out": int(out_sig[i]), "bwd": [],
                                        "gpu": [], "gpu_bwd": 0})
            g["durs"].append(int(dur[i]))
            if timed[i]:
                g["gpu"].append(int(gpu_ns[i]))
        for b, f in zip(bwd.tolist(), bwd_fwd.tolist()):
            if f >= 0:
                key = (int(spans.module[f]), bool(spans.flags[f] & SPAN_EVAL), int(in_sig[f]))
                if key in groups:
                    groups[key]["bwd"].append(int(dur[b]))
                    groups[key]["gpu_bwd"] += int(gpu_ns[b]) if timed[b] else 0
        rows: list[dict[str, Any]] = []
        for (m, is_eval, sig), g in groups.items():
            name, type_name = trace.modules[m] if m < len(trace.modules) else (f"<module {m}>", "?")
            d = np.asarray(g["durs"], np.int64)
            rows.append({
                "module": name, "type": type_name, "mode": "eval" if is_eval else "train",
                "in_shapes": table[sig], "out_shapes": table[g["out"]] if g["out"] >= 0 else UNKNOWN,
                "calls": len(d), "total_ns": int(d.sum()), "mean_ns": float(d.mean()),
                "p50_ns": float(np.percentile(d, 50)), "p99_ns": float(np.percentile(d, 99)),
                "bwd_calls": len(g["bwd"]), "bwd_total_ns": int(sum(g["bwd"]))})
            if gpu:
                rows[-1].update(gpu_calls=len(g["gpu"]), gpu_total_ns=int(sum(g["gpu"])),
                                gpu_p50_ns=float(np.percentile(g["gpu"], 50)) if g["gpu"]
                                else None, gpu_bwd_total_ns=g["gpu_bwd"])
        rows.sort(key=lambda r: -(r["total_ns"] + r["bwd_total_ns"]))
        if gpu:  # stable: equal device time keeps the host order
            rows.sort(key=lambda r: -(r["gpu_total_ns"] + r["gpu_bwd_total_ns"]))
        return cls(rows, True, gpu)

    def to_text(self, top: int | None = None, *, wide: bool = False) -> str:
        from hooktrace.text import align_columns, format_ns, shorten_middle, text_lines

        if not self.recorded:
            return "no shapes recorded: trace with hooktrace.trace(model, shapes=True) or run --shapes"
        header = ["module", "in_shapes", "out_shapes", "calls", "total", "p50", "p99", "bwd_total"]
        if self.gpu:
            header = header[:3] + ["gpu_total", "gpu_p50", "gpu_bwd_total", "calls"] + [
                "host_" + h for h in header[4:]]
        table = [header] + [
            [(r["module"] or "<root>") + (" [eval]" if r["mode"] == "eval" else ""),
             r["in_shapes"] or "-", r["out_shapes"] or "-"]
            + ([format_ns(r["gpu_total_ns"]),
                "" if r["gpu_p50_ns"] is None else format_ns(r["gpu_p50_ns"]),
                format_ns(r["gpu_bwd_total_ns"]) if r["bwd_calls"] else ""] if self.gpu else [])
            + [str(r["calls"]),
               format_ns(r["total_ns"]), format_ns(r["p50_ns"]), format_ns(r["p99_ns"]),
               format_ns(r["bwd_total_ns"]) if r["bwd_calls"] else ""]
            for r in self.rows[:top]]
        if not wide:  # long signatures: cut in the middle, keeping both ends
            for line in table[1:]:
                line[1], line[2] = shorten_middle(line[1], 36), shorten_middle(line[2], 36)
        lines = align_columns(table, 3)
        if top is not None and len(self.rows) > top:
            lines.append(f"... {len(self.rows) - top} more rows")
        lines.append("one row per module and input signature (dtype[sizes] of each tensor "
                     "argument, in order); bwd_total: the backward of those calls")
        if self.gpu:
            lines.append("gpu_*: device time of the timed calls, sorted by gpu_total + "
                         "gpu_bwd_total; host_*: host time")
        return text_lines(lines)

    def to_csv(self, top: int | None = None) -> str:
        from hooktrace.text import csv_text

        return csv_text(self.rows[:top], self.columns)

    def to_json(self, top: int | None = None) -> str:
        import json

        return json.dumps({"rows": self.rows[:top]}, ensure_ascii=False)
