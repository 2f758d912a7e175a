"""What the outputs show of a run's device time (``trace(gpu=True)``, issue #28).

The recording (``TraceData.gpu_spans()``: :class:`~hooktrace.reading.GpuSpans`) gives
each timed module call its interval on the device, aligned to the host clock. This
module turns it into what the summary, diff, report, straggler and shape tables and the
exports need:

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
from hooktrace.analysis.phases import CAT_BACKWARD, CAT_EVAL, CAT_FORWARD, EVAL, HOST_PHASES
from hooktrace.reading import SPAN_EVAL, GpuSpans, TraceData
from hooktrace.text import format_ns

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls

__all__ = ["CAT_EVAL", "DeviceTimeColumns", "GPU_COLUMNS", "LAUNCH_NOTE", "ModuleGpu",
           "add_gpu", "gpu_info", "gpu_ms_by_module", "gpu_notes", "gpu_recorded",
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
    return gpu_info(trace) is not None or len(trace.gpu_spans()) > 0


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
    return trace.derived("span_gpu", lambda: span_totals(trace.gpu_spans(), len(trace.spans())))


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
    gpu = trace.gpu_spans()
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
    gpu = trace.gpu_spans()
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
    """Device time per (module, category) when it was recorded (TraceData.gpu_spans(),
    issue #28), else None; the intervals of the spans ``eval_spans`` marks (per span,
    bool) under (module, CAT_EVAL)."""
    g = trace.gpu_spans()
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
        gpu = trace.gpu_spans()
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
