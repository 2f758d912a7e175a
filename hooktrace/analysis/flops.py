"""FLOPs per module (``trace(model, flops=True)``) and achieved TFLOP/s.

**Counting.** ``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of
every aten op and attributes them to the modules on the stack (inclusive: a
block's count includes its children's). It costs a Python dispatch per op
(11-28x a plain step on benchmarks/flops.py's MLP), so it runs on one root call per
distinct input signature (shapes, dtypes, devices, ``requires_grad`` of the
tensor arguments, the other arguments' values, ``model.training``, grad mode):
the first time a signature is seen, the counter is entered just before that
root call and left at the next root call, step mark or the end of the block,
whichever comes first, so that the call's backward pass is counted too; the
forward counts are read when the root call returns, the backward counts are
the rest (ops outside every module, the loss's and the optimizer's, count
for no module). Every later call with the same signature has the same
counts and runs uninstrumented.

**Timing.** The counted calls run slower, so they are left out of TFLOP/s:
``tflops`` = the module's FLOPs over its time, summed over the root calls that
were *not* counted. Their spans stay in every time column (they did run).

**On the spans.** Exports (``hooktrace export``, JSON and ``.pftrace``) and
traces merged with torch.profiler give every forward and backward module span
of a root call the args ``flops`` (that call's FLOPs, an integer) and, for the
root calls that were not counted, ``tflops`` (``flops`` over the span's own
duration, in TFLOP/s, rounded to 4 significant digits; left out when
``flops`` is 0, for unfinished spans and for empty ones). Spans of a counted
root call carry ``flops`` and ``flops_counted: true`` instead of ``tflops``:
they ran under the counter, so their time says nothing about the speed.
FlopCounterMode counts a module's FLOPs per root call, not per call: when a
module runs k times in one root call (a shared layer, a loop; or k backward
passes), its count is divided evenly among those k spans of the phase, as
integers (the first ``count mod k`` calls, in call order, get one FLOP more),
so that a module's spans of one root call add up to FlopCounterMode's count
exactly; the summary's ``flops`` column is the mean of these over every call.
Recompute spans (activation checkpointing) and spans outside every root call
get no FLOP args; so do spans of runs recorded without ``flops=True``. A
count with no span of its module and phase in that root call is on no span (it
is in the ancestors' counts): FlopCounterMode gives backward FLOPs to an
eval-mode ``Dropout``, which returns its input and so has no autograd node and
no backward span (the summary has no ``bwd_flops`` for it either).

**Recorded** in ``info["flops"]``: ``signatures`` (per signature, ``forward``
and ``backward``: module qualified name -> FLOPs of one root call), ``calls``
(the signature index of each root call, in order) and ``counted`` (the root
calls that ran under the counter). Root call k is the root module's span with
``call`` k: a schedule window's ``calls`` and ``counted`` are its own root calls,
numbered from 0 as its spans number them; a streamed file (``out=``) has the
block in its footer; a ring buffer that overwrote its oldest events holds the
newest root calls, which :func:`run_flop_info` matches to its spans.

**Shown** by :class:`FlopColumns`, the column provider (hooktrace.analysis.columns): the
summary's :data:`FLOP_COLUMNS`, the spans table's ``flops``, the aggregates' ``tflops``.

Example::

    with hooktrace.trace(model, flops=True) as tr:
        for x in batches:
            model(x).sum().backward()
    print(tr.summary().to_text(wide=True))   # flops, bwd_flops, tflops, bwd_tflops
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.analysis._summary_columns import UNATTRIBUTED
from hooktrace.analysis.column_provider import (
    ArgColumn,
    Column,
    ColumnProvider,
    SpanColumn,
    SummaryPart,
    TextColumn,
    WindowGroup,
    measured_only,
)
from hooktrace.analysis.device_time import gpu_recorded, launch_time_only, span_gpu
from hooktrace.analysis.kernel_time import kernels_recorded, span_kernels
from hooktrace.errors import HooktraceError
from hooktrace.format.meta import is_int
from hooktrace.text import format_count

if TYPE_CHECKING:
    from hooktrace.analysis.calls import Calls
    from hooktrace.reading import Spans, TraceData

__all__ = ["FLOP_COLUMNS", "FlopColumns", "PEAK_TFLOPS", "SpanFlops", "add_flops",
           "flop_columns", "newest_flop_info", "peak_tflops_for", "run_flop_info",
           "span_flops", "tflops_by_module"]

# The summary's FLOP columns (recorded only with trace(flops=True)): after the others.
FLOP_COLUMNS = ("flops", "bwd_flops", "tflops", "bwd_tflops", "mfu")

# Dense BF16/FP16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data
# sheets, for MFU when no --peak-tflops is given; matched by substring of
# torch.cuda.get_device_name(), longest first.
PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 989.0,
    "A100": 312.0, "A10G": 70.0, "L40S": 362.0, "L4": 121.0, "V100": 125.0, "T4": 65.0,
    "RTX 4090": 165.0, "RTX 3090": 71.0, "MI300X": 1307.0, "MI250X": 383.0,
}


def peak_tflops_for(device_name: str | None) -> float | None:
    """The table's peak for a CUDA device name, or None (CPUs and unknown devices)."""
    if not device_name:
        return None
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_TFLOPS[key]
    return None


