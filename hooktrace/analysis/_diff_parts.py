"""``hooktrace diff``'s numbers of one run, before any comparison: each trace file
reduced to a :class:`Part` (per (module, phase): p50 per call, time, self time and calls
per complete step, on numpy from a ``.htrace`` file or on DuckDB from a Parquet export),
and a run's parts (one file, or the schedule windows of one process) pooled into its
:class:`RunStats`. Reading the files of a path (in worker processes, or a Parquet
export) is here too.

:mod:`hooktrace.analysis.diff` compares two runs' :class:`RunStats` and renders the
result; :mod:`hooktrace.analysis._diff_inputs` says which files make a run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hooktrace.analysis._diff_inputs import DiffInputError, file_meta
from hooktrace.analysis.rankset import RankFile
from hooktrace.analysis.device_time import gpu_recorded, gpu_spans, launch_time_only, module_gpu
from hooktrace.analysis.kernel_time import kernels_recorded, span_kernels
from hooktrace.analysis.calls import COMPILE, KERNELS, Calls
from hooktrace.analysis.phases import CAT_BACKWARD, CAT_FORWARD, EVAL, GPU_PHASES, KEY_PHASES
from hooktrace.analysis.phases import HOST_PHASES as PHASES
from hooktrace.analysis.phases import key_phases
from hooktrace.analysis.groups import Groups
from hooktrace.analysis.kernels import fused_modules, silent_in_regions
from hooktrace._events import SPAN_DEFINITION, SPAN_DEFINITIONS, span_definition
from hooktrace.reading import SPAN_EVAL, TraceData, as_data, load

# The keys' phases (hooktrace.analysis.phases.KEY_PHASES): PHASES, with "eval", forward
# calls made with grad off or in eval mode (SPAN_EVAL), compared apart from the training
# calls of the same module; the device time's (trace(gpu=True),
# hooktrace.analysis.device_time) GPU_PHASES, the same phases on the GPU, rows of their own
# ("gpu forward": forward and recompute, as the summary's gpu_total). When both runs have
# them, the gate (``failures``) checks these rows and the step only.


Key = tuple[str, str]  # (module, phase)


@dataclass
class PhaseStats:
    """One run's numbers for a (module, phase): p50 per call, time and calls per step."""

    type: str
    p50_ns: float
    per_step_ns: float
    self_per_step_ns: float
    calls: float
    timing: str = "measured"  # or "kernels" / "measured+kernels", as summary's column
    p50_self_ns: float = 0.0  # the median call's self time
    spread_ns: float = 0.0  # run-to-run noise: IQR of the time per step (see spread)


@dataclass
class RunStats:
    per_key: dict[Key, PhaseStats]
    steps: int  # complete steps (0: the whole run counts as one)
    step_p50_ns: float | None
    total_ns: float  # time per step of the root calls, forward + backward: the run's scale
    span_definition: int = SPAN_DEFINITION  # what a span covers (hooktrace._events)
    gpu: bool = False  # device time recorded
    launch: bool = False  # a CUDA run without device time
    # (module, phase) of compiled regions that ran with no kernel of their own (their ops
    # fused into other modules' kernels): no numbers, but not absent from the run
    fused: set[Key] = field(default_factory=set)
    # the step time's own step-to-step spread (step_spread): None with fewer than 2 steps
    step_spread_ns: float | None = None


def step_spread(step_ns: np.ndarray) -> float | None:
    """How much one run's step time varies from step to step: the interquartile range
    of its complete steps' durations from 4 steps on, their range with 2 or 3 (issue #47:
    two identical 3-step runs differed by 12% with nothing saying it was noise); None
    with fewer (unknown)."""
    if len(step_ns) >= 4:
        q75, q25 = np.percentile(step_ns, [75, 25])
        return float(q75 - q25)
    if len(step_ns) >= 2:
        return float(np.max(step_ns) - np.min(step_ns))
    return None


