"""Many ranks, one timeline (issue #11): every rank's trace in one Chrome / Perfetto file.

One process per rank, named ``rank 3 · host:pid`` and placed in rank order
(``process_sort_index``); inside it the rows of the one-rank export
(:mod:`hooktrace.exporters.chrome`'s convention: forward spans on the thread's
row, ``T backward`` lanes, ``T autograd (unattributed)``, a ``steps`` row, and with
``trace(gpu=True)`` a ``GPU d stream s`` row per device and stream).
When a rank's torch.profiler trace is given, that rank's part is the merge of
:func:`hooktrace.merge.merge_traces` (its ops, collectives included, with the
module spans), moved into the rank's process.

**Times.** Each rank's ``clock_offset_ns`` (its clock minus rank 0's, measured
by ``hooktrace.record.distributed.align_clocks``) is subtracted from every one of its
times, so all ranks are on rank 0's clock, to within each rank's
``clock_offset_uncertainty_ns``. The file's ``baseTimeNanoseconds`` is a whole
second a minute before the earliest rank (as in ``hooktrace.merge``: small
relative ``ts`` keep Perfetto exact) and every time is written as exact integer
nanoseconds relative to it.

**Process ids.** A rank keeps its OS pid unless another rank has the same one
(ranks on different hosts can), then it gets a number above every pid; the
profiler's other processes (a GPU's rows) get fresh numbers too, named
``rank 3 · <their name>``. Flow event ids (the profiler's ``fwdbwd``/``ac2g``
arrows) are made unique per rank, so no arrow joins two ranks.

**Memory.** Ranks are written one at a time: one rank's events (and its
profiler trace, streamed) are in memory at once, whatever the number of ranks.

**Formats.** :func:`merge_ranks` drives a :class:`RankWriter` (begin, one call
per rank, finish); :class:`ChromeRankWriter` is the JSON one. A Perfetto
protobuf writer implements the same three methods.

Example::

    from hooktrace.exporters.ranks import merge_ranks
    merge_ranks(["traces/"], "all.json.gz")      # traces/rank*/trace.htrace
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import numpy as np

from hooktrace.format._kineto import open_binary, scan, us_to_ns
from hooktrace._output import check_output_path, open_output
from hooktrace.errors import HooktraceError
from hooktrace.exporters._chrome_json import SkipFirstComma, dumps, micros
from hooktrace.exporters._layout import UNATTRIBUTED_CAT, TrackLayout, gpu_slices
from hooktrace.exporters._chrome_events import (
    write_gpu_events,
    write_node_events,
    write_span_events,
    write_steps,
)
from hooktrace.exporters._profiler_merge import BASE_MARGIN_NS, merge_traces
from hooktrace.analysis.rankset import RankFile, RankSet, match_profilers
from hooktrace.reading import CAT_BACKWARD, TraceData, load
from hooktrace.format import FORMAT_VERSION

__all__ = ["ChromeRankWriter", "MergeRanksResult", "RankWriter", "match_profilers",
           "merge_ranks"]

# Flow ids of rank i become id + (i + 1) * FLOW_ID_STRIDE: kineto's ids are
# correlation ids and sequence numbers, far below 2**40.
FLOW_ID_STRIDE = 1 << 40


class RankWriter(Protocol):
    """One output format of a multi-rank trace; :func:`merge_ranks` calls ``begin``,
    then ``add_rank`` or ``add_rank_with_profiler`` once per rank in order, then
    ``finish``. Each returns what the ``"hooktrace"`` block lists for the rank."""

    def begin(self, ranks: RankSet, base_ns: int) -> None: ...

    def add_rank(self, index: int, f: RankFile, run: TraceData) -> dict[str, Any]: ...

    def add_rank_with_profiler(self, index: int, f: RankFile, run: TraceData,
                               profiler: str) -> dict[str, Any]: ...

    def finish(self, block: dict[str, Any]) -> None: ...


@dataclass
class MergeRanksResult:
    """What :func:`merge_ranks` wrote."""

    out_path: str
    ranks: list[dict[str, Any]]  # per rank written: rank, pid, label, path, offset, ...
    problems: list[str] = field(default_factory=list)  # one line per rank left out
    base_ns: int = 0


class _EarlyProfilerEvents(HooktraceError):
    """A profiler trace starts too long before the ranks' recordings (not recoverable
    by leaving the profiler out: part of it is written already)."""


def _utf8(value: Any) -> Any:
    """A parsed event's strings (read as Latin-1, see hooktrace.format._kineto) back to text."""
    if isinstance(value, str):
        try:
            return value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return value
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utf8(v) for v in value]
    return value