class FlopInfoError(HooktraceError):
    """info["flops"] of a trace file is not what a recorder writes."""


def _parse(info: Any) -> tuple[list[dict[str, dict[str, int]]], list[int], set[int]]:
    def bad(what: str) -> FlopInfoError:
        return FlopInfoError(f'info["flops"]: {what}; the file was not written by '
                             "hooktrace.trace(flops=True) or hooktrace run --flops")

    if not isinstance(info, dict):
        raise bad("not an object")
    sigs, calls, counted = info.get("signatures"), info.get("calls"), info.get("counted")
    if not isinstance(sigs, list) or not isinstance(calls, list) or not isinstance(counted,
                                                                                 list):
        raise bad("signatures, calls and counted must be lists")
    for s in sigs:
        if not (isinstance(s, dict) and all(
                isinstance(s.get(p), dict) and all(isinstance(k, str) and isinstance(v, int)
                                                   for k, v in s[p].items())
                for p in ("forward", "backward"))):
            raise bad("each signature maps forward/backward to {module: int}")
    if not all(is_int(c) and 0 <= c < len(sigs) for c in calls):
        raise bad("calls must be signature indices")
    if not all(is_int(c) for c in counted):  # (true is no root call number: issue #46)
        raise bad("counted must be root call numbers")
    return sigs, calls, set(counted)


def run_flop_info(trace: TraceData) -> Any:
    """``trace.info["flops"]`` with its root calls matched to the trace's spans, which
    number the root's calls from 0: a ring buffer that overwrote its oldest events
    (``overwritten_events``) holds the newest root calls, so with n root calls in the
    spans, the spans' root call k is the recorder's ``len(calls) - n + k``. (A schedule
    window's info is made relative to the window when it is recorded.)"""
    info = trace.info["flops"]
    if not trace.overwritten_events:
        return info
    return newest_flop_info(info, trace.spans())


def newest_flop_info(info: Any, spans: Spans) -> Any:
    """A run's ``info["flops"]`` matched to ``spans`` that hold only its newest root
    calls (a ring buffer that overwrote its oldest events; an ``aggregate=`` window,
    reduced as its last step ends): with n root calls in the spans, their root call k is
    the recorder's ``len(calls) - n + k``."""
    from hooktrace.reading import CAT_FORWARD

    if not isinstance(info, dict):
        return info
    calls, counted = info.get("calls"), info.get("counted")
    if not isinstance(calls, list) or not isinstance(counted, list):
        return info  # (_parse says what is wrong)
    start = len(calls) - int(np.count_nonzero((spans.module == 0) & (spans.cat == CAT_FORWARD)))
    if start <= 0:
        return info
    return dict(info, calls=calls[start:],
                counted=[c - start for c in counted if isinstance(c, int) and c >= start])


