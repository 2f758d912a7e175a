"""What ``hooktrace diff`` was given: a file, a rank directory or a directory of windows.

An input is ``PATH`` or ``PATH:N``. ``PATH`` is a ``.htrace`` file or a directory,
searched recursively for ``.htrace`` files (as ``hooktrace merge-ranks`` does). Every
file's metadata says which process wrote it (``hostname``, ``pid``), which rank it was
(``rank``, ``world_size``; none in a single process) and, for a file written by
``hooktrace.window_handler``, which schedule window (``window``: first and last step).
The files are grouped by rank, and each rank (or the one process without a rank)
must be one process whose files are either one trace or schedule windows that do not
overlap. ``:N`` picks each process's window N in step order (0 the first, -1 the
last); without it a process's windows are pooled.

Anything that cannot be one run is refused with a :class:`DiffInputError` naming the
path and the files concerned: an empty directory; files with and without a rank, or
of different world sizes, or two processes claiming one rank (or, without ranks, two
processes), or ranks whose recorded intervals do not overlap (ranks of one job record
at the same time), all signs of traces of different runs in one directory; two files
of one process that are not distinct windows; a window index that a process lacks.

This module only reads metadata (:class:`RankFile`, built from a loaded trace);
``hooktrace.analysis.diff`` computes the numbers.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> parse_spec(d + ":-1") == (d, -1), parse_spec(d) == (d, None)
    (True, True)
    >>> parse_spec("no/such/dir:2")  # not an existing path with ':2' after it
    ('no/such/dir:2', None)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from hooktrace.errors import HooktraceError
from hooktrace.analysis.inputs import Input
from hooktrace.analysis.rankset import NotOneRun, RankFile, check_one_run, find_rank_files
from hooktrace.reading import TraceData

__all__ = ["DiffInputError", "Side", "file_meta", "find_files", "group",
           "parse_spec", "window_of"]

_SPEC = re.compile(r"^(.+):(-?\d+)$")


class DiffInputError(HooktraceError):
    """An input of ``hooktrace diff`` that is not one run (or two that cannot be compared)."""


def file_meta(path: str, trace: TraceData) -> RankFile:
    """The description of a loaded trace file (the one, :class:`RankFile`), with its
    schedule window (raises :class:`DiffInputError` on a malformed ``window`` entry)."""
    return replace(RankFile.from_trace(path, trace), window=window_of(path, trace.info))


def window_of(path: str, info: dict[str, Any]) -> tuple[int, int, bool] | None:
    """A file's schedule window (first step, last step, complete) from its metadata, or
    None; :class:`DiffInputError` on a malformed ``window`` entry."""
    raw = info.get("window")
    window = None
    if raw is not None:
        ok = (isinstance(raw, dict) and all(type(raw.get(k)) is int
                                            for k in ("first_step", "last_step"))
              and isinstance(raw.get("complete"), bool)
              and 0 <= raw["first_step"] <= raw["last_step"])
        if not ok:
            raise DiffInputError(f"{path}: metadata 'window' is {raw!r:.80}, expected "
                                 "{first_step, last_step, complete} as window_handler writes")
        window = (raw["first_step"], raw["last_step"], raw["complete"])
    return window


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``PATH`` or ``PATH:N`` -> (path, window index or None). A path that exists as
    written is a path even when it ends in ``:N``."""
    m = _SPEC.match(spec)
    if os.path.exists(spec) or m is None or not os.path.exists(m.group(1)):
        return spec, None
    return m.group(1), int(m.group(2))


def find_files(inp: Input) -> list[str]:
    """The ``.htrace`` files of an input path (a directory searched recursively)."""
    if not os.path.exists(inp.path):
        raise DiffInputError(f"{inp.path}: no such file or directory")
    files, problems = find_rank_files([inp])
    if problems:
        raise DiffInputError(problems[0])
    return files


@dataclass
class Side:
    """One input: its files grouped by rank (``None``: a process without a rank), each
    rank's files in step order, and the window picked (``None``: all pooled)."""

    spec: str
    path: str
    is_dir: bool
    window: int | None
    processes: dict[int | None, list[RankFile]]
    world_size: int | None
    notes: list[str] = field(default_factory=list)

    @property
    def ranked(self) -> bool:
        """A rank directory: compared rank by rank with another one."""
        return self.is_dir and None not in self.processes

    @property
    def kind(self) -> str:
        if self.ranked:
            return "ranks"
        files = next(iter(self.processes.values()))
        return "windows" if files[0].window is not None else "file"

    def selected(self) -> dict[int | None, list[RankFile]]:
        """Per rank, the files to pool: all of them, or window ``:N``."""
        if self.window is None:
            return self.processes
        out = {}
        for rank, files in self.processes.items():
            who = f"rank {rank}" if rank is not None else f"process {files[0].process}"
            if files[0].window is None:
                raise DiffInputError(
                    f"{self.spec}: ':{self.window}' picks a schedule window, but "
                    f"{files[0].path} ({who}) is not one (no 'window' in its metadata)")
            if not -len(files) <= self.window < len(files):
                raise DiffInputError(
                    f"{self.spec}: {who} has {len(files)} window"
                    f"{'s' if len(files) != 1 else ''} ({_steps(files)}), no window "
                    f"{self.window}")
            out[rank] = [files[self.window]]
        return out

    def describe(self) -> dict[str, Any]:
        """What the input was, for ``--json``."""
        sel = self.selected()
        doc: dict[str, Any] = {"path": self.path, "kind": self.kind,
                               "files": sum(len(f) for f in sel.values()),
                               "window": self.window}
        if self.ranked:
            doc["ranks"] = sorted(r for r in sel if r is not None)
            doc["world_size"] = self.world_size
        first = next(iter(sel.values()))
        if first[0].window is not None and not self.ranked:
            doc["windows"] = [[f.window[0], f.window[1]] for f in first if f.window]
        return doc

    def text(self) -> str:
        """One phrase: what the input was ("" for a file named as such)."""
        sel = self.selected()
        if self.ranked:
            n = len(sel)
            counts = {len(f) for f in sel.values()}
            world = f" of world size {self.world_size}" if self.world_size else ""
            what = f"{n} rank{'s' if n != 1 else ''}{world}"
            if self.window is not None:
                return f"{what}, window {self.window} of each"
            if next(iter(sel.values()))[0].window is not None:
                per = (f"{counts.pop()} windows each" if len(counts) == 1
                       else "their windows")
                return f"{what}, {per} pooled"
            return what
        files = next(iter(sel.values()))
        if files[0].window is None:
            return f"one file, {_rel(files[0].path, self.path)}" if self.is_dir else ""
        total = len(next(iter(self.processes.values())))
        if self.window is not None:
            return f"window {self.window % total} of {total}, {_steps(files)}"
        return f"{len(files)} window{'s' if len(files) != 1 else ''} pooled, {_steps(files)}"