@dataclass
class Part:
    """One trace's numbers per (module, phase), in the form that pools: the windows of
    one process are pooled by concatenating their calls and their steps.

    ``total`` / ``self_ns`` / ``calls``: one value per column, a column being a
    complete step (``n_steps`` of them), or the whole run when there is none.
    ``calls_ns``: every call's duration, sorted, kept only when the part may be
    pooled (a window); ``p50`` is exact for the part alone.
    """

    types: dict[Key, str]
    p50: dict[Key, float]
    calls_ns: dict[Key, np.ndarray] | None
    total: dict[Key, np.ndarray]
    self_ns: dict[Key, np.ndarray]
    calls: dict[Key, np.ndarray]
    n_steps: int
    step_ns: np.ndarray  # the complete steps' durations
    root_ns: float  # the root calls' time in the columns, summed
    span_definition: int = SPAN_DEFINITION
    # the whole run's (every span, in a step or not): for comparing with a run without steps
    run: dict[Key, tuple[float, float, float]] = field(default_factory=dict)  # total, self, calls
    run_root_ns: float = 0.0
    # per key, when not "measured": "kernels" (kernel-derived inside compiled regions,
    # hooktrace.analysis.kernels) or "measured+kernels"
    timing: dict[Key, str] = field(default_factory=dict)
    # the median call's self time; every call's self time, sorted, as calls_ns
    p50_self: dict[Key, float] = field(default_factory=dict)
    self_calls_ns: dict[Key, np.ndarray] | None = None
    # the interquartile range of the calls' durations (for a run without steps' noise)
    iqr: dict[Key, float] = field(default_factory=dict)
    gpu: bool = False  # device time recorded (the GPU_PHASES keys, hooktrace.analysis.device_time)
    launch: bool = False  # a CUDA run without device time: host times are launch times
    fused: set[Key] = field(default_factory=set)  # as RunStats.fused


def whole_run(part: Part) -> Part:
    """``part`` with the whole run as its one column (as a part without steps)."""
    if not part.n_steps:
        return part
    return replace(part, total={k: np.array([v[0]]) for k, v in part.run.items()},
                   self_ns={k: np.array([v[1]]) for k, v in part.run.items()},
                   calls={k: np.array([v[2]]) for k, v in part.run.items()},
                   n_steps=0, step_ns=np.zeros(0, np.int64), root_ns=part.run_root_ns)


def steps_in_one(pa: Sequence[Part], pb: Sequence[Part], names: tuple[str, str]
                  ) -> tuple[str, int] | None:
    """When one run has complete steps and the other none: that run's name and steps."""
    a_steps, b_steps = (sum(p.n_steps for p in ps) for ps in (pa, pb))
    if bool(a_steps) == bool(b_steps):
        return None
    return (names[0], a_steps) if a_steps else (names[1], b_steps)


def unit_note(pa: Sequence[Part], pb: Sequence[Part], names: tuple[str, str]) -> list[str]:
    """Both runs per step, or both per run: when one run has steps and the other none,
    both are compared per run (``whole_run`` on every part), and this note says so."""
    one = steps_in_one(pa, pb, names)
    if one is None:
        return []
    return [f"{one[0]} has {one[1]} complete steps and the other run none: both are compared "
            "per run (whole runs); compare runs of the same length"]


def ranks_unit_note(pa: Mapping[int, Sequence[Part]], pb: Mapping[int, Sequence[Part]],
                     names: tuple[str, str]) -> list[str]:
    """:func:`unit_note` of rank directories, rank by rank: when a rank in both runs
    has steps in one and none in the other, every rank is compared per run (so that
    the rows, over ranks, are all in one unit), and this note says so."""
    odd = {r: one for r in sorted(set(pa) & set(pb))
           if (one := steps_in_one(pa[r], pb[r], names)) is not None}
    if not odd:
        return []
    rank, (stepped, n) = next(iter(odd.items()))
    more = f" (and {len(odd) - 1} more ranks)" if len(odd) > 1 else ""
    return [f"{stepped} has {n} complete steps on rank {rank} and the other run none{more}: "
            "every rank is compared per run (whole runs); compare runs of the same length"]