def _root_call(spans: Spans) -> np.ndarray:
    """Per span: the ``call`` number of the root module's (slot 0) call it belongs to,
    -1 when its outermost ancestor is not a root call (or it is a recompute span)."""
    from hooktrace.reading import CAT_RECOMPUTE

    anc = np.arange(len(spans))
    parent = spans.parent
    for _ in range(int(spans.depth.max(initial=0)) + 1):
        up = parent[anc]
        has = up >= 0
        if not has.any():
            break
        anc = np.where(has, up, anc)
    out = np.where(spans.module[anc] == 0, spans.call[anc].astype(np.int64), -1)
    out[spans.cat == CAT_RECOMPUTE] = -1
    return out


def flop_columns(info: Any, spans: Spans, modules: Sequence[tuple[str, str]],
                 peak_tflops: float | None, *, durations: np.ndarray | None = None,
                 timed: np.ndarray | None = None) -> dict[str, dict[str, float | None]]:
    """Per module name: ``flops`` / ``bwd_flops`` (mean per call, all calls),
    ``tflops`` / ``bwd_tflops`` (over the calls not counted) and ``mfu``
    ((forward + backward FLOPs) / time / ``peak_tflops``).

    ``durations`` (per span) replaces the spans' host durations, and ``timed`` (per
    span, bool) keeps TFLOP/s and MFU to those spans: the device time of the calls
    that were timed on the GPU (``trace(gpu=True)``, hooktrace.analysis.device_time)."""
    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD

    sigs, calls, counted = _parse(info)
    if not len(spans):
        return {}
    root_call = _root_call(spans)
    known = (root_call >= 0) & (root_call < len(calls))
    sig_of_call = np.asarray(calls, np.int64)
    measured_call = np.ones(len(calls), bool)
    measured_call[[c for c in counted if 0 <= c < len(calls)]] = False
    out: dict[str, dict[str, float | None]] = {}
    dur = spans.duration_ns if durations is None else np.asarray(durations)
    for phase, cat, prefix in (("forward", CAT_FORWARD, ""), ("backward", CAT_BACKWARD, "bwd_")):
        sel = known & (spans.cat == cat)
        for m in np.unique(spans.module[sel]).tolist():
            name = modules[m][0] if m < len(modules) else f"<module {m}>"
            mine = sel & (spans.module == m)
            rc = root_call[mine]
            # FLOPs of one root call, per root call this module ran in
            per_root = np.array([s[phase].get(name, 0) for s in sigs], np.float64)
            roots = np.unique(rc)
            flops_all = float(per_root[sig_of_call[roots]].sum())
            meas = measured_call[rc] if timed is None else measured_call[rc] & timed[mine]
            measured_roots = np.unique(rc[meas])
            flops_measured = float(per_root[sig_of_call[measured_roots]].sum())
            time_measured = float(dur[mine][meas].sum())
            row = out.setdefault(name, {})
            row[f"{prefix}flops"] = flops_all / int(mine.sum())
            row[f"{prefix}tflops"] = (flops_measured / time_measured / 1e3
                                      if time_measured > 0 and flops_measured > 0 else None)
            row[f"_{prefix}fl"] = flops_measured
            row[f"_{prefix}ns"] = time_measured
    for row in out.values():
        fl = row.pop("_fl", 0.0) or 0.0
        bfl = row.pop("_bwd_fl", 0.0) or 0.0
        ns = (row.pop("_ns", 0.0) or 0.0) + (row.pop("_bwd_ns", 0.0) or 0.0)
        row["mfu"] = ((fl + bfl) / ns / 1e3 / peak_tflops
                      if peak_tflops and ns > 0 and fl + bfl > 0 else None)
    return out


