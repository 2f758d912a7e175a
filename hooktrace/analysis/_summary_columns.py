"""The per-module summary's optional columns, filled into the rows
:class:`hooktrace.analysis.summary.Summary` builds: device time (``trace(gpu=True)``),
FLOPs (``flops=True``), memory (``memory=True``) and numerics (``numerics=True``), each
returning the notes that explain it; and the notes on compiled regions' kernels and on
what ``--max-disk`` rolled off. The rows' keys and the grouping of a module's train and
eval calls are here too, as both the summary and these columns use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.analysis.device_time import GPU_COLUMNS, gpu_notes, module_gpu, span_gpu
from hooktrace.analysis.kernels import Kernels
from hooktrace.analysis.numerics import Numerics, aggregate, number_for_json
from hooktrace.reading import CAT_BACKWARD, CAT_FORWARD, SPAN_EVAL, Spans

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

UNATTRIBUTED = "<unattributed>"  # "module" of the rows for unattributed autograd nodes
COMPILE_ROW = "<torch.compile>"  # "module" of the row of torch.compile's compile time


COLUMNS = ("module", "type", "mode", "timing", "fused", "calls", "total_ns", "self_ns", "mean_ns", "p50_ns", "p99_ns",
            "bwd_calls", "bwd_total_ns", "bwd_self_ns", "bwd_p50_ns", "bwd_p99_ns",
            "bwd_fwd_ratio", "recompute_calls", "recompute_total_ns", "step_p50_ns",
            "step_p99_ns")
# Recorded only with trace(flops=True) (hooktrace.analysis.flops): added after the others.
FLOP_COLUMNS = ("flops", "bwd_flops", "tflops", "bwd_tflops", "mfu")
# Recorded only with trace(memory=True) (hooktrace.analysis.memory): per device, net bytes a
# call leaves allocated (mean over calls) and the peak above its enter (max over calls).
MEMORY_KEYS = ("mem_net", "mem_peak", "bwd_mem_net", "bwd_mem_peak")


def memory_columns(device: str) -> tuple[str, ...]:
    """The summary's memory columns of ``device`` (``"cpu"`` unprefixed, ``"cuda:N"``
    as ``cuda_...``)."""
    prefix = "" if device == "cpu" else "cuda_"
    return tuple(prefix + k for k in MEMORY_KEYS)


def mode_groups(spans: Spans) -> tuple[np.ndarray, int]:
    """Per span, its summary row's group: the module slot for training calls, slot +
    ``n_mod`` for eval calls (grad off or module.eval(): SPAN_EVAL), and ``n_mod``.
    Group ``g`` is module ``g % n_mod`` in mode ``group_mode(g, n_mod)``."""
    n_mod = int(spans.module.max()) + 1 if len(spans) else 0
    eval_ = (spans.flags & SPAN_EVAL) != 0
    return spans.module.astype(np.int64) + n_mod * eval_.astype(np.int64), n_mod


def group_mode(group: int, n_mod: int) -> str:
    return "eval" if group >= n_mod else "train"


def add_flops(rows: list[dict[str, Any]], trace: TraceData,
               peak_tflops: float | None, *, gpu: bool = False,
               launch: bool = False) -> list[str]:
    """Fill the FLOP columns of ``rows`` from ``trace.info["flops"]``; returns notes.
    ``gpu``: TFLOP/s and MFU from the device time of the timed calls; ``launch`` (a
    CUDA run without device time): withheld, as launch time says nothing of them."""
    from hooktrace.analysis.flops import flop_columns, peak_tflops_for, run_flop_info

    info = run_flop_info(trace)
    peak = peak_tflops if peak_tflops is not None else peak_tflops_for(
        trace.info.get("device_name"))
    if gpu:
        total, _, timed = span_gpu(trace)
        per_module = flop_columns(info, trace.spans(), trace.modules, peak, durations=total,
                                  timed=timed)
    else:
        per_module = flop_columns(info, trace.spans(), trace.modules, peak)
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


def add_gpu(rows: list[dict[str, Any]], trace: TraceData) -> list[str]:
    """Fill the GPU columns of ``rows`` from the run's device time (hooktrace.analysis.device_time),
    add a row for each module timed only on the device (a kernel site of a compiled
    region without a row), and sort the rows by device time; returns notes."""
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


def add_numerics(rows: list[dict[str, Any]], trace: TraceData) -> list[str]:
    """Fill the numerics columns (hooktrace.analysis.numerics); returns notes."""
    n = Numerics.from_trace(trace)
    keys, v = aggregate(n, np.flatnonzero(n.measured()), n.module, n.eval.astype(np.int64),
                        n.backward.astype(np.int64))
    by_row = {(trace.modules[m][0], "eval" if is_eval else "train", backward): i
              for i, (m, is_eval, backward) in enumerate(keys) if m < len(trace.modules)}
    for row in rows:
        for backward, prefix in ((0, ""), (1, "bwd_")):
            i = by_row.get((row["module"], row["mode"], backward))
            row[prefix + "absmax"] = None if i is None else number_for_json(float(v["absmax"][i]))
            row[prefix + "rms"] = None if i is None else number_for_json(float(v["rms"][i]))
            row[prefix + "nonfinite"] = None if i is None else int(v["nonfinite"][i])
    skipped = int(np.count_nonzero(n.skipped & ~n.recompute))
    failed = int(np.count_nonzero(n.failed))
    every = n.every
    notes = ["numerics: absmax/rms/nonfinite of each call's output (max, mean, sum over calls); "
             "bwd_: of the gradient of its inputs"
             + ("" if every == 1 else f"; steps 0, {every}, {2 * every}, ... only")]
    not_walked = int(np.count_nonzero(n.not_walked & ~n.recompute))
    if skipped or failed or not_walked:
        notes.append(f"numerics: {skipped} calls without a floating-point tensor (skipped)"
                     + (f", {failed} that could not be reduced" if failed else "")
                     + (f", {not_walked} whose output nests tuples/lists/dicts/dataclasses "
                        "deeper than 4 levels (not walked: their tensors are left out)"
                        if not_walked else ""))
    return notes


def add_memory(rows: list[dict[str, Any]], trace: TraceData, device: str) -> list[str]:
    """Fill ``device``'s memory columns of ``rows``; returns notes."""
    from hooktrace.analysis.memory import span_memory

    spans = trace.spans()
    mem = span_memory(trace, device)
    keys = memory_columns(device)
    by_module: dict[tuple[str, str], dict[str, int]] = {}
    groups, n_mod = mode_groups(spans)
    for phase, cats in ((0, (CAT_FORWARD,)), (2, (CAT_BACKWARD,))):
        sel = np.flatnonzero(np.isin(spans.cat, cats) & mem.known)
        if not len(sel):
            continue
        module = groups[sel]
        n = 2 * n_mod
        calls = np.bincount(module, minlength=n)
        net = np.bincount(module, weights=mem.net[sel].astype(np.float64), minlength=n)
        peak = np.full(n, np.iinfo(np.int64).min, np.int64)
        np.maximum.at(peak, module, mem.peak_above[sel])
        for m in np.flatnonzero(calls).tolist():
            values = by_module.setdefault(
                (trace.modules[m % n_mod][0], group_mode(m, n_mod)), {})
            values[keys[phase]] = int(round(net[m] / calls[m]))
            values[keys[phase + 1]] = int(peak[m])
    for row in rows:
        values = (by_module.get((row["module"], row["mode"]), {})
                  if row["module"] != UNATTRIBUTED else {})
        for key in keys:
            row[key] = values.get(key)
    unknown = int(np.count_nonzero(~mem.known))
    # (each note fits the 120-column table with its "note: " prefix, for "cuda:NNN" too)
    notes = [f"memory ({device}): {keys[0]} = bytes a call leaves allocated (mean), "
             f"{keys[1]} = peak above its start (max)"]
    if unknown:
        notes.append(f"memory ({device}): {unknown} call(s) without both samples left out")
    if device != "cpu" and len(mem.exact) and not mem.exact[mem.known].all():
        notes.append(f"memory ({device}): where the device's high-water mark did not rise in "
                     "a call, its peak is a lower bound")
    return notes