# A top-level key's number (int or decimal) in an event's JSON text.
def _number_re(key: str) -> re.Pattern[str]:
    return re.compile(r'"' + key + r'"\s*:\s*(-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)')


_PID, _TS, _ID = _number_re("pid"), _number_re("ts"), _number_re("id")
# ... and a string value (kineto's "Spans" process has pid "Spans", tid "PyTorch Profiler")
_PID_STR = re.compile(r'"pid"\s*:\s*("(?:[^"\\]|\\.)*")')
_TID_STR = re.compile(r'"tid"\s*:\s*("(?:[^"\\]|\\.)*")')


def _top_level(pattern: re.Pattern[str], text: str) -> tuple[int, int] | None:
    """(start, end) of the event's own value for ``pattern``'s key (not one in its args)."""
    found = list(pattern.finditer(text))
    if len(found) == 1 and text.find("{", 1, found[0].start()) < 0:
        return found[0].span(1)
    for m in found:
        depth, in_str, esc = 0, False, False
        for ch in text[: m.start()]:
            if in_str:
                esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
        if depth == 1:
            return m.span(1)
    return None


class ChromeRankWriter:
    """Chrome trace JSON, one process per rank (see the module docstring)."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._items = SkipFirstComma(out.write)
        self.base_ns = 0
        self._next_pid = 1

    def begin(self, ranks: RankSet, base_ns: int) -> None:
        self.base_ns = base_ns
        self._next_pid = ranks.max_pid + 1
        self._out.write(b'{"traceEvents":[\n')

    def _process(self, index: int, pid: int, name: str) -> None:
        meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                 "args": {"name": name}},
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                 "args": {"sort_index": index}}]
        self._items("".join(",\n" + dumps(m) for m in meta).encode("utf-8"))

    def add_rank(self, index: int, f: RankFile, run: TraceData) -> dict[str, Any]:
        """The rank's module spans, unattributed autograd nodes and steps, on rank 0's clock."""
        self._process(index, f.out_pid, f.label)
        run.info["pid"] = f.out_pid  # the chrome writers write trace.pid
        off = f.offset_ns
        spans = run.spans()
        nodes = spans.nodes
        backward = np.flatnonzero(spans.cat == CAT_BACKWARD)
        loose = np.flatnonzero(nodes.span < 0)
        os_threads = np.union1d(np.union1d(spans.threads, spans.tid), nodes.tid).astype(np.int64)
        span_start, span_end = spans.start_ns - off, spans.end_ns - off
        node_start, node_end = nodes.start_ns - off, nodes.end_ns - off
        layout = TrackLayout(spans, span_start=span_start, span_end=span_end,
                             node_start=node_start, node_end=node_end, backward=backward,
                             nodes_on_backward=np.zeros(0, np.int64), unattributed=loose,
                             forward=np.zeros(0, np.int64), used_tids=os_threads)
        meta = layout.metadata(f.out_pid, run.info.get("thread_names"), named=os_threads.tolist())
        self._items("".join(",\n" + dumps(m) for m in meta).encode("utf-8"))
        row = spans.tid.copy()
        row[backward] = layout.backward_tid
        write_span_events(self._items, run, np.arange(len(spans)), span_start, span_end, row,
                          self.base_ns)
        write_node_events(self._items, run, loose, node_start[loose], node_end[loose],
                          layout.unattributed_tid, UNATTRIBUTED_CAT, self.base_ns)
        tracks = layout.track_table()
        # write_steps writes step time - base: with base + offset that is aligned time - base
        step_track = write_steps(self._items, run, layout.next_tid, self.base_ns + off)
        if step_track is not None:
            tracks.append(step_track)
        # device time (trace(gpu=True)): the one-rank export's "GPU d stream s" rows, in
        # the rank's process, on rank 0's clock as everything else
        gs = gpu_slices(run)
        tracks += write_gpu_events(self._items, run, gs, layout.next_tid + 1,
                                   self.base_ns + off)
        return {"spans": len(spans), "backward_spans": len(backward),
                "unattributed_nodes": len(loose), "steps": len(run.steps()),
                "gpu_intervals": len(gs.rows), "tracks": tracks}

    def add_rank_with_profiler(self, index: int, f: RankFile, run: TraceData,
                               profiler: str) -> dict[str, Any]:
        """``merge_traces(run, profiler)`` (into a temporary file), moved into the rank's
        process and onto rank 0's clock, event by event."""
        self._process(index, f.out_pid, f.label)
        with tempfile.TemporaryDirectory(prefix="hooktrace-rank") as d:
            merged = os.path.join(d, "merged.json")
            result = merge_traces(run, profiler, merged)
            # the merged file's ts are relative to result.base_ns on the rank's clock
            shift = result.base_ns - f.offset_ns - self.base_ns
            self._copy_events(merged, index, f, run.pid, shift)
        return {"profiler": profiler, "profiler_events": result.profiler_events,
                "spans": result.shared + result.adjacent + result.backward,
                "backward_spans": result.backward, "clipped": result.clipped,
                "outside_window": result.outside_window}

    def _copy_events(self, merged: str, index: int, f: RankFile, run_pid: int,
                     shift: int) -> None:
        other_pids: dict[str, int] = {}

        def new_pid(pid: Any) -> int:
            if pid == run_pid:
                return f.out_pid
            key = repr(pid)
            if key not in other_pids:
                other_pids[key], self._next_pid = self._next_pid, self._next_pid + 1
                # named now (kineto names no "Spans" process); a process_name of its own
                # follows when the profiler wrote one
                name = pid if isinstance(pid, str) else f"process {pid}"
                self._process(index, other_pids[key], f"{f.label} · {_utf8(name)}")
            return other_pids[key]

        def rewrite(event: Any, text: str) -> None:
            if not isinstance(event, dict):
                return
            if event.get("ph") == "M":
                self._copy_metadata(event, index, f, run_pid, new_pid)
                return
            edits: list[tuple[tuple[int, int], str]] = []
            if "pid" in event:
                where = _top_level(_PID if isinstance(event["pid"], int) else _PID_STR, text)
                if where is not None:
                    edits.append((where, str(new_pid(event["pid"]))))
            if isinstance(event.get("tid"), str):
                # Perfetto gives a string tid one thread id, whatever the process: the
                # ranks' "PyTorch Profiler" rows would collide (measured: one was lost)
                where = _top_level(_TID_STR, text)
                if where is not None:
                    edits.append((where, text[where[0]:where[1] - 1] + f' (rank {f.rank})"'))
            if "ts" in event:
                where = _top_level(_TS, text)
                try:
                    ns = us_to_ns(event["ts"]) + shift
                except ValueError:
                    ns = None
                if where is not None and ns is not None:
                    if ns < 0:
                        raise _EarlyProfilerEvents(
                            f"{f.path}: rank {f.rank}'s profiler events start more than "
                            f"{BASE_MARGIN_NS // 10**9} s before its first rank's recording; "
                            "merge ranks of one run")
                    edits.append((where, micros(ns)))
            if event.get("ph") in ("s", "t", "f") and isinstance(event.get("id"), int):
                where = _top_level(_ID, text)
                if where is not None:
                    edits.append((where, str(event["id"] + (index + 1) * FLOW_ID_STRIDE)))
            for (a, b), value in sorted(edits, reverse=True):
                text = text[:a] + value + text[b:]
            self._items((",\n" + text).encode("latin-1"))

        with open_binary(merged) as src:
            scan(src, merged, lambda e: None, rewrite_event=rewrite)  # type: ignore[arg-type]

    def _copy_metadata(self, event: dict[str, Any], index: int, f: RankFile, run_pid: int,
                       new_pid: Callable[[Any], int]) -> None:
        name = event.get("name")
        if event.get("pid") == run_pid and name in ("process_name", "process_sort_index",
                                                    "process_labels"):
            return  # the rank's own process: named and sorted by _process
        # (a ts means nothing on an M event; kineto's would be quoted text here)
        event = {k: v for k, v in _utf8(event).items() if k != "ts"}
        if "pid" in event:
            event["pid"] = new_pid(event["pid"])
        if isinstance(event.get("tid"), str):
            event["tid"] = f"{event['tid']} (rank {f.rank})"
        args = event.get("args")
        if name == "process_name" and isinstance(args, dict):
            event["args"] = dict(args, name=f"rank {f.rank} · {args.get('name', '')}")
        elif name == "process_sort_index" and isinstance(args, dict):
            event["args"] = dict(args, sort_index=index)
        self._items((",\n" + dumps(event)).encode("utf-8"))

    def finish(self, block: dict[str, Any]) -> None:
        tail = ('\n],\n"displayTimeUnit":"ns","baseTimeNanoseconds":' + str(self.base_ns)
                + ',\n"hooktrace":' + dumps(block) + "}\n")
        # the ranks' paths and problems name files: a name that is not UTF-8 holds lone
        # surrogates, written as JSON's \udcNN escapes (json.loads gives the name back)
        self._out.write(tail.encode("utf-8", "backslashreplace"))