def trace_part(trace: TraceData, keep_calls: bool = False) -> Part:
    steps = trace.steps()
    complete = np.flatnonzero(steps.complete)
    n_steps = len(complete)
    # the per-call table (hooktrace.analysis.calls: measured and kernel-derived calls, the
    # one self time); compiles are not a module's
    calls = Calls.from_trace(trace)
    keep = calls.timing != COMPILE
    # per call: its column among the complete steps (-1: outside them; 0 for every call
    # of a run without complete steps: the whole run is its one column)
    span_col = (calls.step_columns(steps.number[complete]) if n_steps
                else np.zeros(len(calls), np.int64))
    dur, root, derived = calls.dur, calls.root, calls.timing == KERNELS
    part = Part({}, {}, {} if keep_calls else None, {}, {}, {}, n_steps,
                 steps.duration_ns[complete].astype(np.int64), 0.0,
                 span_definition(trace.info), self_calls_ns={} if keep_calls else None)
    kp = key_phases(calls.cat, calls.eval, device=False)
    for k, phase in enumerate(PHASES):
        sel = np.flatnonzero(keep & (kp == k))
        add_calls(part, phase, calls.module[sel], dur[sel], calls.self_ns[sel], span_col[sel],
                  max(n_steps, 1), derived[sel], lambda m: (calls.names[m], calls.types[m]),
                  "measured+kernels")
        roots = root[sel]
        part.root_ns += float(dur[sel][roots & (span_col[sel] >= 0)].sum())
        part.run_root_ns += float(dur[sel][roots].sum())
    if gpu_recorded(trace):
        add_gpu_phases(part, trace, complete)
    elif kernels_recorded(trace):
        add_kernel_phases(part, trace, complete)
    part.launch = launch_time_only(trace)
    # modules inside compiled regions with no time of their own: fused into other
    # modules' kernels, or with no ops at all (kernels.silent_in_regions)
    for slot, eval_, phase in fused_modules(trace) | silent_in_regions(trace):
        if not (eval_ and phase == "backward"):
            part.fused.add((trace.modules[slot][0], "eval" if eval_ else phase))
    return part


def add_gpu_phases(part: Part, trace: TraceData, complete: np.ndarray) -> None:
    """The run's device time as the GPU_PHASES rows of ``part``: per (module, phase) its
    intervals as calls, in the columns of the complete steps that were timed
    (``gpu_every=N`` times every N-th: the others would count as 0), or the whole run."""
    gpu = gpu_spans(trace)
    part.gpu = True
    if not len(gpu):
        return
    m = module_gpu(trace, len(trace.modules))
    timed = np.intersect1d(complete, m.step[m.step >= 0])
    n_cols = max(len(timed), 1) if part.n_steps else 1
    col = np.full(len(trace.steps()) + 1, -1, np.int64)
    if part.n_steps:
        col[timed] = np.arange(len(timed))
        span_col = col[m.step]
    else:
        span_col = np.zeros(len(gpu), np.int64)
    is_eval = m.group >= m.n_mod
    module = m.group % m.n_mod

    kp = key_phases(np.where(m.backward, CAT_BACKWARD, CAT_FORWARD), is_eval, device=True)
    for k, phase in enumerate(GPU_PHASES, EVAL + 1):
        sel = np.flatnonzero(kp == k)
        # (an interval without a host span: a kernel site of a compiled region)
        add_calls(part, phase, module[sel], gpu.duration_ns[sel], gpu.self_ns[sel],
                  span_col[sel], n_cols, gpu.span[sel] < 0, _name_of(trace), "kernels")


