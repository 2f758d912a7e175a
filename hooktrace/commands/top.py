"""``hooktrace top PID`` (``--ranks PID`` for a torchrun job, or ``DIR``): a running job's
modules, live, in the terminal (issue #51).

``top PID`` attaches as ``hooktrace attach`` does (the same checks and one-line refusals,
:func:`hooktrace.record.attach.attach`), recording with ``aggregate=`` a private folder:
the job reduces its steps to per-module rows every second and rewrites
``live/<run>.json`` there, which ``top`` reads (:mod:`hooktrace.analysis.live`);
``top DIR`` reads the same files of a job run with ``--aggregate DIR``, attaching to
nothing. The table refreshes about once a second, in place, fitted to the terminal;
plain text, no colours, no mouse. Keys: ``q`` quits (detaching: the job goes on as it
was), ``s`` sorts by time, calls, change or name, ``/`` filters the modules (Enter
keeps the text, Esc clears it), ``p`` or space pauses. ``--once --after S`` prints one
table after S seconds (``--json``: as data) and detaches.

While attached, ``top`` keeps touching a lease file; the job detaches by itself at
its next module call once that is gone or 10 s old (``top`` killed, or stopped with
Ctrl-Z). Ctrl-C, a closed terminal (SIGHUP), SIGTERM, the job ending, and no step in
``--timeout`` seconds all end ``top`` with one line.

Example::

    hooktrace top 12345
    hooktrace top --once --after 5 --json 12345 > now.json
    hooktrace top runs/agg/
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hooktrace._args import finite_float
from hooktrace.analysis.live import LIVE_DIR, SORTS, View, Watch
from hooktrace.commands import CliError
from hooktrace.errors import HooktraceError
from hooktrace.record.launch import add_options, options_from_args
from hooktrace.text import format_bytes, format_ns, printable, shorten_distinct, shorten_middle

NAME = "top"
HELP = "watch a running job's modules live (PID: attach to it, DIR: an --aggregate folder)"

# the recording options top passes on (as attach does); the others are about files
LEFT_OUT = ("schedule", "profile", "policy", "steps", "dump_on", "dump_dir", "hang_timeout",
            "max_disk", "shapes", "aggregate", "detail", "aggregate_interval")
REFRESH_S = 1.0
# q: how long to wait for the job to say it detached (its last rows written), and when it
# never stepped (it detaches at its next module call: it may make none)
DETACH_WAIT_S, NO_STEP_WAIT_S = 15.0, 2.0
WATCH_S = 30 * 86400.0  # the recording's own limit (the lease ends it before)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="PID|DIR",
                   help="the process to attach to (with --ranks: torchrun's), or an "
                        "--aggregate folder a job is writing")
    p.add_argument("--ranks", action="store_true",
                   help="PID is a torchrun agent: watch each of its workers, one row set "
                        "(each row's slowest rank named)")
    p.add_argument("--once", action="store_true",
                   help="print one table after --after seconds (or the first, when none came "
                        "by then), then detach")
    p.add_argument("--after", type=finite_float, metavar="S", default=3.0,
                   help="with --once: seconds to watch first (default: 3)")
    p.add_argument("--json", action="store_true", help="with --once: the table as JSON")
    p.add_argument("--sort", choices=SORTS, default="time",
                   help="the rows' order (default: time per step)")
    p.add_argument("--filter", metavar="TEXT", default="",
                   help="only the modules whose names hold TEXT")
    p.add_argument("--timeout", type=finite_float, metavar="S", default=120.0,
                   help="give up when no step was seen in S seconds (default: 120)")
    add_options(p, leave_out=LEFT_OUT, outputs=False)


class _Closed(BaseException):
    """SIGHUP or SIGTERM while watching (as KeyboardInterrupt for Ctrl-C): what
    happened, and the exit status (128 + the signal)."""


def _closed(signum: int, frame: Any) -> None:
    raise _Closed("the terminal closed (SIGHUP)" if signum == signal.SIGHUP
                  else "terminated (SIGTERM)", 128 + signum)


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--after", args.after), ("--timeout", args.timeout)):
        if value <= 0:
            raise CliError(f"{flag} must be positive, got {value}")
    if args.json and not args.once:
        raise CliError("--json prints one table: use it with --once")
    source: _Folder | _Job = _Folder(args) if _is_folder(args.target) else _Job(args)
    if not args.once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError("hooktrace top draws its table in a terminal; without one, use --once "
                       "(and --json)")
    before = {s: signal.signal(s, _closed) for s in (signal.SIGHUP, signal.SIGTERM)}
    before[signal.SIGINT] = signal.getsignal(signal.SIGINT)
    try:
        source.start()
        line, status = (_once if args.once else _screen)(source, args)
    except KeyboardInterrupt:
        line, status = "interrupted (Ctrl-C)", 130
    except _Closed as e:
        line, status = e.args
    finally:
        for s in before:  # (a second Ctrl-C, a SIGHUP now: the detach goes on)
            signal.signal(s, signal.SIG_IGN)
        end = source.close()
        for s, handler in before.items():
            signal.signal(s, handler)
    said = "; ".join(filter(None, (line, end)))
    if said:
        with contextlib.suppress(OSError):  # (a closed terminal)
            print(printable(f"hooktrace: {'error: ' if status == 1 else ''}{said}"),
                  file=sys.stderr)
    return status


def _is_folder(target: str) -> bool:
    return not target.strip().isdigit() or os.path.isdir(target)


class _Folder:
    """``top DIR``: an aggregate= folder a job is writing; nothing to attach."""

    def __init__(self, args: argparse.Namespace) -> None:
        if args.ranks:
            raise CliError("--ranks takes the PID of torchrun; a folder's ranks are all shown")
        self.dir = args.target
        if not os.path.isdir(self.dir):
            raise CliError(f"{self.dir}: no such folder (hooktrace top takes a PID or a folder "
                           "a job writes with --aggregate)")
        if not any(os.path.isdir(os.path.join(self.dir, d)) for d in (LIVE_DIR, "aggregates")):
            raise CliError(f"{self.dir}: not an --aggregate folder (no aggregates/ or "
                           f"{LIVE_DIR}/ in it)")
        self.what = self.dir

    def start(self) -> None:
        pass

    def touch(self) -> None:
        pass

    def ended(self, view: View | None) -> tuple[str, int] | None:
        if view is not None and view.ended:
            return f"the job writing {self.dir} ended; its run: hooktrace summary {self.dir}", 0
        return None

    def close(self) -> str:
        return ""


class _Job:
    """``top PID``: attached (hooktrace.record.attach) with aggregate= a private folder."""

    def __init__(self, args: argparse.Namespace) -> None:
        from hooktrace.record.attach import check_target, worker_pids

        pid = int(args.target)
        self.pids = worker_pids(pid) if args.ranks else [pid]
        if not args.ranks:
            check_target(pid)  # (one line, before the screen is taken)
        self.what = (f"torchrun {pid} ({len(self.pids)} workers)" if args.ranks
                     else f"process {pid}")
        self.options = {k: v for k, v in vars(args).items() if k not in (
            "func", "command", "target", "ranks", "once", "after", "json", "sort", "filter",
            "timeout")}
        self.dir = Path()
        self.thread: threading.Thread | None = None
        self.outcomes: list[Any] = []
        self.error: str | None = None
        self.touched, self.stalled = time.monotonic(), False

    def start(self) -> None:
        from hooktrace.record.attach import AttachRequest

        self.dir = Path(tempfile.mkdtemp(prefix="hooktrace-top-"))
        owner = os.stat(f"/proc/{self.pids[0]}").st_uid
        if owner != os.geteuid():  # (root watching another user's job: it writes here)
            os.chown(self.dir, owner, -1)
        self.lease = self.dir / "lease"
        self.lease.touch()
        self.touched = time.monotonic()
        options = {**self.options, "aggregate": str(self.dir), "aggregate_interval": 1.0,
                   "detail": "", "output": str(self.dir) + os.sep, "chrome": None,
                   "pftrace": None, "summary": False}
        try:  # a bad option never reaches the job
            options_from_args(argparse.Namespace(**options))
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        request = AttachRequest(options=options, steps=None, seconds=None, timeout=WATCH_S,
                                lease=str(self.lease))
        self.thread = threading.Thread(target=self._attach, args=(request,), daemon=True,
                                       name="hooktrace-top-attach")
        self.thread.start()

    def _attach(self, request: Any) -> None:
        from hooktrace.record.attach import attach

        try:
            self.outcomes = attach(self.pids, request, self.dir)
        except HooktraceError as e:
            self.error = str(e)

    def touch(self) -> None:
        from hooktrace.record.attach_agent import LEASE_STALE_S

        now = time.monotonic()  # (counts while top is stopped)
        self.stalled |= now - self.touched >= LEASE_STALE_S
        self.touched = now
        with contextlib.suppress(OSError):
            os.utime(self.lease)

    def ended(self, view: View | None) -> tuple[str, int] | None:
        if self.thread is None or self.thread.is_alive():
            return None
        failed = next((str(o.status.get("message")) for o in self.outcomes
                       if o.state == "error"), self.error)
        if failed and " ended " not in failed:
            hint = ("; if it records with --aggregate DIR, hooktrace top DIR watches it"
                    if "already under hooktrace" in failed else "")
            return failed + hint, 1
        if self.stalled:  # (the lease went stale: the job ended its recording itself)
            return (f"{self.what} stopped recording: top did not touch its lease for 10 s or "
                    "more (stopped, or stalled), so the job detached by itself", 1)
        return f"{self.what} ended while watched", 0

    def close(self) -> str:
        if self.thread is None:
            return ""
        on_its_own = not self.thread.is_alive()  # (the job ended, or ended its recording)
        self.lease.unlink(missing_ok=True)
        stepped = any(Path(self.dir, LIVE_DIR).glob("*.json"))
        self.thread.join(DETACH_WAIT_S if stepped else NO_STEP_WAIT_S)
        if self.thread.is_alive():  # (its files stay: the job writes there when it detaches)
            return f"{self.what} detaches at its next module call"
        shutil.rmtree(self.dir, ignore_errors=True)
        return "" if self.error or on_its_own else f"detached from {self.what}, which goes on"


def _watch(source: _Folder | _Job, watch: Watch, started: float, timeout: float
           ) -> tuple[View | None, tuple[str, int] | None]:
    """One refresh: the lease touched, the newest view, and why watching ends (or None)."""
    source.touch()
    view = watch.look()
    end = source.ended(view)
    if end is None and view is None and time.monotonic() - started > timeout:
        end = (f"{source.what} reached no optimizer step in {timeout:.0f} s (blocked, or "
               "not stepping an optimizer?)", 1)
    return view, end


def _once(source: _Folder | _Job, args: argparse.Namespace) -> tuple[str, int]:
    started = time.monotonic()
    watch = Watch(source.dir)
    view = None
    while True:  # a look every second (the first window seen is the change's base), for
        # --after seconds, then until the first table (or --timeout)
        view, end = _watch(source, watch, started, args.timeout)
        if end is not None or view is not None and time.monotonic() - started >= args.after:
            break
        time.sleep(REFRESH_S if view is None else
                   min(REFRESH_S, max(0.0, started + args.after - time.monotonic())))
    if view is None:
        assert end is not None
        return end
    ui = _Ui(sort=args.sort, filter=args.filter)
    if args.json:
        data = view.to_json()
        data["rows"] = [r for r in data["rows"] if args.filter.lower() in r["module"].lower()]
        print(json.dumps({"source": str(source.what), **data}))
    else:
        width = shutil.get_terminal_size((120, 24)).columns
        print("\n".join(render(view, source.what, ui, max(width, 60), 10**6, keys=False)))
    return (end[0] if end else "", 0)


@dataclass
class _Ui:
    """What the keys set."""

    sort: str = "time"
    filter: str = ""
    typing: bool = False
    paused: bool = False

    def key(self, k: str) -> bool:
        """Applies key ``k``; False for q."""
        if self.typing:
            if k in ("\r", "\n"):
                self.typing = False
            elif k == "\x1b":
                self.typing, self.filter = False, ""
            elif k in ("\x7f", "\b"):
                self.filter = self.filter[:-1]
            elif k.isprintable():
                self.filter += k
            return True
        if k in "qQ":
            return False
        if k == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif k == "/":
            self.typing = True
        elif k in "p ":
            self.paused = not self.paused
        elif k == "\x1b":
            self.filter = ""
        return True


def _screen(source: _Folder | _Job, args: argparse.Namespace) -> tuple[str, int]:
    import termios
    import tty

    fd, out = sys.stdin.fileno(), sys.stdout
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    out.write("\x1b[?1049h\x1b[?25l")  # the alternate screen, no cursor: left as it was
    ui, watch, started = _Ui(sort=args.sort, filter=args.filter), Watch(source.dir), \
        time.monotonic()
    view: View | None = None
    try:
        due = 0.0
        while True:
            if time.monotonic() >= due:
                due = time.monotonic() + REFRESH_S
                newest, end = _watch(source, watch, started, args.timeout)
                if end is not None:
                    return end
                if not ui.paused or view is None:
                    view = newest
            width, height = shutil.get_terminal_size((80, 24))
            out.write("\x1b[H" + "\x1b[K\r\n".join(render(view, source.what, ui, width, height))
                      + "\x1b[K\x1b[J")
            out.flush()
            if select.select([fd], [], [], max(0.0, due - time.monotonic()))[0]:
                for k in os.read(fd, 64).decode(errors="replace"):
                    if not ui.key(k):
                        return "", 0
    finally:
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def render(view: View | None, what: str, ui: _Ui, width: int, height: int,
           keys: bool = True) -> list[str]:
    """The screen's lines, each at most ``width`` long, at most ``height`` of them: a
    head line, the keys (unless ``keys`` is False), the table and its footer lines."""
    if view is None:
        state = "waiting for the first step..."
    else:
        state = (f"step {format_ns(view.step_ms * 1e6)}, {view.steps_per_s:.3g} steps/s, "
                 f"{view.steps} steps" + (f", {len(view.sources)} ranks/runs" if view.sources
                                          else "")
                 + (", ended" if view.ended else "")
                 + (f", no new rows for {view.age_s:.0f} s" if view.age_s > 5 else ""))
    state += "  [paused]" if ui.paused else ""
    # (the numbers first: a long folder name is what gets shortened)
    head = f"hooktrace top: {state} - "
    head += shorten_middle(printable(str(what)), max(8, width - len(head)))
    hint = (f"filter: {printable(ui.filter)}_   (Enter: keep, Esc: clear)" if ui.typing else
            f"q quit  s sort: {ui.sort}  / filter{': ' + printable(ui.filter) if ui.filter else ''}"
            "  p pause")
    lines = [head, hint, ""] if keys else [head, ""]
    if view is not None:
        rows = view.sorted(ui.sort, ui.filter)
        gpu = any(r.gpu_ms is not None for r in view.rows)
        mem = any(r.mem_peak is not None for r in view.rows)
        cols = [("phase", 9), ("ms/step", 10), ("share", 7), ("calls/step", 11)] + \
            [("gpu/step", 10)] * gpu + [("mem peak", 10)] * mem + [("change", 8)] + \
            [("slowest", 9)] * bool(view.sources)
        name_w = max(12, width - sum(w for _, w in cols) - 1)
        lines.append(f"{'module':<{name_w}} " + "".join(f"{c:>{w}}" for c, w in cols))
        room = max(1, height - len(lines) - len(view.footer) - 1)
        more = len(rows) - room if len(rows) > room else 0
        names = shorten_distinct([printable(r.module) for r in rows[:room - bool(more)]], name_w)
        for name, r in zip(names, rows):
            cells = [r.mode, format_ns(r.ms * 1e6),
                     "" if r.share is None else f"{r.share:.1f}%", f"{r.calls:.3g}"] + \
                [("" if r.gpu_ms is None else format_ns(r.gpu_ms * 1e6))] * gpu + \
                [("" if r.mem_peak is None else format_bytes(r.mem_peak))] * mem + \
                ["" if r.change is None else f"{r.change:+.0f}%"] + \
                [printable(r.source or "")] * bool(view.sources)
            lines.append(f"{name:<{name_w}} " + "".join(
                f"{c:>{w}}" for c, (_, w) in zip(cells, cols)))
        if more:
            lines.append(f"... {more} more rows (/ filters them)")
        lines += [""] + view.footer if view.footer else []
    return [line[:width] for line in lines[:height]]
