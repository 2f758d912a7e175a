"""The trace files of many ranks (issue #11), read one rank per worker.

``find_rank_files(["traces/"])`` lists the ``.htrace`` files under a directory
(recursively) or as given; ``RankSet.scan(paths)`` reads each one (in worker
processes for 4 files or more) and keeps only its metadata: rank, world size,
host, pid, clock offset to rank 0 and recorded interval. A file that is missing,
truncated or corrupt is one line in ``problems`` naming its path (and a rank
that no file holds, when the ranks' ``world_size`` says it should exist); the
other ranks go on. Ranks come in rank order (files without a rank after them,
by path).

Times: a rank's ``clock_offset_ns`` (its clock minus rank 0's, measured by
``hooktrace.record.distributed.align_clocks``) is subtracted from all its times, so
every rank is on rank 0's clock; ``uncertainty_ns`` says how well.

**Workers.** ``map_ranks(fn, paths)`` runs ``fn(path)`` for each file in a
``ProcessPoolExecutor`` with the ``forkserver`` start method (torch in a forked
child of a threaded parent can deadlock), each worker holding one rank's events
at a time and returning a small result. Starting a worker costs an import of
torch (~1-2 s on the project's 2-core machine), so fewer than
``PARALLEL_FROM`` files are read in this process, one at a time.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from hooktrace.format._kineto import ProfilerTraceError, open_binary, scan
from hooktrace._naming import aggregate_dir_problem
from hooktrace.analysis.inputs import Input, Kind, resolve
from hooktrace.errors import HooktraceError
from hooktrace.reading import TraceData, load

__all__ = ["PARALLEL_FROM", "NotOneRun", "RankFile", "RankSet", "RankSetError",
           "check_one_run", "find_rank_files", "map_ranks", "match_profilers", "rank_label",
           "separate_runs"]

PARALLEL_FROM = 4
T = TypeVar("T")
PathLike = str | os.PathLike[str]


class RankSetError(HooktraceError):
    """No rank could be read at all, or an input names nothing usable."""


def rank_label(rank: int | None, hostname: str, pid: int) -> str:
    """How a rank's process is named in merged traces and tables.

    Example:
        >>> rank_label(3, "node7", 4242), rank_label(None, "h", 1)
        ('rank 3 · node7:4242', 'h:1')
    """
    where = f"{hostname}:{pid}"
    return f"rank {rank} · {where}" if rank is not None else where


@dataclass
class RankFile:
    """One rank's trace file: its metadata, without its events."""

    path: str
    rank: int | None
    world_size: int | None
    hostname: str
    pid: int
    offset_ns: int  # the rank's clock minus rank 0's; subtract from its times
    uncertainty_ns: int
    aligned: bool  # whether an offset was measured (rank 0 and single hosts need none)
    start_ns: int  # recorded interval, on rank 0's clock
    stop_ns: int
    events: int
    backend: str | None = None
    out_pid: int = 0  # the process id in merged outputs (unique among ranks)
    cut: bool = False  # a stream cut before its footer (which carries the rank)
    # the schedule window it holds (first step, last step, complete); None: not a window
    window: tuple[int, int, bool] | None = None

    @property
    def label(self) -> str:
        return rank_label(self.rank, self.hostname, self.pid)

    @classmethod
    def from_trace(cls, path: str, run: TraceData) -> RankFile:
        info = run.info
        offset = int(info.get("clock_offset_ns", 0))
        start = info.get("start_unix_ns")
        stop = info.get("stop_unix_ns")
        spans = run.spans()
        if not isinstance(start, int):
            start = int(spans.start_ns.min()) if len(spans) else int(run.clock.unix_ns0)
        if not isinstance(stop, int):
            stop = int(spans.end_ns.max()) if len(spans) else start
        rank = info.get("rank")
        return cls(path=path, rank=rank if isinstance(rank, int) else None,
                   world_size=info.get("world_size") if isinstance(info.get("world_size"), int)
                   else None, hostname=run.hostname, pid=run.pid, offset_ns=offset,
                   uncertainty_ns=int(info.get("clock_offset_uncertainty_ns", 0)),
                   aligned="clock_offset_ns" in info, start_ns=start - offset,
                   stop_ns=stop - offset, events=len(run.events),
                   backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
                   cut="cut" in info)

    @classmethod
    def from_runs_row(cls, row: dict[str, Any], info: dict[str, Any]) -> RankFile:
        """The description of a file from its row of an export's ``runs`` table
        (hooktrace.data.schema) and its parsed ``info``."""
        rank = info.get("rank")
        return cls(path=row["path"], rank=rank if isinstance(rank, int) else None,
                   world_size=row["world_size"], hostname=row["hostname"], pid=row["pid"],
                   offset_ns=row["clock_offset_ns"],
                   uncertainty_ns=row["clock_offset_uncertainty_ns"],
                   aligned=row["clock_aligned"], start_ns=row["start_ns"],
                   stop_ns=row["stop_ns"], events=row["events"], backend=row["backend"],
                   cut=row["cut"] is not None)

    @property
    def process(self) -> str:
        return f"{self.hostname}:{self.pid}"


