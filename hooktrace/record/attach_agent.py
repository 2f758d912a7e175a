"""``hooktrace attach``'s side inside the traced process (issue #39).

``hooktrace attach PID`` (:mod:`hooktrace.record.attach`) makes the target's main thread run a
few lines at a safe point between bytecodes, with the GIL (``Py_AddPendingCall`` through
gdb before Python 3.14, ``sys.remote_exec`` from 3.14): they check the target's
hooktrace is the attaching one's version and call :func:`start` with the request file,
then return. :func:`start` starts the process-wide recording of ``hooktrace run``
(:func:`hooktrace.record.launch.start`, the same options) and returns at once; the training
loop goes on, recorded.

The recording ends in the target: after the asked number of optimizer steps, or the
asked seconds, or the attach's timeout (a job that never steps), the recorder detaches
at the next module call and writes the output there, as ``hooktrace run`` does at exit
(and at interpreter exit, if the job ends first). Detaching never happens inside
``Optimizer.step``: torch iterates its global step hooks as a live dict there
(``torch/optim/optimizer.py``), and removing the recorder's hook from inside it would
raise in the job; the one-shot global forward pre-hook that detaches is safe to add and
remove at any time (``Module._call_impl`` iterates a copy of those hooks). Detaching
undoes everything the recorder did (``nn.Module.__call__``, torch's global hooks, the
SIGTERM handler), as at the end of ``hooktrace run``.

The agent says where it stands in the status file the request names (JSON, replaced
atomically): ``recording`` once started, then ``done`` or ``error`` with one line, the
lines ``hooktrace run`` would have printed, and the output's path. Nothing is printed
in the job's own output.

The first step recorded is partial: the attach lands somewhere in a step, so step 0
runs from the attach to the first optimizer step; ``--steps N`` records steps 1..N
whole after it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import sys
import threading
import time
from typing import Any

from hooktrace.record.process_state import STATE

__all__ = ["Attachment", "start", "write_status"]

# A frame of this file is Optimizer.step's (its hooks are iterated live there)
_OPTIMIZER_FILE = os.path.join("torch", "optim", "optimizer.py")
# hooktrace top's lease (the request's "lease" file): the recording ends once the file is
# gone or untouched for LEASE_STALE_S (a watcher killed, or stopped with Ctrl-Z), looked
# at every LEASE_POLL_S
LEASE_STALE_S = 10.0
LEASE_POLL_S = 0.2


def write_status(path: str, status: dict[str, Any]) -> None:
    """The status file, replaced at once (the attaching side polls it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)


def start(request_path: str) -> None:
    """Starts recording as ``request_path`` asks (see the module docstring); never
    raises: whatever fails is one line in the status file."""
    try:
        with open(request_path) as f:
            request = json.load(f)
    except Exception:  # no status path to report to: the attaching side times out
        return
    status = str(request["status"])
    try:
        problem = _already_traced()
        if problem is not None:
            write_status(status, {"state": "error", "message": problem})
            return
        attachment = Attachment(request)
        STATE.attachment = attachment
        go = request.get("go")
        if go:  # the ranks of a job: all start once all are attached (hooktrace.record.attach)
            threading.Thread(target=_begin_at_go, args=(attachment, str(go)),
                             name="hooktrace-attach-go", daemon=True).start()
        elif _inside_optimizer_step():
            attachment.at_next_module_call(attachment.begin)
        else:
            attachment.begin()
    except BaseException as e:  # (a Ctrl-C too: the job's own loop must not see it)
        STATE.attachment = None
        with contextlib.suppress(Exception):
            write_status(status, {"state": "error",
                                  "message": f"could not start recording: {e}"})


def _begin_at_go(attachment: "Attachment", go: str) -> None:
    """Waits (off the main thread) for the attaching side's go file, then starts the
    recording at the job's next module call (never inside Optimizer.step)."""
    deadline = time.monotonic() + attachment.seconds
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
    attachment.at_next_module_call(attachment.begin)


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
        return f"process {os.getpid()} is already attached to by hooktrace attach"
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


class Attachment:
    """One attach: the request, the recording, and how it ends."""

    def __init__(self, request: dict[str, Any]) -> None:
        from hooktrace.record.launch import add_options, options_from_args

        self.status = str(request["status"])
        self.steps: int | None = request.get("steps")
        # --seconds, else the attaching side's timeout: a job that never steps ends too
        self.seconds = float(request.get("seconds") or request["timeout"])
        self.lease: str | None = request.get("lease")
        # the options as `hooktrace attach` parsed them (hooktrace run's flags), over
        # their defaults
        parser = argparse.ArgumentParser(add_help=False)
        add_options(parser, leave_out=("schedule", "profile", "steps"))
        args = parser.parse_args([])
        vars(args).update(request["options"])
        self.options = options_from_args(args)
        self.trace: Any = None
        self.attached_ns = time.time_ns()
        self.first_step_ns: int | None = None
        self.steps_seen = 0
        self._hook: Any = None  # the one-shot forward pre-hook's handle
        self._pending: Any = None  # what it runs
        self._ended = threading.Event()
        self._finished = False

    # -- start ---------------------------------------------------------------

    def begin(self) -> None:
        from hooktrace.record.launch import start as start_trace

        self.trace = start_trace(self.options, on_step=self._on_step)
        atexit.register(self.finish)
        threading.Thread(target=self._wait, name="hooktrace-attach", daemon=True).start()
        self._write("recording")

    def _on_step(self, ended: int) -> None:
        """After each step mark (inside Optimizer.step: nothing detaches here)."""
        self.steps_seen = ended + 1
        if self.first_step_ns is None:
            self.first_step_ns = time.time_ns()
        # step 0 is the partial one the attach landed in
        if self.steps is not None and ended >= self.steps:
            self.at_next_module_call(self.finish)

    def _wait(self) -> None:
        deadline = time.monotonic() + self.seconds
        poll = LEASE_POLL_S if self.lease else self.seconds
        while not self._ended.wait(min(poll, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or (self.lease and not _held(self.lease)):
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
            STATE.attachment = None
            with contextlib.suppress(Exception):
                self._write("error", message=f"could not start recording: {e}")

    # -- the end -------------------------------------------------------------

    def finish(self) -> None:
        """Ends the recording, puts everything back and writes the output (once)."""
        if self._finished:
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
            with contextlib.suppress(Exception):
                atexit.unregister(self.finish)
            STATE.attachment = None
            with contextlib.suppress(Exception):
                self._write(state, message=message, lines=lines.getvalue().splitlines(),
                            detached_unix_ns=time.time_ns())

    def _write(self, state: str, **more: Any) -> None:
        write_status(self.status, {
            "state": state, "pid": os.getpid(), "output": str(self.options.output),
            "attached_unix_ns": self.attached_ns, "first_step_unix_ns": self.first_step_ns,
            "steps": self.steps_seen, **more})