class SpanFlops:
    """FLOP args of every span of a run (see "On the spans" in the module docstring).

    Per span (indexed like :class:`~hooktrace.reading.Spans`): ``flops`` (int64,
    -1 where the span gets no FLOP args), ``tflops`` (float64 TFLOP/s rounded to 4
    significant digits, NaN where left out) and ``counted`` (bool: its root call
    ran under FlopCounterMode).
    """

    def __init__(self, flops: np.ndarray, tflops: np.ndarray, counted: np.ndarray) -> None:
        self.flops, self.tflops, self.counted = flops, tflops, counted


def span_flops(info: Any, spans: Spans, modules: Sequence[tuple[str, str]]) -> SpanFlops:
    """The FLOP args of ``spans`` from a run's ``info["flops"]`` (vectorized: one
    lookup table of the recorded counts, one sort of the spans that get args).

    Example (two root calls of ``Net``, the first one counted; ``fc`` runs twice per
    root call, 1 µs each, so its 7 MFLOPs are split 3.5 M + 3.5 M, 3.5 TFLOP/s):
        >>> import numpy as np
        >>> from hooktrace._events import EVENT_DTYPE, Clock
        >>> from hooktrace.reading import Spans
        >>> ev = np.zeros(12, EVENT_DTYPE); ev["kind"] = [1, 1, 2, 1, 2, 2] * 2
        >>> ev["id"] = [0, 1, 1, 1, 1, 0] * 2; ev["t"] = np.arange(12) * 1000
        >>> spans = Spans.from_events(ev, Clock(0, 0, 1.0))
        >>> info = {"signatures": [{"forward": {"": 9_000_001, "fc": 7_000_001},
        ...                         "backward": {}}], "calls": [0, 0], "counted": [0]}
        >>> f = span_flops(info, spans, [("", "Net"), ("fc", "Linear")])
        >>> f.flops.tolist()
        [9000001, 3500001, 3500000, 9000001, 3500001, 3500000]
        >>> f.tflops.tolist()[3:], f.counted.tolist()
        ([1.8, 3.5, 3.5], [True, True, True, False, False, False])
    """
    from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, SPAN_UNFINISHED

    sigs, calls, counted_calls = _parse(info)
    n = len(spans)
    flops = np.full(n, -1, np.int64)
    tflops = np.full(n, np.nan)
    counted = np.zeros(n, bool)
    if not n or not calls:
        return SpanFlops(flops, tflops, counted)
    root_call = _root_call(spans)
    sel = np.flatnonzero((root_call >= 0) & (root_call < len(calls))
                         & ((spans.cat == CAT_FORWARD) | (spans.cat == CAT_BACKWARD)))
    if not len(sel):
        return SpanFlops(flops, tflops, counted)
    rc = root_call[sel]
    module = spans.module[sel].astype(np.int64)
    phase = (spans.cat[sel] == CAT_BACKWARD).astype(np.int64)
    n_slots = max(len(modules), int(module.max()) + 1)

    # The recorded counts as a sorted table keyed (signature, module slot, phase).
    slots: dict[str, list[int]] = {}
    for slot, (name, _) in enumerate(modules):
        slots.setdefault(name, []).append(slot)
    keys: list[int] = []
    values: list[int] = []
    for s, sig in enumerate(sigs):
        for p, ph in enumerate(("forward", "backward")):
            for name, count in sig[ph].items():
                for slot in slots.get(name, ()):
                    keys.append((s * n_slots + slot) * 2 + p)
                    values.append(count)
    table_order = np.argsort(np.asarray(keys, np.int64), kind="stable")
    table_keys = np.asarray(keys, np.int64)[table_order]
    table_values = np.asarray(values, np.int64)[table_order]
    want = (np.asarray(calls, np.int64)[rc] * n_slots + module) * 2 + phase
    pos = np.minimum(np.searchsorted(table_keys, want), max(len(table_keys) - 1, 0))
    total = (np.where(table_keys[pos] == want, table_values[pos], 0) if len(table_keys)
             else np.zeros(len(sel), np.int64))

    # Split each count among the module's spans of that phase in that root call, in
    # call order (spans of one call, several backward passes, in span order).
    group = (rc * n_slots + module) * 2 + phase
    call = spans.call[sel].astype(np.int64)
    n_calls = int(call.max()) + 1
    if int(group.max()) < (1 << 62) // n_calls:  # one sort of a packed key
        order = np.argsort(group * n_calls + call, kind="stable")
    else:
        order = np.lexsort((call, group))
    g = group[order]
    first = np.empty(len(g), bool)
    first[0] = True
    np.not_equal(g[1:], g[:-1], out=first[1:])
    per_call = total
    if not first.all():  # some module ran several times in a root call
        starts = np.flatnonzero(first)
        sizes = np.diff(np.append(starts, len(g)))
        rank = np.arange(len(g)) - np.repeat(starts, sizes)
        k = np.repeat(sizes, sizes)
        t = total[order]
        per_call = np.empty_like(total)
        per_call[order] = t // k + (rank < t % k)
    flops[sel] = per_call

    is_counted = np.zeros(len(calls), bool)
    is_counted[[c for c in counted_calls if 0 <= c < len(calls)]] = True
    counted[sel] = is_counted[rc]
    dur = spans.duration_ns[sel]
    timed = ((per_call > 0) & ~counted[sel] & (dur > 0)
             & ((spans.flags[sel] & SPAN_UNFINISHED) == 0))
    tflops[sel[timed]] = round_significant(per_call[timed] / dur[timed] / 1e3, 4)
    return SpanFlops(flops, tflops, counted)