def _peek(path: str) -> RankFile:
    return RankFile.from_trace(path, load(path))


def find_rank_files(inputs: Sequence[PathLike | Input]) -> tuple[list[str], list[str]]:
    """The ``.htrace`` files named by ``inputs`` (directories searched recursively,
    sorted; the name given to ``hooktrace run -o`` under torchrun stands for its
    ``_rank<R>`` files), and one problem line per input that does not exist. An input
    may be :func:`~hooktrace.analysis.inputs.resolve`'s answer for its path."""
    files: list[str] = []
    problems: list[str] = []
    for item in inputs:
        # (the one input resolver, hooktrace.analysis.inputs)
        inp = item if isinstance(item, Input) else resolve(item)
        name = inp.path
        if inp.kind is Kind.AGGREGATE and os.path.isdir(name):  # kept steps are not ranks
            problems.append(aggregate_dir_problem(name))
        elif inp.kind is Kind.MISSING:
            problems.append(f"{name}: no such file")
        elif inp.kind in (Kind.TRACE, Kind.TRACES):
            files += inp.files
        elif os.path.isdir(name):  # a folder of no traces (Parquet: hooktrace summary reads it)
            problems.append(f"{name}: a directory with no .htrace file in it")
        else:
            files.append(name)  # (loading says what it is not)
    first: dict[str, str] = {}  # a file named twice (by two paths) is read once
    for f in files:
        first.setdefault(os.path.realpath(f), f)
    return list(first.values()), problems


_ONE_RUN = ("Keep one run's files per directory (hooktrace diff A B compares two runs), or "
            "name one file")


@dataclass(frozen=True)
class NotOneRun:
    """Why trace files are not one run (:func:`check_one_run`), with two files that show
    it; each caller words it for its own command.

    ``kind``: ``"rank_and_no_rank"`` (``a`` has a rank, ``b`` none: a cut stream if any
    is), ``"world_sizes"`` (``a`` and ``b`` disagree), ``"processes"`` (``a`` and ``b``
    are two of the ``processes`` that wrote ``rank``, or, ``rank`` None, two processes
    without a rank), ``"not_at_the_same_time"`` (``a``'s rank stopped recording at
    ``stop_ns``, before ``b``'s started at ``start_ns``)."""

    kind: Literal["rank_and_no_rank", "world_sizes", "processes", "not_at_the_same_time"]
    a: RankFile
    b: RankFile
    rank: int | None = None
    processes: int = 0
    stop_ns: int = 0
    start_ns: int = 0