def kernel_notes(trace: TraceData, rows: list[dict[str, Any]]) -> list[str]:
    """What the summary should say about compiled regions: kernels it could not place,
    and regions compiled before the trace (one span each, nothing inside)."""
    notes = []
    k = Kernels.from_trace(trace)
    lost = [(k.unpaired, "kernel starts without an end"),
            (k.unplaced, "kernels outside any recorded module call"),
            (k.unnamed, "kernels of modules the module table lacks (counted in their region)")]
    if any(n for n, _ in lost):
        notes.append(", ".join(f"{n} {what}" for n, what in lost if n))
    rolling = trace.info.get("rolling")
    if isinstance(rolling, dict):
        notes += rolling_notes(rolling)
    before = trace.info.get("compiled_before_trace")
    if isinstance(before, list) and before:
        names = ", ".join(str(n) or "<root>" for n in before[:4]) + (
            f" and {len(before) - 4} more" if len(before) > 4 else "")
        notes.append(f"{names}: compiled before the trace, so one span each; to see the modules "
                     "inside, compile inside hooktrace.trace() or under hooktrace run")
    return notes


def rolling_notes(rolling: dict[str, Any]) -> list[str]:
    """What --max-disk removed: rolled-off segments (counted by the writer, or only
    known from the segment numbers when the run was killed), a full disk's losses."""
    bound = f"{int(rolling.get('max_disk', 0)) / 2**20:.0f} MiB"
    segments = int(rolling.get("rolled_off_segments", 0) or 0)
    notes = []
    if rolling.get("rolled_off_events"):
        notes.append(f"--max-disk: the {int(rolling['rolled_off_events']):,} oldest events "
                     f"({segments} segments) were rolled off to keep the stream within {bound}")
    elif segments and "rolled_off_events" not in rolling:
        notes.append(f"--max-disk: the {segments} oldest segments were rolled off to keep the "
                     f"stream within {bound} (how many events they held is not known: the run "
                     "did not finish)")
    full = int(rolling.get("full_disk_rolled_off_segments", 0) or 0)
    lost = int(rolling.get("full_disk_lost_events", 0) or 0)
    if full or lost:
        notes.append(f"--max-disk: the disk was full: {full} of those segments were rolled off "
                     f"early to make room, and {lost:,} events were lost with no room left")
    return notes
