"""What the outputs show of a run's device time (``trace(gpu=True)``, issue #28).

The recording (``trace(gpu=True)``) leaves timing marks; :func:`gpu_spans` pairs them
into each timed module call's interval on the device, aligned to the host clock
(:class:`~hooktrace.reading.GpuSpans`; ``TraceResult.gpu_spans()``). This module turns
them into what the summary, diff, report, straggler and shape tables and the exports
need:

* :func:`gpu_recorded` / :func:`launch_time_only`: which of three kinds of run this
  is. With GPU time, the tables lead with it. On a CUDA run without it
  (``info["accelerator"] == "cuda"``, no ``info["gpu"]``) the host times are when the
  kernels were *queued*: the tables say so in one line and withhold TFLOP/s and MFU.
  A CPU run is neither (its host time is its compute time) and shows nothing new.
* :func:`span_gpu`: per host span, the device time of its intervals (total and self).
* :func:`module_gpu`: per (module slot, eval, phase), the summed device time: forward
  = CAT_FORWARD + CAT_RECOMPUTE, backward = CAT_BACKWARD; an interval without a host
  span (a kernel site of a compiled region) counts to its module, as a training call.
* :class:`DeviceTimeColumns`: its column provider (hooktrace.analysis.columns): the
  summary's ``gpu_*`` columns (they lead and sort the rows), the spans table's
  ``gpu_dur_ns``/``gpu_self_ns``, the aggregates' ``gpu_ms``.

Example:
    >>> import numpy as np
    >>> from hooktrace.reading import GpuSpans
    >>> g = GpuSpans({"start_ns": np.array([0, 2, 20]), "end_ns": np.array([10, 6, 25]),
    ...               "self_ns": np.array([6, 4, 5]), "span": np.array([0, 1, -1]),
    ...               "module": np.array([0, 1, 2], np.uint32),
    ...               "cat": np.array([0, 0, 0], np.uint8),
    ...               "device": np.array([0, 0, 0], np.int16), "stream": np.array([7, 7, 7])})
    >>> total, self_, timed = span_totals(g, 2)
    >>> total.tolist(), self_.tolist(), timed.tolist()
    ([10, 4], [6, 4], [True, True])
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.analysis._summary_columns import COLUMNS, COMPILE_ROW, UNATTRIBUTED, group_mode
from hooktrace.analysis.column_provider import (
    Column,
    ColumnProvider,
    SpanColumn,
    SummaryPart,
    TextColumn,
    WindowGroup,
    measured_only,
)
from hooktrace._events import (GPU_BACKWARD, GPU_EXIT, GPU_KERNEL, GPU_MARK, GPU_NO_MODULE,
                               GPU_TIME)
from hooktrace._span_tables import GPU_FIELDS
from hooktrace.analysis.phases import CAT_BACKWARD, CAT_EVAL, CAT_FORWARD, EVAL, HOST_PHASES
from hooktrace.reading import SPAN_EVAL, GpuSpans, Spans, TraceData, kernel_sites, site_modules
from hooktrace.text import format_ns

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls

__all__ = ["CAT_EVAL", "DeviceTimeColumns", "GPU_COLUMNS", "LAUNCH_NOTE", "ModuleGpu",
           "add_gpu", "gpu_info", "gpu_ms_by_module", "gpu_notes", "gpu_recorded", "gpu_spans",
           "kernel_label", "launch_time_only", "module_gpu", "span_gpu", "span_totals",
           "timed_steps"]

# The summary's GPU columns (ns), in the order the table leads with them.
GPU_COLUMNS = ("gpu_calls", "gpu_total_ns", "gpu_self_ns", "gpu_bwd_total_ns", "gpu_bwd_self_ns")
# The one line a CUDA run without device time prints under its tables.
LAUNCH_NOTE = ("host (launch) times: on CUDA these are when kernels were queued, not when they "
               "ran; TFLOP/s and MFU withheld; trace(model, gpu=True) for device time")


def gpu_info(trace: TraceData) -> dict[str, Any] | None:
    """``info["gpu"]`` (how the run's device time was recorded), or None."""
    info = trace.info.get("gpu")
    return info if isinstance(info, dict) else None


def gpu_recorded(trace: TraceData) -> bool:
    """Whether the run recorded device time (``trace(gpu=True)``)."""
    return gpu_info(trace) is not None or len(gpu_spans(trace)) > 0


def launch_time_only(trace: TraceData) -> bool:
    """A CUDA run without device time: its host times are launch times."""
    kernels = trace.info.get("kernels")
    return (trace.info.get("accelerator") == "cuda" and not gpu_recorded(trace)
            and not (isinstance(kernels, dict) and "library" in kernels))


def kernel_label(trace: TraceData) -> str:
    """What a kernel-derived row (a module inside a compiled region) is labelled:
    ``"kernel launches"`` where its host time is when its kernels were queued (a CUDA
    run without device time), else ``"kernels"``."""
    return "kernel launches" if launch_time_only(trace) else "kernels"


def gpu_spans(trace: TraceData) -> GpuSpans:
    """The run's device time per module call (paired once, then cached on the trace);
    empty when none was recorded (``trace(gpu=True)``: :class:`GpuSpans`)."""
    return trace.derived("gpu_spans", lambda: _pair_marks(trace))


def _pair_marks(trace: TraceData) -> GpuSpans:
    """The device intervals of ``trace(gpu=True)`` (csrc/gpu_time.h): GPU_MARK events
    (a timing event on a stream) with the device time of their GPU_TIME event.

    Forward (and recompute): a call's two marks lie inside its host span (after its
    ENTER, before its EXIT), so both find that span; its interval runs from one to the
    other, and its ``self_ns`` is that minus its children's intervals on the same stream.
    Backward: on each (device, stream), in device order, a mark starts the stretch of
    the module it names, up to the next mark (GPU_NO_MODULE: none). Each stretch finds
    its module's backward span (the one holding the mark's host time); a backward span
    gets one interval from the first to the last stretch of it and of the backward spans
    under it, with ``self_ns`` its own stretches. Marks without a time (dropped, or
    recorded after the last resolution) and unpaired calls are left out."""
    ev = trace.events
    kind = ev["kind"]
    mark_i = np.flatnonzero(kind == GPU_MARK)
    time_i = np.flatnonzero(kind == GPU_TIME)
    if not mark_i.size or not time_i.size:
        return GpuSpans.empty()
    # each mark's device time: the GPU_TIME whose id is the mark's id
    time_ids = ev["id"][time_i]
    order = np.argsort(time_ids, kind="stable")
    ids_sorted = time_ids[order]
    mark_ids = ev["rf_tid"][mark_i]
    pos = np.minimum(np.searchsorted(ids_sorted, mark_ids), len(ids_sorted) - 1)
    has = ids_sorted[pos] == mark_ids
    mark_i, pos = mark_i[has], pos[has]
    tev = time_i[order[pos]]
    dev_t = ev["seq"][tev].view(np.int64)
    device = ev["rf_tid"][tev].astype(np.int16)
    host_t = trace.clock.to_unix_ns(ev["t"][mark_i])
    module = ev["id"][mark_i]
    flags = ev["flags"][mark_i]
    stream = ev["seq"][mark_i].view(np.int64)
    spans = trace.spans()
    backward = (flags & GPU_BACKWARD) != 0
    kernel = (flags & GPU_KERNEL) != 0
    forward = ~backward & ~kernel
    parts = [_forward_gpu(spans, *(a[forward] for a in (
        module, flags, host_t, dev_t, device, stream)))]
    parts.append(_backward_gpu(spans, *(a[backward] for a in (
        module, host_t, dev_t, device, stream, ev["rf_tid"][mark_i]))))
    out = {name: np.concatenate([p[name] for p in parts]).astype(dtype)
           for name, dtype in GPU_FIELDS.items()}
    if kernel.any():
        out = _with_kernel_sites(trace, spans, out, *(a[kernel] for a in (
            module, flags, host_t, dev_t, device, stream, ev["tid"][mark_i])))
    by_start = np.argsort(out["start_ns"], kind="stable")
    return GpuSpans({name: a[by_start] for name, a in out.items()})


def _with_kernel_sites(trace: TraceData, spans: Spans, out: dict[str, np.ndarray],
                       site: np.ndarray, flags: np.ndarray, host_t: np.ndarray,
                       dev_t: np.ndarray, device: np.ndarray, stream: np.ndarray,
                       tid: np.ndarray) -> dict[str, np.ndarray]:
    """``out`` and the intervals of compiled code's kernel sites: a site's two marks
    (before and after its kernel, one after the other on the recording thread) are one
    interval of the site's module (``span`` -1) in the site's phase. The innermost host
    span holding it is the compiled region's call (hooktrace.analysis.kernels places kernels the
    same way); the site's module is :func:`site_modules`' (the host side's too), and the
    region's interval loses the kernel's time from its ``self_ns`` when on the same
    stream. A site that resolves to the region itself adds nothing: its time is the
    region's own."""
    sites = kernel_sites(trace.info)
    order = np.argsort(tid, kind="stable")  # (marks in recorded order per thread)
    site, flags, host_t, dev_t = site[order], flags[order], host_t[order], dev_t[order]
    device, stream, tid = device[order], stream[order], tid[order]
    begin = np.flatnonzero((flags[:-1] & GPU_EXIT) == 0)
    pair = begin[((flags[begin + 1] & GPU_EXIT) != 0) & (site[begin + 1] == site[begin])
                 & (tid[begin + 1] == tid[begin]) & (dev_t[begin + 1] >= dev_t[begin])]
    if not len(pair):
        return out
    # the host span holding each kernel is its region's call (forward, or the backward
    # span of its CompiledFunctionBackward node); a site names a module under the region
    holder = spans.index().innermost(tid[pair], host_t[pair])
    region = np.where(holder >= 0, spans.module[np.maximum(holder, 0)].astype(np.int64), -1)
    slot = site_modules(trace.modules, sites, region, site[pair])[0]
    backward = np.array([p == "backward" for _, _, p in sites] + [False])
    cat = np.where(backward[np.minimum(site[pair], len(sites))], CAT_BACKWARD, CAT_FORWARD)
    # a kernel of the region itself stays in its interval's self time, as on the host
    keep = (slot >= 0) & (slot != region)
    pair, slot, cat, holder = pair[keep], slot[keep], cat[keep], holder[keep]
    a, b = dev_t[pair], dev_t[pair + 1]
    row = np.full(len(spans), -1, np.int64)
    placed = out["span"] >= 0
    row[out["span"][placed]] = np.flatnonzero(placed)
    r = np.where(holder >= 0, row[np.maximum(holder, 0)], -1)
    hit = np.flatnonzero(r >= 0)
    hit = hit[(out["device"][r[hit]] == device[pair][hit])
              & (out["stream"][r[hit]] == stream[pair][hit])]
    out = dict(out)
    out["self_ns"] = out["self_ns"].copy()
    np.subtract.at(out["self_ns"], r[hit], (b - a)[hit])
    add = {"start_ns": a, "end_ns": b, "self_ns": b - a,
           "span": np.full(len(pair), -1, np.int64), "module": slot, "cat": cat,
           "device": device[pair], "stream": stream[pair]}
    return {name: np.concatenate([out[name], np.asarray(add[name]).astype(dtype)])
            for name, dtype in GPU_FIELDS.items()}


def _forward_gpu(spans: Spans, module: np.ndarray, flags: np.ndarray, host_t: np.ndarray,
                 dev_t: np.ndarray, device: np.ndarray, stream: np.ndarray
                 ) -> dict[str, np.ndarray]:
    span = spans.index().of_module(module, host_t, "forward")
    n = len(spans)
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    exit_ = (flags & GPU_EXIT) != 0
    found = span >= 0
    first = found & ~exit_
    start[span[first]] = dev_t[first]
    last = found & exit_
    end[span[last]] = dev_t[last]
    where = np.full(n, -1, np.int64)
    where[span[first]] = np.flatnonzero(first)  # each span's start mark: device, stream
    timed = np.flatnonzero((start >= 0) & (end >= start) & (where >= 0))
    dur = end[timed] - start[timed]
    mark = where[timed]
    dev, strm = device[mark], stream[mark]
    # self: minus the children's intervals on the same device and stream
    row = np.full(n, -1, np.int64)
    row[timed] = np.arange(len(timed))
    parent = spans.parent[timed]
    prow = np.where(parent >= 0, row[np.maximum(parent, 0)], -1)
    child = np.flatnonzero((prow >= 0) & (dev == dev[np.maximum(prow, 0)])
                           & (strm == strm[np.maximum(prow, 0)]))
    self_ns = dur.copy()
    np.subtract.at(self_ns, prow[child], dur[child])
    return {"start_ns": start[timed], "end_ns": end[timed], "self_ns": self_ns,
            "span": timed.astype(np.int64), "module": spans.module[timed],
            "cat": spans.cat[timed], "device": dev, "stream": strm}


def _backward_gpu(spans: Spans, module: np.ndarray, host_t: np.ndarray, dev_t: np.ndarray,
                  device: np.ndarray, stream: np.ndarray, mark_id: np.ndarray
                  ) -> dict[str, np.ndarray]:
    # the stretches: each mark to the next one on its device and stream
    order = np.lexsort((mark_id, dev_t, stream, device))
    module, host_t, dev_t = module[order], host_t[order], dev_t[order]
    device, stream = device[order], stream[order]
    nxt = np.arange(1, len(order) + 1)
    has_next = np.zeros(len(order), bool)
    if len(order) > 1:
        has_next[:-1] = (device[1:] == device[:-1]) & (stream[1:] == stream[:-1])
    own = np.flatnonzero(has_next & (module != GPU_NO_MODULE))
    a, b = dev_t[own], dev_t[nxt[own]]
    span = spans.index().of_module(module[own], host_t[own], "backward")
    # stretches of no backward span: one interval each
    alone = span < 0
    out_parts = [{"start_ns": a[alone], "end_ns": b[alone], "self_ns": b[alone] - a[alone],
                  "span": np.full(int(alone.sum()), -1, np.int64), "module": module[own][alone],
                  "cat": np.full(int(alone.sum()), CAT_BACKWARD, np.uint8),
                  "device": device[own][alone], "stream": stream[own][alone]}]
    placed = ~alone
    if placed.any():
        sp, a, b = span[placed], a[placed], b[placed]
        dev, strm = device[own][placed], stream[own][placed]
        n = len(spans)
        lo = np.full(n, np.iinfo(np.int64).max, np.int64)
        hi = np.full(n, np.iinfo(np.int64).min, np.int64)
        self_ns = np.zeros(n, np.int64)
        np.add.at(self_ns, sp, b - a)
        first_dev = np.zeros(n, np.int16)
        first_strm = np.zeros(n, np.int64)
        first_dev[sp[::-1]] = dev[::-1]  # (the first stretch's)
        first_strm[sp[::-1]] = strm[::-1]
        # each stretch widens its span and every backward span above it
        cur = sp.copy()
        while cur.size:
            np.minimum.at(lo, cur, a)
            np.maximum.at(hi, cur, b)
            up = spans.parent[cur]
            keep = up >= 0
            keep[keep] &= spans.cat[up[keep]] == CAT_BACKWARD
            cur, a, b = up[keep], a[keep], b[keep]
        timed = np.flatnonzero(hi >= lo)
        out_parts.append({"start_ns": lo[timed], "end_ns": hi[timed], "self_ns": self_ns[timed],
                          "span": timed.astype(np.int64), "module": spans.module[timed],
                          "cat": spans.cat[timed], "device": first_dev[timed],
                          "stream": first_strm[timed]})
    return {name: np.concatenate([p[name] for p in out_parts]).astype(dtype)
            for name, dtype in GPU_FIELDS.items()}


def span_totals(gpu: GpuSpans, n_spans: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per host span (``n_spans`` of them): device total and self time (int64, summed over
    its intervals: one per stream it ran work on) and whether it was timed."""
    has = gpu.span >= 0
    idx = gpu.span[has]
    total = np.bincount(idx, weights=gpu.duration_ns[has], minlength=n_spans)[:n_spans]
    self_ = np.bincount(idx, weights=gpu.self_ns[has], minlength=n_spans)[:n_spans]
    timed = np.bincount(idx, minlength=n_spans)[:n_spans] > 0
    return total.astype(np.int64), self_.astype(np.int64), timed


def span_gpu(trace: TraceData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`span_totals` of ``trace``'s spans (cached on the trace)."""
    return trace.derived("span_gpu", lambda: span_totals(gpu_spans(trace), len(trace.spans())))


@dataclass
class ModuleGpu:
    """Per interval of a run's :class:`GpuSpans`: its row group (module slot, + ``n_mod``
    for an eval call), whether it is backward, and its step row (-1: none)."""

    group: np.ndarray
    backward: np.ndarray
    step: np.ndarray
    n_mod: int


def module_gpu(trace: TraceData, n_mod: int) -> ModuleGpu:
    """The row group of each of the run's intervals: a module's eval calls (SPAN_EVAL on
    the host span) are rows of their own, as in the summary; the step of an interval is
    its host span's (a kernel site's: the step its device start falls in)."""
    gpu = gpu_spans(trace)
    spans = trace.spans()
    has = (gpu.span >= 0) & (gpu.span < len(spans))
    safe = np.where(has, gpu.span, 0)
    eval_ = np.zeros(len(gpu), bool)
    if len(spans):
        eval_ = has & ((spans.flags[safe] & SPAN_EVAL) != 0)
    steps = trace.steps()
    step = steps.index_of(gpu.start_ns)
    if len(spans):
        step = np.where(has, trace.span_steps()[safe], step)
    n_mod = max(n_mod, int(gpu.module.max()) + 1 if len(gpu) else 0)
    return ModuleGpu(gpu.module.astype(np.int64) + n_mod * eval_, gpu.cat == CAT_BACKWARD,
                     step, n_mod)


def timed_steps(trace: TraceData) -> np.ndarray:
    """Rows of ``trace.steps()`` that hold device time (``gpu_every=N`` times every N-th)."""
    m = module_gpu(trace, 0)
    return np.unique(m.step[m.step >= 0])


def gpu_notes(trace: TraceData) -> list[str]:
    """The lines under a table with GPU columns: what they are, how many steps were
    timed, the clock alignment's bound, and the calls not timed."""
    info = gpu_info(trace) or {}
    every = info.get("every")
    steps = info.get("timed_steps")
    timer = info.get("timer")
    what = ("gpu_*: device time on the module's stream (gpu_self: less its children's); "
            "host columns: when the calls ran on the CPU")
    if timer == "host":
        what += " (timer 'host': the test backend, host clock)"
    lines = [what]
    parts = []
    if isinstance(steps, int):
        parts.append(f"{steps} timed steps" + (f" (1 step in {every})" if isinstance(every, int)
                                               and every > 1 else ""))
    err = info.get("align_error_ns")
    if isinstance(err, (int, float)):
        realigned = info.get("realigned")
        estimated = info.get("align_estimated")
        parts.append(f"device clock aligned to the host's within ±{format_ns(err)}"
                     + (" (estimated: the device never idled; durations are exact)"
                        if isinstance(estimated, int) and estimated and not info.get("realigned")
                        else "")
                     + (f", re-aligned {realigned}x (largest correction "
                        f"{format_ns(info.get('max_realign_correction_ns') or 0)})"
                        if isinstance(realigned, int) and realigned else ""))
    lost = [(info.get("dropped"), "calls not timed (event pool exhausted)"),
            (info.get("skipped_capturing"), "calls not timed while a CUDA graph was captured"),
            (info.get("failed"), "marks whose device time could not be read (counted, not "
                                 "raised: e.g. recorded inside a graph capture)")]
    parts += [f"{n} {what}" for n, what in lost if isinstance(n, int) and n]
    if parts:
        lines.append("gpu: " + "; ".join(parts))
    return lines


def add_gpu(rows: list[dict[str, Any]], trace: TraceData) -> list[str]:
    """Fill the GPU columns of the summary's ``rows`` from the run's device time, add a
    row for each module timed only on the device (a kernel site of a compiled region
    without a row), and sort the rows by device time; returns notes."""
    gpu = gpu_spans(trace)
    spans = trace.spans()
    m = module_gpu(trace, int(spans.module.max()) + 1 if len(spans) else 0)
    n = 2 * m.n_mod
    dur = gpu.duration_ns.astype(np.float64)
    self_ns = gpu.self_ns.astype(np.float64)
    values: dict[tuple[str, str], dict[str, int]] = {}
    for backward, prefix in ((False, "gpu_"), (True, "gpu_bwd_")):
        sel = m.backward == backward
        g = m.group[sel]
        calls = np.bincount(g, minlength=n)
        total = np.bincount(g, weights=dur[sel], minlength=n)
        own = np.bincount(g, weights=self_ns[sel], minlength=n)
        for k in np.flatnonzero(calls).tolist():
            slot = k % m.n_mod
            name = trace.modules[slot][0] if slot < len(trace.modules) else f"<module {slot}>"
            v = values.setdefault((name, group_mode(k, m.n_mod)), {})
            v[prefix + "total_ns"] = int(total[k])
            v[prefix + "self_ns"] = int(own[k])
            if not backward:
                v["gpu_calls"] = int(calls[k])
    seen = {(r["module"], r["mode"]) for r in rows}
    for (name, mode), v in values.items():
        if (name, mode) in seen:
            continue
        type_name = next((t for n_, t in trace.modules if n_ == name), "?")
        row: dict[str, Any] = dict.fromkeys(COLUMNS)
        # no host column: its calls were compiled into a region launched from the host
        row.update(module=name, type=type_name, mode=mode, timing="kernels")
        rows.append(row)
    for row in rows:
        v = values.get((row["module"], row["mode"]), {})
        special = row["module"] in (UNATTRIBUTED, COMPILE_ROW)
        for key in GPU_COLUMNS:
            row[key] = None if special else v.get(key, 0)
    # Stable: equal device time keeps the host order (rows without any: last)
    rows.sort(key=lambda r: -((r["gpu_total_ns"] or 0) + (r["gpu_bwd_total_ns"] or 0)))
    return gpu_notes(trace)


def gpu_ms_by_module(trace: TraceData, eval_spans: np.ndarray | None = None
                     ) -> dict[tuple[int, int], float] | None:
    """Device time per (module, category) when it was recorded (:func:`gpu_spans`,
    issue #28), else None; the intervals of the spans ``eval_spans`` marks (per span,
    bool) under (module, CAT_EVAL)."""
    g = gpu_spans(trace)
    if not len(g):
        return None
    out: dict[tuple[int, int], float] = {}
    dur = (g.end_ns - g.start_ns).astype(np.float64) / 1e6
    cats = g.cat.astype(np.int64)
    if eval_spans is not None and len(eval_spans):
        has = (g.span >= 0) & (g.span < len(eval_spans))
        marked = np.zeros(len(g), bool)
        marked[has] = eval_spans[g.span[has]]
        cats = np.where(marked, CAT_EVAL, cats)
    for m, c, d in zip(g.module.tolist(), cats.tolist(), dur.tolist(), strict=True):
        out[(m, c)] = out.get((m, c), 0.0) + d
    return out


class DeviceTimeColumns(ColumnProvider):
    """Device time's columns (``trace(gpu=True)``) in the summary, the spans table and
    the aggregates."""

    name = "device time"
    columns = (
        Column("gpu_dur_ns", "int64", "device time of the call (trace(gpu=True)); null when "
               "not timed", order=10, check="nonnegative"),
        Column("gpu_self_ns", "int64", "device time minus its children's on the stream",
               order=10, check="nonnegative", at_most="gpu_dur_ns"),
        Column("gpu_ms", "float32", "device time (trace(gpu=True)); null when not recorded",
               "aggregates", 10, "finite", reduce="per_step", title="gpu ms/step",
               tip="device time per step, when recorded", fact="device time recorded"))
    headers = dict(zip(GPU_COLUMNS, (
        ("gpu_calls", "forward calls timed on the GPU"),
        ("gpu_total", "device time of the forward calls (recompute included) on the module's "
                      "stream"),
        ("gpu_self", "gpu_total less its children's device time"),
        ("gpu_bwd_total", "device time of the module's backward"),
        ("gpu_bwd_self", "gpu_bwd_total less its children's device time")), strict=True))

    def text_layout(self, columns: list[TextColumn], keys: Collection[str], *,
                    wide: bool, backward: bool) -> list[TextColumn]:
        """Device time first (after module and type; calls too in the narrow table);
        the host columns say they are host time, and the narrow table keeps only the
        host totals."""
        if "gpu_total_ns" not in keys:
            return columns
        return columns[:2] + ([("calls", "calls")] if not wide else []) + [
            (title, k) for k, (title, _) in self.headers.items() if backward or "bwd" not in k] + [
            ("host_" + title if key.endswith("_ns") or key == "bwd_fwd_ratio" else title, key)
            for title, key in columns[2:]
            if wide or key not in ("calls", "self_ns", "p50_ns", "bwd_self_ns", "bwd_fwd_ratio")]

    def recorded(self, trace: TraceData) -> bool:
        return gpu_recorded(trace)

    def summary(self, rows: list[dict[str, Any]], trace: TraceData,
                options: Mapping[str, Any]) -> SummaryPart:
        return SummaryPart(GPU_COLUMNS, add_gpu(rows, trace), lead=True,
                           attributes={"time_kind": "device"})

    def unrecorded(self, trace: TraceData) -> SummaryPart:
        if launch_time_only(trace):  # host times are launch times
            return SummaryPart(notes=[LAUNCH_NOTE], attributes={"time_kind": "launch"})
        return SummaryPart()

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        gpu = gpu_spans(trace)
        if not len(gpu):
            return {}
        dur, self_, timed = span_totals(gpu, n)
        return {"gpu_dur_ns": measured_only(dur, timed, m),
                "gpu_self_ns": measured_only(self_, timed, m)}

    def aggregate(self, trace: TraceData, calls: Calls
                  ) -> Callable[[WindowGroup], dict[str, list[Any]]] | None:
        s = trace.spans()
        gpu = gpu_ms_by_module(trace, (s.cat == CAT_FORWARD) & ((s.flags & SPAN_EVAL) != 0))
        if gpu is None:
            return None

        def values(group: WindowGroup) -> dict[str, list[Any]]:
            if group.mode not in HOST_PHASES:
                return {}
            key = CAT_EVAL if group.mode == HOST_PHASES[EVAL] else group.cat
            return {"gpu_ms": [gpu.get((m, key)) for m in group.modules]}

        return values
