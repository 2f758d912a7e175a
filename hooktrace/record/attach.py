"""``hooktrace attach``: record a running PyTorch process for a few steps, then leave
(issue #39). This is the attaching side; :mod:`hooktrace.record.attach_agent` runs in the target.

What it needs, checked before anything is done to the target (each missing one is one
line, and the target is left untouched):

- the target is a CPython process (its ``/proc/PID/maps`` holds a libpython, or its
  executable exports ``Py_AddPendingCall``);
- ptrace rights over it: the same user (or CAP_SYS_PTRACE, root in most containers), and
  ``kernel.yama.ptrace_scope`` 0 (1 and 2 need CAP_SYS_PTRACE, 3 forbids attaching);
- before Python 3.14, ``gdb`` on PATH; from 3.14, ``sys.remote_exec`` (PEP 768);
- the target imports the same hooktrace (same version): the same environment.

How it injects, before 3.14: gdb stops the process for well under a second, maps one
page (``mmap``: a system call, no lock taken, unlike ``malloc``, which another thread
may hold), writes a few lines of Python there and queues them with
``Py_AddPendingCall(PyRun_SimpleString, page)``, then detaches. The main thread runs them
at its next safe point between bytecodes, holding the GIL (code run from gdb directly
on a stopped thread deadlocks when another thread holds malloc's or the GIL's lock). The
lines run hooktrace's boot file in a namespace of their own, catching everything (a
pending call that fails would raise SystemError in the job). The page (4 KiB) stays
mapped in the target.

Example::

    hooktrace attach 12345 -o slow.htrace --steps 5
    hooktrace attach --ranks 6789 -o out/ --steps 3   # every worker of a torchrun job
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooktrace.errors import AttachError

__all__ = ["AttachRequest", "Attached", "attach", "check_target", "worker_pids"]

# CAP_SYS_PTRACE's bit in /proc/PID/status's CapEff (linux/capability.h)
CAP_SYS_PTRACE = 19
# How long gdb may take to stop, inject and detach (about 0.4 s measured, torch loaded)
GDB_TIMEOUT_S = 60.0
# How often the status files are read while waiting
POLL_S = 0.05


@dataclass(frozen=True)
class AttachRequest:
    """What to record and when to stop (``hooktrace attach``'s arguments)."""

    options: dict[str, Any]  # hooktrace run's options, as parsed (JSON values)
    steps: int | None  # optimizer steps to record after the partial first one
    seconds: float | None  # or seconds of recording
    timeout: float  # how long to wait for the recording to end
    # hooktrace top's hook: a file the watcher keeps touching; the recording ends once it
    # is gone or LEASE_STALE_S old (hooktrace.record.attach_agent)
    lease: str | None = None


@dataclass
class Attached:
    """One target's outcome: its status file's last content."""

    pid: int
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return str(self.status.get("state", "waiting"))


# -- checks -------------------------------------------------------------------


def check_target(pid: int) -> None:
    """Raises AttachError (one line) unless ``pid`` is a CPython process this process
    may attach to, with what attaching needs here."""
    proc = f"/proc/{pid}"
    if pid <= 0 or not os.path.isdir(proc):
        raise AttachError(f"no process with PID {pid}")
    try:
        exe = os.readlink(f"{proc}/exe")
        with open(f"{proc}/maps") as f:
            maps = f.read()
    except PermissionError:
        raise AttachError(f"process {pid}: cannot read {proc}/maps: attaching needs ptrace "
                          f"rights over it (the same user, or CAP_SYS_PTRACE)") from None
    except FileNotFoundError:
        raise AttachError(f"no process with PID {pid}") from None
    if not _exports_pending_call(pid, exe, maps):
        raise AttachError(f"process {pid} ({os.path.basename(exe)}) is not a CPython "
                          "interpreter (no libpython mapped, no Py_AddPendingCall exported)")
    problem = _ptrace_problem(pid)
    if problem is not None:
        raise AttachError(problem)
    if not _remote_exec_usable(pid) and shutil.which("gdb") is None:
        raise AttachError("gdb is not on PATH: before Python 3.14 hooktrace attach injects "
                          "through gdb (e.g. apt-get install gdb)")


def _exports_pending_call(pid: int, exe: str, maps: str) -> bool:
    paths = {line.split(None, 5)[5] for line in maps.splitlines()
             if len(line.split(None, 5)) == 6}
    libs = sorted(p for p in paths if re.search(r"/libpython3[^/]*\.so", p))
    for path in [*libs, exe]:
        try:  # (through /proc/PID/root: the target's own files, in a container too)
            data = Path(f"/proc/{pid}/root{path}").read_bytes()
        except OSError:
            continue
        if b"\0Py_AddPendingCall\0" in data and b"\0PyRun_SimpleString\0" in data:
            return True
    return False


def _target_version(pid: int) -> tuple[int, int] | None:
    """The target's Python (major, minor), from its libpython or executable name."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    found = re.search(r"libpython(\d)\.(\d+)", maps) or re.search(r"python(\d)\.(\d+)", exe)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _remote_exec_usable(pid: int) -> bool:
    version = _target_version(pid)
    return hasattr(sys, "remote_exec") and version is not None and version >= (3, 14)


def _capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _ptrace_problem(pid: int) -> str | None:
    """Why ptrace would refuse to attach to ``pid``, in one line, or None."""
    can_ptrace = bool(_capabilities() >> CAP_SYS_PTRACE & 1)
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        with open(f"/proc/{pid}/status") as f:
            tracer = next((int(line.split()[1]) for line in f if line.startswith("TracerPid:")), 0)
    except OSError as e:
        return f"process {pid}: {e.strerror}"
    if tracer:
        return f"process {pid} is being traced by process {tracer} (a debugger): detach it first"
    if owner != os.geteuid() and not can_ptrace:
        return (f"process {pid} belongs to another user (uid {owner}): attaching needs the "
                "same user or CAP_SYS_PTRACE")
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip() or 0)
    except (OSError, ValueError):
        scope = 0  # no Yama: the user's own processes
    if scope == 3:
        return "kernel.yama.ptrace_scope is 3: no process may be attached to until reboot"
    if scope in (1, 2) and not can_ptrace:
        return (f"kernel.yama.ptrace_scope is {scope}: attaching to a process that is not a "
                "child needs CAP_SYS_PTRACE (run as root, or sudo sysctl "
                "kernel.yama.ptrace_scope=0)")
    return None


def worker_pids(agent_pid: int) -> list[int]:
    """The CPython children of a torchrun agent (its workers), sorted."""
    check_target(agent_pid)
    children: set[int] = set()
    for task in Path(f"/proc/{agent_pid}/task").iterdir():
        try:
            children.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    workers = []
    for child in sorted(children):
        try:
            check_target(child)
        except AttachError:
            continue
        workers.append(child)
    if not workers:
        raise AttachError(f"process {agent_pid} has no Python child processes: --ranks "
                          "takes the PID of torchrun (its agent), whose workers it attaches to")
    return workers


# -- injection ----------------------------------------------------------------

_BOOT = '''\
def _hooktrace_attach():
    import os
    status = {status!r}
    def fail(message):
        import json
        with open(status + ".boot.tmp", "w") as f:
            json.dump({{"state": "error", "message": message}}, f)
        os.replace(status + ".boot.tmp", status)
    try:
        from hooktrace._version import __version__
    except BaseException as e:
        fail("process %d cannot import hooktrace (%s: %s): attach to a process of the same "
             "environment" % (os.getpid(), type(e).__name__, e))
        return
    if __version__ != {version!r}:
        fail("process %d has hooktrace %s, this is %s: attach with the hooktrace of its "
             "environment" % (os.getpid(), __version__, {version!r}))
        return
    from hooktrace.record.attach_agent import start
    start({request!r})
_hooktrace_attach()
'''

# What the pending call runs: the boot file, in a namespace of its own, never raising
_PENDING = ("try:\n    exec(compile(open({boot!r}, 'rb').read(), {boot!r}, 'exec'), "
            "{{'__name__': '__hooktrace_attach__'}})\nexcept BaseException:\n    pass\n")


def _inject(pid: int, boot: Path, work: Path) -> None:
    """Has the target's main thread run ``boot`` at its next safe point."""
    if _remote_exec_usable(pid):
        pending = work / "pending.py"
        pending.write_text(_PENDING.format(boot=str(boot)))
        try:
            sys.remote_exec(pid, str(pending))  # type: ignore[attr-defined]
        except Exception as e:
            raise AttachError(f"process {pid}: sys.remote_exec failed: {e}") from None
        return
    code = work / "pending.bin"
    code.write_bytes(_PENDING.format(boot=str(boot)).encode() + b"\0")
    if code.stat().st_size > 4096:
        raise AttachError(f"the boot path is too long for one page: {boot}")
    gdb = shutil.which("gdb")
    assert gdb is not None  # (check_target)
    command = [gdb, "-nx", "-batch", "-p", str(pid),
               # only libc's and libpython's symbols: libtorch's take gdb tens of seconds
               "-iex", "set auto-solib-add off",
               "-ex", r"sharedlibrary libc\.so", "-ex", "sharedlibrary libpython",
               "-ex", "set $page = (char *) mmap(0, 4096, 3, 34, -1, 0)",
               "-ex", f"restore {code} binary $page",
               "-ex", "print (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, "
                      "(void *) $page)",
               "-ex", "detach"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=GDB_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AttachError(f"process {pid}: gdb did not finish in {GDB_TIMEOUT_S:.0f} s") from None
    queued = re.search(r"^\$\d+ = (-?\d+)\s*$", done.stdout, re.MULTILINE)
    if queued is None or queued.group(1) != "0":
        why = next((line for line in (done.stderr + done.stdout).splitlines()
                    if "ptrace" in line or "rror" in line or "No symbol" in line),
                   "Py_AddPendingCall was not called")
        raise AttachError(f"process {pid}: gdb could not inject: {why.strip()}")


# -- the whole attach ------------------------------------------------------------


def attach(pids: list[int], request: AttachRequest, status_dir: Path) -> list[Attached]:
    """Attaches to each of ``pids`` (checked first, all of them), records as
    ``request`` asks and waits for each to be done; returns their outcomes. Raises
    AttachError when a target cannot be attached to (none is touched then)."""
    from hooktrace._version import __version__

    for pid in pids:
        check_target(pid)
    work = Path(tempfile.mkdtemp(prefix="hooktrace-attach-"))
    outcomes = [Attached(pid) for pid in pids]
    statuses = {o.pid: status_dir / f".hooktrace-attach-{o.pid}.json" for o in outcomes}
    # Several targets (the ranks of a job) start recording together: each waits for
    # this file, written once all are injected (else under load rank 0 could record
    # its steps and stop before rank 1 was attached: not ranks of one run)
    go = work / "go" if len(pids) > 1 else None
    try:
        os.chmod(work, 0o755)  # a target run by another user reads its boot file
        for o in outcomes:
            statuses[o.pid].unlink(missing_ok=True)
            req = work / f"request-{o.pid}.json"
            req.write_text(json.dumps({
                "status": str(statuses[o.pid]), "options": request.options,
                "steps": request.steps, "seconds": request.seconds,
                "timeout": request.timeout, "go": str(go) if go else None,
                "lease": request.lease}))
            boot = work / f"boot-{o.pid}.py"
            boot.write_text(_BOOT.format(status=str(statuses[o.pid]), version=__version__,
                                         request=str(req)))
            for f in (req, boot):
                os.chmod(f, 0o644)
            _inject(o.pid, boot, work)
        if go is not None:
            go.write_text("go")
            os.chmod(go, 0o644)
        _wait(outcomes, statuses, request)
    finally:
        # a target that has not run its pending call yet finds no files: it does nothing
        shutil.rmtree(work, ignore_errors=True)
        for path in statuses.values():
            path.unlink(missing_ok=True)
    return outcomes


def _wait(outcomes: list[Attached], statuses: dict[int, Path], request: AttachRequest) -> None:
    # the agent stops itself at --seconds or the timeout; a little more for the writing
    deadline = time.monotonic() + request.timeout + 30.0
    waiting = list(outcomes)
    while waiting and time.monotonic() < deadline:
        for o in list(waiting):
            try:
                o.status = json.loads(statuses[o.pid].read_text())
            except (OSError, ValueError):
                if not os.path.isdir(f"/proc/{o.pid}"):
                    o.status = {"state": "error",
                                "message": f"process {o.pid} ended before recording ended"}
                    waiting.remove(o)
                continue
            if o.state in ("done", "error"):
                waiting.remove(o)
            elif not os.path.isdir(f"/proc/{o.pid}"):
                o.status = {**o.status, "state": "error",
                            "message": f"process {o.pid} ended while recording"}
                waiting.remove(o)
        time.sleep(POLL_S)
    for o in waiting:
        o.status = {**o.status, "state": "error", "message": (
            f"process {o.pid}: no recording started in {request.timeout:.0f} s (its main "
            "thread ran no Python code: blocked in a call?)" if o.state == "waiting" else
            f"process {o.pid}: recording did not end in {request.timeout:.0f} s (no module "
            "called since?); it detaches at its next module call")}
