"""An ``aggregate=DIR`` folder read back (issue #31; the recording that writes it is
:mod:`hooktrace.record.aggregate`, a window's rows :mod:`hooktrace.analysis.aggregates`):
the names of its files, the aggregate table of its parts (:func:`load_aggregates`), the
steps it kept whole (:func:`kept_steps`), and ``hooktrace summary DIR`` / ``hooktrace diff
A B`` of such folders (:func:`aggregate_summary`, :func:`aggregate_diff`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from hooktrace.analysis.aggregates import KEPT_INDEX, LIVE_DIR, ranks_only, source_labels


# DIR/aggregates/PART_NAME: a finished part (a part being written has a leading "." and
# ends in .tmp: pyarrow's datasets and duckdb's *.parquet both skip it, issue #35); the run
# is in the name so that runs and ranks sharing a folder never replace each other's parts
PART_NAME = re.compile(r"part-(?:(?P<run>.+)-)?(?P<n>\d+)\.parquet")
# DIR/steps/STEP_NAME: a step kept whole (step-N.htrace: written before the run was named)
STEP_NAME = re.compile(r"step-(?P<step>\d+)(?:_(?P<run>.+))?\.htrace")


def step_rows(table: Any) -> Any:
    """The step rows (mode ``step``: the steps' wall times, a row per window) of an
    aggregate table."""
    import pyarrow.compute as pc

    return table.filter(pc.equal(table["mode"].cast("string"), "step"))


def steps_aggregated(table: Any) -> int:
    """How many steps the aggregate ``table`` holds: the sum of its step rows' ``steps``."""
    import pyarrow.compute as pc

    return int(pc.sum(step_rows(table)["steps"]).as_py() or 0)


# What the summary's and the report's p50 column is (issue #47: it was the median of the
# windows' medians, unweighted: 143 ms on a run whose steps took 55 ms at the median)
P50_MEANING = ("p50 ms/step: the median step's (each window's time per step, weighted by its "
               "steps)")


def weighted_medians(groups: Any, values: Any, weights: Any, n_groups: int) -> Any:
    """Per group ``0 .. n_groups - 1``: the median of its ``values``, each counted
    ``weights`` times (NaN for a group with none); the mean of the two middle values
    when the weights split evenly, as numpy's median does.

    Example:
        >>> import numpy as np
        >>> weighted_medians(np.array([0, 0, 0, 1, 1]), np.array([143.0, 55.0, 60.0, 1.0,
        ...                  3.0]), np.array([1, 17, 2, 1, 1]), 2).tolist()
        [55.0, 2.0]
    """
    import numpy as np

    groups = np.asarray(groups, np.int64)
    values = np.asarray(values, np.float64)
    weights = np.asarray(weights, np.float64)
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    cum = np.cumsum(weights[order])
    ids = np.arange(n_groups)
    start, end = np.searchsorted(g, ids, "left"), np.searchsorted(g, ids, "right")
    out = np.full(n_groups, np.nan)
    has = end > start
    before = np.where(start > 0, cum[np.maximum(start - 1, 0)], 0.0)
    half = before + (cum[np.maximum(end - 1, 0)] - before) / 2
    at = np.minimum(np.searchsorted(cum, half, "left"), np.maximum(end - 1, 0))
    even = has & (cum[at] == half) & (at + 1 < end)
    out[has] = v[at[has]]
    out[even] = (v[at[even]] + v[at[even] + 1]) / 2
    return out


def p50_per_step(table: Any) -> dict[tuple[str, str], float]:
    """Per (module, mode) of an aggregate table: the median over the steps of its time
    per step, each window's (its total over its steps) weighted by its steps, over the
    windows the row is in (a module's eval calls: over the windows that had some):
    :data:`P50_MEANING`. With a window per step (``aggregate_interval=0``), the median
    step exactly."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(table):
        return {}
    keys = pa.table({"module": table["module"].cast(pa.string()),
                     "mode": table["mode"].cast(pa.string())})
    exact = table["total_ns"].null_count == 0
    total = (pc.divide(pc.cast(table["total_ns"], pa.float64()), 1e6) if exact
             else pc.cast(table["total_ms"], pa.float64()))
    steps = np.maximum(pc.fill_null(table["steps"], 1).to_numpy(zero_copy_only=False), 1)
    per_step = pc.fill_null(total, 0.0).to_numpy(zero_copy_only=False) / steps
    unique = keys.group_by(["module", "mode"]).aggregate([]).to_pylist()
    index = {(u["module"], u["mode"]): i for i, u in enumerate(unique)}
    groups = np.fromiter((index[k] for k in zip(keys["module"].to_pylist(),
                                                 keys["mode"].to_pylist())),
                         np.int64, len(table))
    medians = weighted_medians(groups, per_step, steps, len(unique))
    return {k: float(medians[i]) for k, i in index.items()}


def aggregate_rows(table: Any) -> tuple[list[dict[str, Any]], int]:
    """Per (module, mode) over the run, largest total first (the step row on top), and
    the number of steps aggregated; the recorded quantities' columns reduced as their
    providers declare (hooktrace.analysis.column_provider.Column: ``reduce``, row key
    ``key``). ``table``: :func:`load_aggregates`' (every declared column there)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from hooktrace.analysis.columns import declared
    from hooktrace.data.schema import AGGREGATES

    f64 = pa.float64()
    n_steps = steps_aggregated(table)
    total = pc.cast(table["total_ms"], f64)
    work = {"module": table["module"].cast(pa.string()), "mode": table["mode"].cast(pa.string()),
            "calls": table["calls"], "total_ms": total, "max_ms": pc.cast(table["max_ms"], f64)}
    how = [("calls", "sum"), ("total_ms", "sum"), ("max_ms", "max")]
    quantities = declared(AGGREGATES)
    for c in quantities:
        if c.reduce == "weighted":  # each window's weighted by its time (the weight's when there)
            values = pc.cast(table[c.name], f64)
            basis = total
            if c.weight:
                weight = pc.cast(table[c.weight], f64)
                basis = pc.if_else(pc.is_valid(weight), weight, total)
            basis = pc.if_else(pc.is_valid(values), basis, pa.scalar(None, f64))
            work[c.name + "_work"], work[c.name + "_time"] = pc.multiply(values, basis), basis
            how += [(c.name + "_work", "sum"), (c.name + "_time", "sum")]
        else:
            work[c.name] = (pc.cast(table[c.name], f64) if c.reduce == "per_step"
                            else table[c.name])
            how.append((c.name, "max" if c.reduce == "max" else "sum"))
    grouped = pa.table(work).group_by(["module", "mode"]).aggregate(how).to_pylist()
    p50 = p50_per_step(table)
    rows = []
    per = max(1, n_steps)
    for g in grouped:
        row = {"module": g["module"], "mode": g["mode"], "calls": g["calls_sum"],
               "total_ms": g["total_ms_sum"], "ms_per_step": (g["total_ms_sum"] or 0.0) / per,
               "p50_ms_per_step": p50.get((g["module"], g["mode"])), "max_ms": g["max_ms_max"]}
        for c in quantities:
            if c.reduce == "weighted":
                time = g[c.name + "_time_sum"]
                row[c.key] = g[c.name + "_work_sum"] / time if time else None
            elif c.reduce == "per_step":
                row[c.key] = None if g[c.name + "_sum"] is None else g[c.name + "_sum"] / per
            else:
                row[c.key] = g[f"{c.name}_{'max' if c.reduce == 'max' else 'sum'}"]
        rows.append(row)
    rows.sort(key=lambda r: (r["mode"] != "step", -(r["total_ms"] or 0.0)))
    return rows, n_steps


def part_files(folder: str) -> list[str]:
    """The finished parts in an aggregates folder, by name: a part a killed run left half
    written (``.part-*.tmp``, or ``part-N.parquet.tmp`` of older versions) is not one."""
    return sorted(f for f in os.listdir(folder) if not f.startswith((".", "_"))
                  and f.endswith(".parquet"))


def load_aggregates(path: str | os.PathLike[str]) -> Any:
    """The aggregate table of ``trace(aggregate=DIR)`` (DIR, DIR/aggregates or one part) as a
    pyarrow Table, rows in (run, rank, step) order, with the ``run`` and ``rank`` of each
    row (a part written before they were: ``run`` from its name, ``rank`` null); an
    unreadable part is hooktrace's one-line InputPathError (``summary``, ``diff`` and
    ``report`` all read through here)."""
    folder = os.fspath(path)
    if os.path.isdir(os.path.join(folder, "aggregates")):
        folder = os.path.join(folder, "aggregates")
    names: list[str]
    if os.path.isfile(folder) and folder.endswith(".parquet"):  # one part (issue #38)
        folder, name = os.path.split(folder)
        names = [name]
    else:
        names = part_files(folder) if os.path.isdir(folder) else []
    if not names:
        from hooktrace._naming import is_aggregate_dir

        top = os.path.dirname(folder) if os.path.basename(folder) == "aggregates" else folder
        if is_aggregate_dir(top):
            from hooktrace.errors import InputPathError

            # an aggregate= folder whose runs have not written a part (killed before the
            # first, or still running): what they recorded, not N "ranks" (issue #47)
            raise InputPathError(no_parts_problem(top, os.fspath(path)))
        raise FileNotFoundError(f"{os.fspath(path)}: no aggregate parts (part-*.parquet) there")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hooktrace.data.schema import AGGREGATES, schema
    from hooktrace.data.validate import ParquetInputError, check_rows, check_table
    from hooktrace.errors import InputPathError
    from hooktrace.text import display_path

    declared = schema(AGGREGATES)
    # every part checked against the schema first (issue #35): a part from elsewhere is
    # one line naming it and its column (parts of older versions, without the run and
    # rank columns, are read as below)
    parts = [os.path.join(folder, n) for n in names]
    try:
        check_table(AGGREGATES, parts)
        check_rows(AGGREGATES, parts)
    except ParquetInputError as e:
        raise InputPathError(f"{display_path(os.fspath(path))}: the aggregate table cannot be "
                             f"read: {e}") from None
    tables = []
    for name in names:
        try:
            t = pq.read_table(os.path.join(folder, name))
        except (pa.ArrowException, OSError) as e:  # a part cut short, or not Parquet
            first = next((line.strip() for line in str(e).splitlines() if line.strip()),
                         type(e).__name__)
            raise InputPathError(f"{os.fspath(path)}: the aggregate table cannot be read: "
                                 f"{name}: {first}") from None
        if "run" not in t.column_names:  # (written before runs were told apart)
            match = PART_NAME.fullmatch(name)
            t = t.append_column("run", pa.array([match and match["run"] or ""] * len(t),
                                                pa.string()))
        for f in declared:  # a column a part was written without (older versions): null
            if f.name not in t.column_names:
                t = t.append_column(f.name, pa.nulls(len(t), f.type))
        tables.append(t)
    try:  # each part as declared first: older and newer parts type a column alike
        table = pa.concat_tables([t.select(declared.names).cast(declared) for t in tables])
    except (pa.ArrowException, KeyError) as e:
        raise InputPathError(f"{os.fspath(path)}: the aggregate parts do not make one "
                             f"table of the declared columns: {str(e).splitlines()[0]}"
                             ) from None
    import pyarrow.compute as pc

    keys = pa.table({"run": table["run"].cast(pa.string()), "rank": table["rank"],
                     "step": table["step"]})
    return table.take(pc.sort_indices(keys, sort_keys=[
        ("run", "ascending"), ("rank", "ascending"), ("step", "ascending")]))


# The live file's fields the readers use for what a run lost, and their types (the file
# is another program's output: one of another type is as good as absent). Written before
# these were, a live file has no host: such a run is left out.
_PROGRESS_FIELDS: dict[str, type | tuple[type, ...]] = {
    "run": str, "host": str, "pid": int, "steps": int, "unix_ns": int,
    "part_interval": (int, float), "ended": bool}


def run_progress(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """How far each run of an ``aggregate=`` folder got, from its live file
    (DIR/live/<run>.json, hooktrace.record.aggregate): ``run``, ``host``, ``pid``,
    ``steps`` (marked by then), ``unix_ns`` (when), ``part_interval`` and ``ended``
    (whether it wrote its last part), in run order. A file that is not such a record
    (cut short, another program's, a FIFO: never opened) is left out."""
    from hooktrace._input import files_under, open_input

    out = []
    for name in files_under(os.path.join(os.fspath(path), LIVE_DIR), (".json",),
                            recursive=False):
        try:
            with open_input(name) as f:
                record = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not all(
                isinstance(record.get(k), kind) and not (kind is int and isinstance(
                    record.get(k), bool)) for k, kind in _PROGRESS_FIELDS.items()):
            continue
        out.append({k: record[k] for k in _PROGRESS_FIELDS})
    return out


def _alive(record: dict[str, Any]) -> bool | None:
    """Whether the run's process still runs: None where that cannot be told (another
    host)."""
    import socket

    if record["host"] != socket.gethostname():
        return None
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process: it exists)
        return True
    return True


def unwritten_lines(path: str | os.PathLike[str], table: Any = None) -> list[str]:
    """What the folder lacks of the steps its runs recorded, a line per run that did not
    write its last part: killed (kill -9, the OOM killer, a crash: the steps since its
    last part are lost) or still running (not written yet); [] when every run ended."""
    import time

    folder = os.fspath(path).rstrip(os.sep)
    if os.path.isfile(folder):  # one part: DIR/aggregates/part-*.parquet
        folder = os.path.dirname(folder)
    if os.path.basename(folder) == "aggregates":  # DIR/aggregates
        folder = os.path.dirname(folder)
    in_table = steps_by_run(table) if table is not None else {}
    lines = []
    for r in run_progress(folder):
        if r["ended"]:
            continue
        steps, next_step = in_table.get(r["run"], (0, 0))
        missing = max(0, r["steps"] - steps)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["unix_ns"] / 1e9))
        counted = f"at least {missing}, those it recorded by {when}"
        alive = _alive(r)
        if alive:
            lines.append(f"run {r['run']} is still running (pid {r['pid']}): its steps from "
                         f"step {next_step} on are not in a part yet ({counted}; a part every "
                         f"{r['part_interval']:g} s)")
        elif alive is None:
            lines.append(f"run {r['run']} did not end (killed, or still running on "
                         f"{r['host']}): its steps from step {next_step} on are not in the "
                         f"folder ({counted})")
        else:
            lines.append(f"run {r['run']} ended without writing its last part (killed: kill "
                         f"-9, the OOM killer, a crash): its steps from step {next_step} on "
                         f"are lost ({counted})")
    return lines


