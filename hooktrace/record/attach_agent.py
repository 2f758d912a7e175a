"""``hooktrace attach``'s side inside the traced process (issue #39).

``hooktrace attach PID`` (:mod:`hooktrace.record.attach`) makes the target's main thread run
a few lines at a safe point between bytecodes, with the GIL, in a namespace of their own
(``Py_AddPendingCall`` through gdb before Python 3.14, ``sys.remote_exec`` from 3.14):
they open the private folder attach made for this process, take its one-shot token
(proving the folder and the request are this attach's), check that torch is imported and
that this hooktrace is the attaching one's version, and call :func:`start` with the
request and the folder's descriptor, then return. :func:`start` starts the process-wide
recording of ``hooktrace run`` (:func:`hooktrace.record.launch.start`, the same options)
and returns at once; the training loop goes on, recorded.

The recording ends in the target: after the asked number of optimizer steps, or the
asked seconds, or shortly before the attach's timeout (a job that never steps), or as
soon as attach says ``stop`` (a Ctrl-C) or ``left`` (it gave up): the recorder detaches
at the next module call and writes the output there, as ``hooktrace run`` does at exit
(and at interpreter exit, if the job ends first). Detaching never happens inside
``Optimizer.step``: torch iterates its global step hooks as a live dict there
(``torch/optim/optimizer.py``), and removing the recorder's hook from inside it would
raise in the job; the one-shot global forward pre-hook that detaches is safe to add and
remove at any time (``Module._call_impl`` iterates a copy of those hooks). Detaching
undoes everything the recorder did (``nn.Module.__call__``, torch's global hooks, the
SIGTERM handler, the warning filter below), as at the end of ``hooktrace run``.

Files (issue #46): the outputs (``-o``, ``--chrome``, ``--pftrace``) are written inside
the private folder, through ``/proc/self/fd/N``, the folder's descriptor (a path another
user could swap for a link is never followed), then renamed into place (a link planted
at the output's name is replaced, never followed). The status (JSON with attach's nonce:
``recording`` once started, then ``done`` or ``error`` with one line, the lines
``hooktrace run`` would have printed, the output's path) is written to a temporary file
in the folder and renamed. Nothing is printed in the job's own output: torch's warning
about global hooks on a ``torch.compile``'d module (issue #47) is filtered while recording.

The first step recorded is partial: the attach lands somewhere in a step, so step 0
runs from the attach to the first optimizer step; ``--steps N`` records steps 1..N
whole after it. The trace's metadata says so (``info["attach"]``), and readers count
step 0 as incomplete; it also says whether the model had been compiled before.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import os
import secrets
import sys
import threading
import time
import warnings
from typing import Any

from hooktrace.record.attach_folder import GO, JobFolder
from hooktrace.record.process_state import STATE

__all__ = ["Attachment", "start"]

# A frame of this file is Optimizer.step's (its hooks are iterated live there)
_OPTIMIZER_FILE = os.path.join("torch", "optim", "optimizer.py")
# How often the recording looks for attach's stop, left and go (a stat each)
POLL_S = 0.05
# torch/_dynamo/eval_frame.py's OptimizedModule.__call__, with any global module hook
_COMPILE_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
# hooktrace top's lease (the request's "lease" file): the recording ends once the file is
# gone or untouched for LEASE_STALE_S (a watcher killed, or stopped with Ctrl-Z)
LEASE_STALE_S = 10.0


def start(request: dict[str, Any], fd: int) -> None:
    """Starts recording as ``request`` asks (see the module docstring); ``fd``: the
    private folder, whose token the boot code took. Never raises: whatever fails is one
    line in the status file."""
    folder = JobFolder(fd, str(request.get("nonce")))
    try:
        problem = _already_traced()
        if problem is None and folder.told_to_stop():
            problem = "attach gave up before recording started"
        if problem is not None:
            folder.write_status({"state": "error", "message": problem})
            _close(folder)
            return
        attachment = Attachment(request, folder)
        STATE.attachment = attachment
        if request.get("go"):  # the ranks of a job: all start once all are attached
            threading.Thread(target=attachment.begin_at_go, name="hooktrace-attach-go",
                             daemon=True).start()
        elif _inside_optimizer_step():
            attachment.at_next_module_call(attachment.begin)
        else:
            attachment.begin()
    except BaseException as e:  # (a Ctrl-C too: the job's own loop must not see it)
        STATE.attachment = None
        with contextlib.suppress(Exception):
            folder.write_status({"state": "error", "message": f"could not start recording: {e}"})
        _close(folder)


def _close(folder: JobFolder) -> None:
    if folder.abandoned():
        folder.remove()
    folder.close()


def _held(lease: str) -> bool:
    """Whether hooktrace top's lease file is there and was touched lately."""
    try:
        return time.time() - os.stat(lease).st_mtime < LEASE_STALE_S
    except OSError:
        return False


def _already_traced() -> str | None:
    """Why this process cannot be attached to, if it cannot."""
    from hooktrace.record import dispatch

    if STATE.attachment is not None:
        return (f"process {os.getpid()} is already recorded by another hooktrace attach: "
                "wait for it to end")
    if dispatch.installed() is not None:
        return (f"process {os.getpid()} is already under hooktrace (hooktrace run, "
                "HOOKTRACE=1, trace() or a callback): its own trace records it")
    return None