def add_kernel_phases(part: Part, trace: TraceData, complete: np.ndarray) -> None:
    """The run's kernel busy time (CUPTI, hooktrace.analysis.kernel_time) as the
    GPU_PHASES rows of ``part``: each module call that launched kernels is a call of
    its busy time (self: its own kernels'), in the columns of the complete steps."""
    spans, sk = trace.spans(), span_kernels(trace)
    part.gpu = True
    has = np.flatnonzero(sk.count > 0)
    n_cols = max(len(complete), 1) if part.n_steps else 1
    col = np.full(len(trace.steps()) + 1, -1, np.int64)
    col[complete] = np.arange(len(complete))
    span_col = col[trace.span_steps()[has]] if part.n_steps else np.zeros(len(has), np.int64)
    is_eval = (spans.flags[has] & SPAN_EVAL) != 0
    backward = spans.cat[has] == CAT_BACKWARD
    module = spans.module[has].astype(np.int64)

    # (an eval backward call's kernels are gpu backward here)
    kp = key_phases(spans.cat[has], is_eval & ~backward, device=True)
    for k, phase in enumerate(GPU_PHASES, EVAL + 1):
        sel = np.flatnonzero(kp == k)
        add_calls(part, phase, module[sel], sk.busy[has][sel], sk.self_busy[has][sel],
                  span_col[sel], n_cols, np.zeros(len(sel), bool), _name_of(trace), "kernels")


def _name_of(trace: TraceData) -> Callable[[int], tuple[str, str]]:
    """A module slot's (name, type) in ``trace``; ``<module N>`` past its table."""
    return lambda m: trace.modules[m] if m < len(trace.modules) else (f"<module {m}>", "?")


def add_calls(part: Part, phase: str, module: np.ndarray, dur: np.ndarray, self_ns: np.ndarray,
              col: np.ndarray, width: int, derived: np.ndarray,
              name_of: Callable[[int], tuple[str, str]], mixed: str) -> None:
    """One phase's calls into ``part``, per (module, ``phase``): per call, its ``module``
    (``name_of`` gives its name and type), ``dur``, ``self_ns``, its column ``col`` among
    ``width`` (-1: none) and whether it is kernel-derived (``derived``: the key's timing
    is "kernels" when all its calls are, else ``mixed``)."""
    if not len(module):
        return
    n_mod = int(module.max()) + 1
    g = Groups(module, dur, self_ns, n_mod)
    p50, p50_self = g.percentile(50), g.self_percentile(50)
    iqr = g.percentile(75) - g.percentile(25)
    ok = col >= 0
    cell = module[ok] * width + col[ok]
    per_col = np.bincount(cell, weights=dur[ok], minlength=n_mod * width).reshape(n_mod, width)
    self_col = np.bincount(cell, weights=self_ns[ok],
                           minlength=n_mod * width).reshape(n_mod, width)
    n_calls = np.bincount(cell, minlength=n_mod * width).reshape(n_mod, width)
    n_derived = np.bincount(module, weights=derived, minlength=n_mod)
    for k, m in enumerate(g.ids.tolist()):
        name, type_name = name_of(m)
        key = (name, phase)
        part.run[key] = (float(g.total[k]), float(g.self_total[k]), float(g.counts[k]))
        part.types[key] = type_name
        part.p50[key] = float(p50[k])
        part.p50_self[key] = float(p50_self[k])
        part.iqr[key] = float(iqr[k])
        if part.calls_ns is not None and part.self_calls_ns is not None:
            part.calls_ns[key] = g.values(k).copy()
            part.self_calls_ns[key] = g.self_values(k).copy()
        part.total[key] = per_col[m].copy()
        part.self_ns[key] = self_col[m].copy()
        part.calls[key] = n_calls[m].astype(np.float64)
        if n_derived[m]:
            part.timing[key] = "kernels" if n_derived[m] == g.counts[k] else mixed