def check_one_run(files: Sequence[RankFile], *, named_ranks: bool = False) -> NotOneRun | None:
    """Whether ``files`` can be the traces of one run: None, or why not.

    The rules (one place for rank sets, :func:`separate_runs`, and ``hooktrace diff``,
    ``hooktrace.analysis._diff_inputs.group``): a run's ranks (under torchrun) each carry
    ``rank`` and the same ``world_size`` in their metadata, one process per rank
    (several files of one process: its schedule windows), recording at the same time;
    files without a rank are one process each (``hooktrace run`` without a launcher), so
    two processes without a rank, or files with and without a rank, are separate runs.
    ``named_ranks``: files without a rank named as one output's ranks by ``hooktrace
    run`` (``STEM_rank<R>.htrace``, distinct R: ``RANK`` was set without
    ``WORLD_SIZE``) are one run's ranks. Files are taken in the order given (the two
    named are the first two that show it)."""
    ranked = [f for f in files if f.rank is not None]
    plain = [f for f in files if f.rank is None]
    if ranked and plain:
        cut = next((f for f in plain if f.cut), None)
        return NotOneRun("rank_and_no_rank", ranked[0], cut or plain[0])
    sizes: dict[int, RankFile] = {}
    for f in ranked:
        if f.world_size is not None:
            sizes.setdefault(f.world_size, f)
    if len(sizes) > 1:
        f1, f2 = list(sizes.values())[:2]
        return NotOneRun("world_sizes", f1, f2)
    by_rank: dict[int | None, list[RankFile]] = {}
    for f in files:
        by_rank.setdefault(f.rank, []).append(f)
    for rank in sorted(by_rank, key=lambda r: -1 if r is None else r):
        procs: dict[str, RankFile] = {}
        for f in by_rank[rank]:
            procs.setdefault(f.process, f)
        if len(procs) > 1 and not (rank is None and named_ranks
                                   and _ranks_by_name(by_rank[rank])):
            f1, f2 = list(procs.values())[:2]
            return NotOneRun("processes", f1, f2, rank=rank, processes=len(procs))
    if len(by_rank) > 1:  # (ranks: ranks of one job record at the same time)
        stops = {r: max(fs, key=lambda f: f.stop_ns) for r, fs in by_rank.items()}
        starts = {r: min(fs, key=lambda f: f.start_ns) for r, fs in by_rank.items()}
        early = min(stops.values(), key=lambda f: f.stop_ns)
        late = max(starts.values(), key=lambda f: f.start_ns)
        if late.start_ns > early.stop_ns:
            return NotOneRun("not_at_the_same_time", early, late, stop_ns=early.stop_ns,
                             start_ns=late.start_ns)
    return None


def separate_runs(files: Sequence[RankFile]) -> str | None:
    """Why ``files`` are not the ranks of one run, naming two files that show it; None
    when they can be (:func:`check_one_run`'s rules, files named as one output's ranks
    included). A stream cut before its footer (which carries the rank) is left to the
    callers' problem lines. ``hooktrace diff`` (``hooktrace.analysis._diff_inputs.group``)
    refuses the same cases, in its own words.

    Example:
        >>> a = RankFile("a.htrace", None, None, "h", 1, 0, 0, False, 0, 10, 5)
        >>> b = RankFile("b.htrace", None, None, "h", 2, 0, 0, False, 20, 30, 5)
        >>> separate_runs([a]) is None, "separate runs" in separate_runs([a, b])
        (True, True)
    """
    found = check_one_run([f for f in files if not f.cut], named_ranks=True)
    if found is None:
        return None
    a, b = found.a, found.b
    if found.kind == "rank_and_no_rank":
        return (f"{a.path} (rank {a.rank}) and {b.path} (no rank) are traces of separate "
                f"runs: files with and without a rank. {_ONE_RUN}")
    if found.kind == "world_sizes":
        return (f"{a.path} (world size {a.world_size}) and {b.path} (world size "
                f"{b.world_size}) are ranks of separate runs: their world sizes differ. "
                f"{_ONE_RUN}")
    if found.kind == "processes" and found.rank is None:
        return (f"{a.path} (by {a.process}) and {b.path} (by {b.process}) are traces of "
                f"separate runs, not ranks of one: neither has a rank in its metadata "
                f"({found.processes} processes without one). {_ONE_RUN}")
    if found.kind == "processes":
        return (f"{a.path} (by {a.process}) and {b.path} (by {b.process}) are both rank "
                f"{found.rank}: ranks of separate runs. {_ONE_RUN}")
    return (f"{a.path} stopped recording before {b.path} started: separate runs, not ranks "
            f"of one (ranks of one job record at the same time). {_ONE_RUN}")


