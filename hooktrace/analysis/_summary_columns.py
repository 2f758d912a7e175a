"""The per-module summary's row keys (:data:`COLUMNS`), its special rows' names, the
grouping of a module's train and eval calls, and the notes on compiled regions' kernels
and on what ``--max-disk`` rolled off: shared by :class:`hooktrace.analysis.summary.Summary`
and the column providers (hooktrace.analysis.columns) that fill its optional columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hooktrace.analysis.kernels import Kernels
from hooktrace.reading import SPAN_EVAL, Spans

if TYPE_CHECKING:
    from hooktrace.reading import TraceData

UNATTRIBUTED = "<unattributed>"  # "module" of the rows for unattributed autograd nodes
COMPILE_ROW = "<torch.compile>"  # "module" of the row of torch.compile's compile time


COLUMNS = ("module", "type", "mode", "timing", "fused", "calls", "total_ns", "self_ns", "mean_ns", "p50_ns", "p99_ns",
            "bwd_calls", "bwd_total_ns", "bwd_self_ns", "bwd_p50_ns", "bwd_p99_ns",
            "bwd_fwd_ratio", "recompute_calls", "recompute_total_ns", "step_p50_ns",
            "step_p99_ns")


def mode_groups(spans: Spans) -> tuple[np.ndarray, int]:
    """Per span, its summary row's group: the module slot for training calls, slot +
    ``n_mod`` for eval calls (grad off or module.eval(): SPAN_EVAL), and ``n_mod``.
    Group ``g`` is module ``g % n_mod`` in mode ``group_mode(g, n_mod)``."""
    n_mod = int(spans.module.max()) + 1 if len(spans) else 0
    eval_ = (spans.flags & SPAN_EVAL) != 0
    return spans.module.astype(np.int64) + n_mod * eval_.astype(np.int64), n_mod


def group_mode(group: int, n_mod: int) -> str:
    return "eval" if group >= n_mod else "train"


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
    missing = rolling.get("missing_segments") or []
    if missing:
        one = len(missing) == 1
        notes.append(f"--max-disk: {len(missing)} segment{'' if one else 's'} missing from "
                     f"the middle of the stream, {'its' if one else 'their'} events and steps "
                     f"not here: {', '.join(missing)}")
    full = int(rolling.get("full_disk_rolled_off_segments", 0) or 0)
    lost = int(rolling.get("full_disk_lost_events", 0) or 0)
    if full or lost:
        notes.append(f"--max-disk: the disk was full: {full} of those segments were rolled off "
                     f"early to make room, and {lost:,} events were lost with no room left")
    return notes