def no_parts_problem(folder: str, given: str) -> str:
    """The one line for an ``aggregate=`` folder with no part: what its runs recorded,
    and the steps it kept whole (traces of their own)."""
    lines = unwritten_lines(folder)
    kept = kept_steps(folder)
    said = "; ".join(lines) if lines else "no run has written a part into it"
    if kept:
        said += (f"; the steps it kept whole are traces: {kept[0]['path']}"
                 + (f" and {len(kept) - 1} more in {os.path.join(folder, 'steps')}"
                    if len(kept) > 1 else ""))
    return f"{given}: an aggregate= folder with no part (part-*.parquet) yet: {said}"


def steps_by_run(table: Any) -> dict[str, tuple[int, int]]:
    """Per run of an aggregate table: the steps its step rows hold, and the step after
    its last window's."""
    rows = step_rows(table)
    out: dict[str, tuple[int, int]] = {}
    for run, first, n in zip(rows["run"].cast("string").to_pylist(), rows["step"].to_pylist(),
                             rows["steps"].to_pylist(), strict=True):
        steps, after = out.get(str(run), (0, 0))
        out[str(run)] = (steps + int(n or 0), max(after, int(first or 0) + int(n or 0)))
    return out


def runs_of(table: Any) -> list[tuple[str, int | None]]:
    """The (run, rank) pairs of an aggregate table, rank order first."""
    pairs = {(str(r), k) for r, k in zip(table["run"].to_pylist(), table["rank"].to_pylist(),
                                         strict=True)}
    return sorted(pairs, key=lambda p: (p[1] is None, p[1] or 0, p[0]))