def part_from_tables(t: Mapping[str, Any], info: Mapping[str, Any], gpu: bool,
                      keep_calls: bool) -> Part:
    """A :class:`Part` from :func:`hooktrace.data.engine.diff_tables`' results of one
    file (``split_files``: a table without rows of the file is absent; ``info``: the
    file's metadata; ``gpu``: device time recorded)."""
    step_ns = (t["steps"].column("dur_ns").to_numpy().astype(np.int64) if "steps" in t
               else np.zeros(0, np.int64))
    n_steps = len(step_ns)
    part = Part({}, {}, {} if keep_calls else None, {}, {}, {}, n_steps, step_ns, 0.0,
                 span_definition(dict(info)), self_calls_ns={} if keep_calls else None)
    roots = t["host_roots"].to_pylist()[0] if "host_roots" in t else {"in_steps": 0, "run": 0}
    part.root_ns, part.run_root_ns = float(roots["in_steps"]), float(roots["run"])
    for side in ("host", "gpu") if gpu else ("host",):
        width = max(n_steps, 1)
        if side == "gpu":
            part.gpu = True
            if n_steps:
                width = max(int(t["gpu_timed"].column("n")[0].as_py()) if "gpu_timed" in t
                            else 0, 1)
        cells: dict[tuple[int, int], list[np.ndarray]] = {}
        if f"{side}_cells" in t:
            c = {k: t[f"{side}_cells"].column(k).to_numpy()
                 for k in t[f"{side}_cells"].column_names}
            for kp_slot, rows in _by_key(c):
                cells[kp_slot] = [np.zeros(width) for _ in range(3)]
                for v, name in zip(cells[kp_slot], ("total_ns", "self_ns", "calls")):
                    v[c["col"][rows]] = c[name][rows]
        calls_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        if keep_calls and f"{side}_calls" in t:
            k = {n: t[f"{side}_calls"].column(n).to_numpy() for n in
                 ("key_phase", "slot", "dur_ns", "self_ns")}
            for kp_slot, rows in _by_key(k):
                calls_of[kp_slot] = (np.sort(k["dur_ns"][rows]).astype(np.int64),
                                     np.sort(k["self_ns"][rows]).astype(np.int64))
        zero = np.zeros(width)
        for row in t[f"{side}_keys"].to_pylist() if f"{side}_keys" in t else []:
            kp, slot = int(row["key_phase"]), int(row["slot"])
            key = (row["module"], KEY_PHASES[kp])
            part.types[key] = row["type"]
            q25, p50, q75 = (float(q) for q in row["q"])  # (one sort for the three)
            part.p50[key] = p50
            part.p50_self[key] = float(row["p50_self"])
            part.iqr[key] = q75 - q25
            total, self_, calls = cells.get((kp, slot), [zero, zero, zero])
            part.total[key], part.self_ns[key], part.calls[key] = (total.copy(), self_.copy(),
                                                                   calls.copy())
            part.run[key] = (float(row["total_ns"]), float(row["self_ns"]),
                             float(row["calls"]))
            if keep_calls and part.calls_ns is not None and part.self_calls_ns is not None:
                part.calls_ns[key], part.self_calls_ns[key] = calls_of[(kp, slot)]
            if row["derived"]:
                part.timing[key] = ("kernels" if side == "gpu" or row["derived"] == row["calls"]
                                    else "measured+kernels")
    part.launch = info.get("accelerator") == "cuda" and not gpu  # (launch_time_only)
    return part


def _by_key(cols: Mapping[str, np.ndarray]) -> Iterator[tuple[tuple[int, int], slice]]:
    """The rows of each (key_phase, slot) of a table's columns sorted by them."""
    keys = cols["key_phase"].astype(np.int64) * (1 << 32) + cols["slot"].astype(np.int64)
    bounds = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True]) if len(keys) else keys
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield (int(cols["key_phase"][a]), int(cols["slot"][a])), slice(a, b)


def spread(per_step: np.ndarray, call_iqr: float, calls: float) -> float:
    """Run-to-run noise of a (module, phase)'s time per step: the interquartile range
    of its time over the complete steps, from 4 steps on; else (fewer steps, or the
    whole run as one) the calls' interquartile range times the calls per step."""
    if len(per_step) >= 4:
        q75, q25 = np.percentile(per_step, [75, 25])
        return float(q75 - q25)
    return float(call_iqr * calls)