def _inside_optimizer_step() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_OPTIMIZER_FILE):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _compiled_before() -> bool:
    """Whether torch.compile has compiled frames in this process (dynamo's counters)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return False
    with contextlib.suppress(Exception):
        return bool(counters["frames"].get("ok", 0) or counters["stats"].get("unique_graphs", 0))
    return False


class _Staged:
    """One file option written in the private folder (``o<k>/``), then renamed into
    ``dest`` (the output's folder: the private folder's parent; else opened by name)."""

    def __init__(self, folder: JobFolder, k: int, option: str, dest: str) -> None:
        self.sub = f"o{k}"
        self.dest = dest
        os.mkdir(self.sub, 0o700, dir_fd=folder.fd)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        self.dest_fd = (os.open("..", flags, dir_fd=folder.fd) if k == 0 else
                        os.open(dest, flags))
        self.root = f"/proc/self/fd/{folder.fd}/{self.sub}"
        self.option = option

    def path(self, value: str) -> str:
        """``value`` (a file or a folder/) inside the private folder."""
        return self.root + os.sep + ("" if value.endswith(os.sep) else os.path.basename(value))

    def shown(self, text: str) -> str:
        """``text`` with the private folder's paths as the places they were moved to."""
        dest = self.dest.rstrip(os.sep) or os.sep
        return text.replace(self.root + os.sep, os.path.join(dest, "")).replace(self.root, dest)

    def publish(self, folder: JobFolder) -> list[str]:
        """Renames every file written into place (a name there, a link included, is
        replaced, never followed); returns a line per file that went elsewhere."""
        notes: list[str] = []
        sub = os.open(self.sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=folder.fd)
        try:
            for name in os.listdir(sub):
                try:
                    os.rename(name, name, src_dir_fd=sub, dst_dir_fd=self.dest_fd)
                    continue
                except OSError as e:
                    why = e.strerror
                # (a sticky folder where another user's file holds the name): a new name
                stem, dot, ext = name.partition(".")
                other = f"{stem}.attach-{secrets.token_hex(4)}{dot}{ext}"
                try:
                    os.link(name, other, src_dir_fd=sub, dst_dir_fd=self.dest_fd,
                            follow_symlinks=False)
                    os.unlink(name, dir_fd=sub)
                    notes.append(f"hooktrace: {os.path.join(self.dest, name)} could not be "
                                 f"replaced ({why}): wrote {os.path.join(self.dest, other)}")
                except OSError as e:
                    notes.append(f"hooktrace: error: {name} could not be moved to "
                                 f"{self.dest} ({why}; {e.strerror}): it is lost")
        finally:
            os.close(sub)
        return notes

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.dest_fd)