_PER_RANK_NAME = re.compile(r"^(.*)_rank(\d+)\.htrace$")


def _ranks_by_name(files: Sequence[RankFile]) -> bool:
    """Whether ``files`` are named as one output's ranks by ``hooktrace run``
    (``STEM_rank<R>.htrace``: one folder, one stem, distinct ranks)."""
    outputs, ranks = set(), set()
    for f in files:
        m = _PER_RANK_NAME.match(os.path.basename(f.path))
        if m is None:
            return False
        outputs.add((os.path.dirname(f.path), m.group(1)))
        ranks.add(int(m.group(2)))
    return len(outputs) == 1 and len(ranks) == len(files)


def _mp_context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _call(fn: Callable[..., T], path: str, *extra: Any) -> T | str:
    """``fn(path, *extra)``, or the one-line reason it failed (a bad file must not stop
    the others)."""
    try:
        return fn(path, *extra)
    except (HooktraceError, OSError, ValueError) as e:
        text = str(e)
        return text if text.startswith(path) else f"{path}: {text}"


def map_ranks(fn: Callable[..., T], paths: Sequence[str], extras: Sequence[Any] | None = None,
              *, workers: int | None = None) -> list[T | str]:
    """``fn(path)`` (``fn(path, extra)`` with ``extras``) for every path, in order; a
    failure is its one-line message instead.

    ``fn`` must be a module-level function (it is pickled to the workers).
    ``workers``: processes to use (default: one per CPU, at most one per file, and
    none below ``PARALLEL_FROM`` files: 1 reads in this process). Each worker holds
    one rank at a time.
    """
    n = len(paths)
    args: list[tuple[Any, ...]] = [(p,) if extras is None else (p, extras[i])
                                   for i, p in enumerate(paths)]
    if workers is None:
        workers = min(os.cpu_count() or 1, n) if n >= PARALLEL_FROM else 1
    if workers <= 1 or n <= 1:
        return [_call(fn, *a) for a in args]
    with ProcessPoolExecutor(max_workers=min(workers, n), mp_context=_mp_context()) as pool:
        # chunksize 1: ranks differ in size, and each result is small
        return list(pool.map(_call, [fn] * n, *zip(*args), chunksize=1))


