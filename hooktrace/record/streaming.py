"""A recording's stream (``out=``): the file written while recording, a killed run
included. :class:`StreamedRecording` is a part of the recorder
(:class:`hooktrace.record.recorder.Recorder`): it opens the file (header and META) and
starts the native writer, ends it with the last events and the FOOTER, reads it back as
the result, and keeps a forked child (a DataLoader's worker) off the parent's stream.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from typing import Any

import hooktrace._C as _C
from hooktrace._output import write_failure
from hooktrace.format import (
    BLOCK_FOOTER,
    BLOCK_META,
    encode_json,
    read_trace,
    rolling_segments,
    stream_block,
    stream_header,
)
from hooktrace.record.ranks import rank_info
from hooktrace.record.options import RecordOptions
from hooktrace.record.scopes import ProcessScope, Scope
from hooktrace.result import TraceResult

# Streaming (out=...): the writer wakes every STREAM_PERIOD_MS (or when half of the
# capacity, record/options.py, is in flight).
STREAM_PERIOD_MS = 10
# max_disk: segments of max_disk / 8, at least 256 KiB (each restates its tables)
SEGMENT_MIN_BYTES = 256 << 10


# The recorders streaming now, for os.fork() (a DataLoader's workers): their writer
# threads hold no lock across a fork (_before_fork), and in the child the stream stays
# the parent's (nothing is written to it there, the file is not removed).
_streaming: weakref.WeakSet[StreamedRecording] = weakref.WeakSet()
_fork_held: list[Any] = []  # the writers _before_fork locked, until the fork is done


def _before_fork() -> None:
    for recorder in list(_streaming):
        writer = recorder._writer
        if writer is not None and recorder._stream_pid == os.getpid():
            writer.before_fork()
            _fork_held.append(writer)


def _after_fork(in_child: bool) -> None:
    while _fork_held:
        _fork_held.pop().after_fork(in_child)


os.register_at_fork(before=_before_fork, after_in_parent=lambda: _after_fork(False),
                    after_in_child=lambda: _after_fork(True))


class StreamedRecording:
    """The stream of a recording (``out=``). The class using it has ``options``,
    ``_scope``, ``_session``, ``_state``, ``_start_unix_ns``, ``_run_info()`` and
    ``_add_metadata()``, calls :meth:`_init_stream` with its other argument checks,
    :meth:`_open_stream` once the session exists (:meth:`_abandon_stream` when entry
    fails after it), :meth:`_finish_stream` when the session has stopped and
    :meth:`_load_stream` for its result."""

    options: RecordOptions
    _scope: Scope
    _session: Any
    _state: str
    _start_unix_ns: int

    def _run_info(self, session: Any) -> dict[str, Any]:  # provided by the recording class
        raise NotImplementedError

    def _add_metadata(self, info: dict[str, Any]) -> None:  # provided by the recording class
        raise NotImplementedError

    def _init_stream(self, out: str | None) -> None:
        """Sets the stream's state up (``out=``: checked by ``RecordOptions``)."""
        self._out: str | None = out  # (a str once checked)
        self._writer: Any = None
        self._stream_fd = -1
        self._stream_lost: tuple[str, int] | None = None  # (write error, events lost)
        # the write that failed, in one line (its file, why, the disk when it was full)
        self.stream_failure: str | None = None
        self._stream_counts: dict[str, int] | None = None  # what the stream holds, at its end
        self._stream_pid = 0  # the process writing the stream (a forked child does not)
        self._rolling: dict[str, Any] | None = None  # max_disk: META's "rolling"

    def _open_stream(self, session: Any) -> None:
        """Starts the file (header and META) and creates its writer; nothing else yet.

        Written in place, not through a temporary file: the point of a stream is that
        the file at ``out`` is readable at every moment, a killed run included.
        """
        assert self._out is not None
        fd = os.open(self._out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        self._stream_fd = fd
        self._stream_pid = os.getpid()
        meta = self._run_info(session)
        meta["modules"] = [[name, type_name] for name, type_name in self._scope.modules_table()]
        max_disk = self.options.max_disk
        if max_disk:
            # rolling segments (csrc/stream_writer.h): OUT holds the newest, the older
            # ones <stem>.<k>.htrace beside it; a previous run's are removed first
            base = os.path.basename(self._out)
            stem = base[: -len(".htrace")] if base.endswith(".htrace") else base
            rolling = {"newest": base, "stem": stem, "max_disk": int(max_disk),
                       "segment_bytes": max(SEGMENT_MIN_BYTES, int(max_disk) // 8)}
            for old in rolling_segments(self._out, rolling):
                with contextlib.suppress(OSError):
                    os.unlink(old)
            meta["rolling"] = self._rolling = rolling
        prefix = stream_header() + stream_block(BLOCK_META, encode_json(meta))
        _write_all(fd, prefix)
        self._writer = _C.StreamWriter(session, fd, STREAM_PERIOD_MS)
        if self._rolling is not None:
            self._writer.set_rolling(
                self._out, os.path.join(os.path.dirname(self._out), self._rolling["stem"]),
                prefix, self._rolling["segment_bytes"], self._rolling["max_disk"])
        _streaming.add(self)
        if isinstance(self._scope, ProcessScope):
            # its table grows while recording (it is [] in META): MODULES blocks
            self._scope.on_modules = self._writer.set_modules

    def _abandon_stream(self) -> None:
        """Entry failed before recording: the file holds no run, so it goes."""
        if self._stream_fd >= 0:
            os.close(self._stream_fd)
            self._stream_fd = -1
            self._writer = None
            assert self._out is not None
            with contextlib.suppress(OSError):
                os.unlink(self._out)

    def _finish_stream(self, stop_unix_ns: int) -> None:
        """Drains the last events (the session is stopped), then the FOOTER, then closes."""
        writer, session, scope = self._writer, self._session, self._scope
        _streaming.discard(self)
        try:
            if self.streamed_by_parent():
                # a forked child's copy: the writer thread and the file are the parent's
                writer.stop()  # (inert here: joins and writes nothing)
                return
            if isinstance(scope, ProcessScope):
                scope.on_modules = None
                writer.set_modules(0, scope.modules_table())  # (unchanged: nothing to write)
            writer.stop()
            stats, written = session.stats(), writer.stats()
            fd = int(writer.fd())  # the newest segment's (this one unless it rolled)
            if fd != self._stream_fd:
                os.close(self._stream_fd)
                self._stream_fd = fd
            footer = {
                "dropped_events": int(stats["dropped"]),
                "overwritten_events": int(stats["overwritten"]),
                "stop_unix_ns": stop_unix_ns,
                "thread_names": thread_names(),
                "events": int(written["events"]),
                # the writer's own figures: how far memory went, how busy it was
                "stream": {"chunks": int(stats["chunks"]), "rounds": int(written["rounds"]),
                           "blocks": int(written["blocks"]), "bytes": int(written["bytes"]),
                           "busy_ns": int(written["busy_ns"]),
                           "cpu_ns": int(written["cpu_ns"])},
            }
            # rank, world size and clock offsets (issue #11), as save()d files have them
            footer.update(rank_info(self._start_unix_ns, stop_unix_ns))
            footer.update(scope.info())  # a process scope's top-level modules, as of now
            # kernel sites and compiles, shape signatures seen while streaming, the
            # devices the run used, FLOPs (stopped by now: every count closed)
            self._add_metadata(footer)
            self._stream_counts = {"events": int(written["events"]),
                                   "dropped_events": int(stats["dropped"]),
                                   "overwritten_events": int(stats["overwritten"])}
            if self._rolling:
                rolled = {k: int(written[k]) for k in (
                    "segments", "rolled_off_segments", "rolled_off_events", "rolled_off_bytes",
                    "full_disk_rolled_off_segments", "full_disk_lost_events")}
                footer["rolling"] = dict(self._rolling, **rolled,
                                         events_written=int(written["events"]))
                footer["events"] = int(written["segment_events"])  # this file's
                self._stream_counts["rolled_off_events"] = rolled["rolled_off_events"]
                full_lost = rolled["full_disk_lost_events"]
                if full_lost:
                    # the disk had no room even with every older segment gone: lost,
                    # counted as dropped (the file says so in its footer)
                    footer["dropped_events"] = int(stats["dropped"]) + full_lost
                    self._stream_counts["dropped_events"] += full_lost
                if rolled["full_disk_rolled_off_segments"] or full_lost:
                    warnings.warn(
                        f"hooktrace: the disk holding {self._out} was full: "
                        f"{rolled['full_disk_rolled_off_segments']} older segments were "
                        f"rolled off early to make room and {full_lost:,} events were lost "
                        "with no room left (--max-disk keeps recording the newest)",
                        RuntimeWarning, stacklevel=4)
            if written["error"]:
                # Every block before the failed one is intact: the file loads up to it.
                # Its events after that are dropped events of the result (the file cannot
                # say so: it could not be written).
                self._stream_lost = (str(written["error"]),
                                     int(written["lost_events"]) + int(stats["dropped"]))
                self._stream_counts["dropped_events"] += int(written["lost_events"])
                # (counted apart too: the disk lost them, no --capacity would have kept
                # them; a full disk names itself: issue #46)
                self._stream_counts["write_lost_events"] = int(written["lost_events"])
                self.stream_failure = write_failure(str(self._out), f"at {written['error']}")
                warnings.warn(
                    f"hooktrace: writing {self.stream_failure}; "
                    f"{int(written['lost_events']):,} events were lost and the file ends "
                    "there (it loads up to that point)", RuntimeWarning, stacklevel=4)
            else:
                _write_all(self._stream_fd, stream_block(BLOCK_FOOTER, encode_json(footer)))
        finally:
            os.close(self._stream_fd)
            self._stream_fd = -1
            self._writer = None

    def stream_counts(self) -> dict[str, int]:
        """After a streamed block: ``events`` (written to the file), ``dropped_events``
        and ``overwritten_events``, without reading the file back."""
        if self._stream_counts is None:
            raise RuntimeError("hooktrace: stream_counts() is there once a streamed (out=) "
                               "trace has ended")
        return dict(self._stream_counts)

    def streamed_by_parent(self) -> bool:
        """Whether this is a forked child's copy of a streaming recorder: the stream is
        the parent process's (the child writes nothing to it)."""
        return self._out is not None and self._stream_pid not in (0, os.getpid())

    def discard_stream(self) -> None:
        """After the block: deletes the streamed file (a run with nothing worth keeping,
        e.g. no module called); not in a forked child (the file is the parent's)."""
        if self._state != "done":
            raise RuntimeError("hooktrace: discard_stream() is for a trace that has ended")
        if self._out is not None and not self.streamed_by_parent():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._out)

    def _load_stream(self, **now: Any) -> TraceResult:
        """The file read back as a result: after the block, or while recording
        (``snapshot()``; ``now``: the counts so far), when it is not cut but being written."""
        assert self._out is not None
        contents = read_trace(self._out)
        info = dict(contents.info, **now)
        if now:
            info.pop("cut", None)
        info["out"] = self._out
        if self._stream_lost is not None:
            error, lost = self._stream_lost
            info["stream_error"] = error
            info["dropped_events"] = int(info.get("dropped_events", 0)) + lost
        return TraceResult(contents.events, contents.modules, contents.node_names,
                           contents.clock, info)


def thread_names() -> dict[str, str]:
    return {str(t.native_id): t.name for t in threading.enumerate()}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
