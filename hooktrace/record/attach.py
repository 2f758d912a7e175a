"""``hooktrace attach``: record a running PyTorch process for a few steps, then leave
(issue #39). This is the attaching side; :mod:`hooktrace.record.attach_agent` runs in the target.

What it needs, checked before anything is done to the target (each missing one is one
line, and the target is left untouched):

- the target is a CPython process (its ``/proc/PID/maps`` holds a libpython, or its
  executable exports ``Py_AddPendingCall``) that has imported torch (a libtorch mapped:
  a process without torch has nothing to record, and nothing is imported into it);
- it is running: a job stopped by SIGSTOP (Ctrl-Z, a scheduler's suspend) is refused,
  since gdb cannot call into a stopped process safely (issue #46: it died of SIGSEGV
  once continued);
- ptrace rights over it: the same user (or CAP_SYS_PTRACE, root in most containers), and
  ``kernel.yama.ptrace_scope`` 0 (1 and 2 need CAP_SYS_PTRACE, 3 forbids attaching); no
  other debugger (or another attach's gdb) holding it;
- its user can write the output folder (the trace is moved there by the job itself);
- before Python 3.14, ``gdb`` on PATH; from 3.14, ``sys.remote_exec`` (PEP 768);
- the target imports the same hooktrace (same version): the same environment.

**Nothing another local user can create, replace or link steers the job** (issue #46).
Each target gets a private folder, ``.hooktrace-attach-<random>`` in the output folder:
made here with mode 0700, handed to the job's user (``fchown`` when attaching as root),
checked after creation (owner, mode, the same inode as the name) and used by descriptor
only. In it: ``token`` (a random nonce, also written into the boot code), the job's
``status`` (written through a temporary file in the folder and renamed), ``go`` (the
ranks of a job start together), ``stop`` / ``left`` (attach gave up or was interrupted),
and ``o<k>/``, where the job writes its outputs before renaming them into place. The
boot code is not a file: gdb writes it into pages it maps in the job. The job runs it
only if the folder is its user's, mode 0700, and holds the nonce, which it consumes
(one shot): once attach has given up it removed the token first, so a queued call that
runs later does nothing at all. A status file is read only if the job's user owns it and
it carries the nonce, and what it says is printed escaped (:func:`hooktrace.text.printable`).

How it injects, before 3.14: gdb stops the process for well under a second, maps a few
pages (``mmap``: a system call, no lock taken, unlike ``malloc``, which another thread
may hold), writes the boot code there and queues it with
``Py_AddPendingCall(PyRun_SimpleString, page)``, then detaches. The main thread runs it
at its next safe point between bytecodes, holding the GIL (code run from gdb directly
on a stopped thread deadlocks when another thread holds malloc's or the GIL's lock).
The code runs in a namespace of its own (``exec`` with a fresh dict, reached through
``import builtins`` under a random name that is deleted after): the script's globals are
neither read nor changed (nanoGPT's ``compile = False`` once made it fail silently,
issue #47). The pages stay mapped in the target.

Signals that reach the job while gdb holds it (a scheduler's SIGUSR1, a timer) are not
passed into the injected calls (one SIGUSR1 passed there killed the job with SIGSEGV,
issue #46): gdb holds them back (``handle all nostop print nopass``) and this side sends
each again once gdb has detached, so the job receives it after, where it would have.
Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL) inside an injected call unwind it
(``unwindonsignal``). gdb runs in a session of its own: a Ctrl-C to attach never
reaches it in the middle of a call; attach waits for it to detach first.

Example::

    hooktrace attach 12345 -o slow.htrace --steps 5
    hooktrace attach --ranks 6789 -o out/ --steps 3   # every worker of a torchrun job
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hooktrace.errors import AttachError
from hooktrace.record.attach_folder import (
    GO,
    LEFT,
    STOP,
    PrivateFolder,
    check_job_can_write,
    check_not_shared,
    proc_status,
)
from hooktrace.text import printable

__all__ = ["AttachRequest", "Attached", "attach", "check_target", "check_torch", "held_back",
           "pending_code", "worker_pids"]

# CAP_SYS_PTRACE's bit in /proc/PID/status's CapEff (linux/capability.h)
CAP_SYS_PTRACE = 19
# How long gdb may take to stop, inject and detach (about 0.4 s measured, torch loaded)
GDB_TIMEOUT_S = 60.0
# How often the status files are read while waiting
POLL_S = 0.05
# After a Ctrl-C: how long the job has to stop recording and move its trace into place
# before attach leaves it to finish alone (a training step is typically well under it)
STOP_GRACE_S = 5.0
# gdb's marker in its command line: another attach that finds it says who holds the job
GDB_MARKER = "set $hooktrace_attach = 1"
# The options whose files the job writes in its private folder and then renames into
# place (the others, folders, are written where they are named: see docs/attach.md)
STAGED = ("output", "chrome", "pftrace")


@dataclass(frozen=True)
class AttachRequest:
    """What to record and when to stop (``hooktrace attach``'s arguments)."""

    options: dict[str, Any]  # hooktrace run's options, as parsed (JSON values)
    steps: int | None  # optimizer steps to record after the partial first one
    seconds: float | None  # or seconds of recording
    timeout: float  # how long attach waits, all told; the recording ends before it
    # hooktrace top's hook: a file the watcher keeps touching; the recording ends once it
    # is gone or LEASE_STALE_S old (hooktrace.record.attach_agent)
    lease: str | None = None


@dataclass
class Attached:
    """One target's outcome: its status file's last content (checked, see
    :func:`_read_status`), or the line attach says about it."""

    pid: int
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return str(self.status.get("state", "waiting"))


# -- checks -------------------------------------------------------------------


def check_target(pid: int) -> None:
    """Raises AttachError (one line) unless ``pid`` is a running CPython process this
    process may attach to, with what attaching needs here."""
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
    problem = _state_problem(pid) or _ptrace_problem(pid)
    if problem is not None:
        raise AttachError(problem)
    if not _remote_exec_usable(pid) and shutil.which("gdb") is None:
        raise AttachError("gdb is not on PATH: before Python 3.14 hooktrace attach injects "
                          "through gdb (e.g. apt-get install gdb)")


def check_torch(pid: int) -> None:
    """AttachError unless ``pid`` has imported torch (a libtorch is mapped): attach
    records PyTorch modules, and never imports torch into a process (issue #47)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError as e:
        raise AttachError(f"process {pid}: {e.strerror}") from None
    if not re.search(r"/libtorch(_cpu|_python)?\.so", maps):
        raise AttachError(f"process {pid} has not imported torch: hooktrace attach records "
                          "PyTorch modules, and there are none to record in it")


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


def _state_problem(pid: int) -> str | None:
    """Why the process's state forbids attaching (stopped, exiting), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return f"no process with PID {pid}"
    if state == "T":
        return (f"process {pid} is stopped (SIGSTOP, Ctrl-Z or a scheduler's suspend): "
                f"attach once it runs again (kill -CONT {pid}); nothing was done to it")
    if state in ("Z", "X"):
        return f"process {pid} has exited"
    return None


def _held_by(pid: int, tracer: int) -> str:
    """Who traces ``pid``: another hooktrace attach's gdb, or a debugger."""
    try:
        with open(f"/proc/{tracer}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        cmdline = b""
    if GDB_MARKER.encode() in cmdline:
        return (f"process {pid} is held by another hooktrace attach (its gdb, process "
                f"{tracer}, is injecting): try again once that attach has started recording; "
                "a second attach is then refused by the job itself while the first records")
    name = os.path.basename(cmdline.split(b"\0", 1)[0].decode(errors="replace")) or "?"
    return (f"process {pid} is being traced by process {tracer} ({printable(name)}, a "
            "debugger or tracer): detach it first")


def _ptrace_problem(pid: int) -> str | None:
    """Why ptrace would refuse to attach to ``pid``, in one line, or None."""
    can_ptrace = bool(_capabilities() >> CAP_SYS_PTRACE & 1)
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        tracer = int(proc_status(pid).get("TracerPid", "0").split()[0])
    except (OSError, ValueError) as e:
        return f"process {pid}: {getattr(e, 'strerror', None) or e}"
    if tracer:
        return _held_by(pid, tracer)
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


class _Target(PrivateFolder):
    """One target: its private folder, whether the job may hold a queued call, and the
    outcome attach reports."""

    def __init__(self, pid: int, parent: str) -> None:
        super().__init__(pid, parent)
        self.injected = False
        self.outcome = Attached(pid)


# -- injection ----------------------------------------------------------------

# The boot code, run by the job's main thread in a namespace of its own (see the module
# docstring). It uses no file: the folder, the nonce and the request are in it. Until the
# token is taken nothing is reported (nothing is proven yet); after, every failure is a
# status line.
_BOOT = '''\
def _boot():
    import os, sys
    folder, nonce, version, request = {folder!r}, {nonce!r}, {version!r}, {request!r}
    flags = os.O_RDONLY | os.O_CLOEXEC
    try:
        fd = os.open(folder, flags | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or (st.st_mode & 0o7777) != 0o700:
            raise OSError("not this attach's folder")
        token = os.open("token", flags | os.O_NOFOLLOW, dir_fd=fd)
        try:
            same = os.read(token, 64) == nonce.encode()
        finally:
            os.close(token)
        if not same:
            raise OSError("not this attach's token")
        os.unlink("token", dir_fd=fd)
    except OSError:
        os.close(fd)
        return

    def fail(message):
        import json
        tmp = "status.%d.tmp" % os.getpid()
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=fd)
        with os.fdopen(out, "w") as f:
            json.dump({{"state": "error", "nonce": nonce, "message": message}}, f)
        os.replace(tmp, "status", src_dir_fd=fd, dst_dir_fd=fd)
        os.close(fd)

    if "torch" not in sys.modules:
        fail("process %d has not imported torch: hooktrace attach records PyTorch modules, "
             "and there are none to record in it" % os.getpid())
        return
    try:
        from hooktrace._version import __version__
    except BaseException as e:
        fail("process %d cannot import hooktrace (%s: %s): attach to a process of the same "
             "environment" % (os.getpid(), type(e).__name__, e))
        return
    if __version__ != version:
        fail("process %d has hooktrace %s, this is %s: attach with the hooktrace of its "
             "environment" % (os.getpid(), __version__, version))
        return
    try:
        from hooktrace.record.attach_agent import start
    except BaseException as e:
        fail("process %d cannot import hooktrace's attach agent (%s: %s)"
             % (os.getpid(), type(e).__name__, e))
        return
    start(request, fd)
_boot()
'''

# What the pending call runs (PyRun_SimpleString: in __main__'s namespace): builtins
# under a name no script has, the boot code exec'd in a fresh dict, the name deleted
_PENDING = ("import builtins as {name}\n"
            "try:\n"
            "    {name}.exec({boot}, {{'__name__': '__hooktrace_attach__', "
            "'__builtins__': {name}}})\n"
            "except BaseException:\n"
            "    pass\n"
            "del {name}\n")

PAGE = 4096
# Signals whose arrival inside an injected call means the call itself faulted: unwound
# there (unwindonsignal), never passed on nor sent again
_FAULTS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")


def pending_code(target: _Target, request: dict[str, Any]) -> str:
    """The Python the job's pending call runs for ``target`` (see :data:`_BOOT`)."""
    from hooktrace._version import __version__

    boot = _BOOT.format(folder=target.path, nonce=target.nonce, version=__version__,
                        request=request)
    return _PENDING.format(name=f"_hooktrace_attach_{target.nonce}", boot=ascii(boot))


def _inject(target: _Target, code: str, work: str) -> None:
    """Has the target's main thread run ``code`` at its next safe point."""
    pid = target.pid
    if _remote_exec_usable(pid):
        # sys.remote_exec reads a file, by name, whenever the job gets to it: in a folder
        # of its own in /tmp (sticky: no one else can rename or replace it), the job
        # user's, 0700; left there (a call made void still reads it: the token says no)
        folder = tempfile.mkdtemp(prefix="hooktrace-attach-exec-")
        script = os.path.join(folder, "pending.py")
        with open(script, "x") as f:
            f.write(code)
        if target.creds.uid != os.geteuid():
            os.chown(script, target.creds.uid, target.creds.gid)
            os.chown(folder, target.creds.uid, target.creds.gid)
        try:
            sys.remote_exec(pid, script)  # type: ignore[attr-defined]
        except Exception as e:
            raise AttachError(f"process {pid}: sys.remote_exec failed: {e}") from None
        return
    data = code.encode() + b"\0"
    size = -(-len(data) // PAGE) * PAGE
    # gdb reads the code from this process's own private folder (mkdtemp: 0700, ours)
    page_file = os.path.join(work, f"pending-{pid}.bin")
    with open(page_file, "wb") as f:
        f.write(data)
    gdb = shutil.which("gdb")
    assert gdb is not None  # (check_target)
    command = [gdb, "-nx", "-batch", "-p", str(pid), "-iex", GDB_MARKER,
               # only libc's and libpython's symbols: libtorch's take gdb tens of seconds
               "-iex", "set auto-solib-add off",
               # signals arriving while gdb holds the job: held back, sent again after
               "-iex", "handle all nostop print nopass",
               "-iex", "handle SIGINT nostop print nopass",
               "-iex", f"handle {' '.join(_FAULTS)} stop print nopass",
               "-iex", "set unwindonsignal on",
               "-ex", r"sharedlibrary libc\.so", "-ex", "sharedlibrary libpython",
               "-ex", f"set $page = (char *) mmap(0, {size}, 3, 34, -1, 0)",
               "-ex", f"restore {page_file} binary $page",
               "-ex", "print (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, "
                      "(void *) $page)",
               "-ex", "detach"]
    interrupted = False
    # its own session: a Ctrl-C at attach's terminal must not stop gdb in an injected call
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + GDB_TIMEOUT_S
    while True:
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            break
        except KeyboardInterrupt:
            interrupted = True  # gdb detaches first; then attach stops (see attach())
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AttachError(f"process {pid}: gdb did not finish in "
                              f"{GDB_TIMEOUT_S:.0f} s") from None
    _send_again(pid, out + err)
    queued = re.search(r"^\$\d+ = (-?\d+)\s*$", out, re.MULTILINE)
    if queued is None or queued.group(1) != "0":
        why = next((line for line in (err + out).splitlines()
                    if "ptrace" in line or "rror" in line or "No symbol" in line),
                   "Py_AddPendingCall was not called")
        raise AttachError(f"process {pid}: gdb could not inject: {printable(why.strip())}")
    if interrupted:
        raise KeyboardInterrupt


def held_back(gdb_output: str) -> list[int]:
    """The signals gdb held back (its ``received signal SIGUSR1`` lines), to send again
    once it has detached: standard ones once each (the kernel merges them too), real-time
    ones as often as they came; never a fault (an injected call's own, unwound)."""
    out: list[int] = []
    for name in re.findall(r"received signal (SIG[A-Z0-9]+)", gdb_output):
        if name in _FAULTS:
            continue
        number = int(name[3:]) if name[3:].isdigit() else getattr(signal.Signals, name, None)
        if number is None:
            continue
        realtime = hasattr(signal, "SIGRTMIN") and number >= signal.SIGRTMIN
        if realtime or number not in out:
            out.append(int(number))
    return out


def _send_again(pid: int, gdb_output: str) -> None:
    for number in held_back(gdb_output):
        with contextlib.suppress(OSError):
            os.kill(pid, number)


# -- the whole attach ------------------------------------------------------------


def _staged(options: dict[str, Any], folder: str) -> list[list[str]]:
    """[option, destination folder] of each file output the job stages in its private
    folder (the output's folder, which holds the private folder, first)."""
    staged = [["output", folder]]
    for name in STAGED[1:]:
        value = options.get(name)
        if isinstance(value, str) and value != "-":
            staged.append([name, value if value.endswith(os.sep) else
                           os.path.dirname(value) or "."])
    return staged


def attach(pids: list[int], request: AttachRequest, status_dir: Path) -> list[Attached]:
    """Attaches to each of ``pids`` (checked first, all of them), records as
    ``request`` asks and waits for each to be done, ``request.timeout`` at most; returns
    their outcomes. ``status_dir``: the output's folder (the private folders go there).
    Raises AttachError when a target cannot be attached to (none is touched then). A
    Ctrl-C ends every recording at once: the outcomes then say ``interrupted``."""
    deadline = time.monotonic() + request.timeout
    folder = os.path.abspath(status_dir)
    targets: list[_Target] = []
    for pid in pids:
        check_target(pid)
        check_torch(pid)
        target = _Target(pid, folder)
        for _, where in _staged(request.options, folder):
            check_job_can_write(pid, target.creds, where)
        for name in ("aggregate", "dump_dir"):
            value = request.options.get(name)
            if isinstance(value, str) and (name != "dump_dir" or request.options.get("dump_on")):
                check_not_shared(pid, target.creds, name, value)
        targets.append(target)
    # The recording ends a little before attach stops waiting, so that the job has time
    # to write the trace (issue #47: --timeout S waited S + 30 s)
    allowance = min(2.0, 0.2 * request.timeout)
    stop_unix = time.time() + request.timeout - allowance
    work = tempfile.mkdtemp(prefix="hooktrace-attach-gdb-")  # (0700, this user's)
    try:
        for t in targets:
            t.make_folder()
        for t in targets:
            job_request = {"nonce": t.nonce, "options": request.options,
                           "steps": request.steps, "seconds": request.seconds,
                           "stop_unix": stop_unix, "go": len(targets) > 1,
                           "staged": _staged(request.options, folder),
                           "lease": request.lease}
            t.injected = True  # (from here the job may hold a queued call)
            _inject(t, pending_code(t, job_request), work)
        # Several targets (the ranks of a job) start recording together: each waits for
        # its go, left once all are injected (else under load rank 0 could record its
        # steps and stop before rank 1 was attached: not ranks of one run)
        if len(targets) > 1:
            for t in targets:
                t.signal(GO)
        _wait(targets, deadline, request)
    except KeyboardInterrupt:
        _interrupt(targets)
    except BaseException:
        for t in targets:  # (an injection failed: the others' queued calls made void)
            if t.fd >= 0 and not t.withdraw():
                t.signal(STOP)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for t in targets:
            _leave(t)
    return [t.outcome for t in targets]


def _wait(targets: list[_Target], deadline: float, request: AttachRequest) -> None:
    waiting = list(targets)
    while waiting:
        for t in list(waiting):
            t.read_status()
            t.outcome.status = dict(t.job)
            if t.job_state in ("done", "error"):
                waiting.remove(t)
            elif not os.path.isdir(f"/proc/{t.pid}"):
                t.read_status()  # (its last word, written at exit)
                t.outcome.status = dict(t.job)
                if t.job_state not in ("done", "error"):
                    t.outcome.status.update(state="error", message=(
                        f"process {t.pid} ended " + ("while recording"
                                                     if t.job_state == "recording"
                                                     else "before recording started")))
                waiting.remove(t)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    for t in waiting:
        _give_up(t, f"{request.timeout:g} s (--timeout)")


def _give_up(t: _Target, after: str) -> None:
    """Attach stops waiting for ``t``: its queued call is made void, or its recording
    told to stop at its next module call (it then writes and removes its folder)."""
    if t.withdraw():
        t.outcome.status = {"state": "error", "message": (
            f"process {t.pid}: no recording started in {after}: its main thread ran no "
            "Python code (blocked in a call?); the call queued in it will do nothing")}
        return
    t.signal(LEFT)
    t.read_status()
    t.outcome.status = dict(t.job)
    if t.job_state in ("done", "error"):
        return
    t.outcome.status.update(state="error", message=(
        f"process {t.pid}: recording did not end in {after}: it stops at its next module "
        f"call, then writes {t.job.get('output', 'its trace')}"))


def _interrupt(targets: list[_Target]) -> None:
    """Ctrl-C: every job stops recording at once (told, not left to its timeout); what
    each had recorded is written if it can be within STOP_GRACE_S. A second Ctrl-C
    stops waiting for that. Each outcome says ``interrupted`` and one line."""
    running = []
    for t in targets:
        if not t.injected:
            t.outcome.status = {"message": f"process {t.pid}: interrupted before attaching; "
                                           "nothing was done to it"}
        elif t.withdraw():
            t.outcome.status = {"message": f"process {t.pid}: interrupted before recording "
                                           "started; the call queued in it will do nothing"}
        else:
            t.signal(STOP)
            running.append(t)
    deadline = time.monotonic() + STOP_GRACE_S
    with contextlib.suppress(KeyboardInterrupt):
        while running and time.monotonic() < deadline:
            for t in list(running):
                t.read_status()
                if t.job_state in ("done", "error") or not os.path.isdir(f"/proc/{t.pid}"):
                    running.remove(t)
            time.sleep(POLL_S)
    for t in targets:
        if t in running or (t.started_by_job and t.job_state not in ("done", "error")):
            t.signal(LEFT)
            t.outcome.status = {**t.job, "message": (
                f"process {t.pid}: interrupted: it stops recording at its next module call, "
                f"then writes {t.job.get('output', 'its trace')}")}
        elif t.job_state == "done":
            t.outcome.status = {**t.job, "message": (
                f"process {t.pid}: interrupted: recording stopped after "
                f"{t.job.get('steps', 0)} steps; wrote {t.job.get('output', '?')}")}
        elif t.job_state == "error":
            t.outcome.status = {**t.job, "message": (
                f"process {t.pid}: interrupted: {t.job.get('message', '')}")}
        t.outcome.status["state"] = "interrupted"


def _leave(t: _Target) -> None:
    """The private folder goes, unless the job still has it in use (told ``left``: it
    removes the folder itself once it has written)."""
    if t.fd < 0:
        return
    if t.started_by_job and t.job_state not in ("done", "error") \
            and os.path.isdir(f"/proc/{t.pid}"):
        t.read_status()
        if t.job_state not in ("done", "error"):
            t.signal(LEFT)
            os.close(t.fd)
            t.fd = -1
            return
    t.remove()