@dataclass
class RankSet:
    """The readable ranks, in rank order, and one line per problem."""

    files: list[RankFile]
    problems: list[str] = field(default_factory=list)

    @classmethod
    def scan(cls, inputs: Sequence[PathLike], *, workers: int | None = None,
             warn: bool = True) -> RankSet:
        """Read the metadata of every rank file under ``inputs``.

        Raises :class:`RankSetError` when no file can be read; otherwise each
        unreadable input is a line in ``problems`` (and a RuntimeWarning when
        ``warn``).
        """
        paths, problems = find_rank_files(inputs)
        results = map_ranks(_peek, paths, workers=workers)
        return cls.from_results(paths, results, problems, warn=warn)

    @classmethod
    def from_results(cls, paths: Sequence[str], results: Iterable[RankFile | str],
                     problems: list[str], *, warn: bool = True) -> RankSet:
        files = []
        for result in results:
            if isinstance(result, str):
                problems.append(result)
            else:
                files.append(result)
        files.sort(key=lambda f: (f.rank is None, f.rank if f.rank is not None else 0, f.path))
        separate = separate_runs(files)
        if separate is not None:
            raise RankSetError(separate)
        by_rank: dict[int, list[str]] = {}
        for f in files:
            if f.rank is not None:
                by_rank.setdefault(f.rank, []).append(f.path)
        for rank, names in by_rank.items():
            if len(names) > 1:
                problems.append(f"rank {rank}: {len(names)} files ({', '.join(names)}); all "
                                "are kept, in path order")
        sizes = {f.world_size for f in files if f.world_size is not None}
        if len(sizes) == 1:  # (several sizes: separate_runs refused them)
            world = sizes.pop()
            missing = sorted(set(range(world)) - set(by_rank))
            if missing:
                shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
                problems.append(f"ranks {shown} of world size {world}: no readable file")
        if not files:
            raise RankSetError("no rank trace could be read: " + "; ".join(problems)
                               if problems else "no .htrace file given")
        rs = cls(files, problems)
        rs._assign_pids()
        if warn:
            for line in problems:
                warnings.warn(f"hooktrace: {line}", RuntimeWarning, stacklevel=3)
        return rs

    def _assign_pids(self) -> None:
        """Each rank's process id in a merged trace: its OS pid when no other rank has
        the same (ranks on different hosts can), else a number above every pid."""
        count = Counter(f.pid for f in self.files)
        fresh = max(count) + 1
        for f in self.files:
            if count[f.pid] == 1:
                f.out_pid = f.pid
            else:
                f.out_pid, fresh = fresh, fresh + 1

    @property
    def max_pid(self) -> int:
        return max(f.out_pid for f in self.files)

    @property
    def start_ns(self) -> int:
        return min(f.start_ns for f in self.files)


# -- which torch.profiler trace is which rank's -----------------------------------

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)(?!\d)")


def _profiler_rank(path: str) -> tuple[int | None, set[int]]:
    """The rank a torch.profiler trace says it is of (its ``distributedInfo``), and its pids."""
    pids: set[int] = set()

    def on_event(e: Any) -> None:
        if isinstance(e, dict) and isinstance(e.get("pid"), int) and e.get("ph") == "X":
            pids.add(e["pid"])

    with open_binary(path) as f:
        top = scan(f, path, on_event)
    info = top.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return (rank if isinstance(rank, int) else None), pids


def match_profilers(ranks: RankSet, profilers: Sequence[str | os.PathLike[str]],
                    problems: list[str]) -> dict[str, str]:
    """Rank file path -> its profiler trace: by the trace's ``distributedInfo`` rank, else
    by a process id only one rank has, else by ``rankN`` in the file name. A trace that
    matches no rank is a line in ``problems``."""
    files: list[str] = []
    for item in profilers:
        name = os.fspath(item)
        if os.path.isdir(name):
            files += sorted(os.path.join(d, n) for d, _, ns in os.walk(name) for n in ns
                            if n.endswith((".json", ".json.gz")))
        elif os.path.exists(name):
            files.append(name)
        else:
            problems.append(f"{name}: no such profiler trace")
    by_rank = {f.rank: f for f in ranks.files if f.rank is not None}
    pid_count = Counter(f.pid for f in ranks.files)
    out: dict[str, str] = {}
    for path in files:
        try:
            rank, pids = _profiler_rank(path)
        except ProfilerTraceError as e:
            problems.append(str(e))
            continue
        target = by_rank.get(rank) if rank is not None else None
        if target is None:
            owners = [f for f in ranks.files if f.pid in pids and pid_count[f.pid] == 1]
            if len(owners) == 1:
                target = owners[0]
        if target is None:
            m = _RANK_IN_NAME.search(os.path.basename(path))
            target = by_rank.get(int(m.group(1))) if m else None
        if target is None:
            problems.append(f"{path}: matches no rank (distributedInfo rank {rank}, pids "
                            f"{sorted(pids)[:4]}); left out")
        elif target.path in out:
            problems.append(f"{path}: a second profiler trace for {target.label} (first: "
                            f"{out[target.path]}); left out")
        else:
            out[target.path] = path
    return out