def round_significant(x: np.ndarray, digits: int) -> np.ndarray:
    """Positive finite ``x`` rounded to ``digits`` significant digits, each the double
    nearest its decimal (so that the shortest repr shows at most ``digits`` digits);
    0 where ``x`` is not positive.

    Example:
        >>> round_significant(np.array([0.0123456, 123456.0, 9.99996e-9]), 4).tolist()
        [0.01235, 123500.0, 1e-08]
    """
    x = np.asarray(x, np.float64)
    ok = x > 0
    v = x if ok.all() else np.where(ok, x, 1.0)
    # 10**e puts the digits-th significant digit in the units; an integer divided by
    # (or times) an exact power of ten, rounded once, is the double nearest the decimal
    e = np.clip(digits - 1 - np.floor(np.log10(v)).astype(np.int64), -22, 22)
    scale = _POW10[np.abs(e)]
    if (e >= 0).all():  # the usual case (values below 10**digits): one expression
        out = np.round(v * scale) / scale
    else:
        out = np.where(e >= 0, np.round(v * scale) / scale, np.round(v / scale) * scale)
    return out if ok.all() else np.where(ok, out, 0.0)


_POW10 = 10.0 ** np.arange(23)  # exact doubles


def _trace_flop_columns(trace: TraceData, info: Any, peak_tflops: float | None
                        ) -> dict[str, dict[str, float | None]]:
    """:func:`flop_columns` of ``trace``'s spans: over the device time of the timed calls
    when the run recorded it, else over host time."""
    if gpu_recorded(trace):
        total, _, timed = span_gpu(trace)
        return flop_columns(info, trace.spans(), trace.modules, peak_tflops, durations=total,
                            timed=timed)
    if kernels_recorded(trace):  # over the kernels' busy time (CUPTI)
        sk = span_kernels(trace)
        return flop_columns(info, trace.spans(), trace.modules, peak_tflops,
                            durations=sk.busy, timed=sk.count > 0)
    return flop_columns(info, trace.spans(), trace.modules, peak_tflops)