class Attachment:
    """One attach: the request, the recording, and how it ends."""

    def __init__(self, request: dict[str, Any], folder: JobFolder) -> None:
        from hooktrace.record.launch import add_options, options_from_args

        self.folder = folder
        self.steps: int | None = request.get("steps")
        self.seconds: float | None = request.get("seconds")
        self.lease: str | None = request.get("lease")
        # attach stops waiting at its timeout: the recording ends a little before (the
        # deadline is wall-clock in the request: the same on both sides of one machine)
        self.stop_at = time.monotonic() + max(0.0, float(request["stop_unix"]) - time.time())
        # the options as `hooktrace attach` parsed them (hooktrace run's flags), over
        # their defaults; the file outputs in the private folder
        parser = argparse.ArgumentParser(add_help=False)
        add_options(parser, leave_out=("schedule", "profile", "steps"))
        args = parser.parse_args([])
        vars(args).update(request["options"])
        self.staged: list[_Staged] = []
        for k, (option, dest) in enumerate(request["staged"]):
            value = getattr(args, option, None)
            if isinstance(value, str):
                staged = _Staged(folder, k, option, dest)
                self.staged.append(staged)
                setattr(args, option, staged.path(value))
        self.options = options_from_args(args)
        self.trace: Any = None
        self.pid = os.getpid()  # (a forked child inherits the hooks: it does nothing)
        self.attached_ns = time.time_ns()
        self.first_step_ns: int | None = None
        self.steps_seen = 0
        self.compiled = False
        self._quiet: Any = None  # the warning filter installed while recording
        self._hook: Any = None  # the one-shot forward pre-hook's handle
        self._pending: Any = None  # what it runs
        self._ended = threading.Event()
        self._finished = False

    def run_info(self) -> dict[str, Any]:
        """The trace's ``info["attach"]`` (hooktrace.record.recorder)."""
        return {"first_step_partial": True, "compiled_before": self.compiled,
                "attached_unix_ns": self.attached_ns}

    def output(self) -> str:
        """Where the .htrace goes, as the user sees it (not the private folder)."""
        return self.shown(str(self.options.output))

    def shown(self, text: str) -> str:
        for staged in self.staged:
            text = staged.shown(text)
        return text

    # -- start ---------------------------------------------------------------

    def begin(self) -> None:
        from hooktrace.record.launch import start as start_trace

        if self.seconds:
            self.stop_at = min(self.stop_at, time.monotonic() + float(self.seconds))
        self.compiled = _compiled_before()
        self._quiet = _quiet_compile_warning()
        self.trace = start_trace(self.options, on_step=self._on_step)
        atexit.register(self.finish)
        threading.Thread(target=self._watch, name="hooktrace-attach", daemon=True).start()
        self._write("recording")

    def begin_at_go(self) -> None:
        """Waits (off the main thread) for attach's go, then starts the recording at
        the job's next module call (never inside Optimizer.step)."""
        while not self.folder.has(GO):
            if self.folder.told_to_stop() or time.monotonic() >= self.stop_at:
                STATE.attachment = None
                with contextlib.suppress(Exception):
                    self._write("error", message="attach gave up before every rank was "
                                                 "attached; nothing was recorded")
                self._close()
                return
            time.sleep(POLL_S / 5)
        self.at_next_module_call(self.begin)

    def _on_step(self, ended: int) -> None:
        """After each step mark (inside Optimizer.step: nothing detaches here)."""
        self.steps_seen = ended + 1
        if self.first_step_ns is None:
            self.first_step_ns = time.time_ns()
        # step 0 is the partial one the attach landed in
        if self.steps is not None and ended >= self.steps:
            self.at_next_module_call(self.finish)

    def _watch(self) -> None:
        """Ends the recording at the deadline, as soon as attach says so, or when hooktrace
        top's lease lapses."""
        while not self._ended.wait(POLL_S):
            if (time.monotonic() >= self.stop_at or self.folder.told_to_stop()
                    or (self.lease and not _held(self.lease))):
                self.at_next_module_call(self.finish)
                return

    # -- the safe point ------------------------------------------------------

    def at_next_module_call(self, then: Any) -> None:
        """Runs ``then()`` on the thread of the next module call (a global forward
        pre-hook, removed first). From any thread: one dict insert under the GIL."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        if self._hook is not None:
            return
        self._pending = then
        self._hook = register_module_forward_pre_hook(self._at_module_call)

    def _at_module_call(self, module: Any, args: Any) -> None:
        if _inside_optimizer_step():  # (a module called by an optimizer hook: later)
            return
        hook, self._hook = self._hook, None
        then, self._pending = self._pending, None
        if hook is None or then is None:  # another thread got here first
            return
        hook.remove()
        try:
            then()
        except BaseException as e:  # never into the job's module call
            if self.trace is None:
                STATE.attachment = None
                _unquiet(self._quiet)
                with contextlib.suppress(Exception):
                    self._write("error", message=f"could not start recording: {e}")
                self._close()

    # -- the end -------------------------------------------------------------

    def finish(self) -> None:
        """Ends the recording, puts everything back, writes the output and moves it
        into place (once)."""
        if self._finished or os.getpid() != self.pid:
            return
        self._finished = True
        self._ended.set()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        from hooktrace.record.launch import stop_writing_on_sigterm, write_outputs

        lines = io.StringIO()
        state, message = "done", ""
        try:
            with contextlib.redirect_stderr(lines):
                stop_writing_on_sigterm()
                if self.trace is not None:
                    self.trace.__exit__(None, None, None)
                    write_outputs(self.trace, self.options)
        except Exception as e:
            state, message = "error", f"could not write the trace: {e}"
        finally:
            _unquiet(self._quiet)
            with contextlib.suppress(Exception):
                atexit.unregister(self.finish)
            STATE.attachment = None
            said = [self.shown(line) for line in lines.getvalue().splitlines()]
            for staged in self.staged:
                with contextlib.suppress(OSError):
                    said += staged.publish(self.folder)
            if self.compiled:
                said.append("hooktrace: the model was compiled (torch.compile) before the "
                            "attach: each compiled region is one span, the module whose call "
                            "entered it")
            with contextlib.suppress(Exception):
                self._write(state, message=self.shown(message), lines=said,
                            detached_unix_ns=time.time_ns())
            self._close()

    def _close(self) -> None:
        for staged in self.staged:
            staged.close()
        _close(self.folder)

    def _write(self, state: str, **more: Any) -> None:
        self.folder.write_status({
            "state": state, "pid": os.getpid(), "output": self.output(),
            "attached_unix_ns": self.attached_ns, "first_step_unix_ns": self.first_step_ns,
            "steps": self.steps_seen, "compiled": self.compiled, **more})


def _quiet_compile_warning() -> Any:
    """Filters torch's warning about global hooks on a compiled module while recording
    (the recorder's hooks are global: the job's log must not change); returns the
    filter, for :func:`_unquiet`."""
    warnings.filterwarnings("ignore", message=_COMPILE_HOOKS_WARNING, category=UserWarning)
    return warnings.filters[0]


def _unquiet(entry: Any) -> None:
    """Removes the filter :func:`_quiet_compile_warning` added (if still there)."""
    if entry is None:
        return
    filters: Any = warnings.filters  # (a list: typeshed says Sequence)
    with contextlib.suppress(ValueError):
        filters.remove(entry)
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()