# -- the merge -----------------------------------------------------------------


def merge_ranks(
    inputs: Sequence[str | os.PathLike[str]], out_path: str | os.PathLike[str], *,
    profilers: Sequence[str | os.PathLike[str]] = (), workers: int | None = None,
    writer: Callable[[IO[bytes]], RankWriter] = ChromeRankWriter, compresslevel: int = 1,
) -> MergeRanksResult:
    """Write the ranks' traces under ``inputs`` (directories or ``.htrace`` files) as one
    trace at ``out_path`` (``.json`` or ``.json.gz``), one process per rank.

    ``profilers``: torch.profiler traces (files or directories), matched to ranks by
    :func:`match_profilers`; those ranks get their ops merged in. A rank file that
    is missing, truncated or corrupt, or a profiler trace that cannot be merged, is
    left out with a RuntimeWarning naming it (and listed in ``problems``); the other
    ranks are written. Raises :class:`~hooktrace.analysis.rankset.RankSetError` when no rank
    can be read.
    """
    paths = [os.fspath(p) for p in inputs]
    check_output_path(out_path, [p for p in paths if os.path.isfile(p)])
    ranks = RankSet.scan(paths, workers=workers, warn=False)
    problems = list(ranks.problems)
    profiler_of = match_profilers(ranks, profilers, problems) if profilers else {}
    base = (ranks.start_ns - BASE_MARGIN_NS) // 10**9 * 10**9
    written: list[dict[str, Any]] = []
    with open_output(out_path, compresslevel=compresslevel,
                     inputs=[f.path for f in ranks.files]) as out:
        w = writer(out)
        w.begin(ranks, base)
        for index, f in enumerate(ranks.files):
            try:
                run = load(f.path)
            except (HooktraceError, OSError) as e:  # changed since it was scanned
                problems.append(str(e))
                continue
            entry: dict[str, Any] = {
                "rank": f.rank, "pid": f.out_pid, "os_pid": f.pid, "hostname": f.hostname,
                "label": f.label, "path": f.path, "clock_offset_ns": f.offset_ns,
                "clock_offset_uncertainty_ns": f.uncertainty_ns, "clock_aligned": f.aligned}
            prof = profiler_of.get(f.path)
            if prof is not None:
                try:
                    entry.update(w.add_rank_with_profiler(index, f, run, prof))
                    written.append(entry)
                    continue
                except _EarlyProfilerEvents:
                    raise
                except HooktraceError as e:
                    # nothing of the rank was written but its process name: fall back
                    problems.append(f"{prof}: not merged ({e}); {f.label} has its module "
                                    "spans only")
            entry.update(w.add_rank(index, f, run))
            written.append(entry)
            del run  # one rank in memory at a time
        from hooktrace._version import __version__

        w.finish({"version": __version__, "format_version": FORMAT_VERSION,
                  "ranks": written, "problems": problems})
    for line in problems:
        warnings.warn(f"hooktrace: {line}", RuntimeWarning, stacklevel=2)
    return MergeRanksResult(os.fspath(out_path), written, problems, base)