def kept_steps(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The steps an ``aggregate=`` folder kept whole, in step order: ``step``, ``why``
    (None when DIR/kept.jsonl does not say) and ``path``, for each step-N_<run>.htrace still
    there."""
    steps = os.path.join(os.fspath(path), "steps")
    if not os.path.isdir(steps):
        return []
    why: dict[str, str] = {}
    rank: dict[str, int] = {}
    try:
        with open(os.path.join(os.fspath(path), KEPT_INDEX), encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    why[str(entry["file"])] = str(entry["why"])
                    if isinstance(entry.get("rank"), int):
                        rank[str(entry["file"])] = entry["rank"]
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a line cut short by a kill: that step's why is unknown
    except OSError:
        pass
    out = []
    for name in os.listdir(steps):
        match = STEP_NAME.fullmatch(name)
        if match:
            out.append({"step": int(match["step"]), "why": why.get(name),
                        "run": match["run"] or "", "rank": rank.get(name),
                        "path": os.path.join(steps, name)})
    return sorted(out, key=lambda k: (k["step"], k["run"]))


# The columns of `summary DIR --csv / --json` of an aggregate= folder (times in ms, as
# the aggregates hold them).
AGGREGATE_SUMMARY_COLUMNS = ("module", "mode", "calls", "total_ms", "ms_per_step",
                             "p50_ms_per_step", "max_ms", "nonfinite", "tflops", "total_ns",
                             "self_ns")


def aggregate_summary_data(path: str | os.PathLike[str], top: int | None = None
                           ) -> dict[str, Any]:
    """What ``hooktrace summary DIR`` shows of an ``aggregate=`` folder, as data: per
    module and mode over the whole run, the calls, the total time (and ``total_ns``,
    ``self_ns``: the summary's, exact, None in a folder an older hooktrace wrote), the
    time per step (``ms_per_step``: the mean over every step aggregated; ``p50_ms_per_step``:
    the median step's, :data:`P50_MEANING`), the longest call, non-finite values and
    TFLOP/s (``rows``; with several runs or ranks, ``ms_per_step_by_source`` too);
    ``counts`` (steps, rows, the runs and their steps) and the kept steps."""
    import pyarrow.compute as pc

    table = load_aggregates(path)
    for column in ("calls", "total_ns", "self_ns", "nonfinite", "steps"):
        # (values are >= 0, checked on reading: a column whose whole sum fits int64 sums
        # without wrapping in every group; Arrow's sums would wrap silently)
        if float(pc.sum(pc.cast(table[column], "float64", safe=False)).as_py() or 0) >= 2.0 ** 63:
            from hooktrace.errors import InputPathError

            raise InputPathError(f"{os.fspath(path)}: column {column} of the aggregates "
                                 "sums past int64; hooktrace writes no such values")
    n_steps = steps_aggregated(table)
    grouped = table.group_by(["module", "mode"]).aggregate([
        ("calls", "sum"), ("total_ms", "sum"),
        ("max_ms", "max"), ("nonfinite", "sum"), ("total_ns", "sum"),
        ("self_ns", "sum")]).to_pylist()
    p50 = p50_per_step(table)
    # total and self in integer ns, the summary's (issue #37), where every part holds them
    # (a folder an older hooktrace wrote has float ms only)
    exact = table["total_ns"].null_count == 0
    for r in grouped:
        if exact:
            r["total_ms_sum"] = r["total_ns_sum"] / 1e6
        else:
            r["total_ns_sum"] = r["self_ns_sum"] = None
    grouped.sort(key=lambda r: (r["mode"] != "step", -(r["total_ms_sum"] or 0.0)))
    if top is not None:
        grouped = grouped[: top + 1]
    # with flops=True: TFLOP/s over the run (each window's weighed by its time), as the
    # report has it
    tflops: dict[tuple[str, str], float | None] = {}
    if table["tflops"].null_count < len(table):
        tflops = {(r["module"], r["mode"]): r["tflops"] for r in aggregate_rows(table)[0]}
    runs = runs_of(table)
    # several runs or ranks in the folder: ms/step per rank (or run), as the straggler
    # table of a folder of rank traces has a column per rank
    steps_per, per_source = _per_source(table) if len(runs) > 1 else ({}, {})
    labels = source_labels(runs)
    rows = []
    for r in grouped:
        key = (str(r["module"]), str(r["mode"]))
        row: dict[str, Any] = {
            "module": key[0], "mode": key[1], "calls": r["calls_sum"],
            "total_ms": r["total_ms_sum"],
            "ms_per_step": (r["total_ms_sum"] or 0.0) / max(1, n_steps),
            "p50_ms_per_step": p50.get(key), "max_ms": r["max_ms_max"],
            "nonfinite": r["nonfinite_sum"], "tflops": tflops.get(key),
            "total_ns": r["total_ns_sum"], "self_ns": r["self_ns_sum"]}
        if per_source:
            row["ms_per_step_by_source"] = {labels[s]: per_source.get((key, s))
                                            for s in runs}
        rows.append(row)
    kept = kept_steps(path)
    steps_dir = os.path.join(os.fspath(path), "steps")
    return {"rows": rows,
            # the steps runs recorded that are not in the table (killed, still running)
            "unwritten": unwritten_lines(path, table),
            "counts": {"steps": n_steps, "rows": len(table),
                       "runs": [{"run": run, "rank": rank, "label": labels[(run, rank)],
                                 "steps": steps_per.get((run, rank), 0) if len(runs) > 1
                                 else n_steps}
                                for run, rank in runs],
                       "ranks_only": ranks_only(runs)},
            "kept_steps": [os.path.join(steps_dir, os.path.basename(k["path"])) for k in kept],
            "has_tflops": bool(tflops)}


def aggregate_summary(path: str | os.PathLike[str], top: int | None = None, *,
                      wide: bool = False, width: int | None = None) -> str:
    """``hooktrace summary DIR`` of an ``aggregate=`` folder, as text: the table of
    :func:`aggregate_summary_data`; the steps kept whole (DIR/steps) after it. Module names
    are cut to fit ``width`` columns (default: the terminal's) as every table cuts them
    (:func:`hooktrace.text.shorten_distinct`), unless ``wide``."""
    from hooktrace.text import CUT_NOTE, align_columns, text_lines

    data = aggregate_summary_data(path)
    counts = data["counts"]
    runs = counts["runs"]
    head = f"{os.fspath(path)}: {counts['steps']} steps aggregated, {counts['rows']} rows"
    which = "ranks" if counts["ranks_only"] else "runs"
    if len(runs) > 1:
        head += f", {len(runs)} {which}: " + ", ".join(
            f"{r['label']}: {r['steps']} steps" for r in runs[:MAX_SOURCE_COLUMNS])
        if len(runs) > MAX_SOURCE_COLUMNS:
            head += f" and {len(runs) - MAX_SOURCE_COLUMNS} more"
    shown = [r["label"] for r in runs[:MAX_SOURCE_COLUMNS]] if len(runs) > 1 else []
    tflops = data["has_tflops"]
    header = (["module", "mode", "calls", "total ms", "self ms", "ms/step"]
              + [label[:11] for label in shown]
              + ["p50 ms/step", "max ms", "nonfinite"] + (["TFLOP/s"] if tflops else []))
    rows = data["rows"] if top is None else data["rows"][: top + 1]  # (+ the step row)
    table = [header]
    for r in rows:
        nf, tf = r["nonfinite"], r["tflops"]
        each = [r.get("ms_per_step_by_source", {}).get(label) for label in shown]
        table.append(
            [r["module"], r["mode"], str(r["calls"]), f"{r['total_ms']:.2f}",
             "" if r["self_ns"] is None else f"{r['self_ns'] / 1e6:.2f}",
             f"{r['ms_per_step']:.3f}"]
            + ["" if v is None else f"{v:.3f}" for v in each]
            + [_ms(r["p50_ms_per_step"]), _ms(r["max_ms"]), "" if nf is None else str(nf)]
            + ([f"{'' if tf is None else f'{tf:.3g}'}"] if tflops else []))
    cut = _cut_names(table, [r["module"] for r in data["rows"]], wide, width)
    lines = [head] + align_columns(table, 2)
    lines.append(P50_MEANING + "; max ms: the longest call")
    if shown:
        lines.append(f"(ms/step: over all {which}' steps; then per {which[:-1]}; the runs: "
                     f"hooktrace query {os.fspath(path)} \"SELECT DISTINCT run, rank FROM "
                     f"aggregates\")")
    if cut:
        lines.append(CUT_NOTE)
    kept = data["kept_steps"]
    if kept:
        lines.append(f"steps kept whole ({len(kept)}), each a trace for summary, diff, "
                     f"report, export: {', '.join(kept[:5])}"
                     + (f" and {len(kept) - 5} more" if len(kept) > 5 else ""))
    lines += [f"note: {line}" for line in data["unwritten"]]
    return text_lines(lines)


def _ms(value: float | None) -> str:
    return "" if value is None or value != value else f"{value:.3f}"


def _cut_names(table: list[list[str]], every: list[str], wide: bool,
               width: int | None) -> bool:
    """Cut the module column (the first) of ``table`` (its header first) to what leaves
    the other columns ``width`` columns (default: the terminal's); ``every``: every
    row's name, those left out by --top included, so that a cut name never reads as
    another. Whether a name was cut."""
    from hooktrace.text import printable, shorten_distinct, terminal_width

    if wide or len(table) < 2:
        return False
    width = terminal_width() if width is None else width
    # (cells measured as printed: a name's control characters are written as escapes)
    widths = [max(len(printable(row[i])) for row in table) for i in range(len(table[0]))]
    room = max(width - sum(widths[1:]) - 2 * (len(widths) - 1), 16)
    if widths[0] <= room:
        return False
    cuts = dict(zip(every, shorten_distinct([printable(n) for n in every], room)))
    changed = False
    for row in table[1:]:
        new = cuts.get(row[0], row[0])
        changed = changed or new != printable(row[0])
        row[0] = new
    return changed


# summary of a folder of several runs or ranks: a ms/step column for this many
MAX_SOURCE_COLUMNS = 8


def _per_source(table: Any) -> tuple[dict[tuple[str, int | None], int],
                                      dict[tuple[tuple[str, str], tuple[str, int | None]], float]]:
    """The steps of each (run, rank), and the ms per step of each (module, mode) in each
    (run, rank), over that run's steps."""
    steps: dict[tuple[str, int | None], int] = {}
    totals: dict[tuple[tuple[str, str], tuple[str, int | None]], float] = {}
    for run, rank, module, mode, total, n in zip(
            table["run"].to_pylist(), table["rank"].to_pylist(),
            table["module"].cast("string").to_pylist(), table["mode"].cast("string").to_pylist(),
            table["total_ms"].to_pylist(), table["steps"].to_pylist(), strict=True):
        source = (str(run), rank)
        if mode == "step":
            steps[source] = steps.get(source, 0) + int(n or 0)
        key = ((str(module), str(mode)), source)
        totals[key] = totals.get(key, 0.0) + float(total or 0.0)
    return steps, {k: v / max(1, steps.get(k[1], 0)) for k, v in totals.items()}


def _per_step(path: str | os.PathLike[str]) -> dict[tuple[str, str], float]:
    """ms per step of each (module, mode) over an aggregate= folder's run."""
    return {(str(r["module"]), str(r["mode"])): r["ms_per_step"]
            for r in aggregate_rows(load_aggregates(path))[0]}


def aggregate_diff(a: str | os.PathLike[str], b: str | os.PathLike[str],
                   top: int | None = None, fail_above: float | None = None,
                   min_share: float = 1.0, width: int | None = None) -> tuple[str, list[str]]:
    """``hooktrace diff A B`` of two aggregate= folders: per module and mode, the ms per
    step in each and the change, largest first; and, with ``fail_above`` (percent), the
    lines of those slower by more than that among the rows holding at least
    ``min_share`` percent of A's step time. Module names are cut to fit ``width`` (default:
    the terminal's) as every table cuts them."""
    from hooktrace.text import CUT_NOTE, align_columns, printable, text_lines

    pa_, pb = _per_step(a), _per_step(b)
    step_a = pa_.get(("<step>", "step"), 0.0)
    keys = sorted(set(pa_) | set(pb), key=lambda k: (k[1] != "step",
                                                     -abs(pb.get(k, 0.0) - pa_.get(k, 0.0))))
    if top is not None:
        keys = keys[: top + 1]
    table = [["module", "mode", "A ms", "B ms", "delta", "change"]]
    failed = []
    for key in keys:
        x, y = pa_.get(key), pb.get(key)
        change = f"{(y - x) / x * 100:+.1f}%" if x and y is not None else "new" if x is None \
            else "gone"
        table.append([key[0], key[1], "" if x is None else f"{x:.3f}",
                      "" if y is None else f"{y:.3f}", f"{(y or 0.0) - (x or 0.0):+.3f}",
                      change])
        if fail_above is not None and x and y is not None and key[1] != "step" and \
                x >= step_a * min_share / 100 and (y - x) / x * 100 > fail_above:
            failed.append(f"{key[0]} {key[1]}: {x:.3f} -> {y:.3f} ms/step ({change})")
    cut = _cut_names(table, sorted({k[0] for k in set(pa_) | set(pb)}), False, width)
    lines = [f"A: {os.fspath(a)}  B: {os.fspath(b)} (ms per step, over each run)"]
    lines += align_columns(table, 2)
    if cut:
        lines.append(CUT_NOTE)
    return text_lines(lines), [printable(line) for line in failed]