def _steps(files: Sequence[RankFile]) -> str:
    spans = [f"{w[0]}-{w[1]}" if w[0] != w[1] else f"{w[0]}"
             for w in (f.window for f in files) if w is not None]
    shown = ", ".join(spans[:6]) + (", ..." if len(spans) > 6 else "")
    return f"step{'s' if len(spans) != 1 or '-' in shown else ''} {shown}"


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def _rel(path: str, root: str) -> str:
    rel = os.path.relpath(path, root) if os.path.isdir(root) else path
    return rel if not rel.startswith("..") else path


def _not_one_run(found: NotOneRun, name: Callable[[RankFile], str]) -> str:
    """``check_one_run``'s finding in diff's words (after ``SPEC: ``)."""
    a, b = found.a, found.b
    if found.kind == "rank_and_no_rank":
        why = (f"{name(b)} is a stream cut before its footer, which carries the rank: "
               "move it out, or name one file" if b.cut else
               "traces of different runs? Keep one run's files per directory")
        return (f"mixes files with a rank ({name(a)}: rank {a.rank}) and without one "
                f"({name(b)}): {why}")
    if found.kind == "world_sizes":
        return (f"the files disagree on the world size ({name(a)}: {a.world_size}, "
                f"{name(b)}: {b.world_size}): ranks of different runs? Keep one run's files "
                "per directory")
    if found.kind == "processes":
        what = (f"{found.processes} processes wrote rank {found.rank}" if found.rank is not None
                else f"holds the traces of {found.processes} processes without a rank")
        return (f"{what} ({name(a)} by {a.process}, {name(b)} by {b.process}): traces of "
                "different runs? Keep one run's files per directory, or name one file")
    return (f"rank {a.rank} ({name(a)}) stopped recording at {_when(found.stop_ns)}, before "
            f"rank {b.rank} ({name(b)}) started at {_when(found.start_ns)}: ranks of "
            "different runs? Ranks of one job record at the same time")


def group(spec: str, path: str, window: int | None, metas: Sequence[RankFile]) -> Side:
    """Group one input's files into processes by rank, refusing anything that is not
    one run (see the module docstring)."""
    is_dir = os.path.isdir(path)

    def name(f: RankFile) -> str:
        return _rel(f.path, path)

    ordered = sorted(metas, key=lambda f: (f.rank if f.rank is not None else -1,
                                           f.window[0] if f.window else -1, f.path))
    # one run? (the rules rank sets follow too: rankset.check_one_run)
    found = check_one_run(ordered)
    if found is not None:
        raise DiffInputError(f"{spec}: {_not_one_run(found, name)}")
    world = next((f.world_size for f in ordered if f.world_size is not None), None)
    by_rank: dict[int | None, list[RankFile]] = {}
    for f in ordered:
        by_rank.setdefault(f.rank, []).append(f)
    # each rank (or the one process without a rank): one trace, or distinct windows
    for rank, files in by_rank.items():
        who = (f"rank {rank} ({files[0].process})" if rank is not None
               else f"process {files[0].process}")
        if world is not None and rank is not None and rank >= world:
            raise DiffInputError(f"{spec}: {name(files[0])} is rank {rank}, but the files' "
                                 f"world size is {world}")
        if len(files) > 1:
            loose = [f for f in files if f.window is None]
            if loose:
                other = files[0] if files[0] is not loose[0] else files[1]
                raise DiffInputError(
                    f"{spec}: {name(loose[0])} and {name(other)} are both traces of {who}, "
                    f"and {name(loose[0])} is not a schedule window: which one is the run? "
                    "Name one file")
            for prev, cur in pairwise(files):
                assert prev.window is not None and cur.window is not None
                if cur.window[0] <= prev.window[1]:
                    raise DiffInputError(
                        f"{spec}: {name(prev)} (steps {prev.window[0]}-{prev.window[1]}) and "
                        f"{name(cur)} (steps {cur.window[0]}-{cur.window[1]}) are overlapping "
                        f"windows of {who}: a copy of a window?")
    side = Side(spec, path, is_dir, window, by_rank, world)
    if world is not None and is_dir:
        missing = sorted(set(range(world)) - set(by_rank))
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            side.notes.append(f"{spec}: no file for rank{'s' if len(missing) > 1 else ''} "
                              f"{shown} of world size {world}")
    return side