def add_flops(rows: list[dict[str, Any]], trace: TraceData,
              peak_tflops: float | None) -> list[str]:
    """Fill the FLOP columns of the summary's ``rows`` from ``trace.info["flops"]``;
    returns notes. With device time, TFLOP/s and MFU are over the timed calls' device
    time; on a CUDA run without it they are withheld, as launch time says nothing of
    them."""
    info = run_flop_info(trace)
    peak = peak_tflops if peak_tflops is not None else peak_tflops_for(
        trace.info.get("device_name"))
    gpu, launch = gpu_recorded(trace) or kernels_recorded(trace), launch_time_only(trace)
    per_module = _trace_flop_columns(trace, info, peak)
    if launch:
        for values in per_module.values():
            values.update(tflops=None, bwd_tflops=None, mfu=None)
    for row in rows:
        values = per_module.get(row["module"], {}) if row["module"] != UNATTRIBUTED else {}
        for key in FLOP_COLUMNS:
            # a row whose calls had no backward (an [eval] row of no_grad calls): no
            # backward FLOPs (blank, not the training calls' figure); eval-mode calls
            # with grad on do have a backward
            row[key] = (None if not row["bwd_calls"] and key.startswith("bwd_")
                        else values.get(key))
    counted = len(info.get("counted", []))
    if counted:
        note = (f"FLOPs from torch's FlopCounterMode on {counted} root call(s), one per input "
                "signature; TFLOP/s leaves those (slower) calls out")
    else:  # a window or a ring buffer's newest calls: counted before
        note = ("FLOPs from torch's FlopCounterMode on earlier root calls of the same input "
                "signatures; TFLOP/s over every call")
    if launch:
        note += "; TFLOP/s and MFU withheld (no device time)"
    elif peak is None:
        note += "; MFU needs --peak-tflops"
    else:
        note += f"; MFU against a peak of {peak:g} TFLOP/s"
    if gpu:
        note += "; TFLOP/s and MFU over the device time of the timed calls"
    if any(r["mode"] == "eval" for r in rows):
        return [note, "FLOP columns of a module's train and [eval] rows are over all its calls"]
    return [note]


def tflops_by_module(trace: TraceData) -> dict[tuple[str, str], float] | None:
    """Achieved TFLOP/s per (module name, "forward"/"backward") of a window, as the
    summary computes it (:func:`flop_columns`: the FLOPs of the root calls not run under
    the counter over their time; device time when it was recorded, else host time), when
    FLOPs were recorded (``flops=True``), else None. None too for a CUDA run without
    device time: launch time says nothing of the speed."""
    if "flops" not in trace.info or launch_time_only(trace):
        return None
    # the window's spans number its root calls from 0; the info holds the run's
    columns = _trace_flop_columns(trace, newest_flop_info(trace.info["flops"], trace.spans()),
                                  None)
    out: dict[tuple[str, str], float] = {}
    for name, values in columns.items():
        for mode, key in (("forward", "tflops"), ("backward", "bwd_tflops")):
            if values.get(key) is not None:
                out[(name, mode)] = float(values[key])  # type: ignore[arg-type]
    return out