def pool(parts: Sequence[Part]) -> RunStats:
    """One run's numbers from its parts (a file, or the windows of one process): p50
    per call over all their calls, medians over all their complete steps (their sums
    when no part has complete steps: then the run has no steps)."""
    definitions = sorted({p.span_definition for p in parts})
    if len(definitions) > 1:
        raise DiffInputError(
            "hooktrace diff: one run's files were recorded under different span definitions "
            f"({', '.join(definition_text(d) for d in definitions)}); re-record them with one "
            "hooktrace version")
    stepped = [p for p in parts if p.n_steps]
    n_steps = sum(p.n_steps for p in stepped)
    keys: dict[Key, str] = {}
    for p in parts:
        for key, type_name in p.types.items():
            keys.setdefault(key, type_name)
    out = {}
    for key, type_name in keys.items():
        if len(parts) == 1:  # (exact, and a part alone keeps no calls)
            p50, p50_self, iqr = parts[0].p50[key], parts[0].p50_self[key], parts[0].iqr[key]
        else:
            calls_ns, self_calls_ns = [], []
            for p in parts:
                if key in p.types:
                    if p.calls_ns is None or p.self_calls_ns is None:
                        raise ValueError("hooktrace.analysis.diff: a part to pool was made "
                                         "without its calls")
                    calls_ns.append(p.calls_ns[key])
                    self_calls_ns.append(p.self_calls_ns[key])
            every = np.concatenate(calls_ns)
            p50, p50_self = float(np.median(every)), float(np.median(np.concatenate(self_calls_ns)))
            q75, q25 = np.percentile(every, [75, 25])
            iqr = float(q75 - q25)
        total, self_ns, calls = (pooled_column(parts, stepped, f, key)
                                 for f in ("total", "self_ns", "calls"))
        per_step = (np.concatenate([p.total.get(key, np.zeros(p.n_steps)) for p in stepped])
                    if stepped else np.zeros(0))
        out[key] = PhaseStats(type_name, p50, total, self_ns, calls, pooled_timing(parts, key),
                               p50_self, spread(per_step, iqr, calls))
    step_ns = np.concatenate([p.step_ns for p in stepped]) if n_steps else np.zeros(0)
    step_p50 = float(np.median(step_ns)) if n_steps else None
    root_total = (sum(p.root_ns for p in stepped) / n_steps if n_steps
                  else sum(p.root_ns for p in parts))
    return RunStats(out, n_steps, step_p50, step_p50 if step_p50 else root_total,
                     definitions[0], all(p.gpu for p in parts), any(p.launch for p in parts),
                     set().union(*(p.fused for p in parts)) - set(out), step_spread(step_ns))


def pooled_timing(parts: Sequence[Part], key: Key) -> str:
    kinds = {k for p in parts if key in p.types
             for k in p.timing.get(key, "measured").split("+")}
    return "+".join(k for k in ("measured", "kernels") if k in kinds)


def pooled_column(parts: Sequence[Part], stepped: Sequence[Part], field: str, key: Key
                   ) -> float:
    """The median over every complete step of every part, or the sum of the parts'
    whole-run values when none has complete steps."""
    if stepped:
        return float(np.median(np.concatenate([
            getattr(p, field).get(key, np.zeros(p.n_steps)) for p in stepped])))
    return float(sum(getattr(p, field)[key][0] for p in parts if key in p.types))


def trace_parts(trace: TraceData | Sequence[TraceData]) -> list[Part]:
    trace = as_data(trace)
    traces = [trace] if isinstance(trace, TraceData) else [as_data(t) for t in trace]
    if not traces:
        raise ValueError("hooktrace.analysis.diff: a run of no trace")
    return [trace_part(t, keep_calls=len(traces) > 1) for t in traces]


def definition_text(d: int) -> str:
    return f"{d}: {SPAN_DEFINITIONS.get(d, 'unknown')}"


# -- paths: files, rank directories, windows -------------------------------------------


def file_part(path: str) -> tuple[RankFile, Part]:
    """Read one file and reduce it (runs in a worker process for many files)."""
    trace = load(path)
    meta = file_meta(path, trace)
    return meta, trace_part(trace, keep_calls=meta.window is not None)


def result_part(results: Mapping[str, tuple[RankFile, Part] | str], path: str) -> Part:
    res = results[os.path.realpath(path)]
    assert not isinstance(res, str)
    return res[1]
