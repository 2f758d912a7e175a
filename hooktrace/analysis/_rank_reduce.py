"""The straggler tables' reduction of one rank (see :mod:`hooktrace.analysis.stragglers`):
a rank's trace reduced to its :class:`RankStats` (per (module, mode, phase, step) its
time, calls and self time; per step the time outside every module span; its top-level
spans), from the file itself with numpy (:func:`rank_stats`, :func:`reduce_rank`) or from
the results of ``hooktrace.data.engine.STRAGGLER_SQL`` (:func:`stats_from_tables`); and
the collectives' executions read from a rank's torch.profiler trace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hooktrace.format._kineto import BadValue, ProfilerTraceError, open_binary, scan, us_to_ns
from hooktrace.analysis.intervals import union_per_step
from hooktrace.analysis.calls import COMPILE, Calls
from hooktrace.analysis.device_time import gpu_recorded, gpu_spans, module_gpu
from hooktrace.analysis.phases import CAT_BACKWARD, CAT_FORWARD, RANK_DEVICE, rank_phase
from hooktrace.analysis.phases import RANK_PHASES
from hooktrace.analysis.rankset import RankFile
from hooktrace.reading import TraceData, load

N_PHASES = len(RANK_PHASES)


# Profiler events that are a collective's execution, waiting included: gloo runs
# each collective as a "gloo:<op>" range on its own thread (measured, torch 2.13);
# NCCL's execution is its GPU kernel.
_COLLECTIVE_PREFIXES = ("gloo:", "ncclKernel", "ncclDevKernel")


@dataclass
class RankStats:
    """One rank reduced to what the tables need (times on rank 0's clock)."""

    file: RankFile
    modules: list[str]
    types: list[str]
    module: np.ndarray  # per (module, mode, phase, step) entry: module slot (int64)
    mode: np.ndarray  # 0 training calls, 1 eval calls (SPAN_EVAL)
    phase: np.ndarray  # index into RANK_PHASES (hooktrace.analysis.phases.rank_phase)
    step: np.ndarray  # step number
    total_ns: np.ndarray
    calls: np.ndarray
    last_end_ns: np.ndarray  # end of the entry's last span
    step_number: np.ndarray  # per step of the rank
    step_start_ns: np.ndarray
    step_end_ns: np.ndarray
    outside_ns: np.ndarray  # time of the step outside every module span
    self_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per entry
    # the top-level spans (no parent; host phases, in a step) in start order: the
    # time outside every module lies between them
    top_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    top_key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (slot*2+mode)*2+bwd
    top_start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    top_end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    coll_start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    coll_end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    profiler: str | None = None
    timed_steps: int = 0  # steps with device time (0: none recorded)


def collectives(path: str, offset_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) on rank 0's clock of the collectives' executions in a profiler trace."""
    starts: list[int] = []
    ends: list[int] = []

    def on_event(e: Any) -> None:
        if not (isinstance(e, dict) and e.get("ph") == "X"):
            return
        name = e.get("name")
        if isinstance(name, str) and name.startswith(_COLLECTIVE_PREFIXES):
            try:
                t, d = us_to_ns(e["ts"]), us_to_ns(e.get("dur", 0))
            except (KeyError, ValueError):
                return
            if d < 0:  # (as every reader of a profiler trace refuses it: issue #46)
                raise BadValue(f"'dur' is {e.get('dur')!r:.40}, a negative duration "
                               "(expected a number of µs >= 0)")
            starts.append(t)
            ends.append(t + d)

    with open_binary(path) as f:
        top = scan(f, path, on_event)
    base = top.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int):
        raise ProfilerTraceError(f"{path}: baseTimeNanoseconds is {base!r}, expected an integer")
    s = np.asarray(starts, np.int64) + base - offset_ns
    o = np.argsort(s, kind="stable")
    return s[o], (np.asarray(ends, np.int64) + base - offset_ns)[o]


def rank_stats(path: str, profiler: str | None = None) -> RankStats:
    """Read one rank and reduce it (runs in a worker process)."""
    run = load(path)
    stats = reduce_rank(run, RankFile.from_trace(path, run))
    if profiler is not None:
        stats.coll_start_ns, stats.coll_end_ns = collectives(profiler, stats.file.offset_ns)
        stats.profiler = profiler
    return stats


def reduce_rank(run: TraceData, f: RankFile) -> RankStats:
    """One rank's run reduced to its :class:`RankStats` (``f``: its file's metadata)."""
    off = f.offset_ns
    steps = run.steps()
    # the per-call table (hooktrace.analysis.calls): measured and kernel-derived calls, in
    # a step, with the one self time; not recomputes or compiles
    c = Calls.from_trace(run)
    sel = (((c.cat == CAT_FORWARD) | (c.cat == CAT_BACKWARD)) & (c.timing != COMPILE)
           & c.step_valid)
    phase = rank_phase(c.cat[sel] == CAT_BACKWARD, device=False)
    mode = c.eval[sel].astype(np.int64)
    module = c.module[sel]
    step = c.step[sel]
    n_mod = max(len(run.modules), int(module.max(initial=-1)) + 1)
    dur = c.dur[sel]
    end = c.end[sel]
    self_t = c.self_ns[sel]
    timed = 0
    if gpu_recorded(run) and len(steps):  # device time: the device phases, its steps
        m = module_gpu(run, n_mod)
        g_sel = m.step >= 0
        gpu = gpu_spans(run)
        n_mod = max(n_mod, m.n_mod)
        module = np.r_[module, (m.group % m.n_mod)[g_sel]]
        mode = np.r_[mode, (m.group >= m.n_mod)[g_sel].astype(np.int64)]
        phase = np.r_[phase, rank_phase(m.backward[g_sel], device=True)]
        step = np.r_[step, steps.number[m.step[g_sel]]]
        dur = np.r_[dur, gpu.duration_ns[g_sel]]
        end = np.r_[end, gpu.end_ns[g_sel]]
        self_t = np.r_[self_t, gpu.self_ns[g_sel].astype(np.int64)]
        timed = len(np.unique(m.step[g_sel]))
    n_step = int(step.max(initial=-1)) + 1
    width = max(n_step, 1)
    key = ((module * 2 + mode) * N_PHASES + phase) * width + step
    uniq, inv = np.unique(key, return_inverse=True)
    total = np.bincount(inv, weights=dur, minlength=len(uniq)).astype(np.int64)
    calls = np.bincount(inv, minlength=len(uniq)).astype(np.int64)
    self_total = np.bincount(inv, weights=self_t, minlength=len(uniq)).astype(np.int64)
    last_end = np.full(len(uniq), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last_end, inv, end - off)
    top = np.flatnonzero(sel & c.root)  # the top-level spans of those calls
    top = top[np.lexsort((top, c.start[top]))]  # start order (the SQL's too)
    covered = union_per_step(c.start[top], c.end[top], steps.start_ns, steps.end_ns)
    names = [name for name, _ in run.modules] + [f"<module {m}>"
                                                 for m in range(len(run.modules), n_mod)]
    types = [t for _, t in run.modules] + ["?"] * (n_mod - len(run.modules))
    return RankStats(
        file=f, modules=names, types=types,
        module=uniq // width // N_PHASES // 2, mode=uniq // width // N_PHASES % 2,
        phase=uniq // width % N_PHASES,
        step=uniq % width, total_ns=total, calls=calls, last_end_ns=last_end,
        step_number=steps.number.copy(), step_start_ns=steps.start_ns - off,
        step_end_ns=steps.end_ns - off, outside_ns=steps.duration_ns - covered,
        timed_steps=timed, self_ns=self_total,
        top_step=c.step[top],
        top_key=(c.module[top] * 2 + c.eval[top]) * RANK_DEVICE
        + rank_phase(c.cat[top] == CAT_BACKWARD, device=False),
        top_start_ns=c.start[top] - off, top_end_ns=c.end[top] - off)


def _groups(table: Any) -> dict[tuple[Any, Any], dict[str, np.ndarray]]:
    """An Arrow table sorted by (rank, window) -> its columns per (rank, window)."""
    import pyarrow.compute as pc

    out: dict[tuple[Any, Any], dict[str, np.ndarray]] = {}
    if not table.num_rows:
        return out
    cols = {name: table.column(name).to_numpy(zero_copy_only=False)
            for name in table.column_names if name not in ("rank", "window")}
    keys = []
    for name in ("rank", "window"):
        c = table.column(name)
        keys.append((pc.fill_null(c, -1).to_numpy(zero_copy_only=False).astype(np.int64),
                     pc.is_null(c).to_numpy(zero_copy_only=False)))
    (rank, rank_null), (window, window_null) = keys
    change = np.flatnonzero((rank[1:] != rank[:-1]) | (window[1:] != window[:-1])
                            | (rank_null[1:] != rank_null[:-1])
                            | (window_null[1:] != window_null[:-1])) + 1
    bounds = np.r_[0, change, table.num_rows]
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        key = (None if rank_null[a] else int(rank[a]), None if window_null[a] else int(window[a]))
        out[key] = {k: v[a:b] for k, v in cols.items()}
    return out


def stats_from_tables(t: dict[str, Any]) -> list[RankStats]:
    """RankStats per file (rank, window) from :data:`hooktrace.data.engine.STRAGGLER_SQL`'s
    results: what :func:`rank_stats` computes from the file itself."""
    agg, steps, modules = _groups(t["agg"]), _groups(t["steps"]), _groups(t["modules"])
    timed = _groups(t["timed"]) if "timed" in t else {}
    tops = _groups(t["tops"]) if "tops" in t else {}
    out = []
    for row in t["runs"].to_pylist():
        key = (row["rank"], row["window"])
        f = RankFile.from_runs_row(row, json.loads(row["info"]))
        m = modules.get(key, {"module": np.zeros(0, object), "type": np.zeros(0, object),
                              "slot": np.zeros(0, np.int64)})
        names = [f"<module {i}>" for i in range(len(m["slot"]))]
        types = ["?"] * len(names)
        for i, n, t_ in zip(m["slot"].tolist(), m["module"].tolist(), m["type"].tolist()):
            names[i], types[i] = str(n), str(t_)
        empty = np.zeros(0, np.int64)
        # each table's columns of the file as int64 (bools as 0/1), empty when it has none
        a, st, tp = ({k: v.astype(np.int64) for k, v in table.get(key, dict.fromkeys(
            columns, empty)).items()} for table, columns in (
            (agg, ("slot", "eval", "phase", "step", "total_ns", "calls",
                   "last_end_ns", "self_total_ns")),
            (steps, ("step", "start_ns", "end_ns", "outside_ns")),
            (tops, ("step", "slot", "eval", "phase", "start_ns", "end_ns"))))
        top = int(a["slot"].max(initial=-1)) + 1  # slots beyond the module table
        names += [f"<module {i}>" for i in range(len(names), top)]
        types += ["?"] * (top - len(types))
        out.append(RankStats(
            file=f, modules=names, types=types, module=a["slot"], mode=a["eval"],
            phase=a["phase"], step=a["step"], total_ns=a["total_ns"],
            calls=a["calls"], last_end_ns=a["last_end_ns"], step_number=st["step"],
            step_start_ns=st["start_ns"], step_end_ns=st["end_ns"], outside_ns=st["outside_ns"],
            timed_steps=int(timed[key]["timed_steps"][0]) if key in timed else 0,
            self_ns=a.get("self_total_ns", a["total_ns"]), top_step=tp["step"],
            top_key=(tp["slot"] * 2 + tp["eval"]) * RANK_DEVICE + tp["phase"],
            top_start_ns=tp["start_ns"], top_end_ns=tp["end_ns"]))
    return out