class FlopColumns(ColumnProvider):
    """FLOPs' columns (``trace(flops=True)``) in the summary, the spans table and the
    aggregates."""

    name = "FLOPs"
    columns = (
        Column("flops", "int64", "FLOPs of the call (flops=True); null when not counted",
               order=30, check="nonnegative"),
        Column("tflops", "float32", "FLOP rate of the calls, TFLOP/s (flops=True)",
               "aggregates", 40, "finite", reduce="weighted", weight="gpu_ms",
               title="TFLOP/s", tip="achieved TFLOP/s over the calls not run under the FLOP "
                                    "counter (flops=True): device time when recorded, else "
                                    "host time", fact="FLOPs recorded (TFLOP/s column)"))
    text_flag = "flops"
    flag_help = ("add FLOPs and TFLOP/s per module to the table (recorded with "
                 "trace(model, flops=True); --wide, --csv and --json always have them)")
    headers = dict(zip(FLOP_COLUMNS, (
        ("flops", "forward FLOPs per call (torch's FlopCounterMode)"),
        ("bwd_flops", "backward FLOPs per forward call"),
        ("TFLOP/s", "achieved forward TFLOP/s (the calls run under the FLOP counter, slower, "
                    "left out)"),
        ("bwd_TFLOP/s", "achieved backward TFLOP/s"),
        ("MFU", "model FLOPs utilization: forward + backward FLOPs over their time, against "
                "the peak")), strict=True))

    def format_cell(self, key: str, value: Any) -> str | None:
        if key in ("flops", "bwd_flops"):
            return format_count(value, "FLOP")
        if key in ("tflops", "bwd_tflops"):
            return f"{value:.3g}"
        return f"{value * 100:.1f}%" if key == "mfu" else None

    def text_columns(self, keys: Collection[str], rows: Sequence[dict[str, Any]], *,
                     wide: bool, backward: bool) -> list[TextColumn]:
        if "flops" not in keys:
            return []
        # (MFU and TFLOP/s are withheld on a CUDA run without device time: no column)
        return [(title, k) for k, (title, _) in self.headers.items()
                if wide or k not in ("mfu", "tflops", "bwd_tflops")
                or any(r.get(k) is not None for r in rows)]

    def recorded(self, trace: TraceData) -> bool:
        return "flops" in trace.info

    def note_shown(self, note: str, shown: Collection[str]) -> bool | None:
        return "flops" in shown if note.startswith(("FLOPs from", "FLOP columns")) else None

    def hover(self, row: Mapping[str, Any], prefix: str) -> str:
        """``<br>1.2 MFLOP per call, 0.5 TFLOP/s`` for a row with FLOPs."""
        flops, tflops = row.get(f"{prefix}flops"), row.get(f"{prefix}tflops")
        if not flops:
            return ""
        return f"<br>{format_count(flops, 'FLOP')} per call" + (
            f", {tflops:.3g} TFLOP/s" if tflops is not None else "")

    def facts(self, root: Mapping[str, Any] | None, columns: Collection[str]) -> list[str]:
        if "flops" not in columns or root is None:
            return []
        achieved = [f"{root[k]:.3g} TFLOP/s {phase}" for k, phase in
                    (("tflops", "forward"), ("bwd_tflops", "backward")) if root.get(k)]
        if root.get("mfu") is not None:
            achieved.append(f"MFU {root['mfu'] * 100:.1f}%")
        return ["model " + (", ".join(achieved) if achieved else "FLOPs recorded")]

    def summary(self, rows: list[dict[str, Any]], trace: TraceData,
                options: Mapping[str, Any]) -> SummaryPart:
        return SummaryPart(FLOP_COLUMNS, add_flops(rows, trace, options.get("peak_tflops")))

    def spans(self, trace: TraceData, n: int, m: int) -> dict[str, SpanColumn]:
        f = span_flops(run_flop_info(trace), trace.spans(), trace.modules)
        return {"flops": measured_only(f.flops, f.flops >= 0, m)}

    def aggregate(self, trace: TraceData, calls: Calls
                  ) -> Callable[[WindowGroup], dict[str, list[Any]]] | None:
        tflops = tflops_by_module(trace)
        if tflops is None:
            return None
        # (TFLOP/s: of the module's training calls, none for eval rows)
        return lambda group: {"tflops": [tflops.get((calls.names[m], group.mode))
                                         for m in group.modules]}

    def export_args(self, trace: TraceData, spans: np.ndarray) -> list[ArgColumn]:
        # "On the spans" in the module docstring: flops, tflops, flops_counted
        if not self.recorded(trace):
            return [ArgColumn(name, None) for name in ("flops", "tflops", "flops_counted")]
        f = span_flops(run_flop_info(trace), trace.spans(), trace.modules)
        return [ArgColumn("flops", f.flops[spans]), ArgColumn("tflops", f.tflops[spans]),
                ArgColumn("flops_counted", f.counted[spans])]
