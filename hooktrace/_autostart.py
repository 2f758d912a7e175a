"""The environment switch: ``HOOKTRACE=1 python train.py`` traces the whole process.

Imported at interpreter startup by ``hooktrace-autostart.pth`` (installed at the
top of site-packages with the package) only when ``HOOKTRACE`` is ``1``; without
it the .pth line costs one environment lookup and imports nothing. For launchers
whose command line cannot be changed (a job scheduler, a notebook kernel, a
framework's own launcher).

``HOOKTRACE_OUT``: the output file or folder (``hooktrace run -o``'s rules: with
RANK set, one file per rank). ``HOOKTRACE_OPTIONS``: any other ``hooktrace run``
options, e.g. ``"--no-backward --summary --chrome out/"``. The ``.htrace`` is
streamed while the process runs, as under ``hooktrace run`` (so ``os._exit`` or a
fatal signal leaves it loadable up to the cut), and finished at interpreter exit
(atexit: after an uncaught exception or ``sys.exit`` too) with the exports; a
process that called no module keeps no file: a launcher's parent process or a
worker that only loads data writes nothing.

A bad option or any failure here prints one line and leaves the program
untraced: the switch must never stop the program it was set for.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

# STATE.autostart_trace: the running global trace, if this process was started traced
from hooktrace.record.process_state import STATE


def _start() -> None:
    from hooktrace.record.launch import options_from_env, start

    options = options_from_env(os.environ)
    trace = start(options)
    STATE.autostart_trace = trace
    atexit.register(_finish, trace, options)


def cancel() -> None:
    """Ends the switch's trace without writing it (``hooktrace run`` takes over): its
    stream, if any, is removed."""
    trace = STATE.autostart_trace
    if trace is not None:
        atexit.unregister(_finish)
        from hooktrace.record.launch import stop_writing_on_sigterm

        stop_writing_on_sigterm()
        trace.__exit__(None, None, None)
        trace.discard_stream()
        STATE.autostart_trace = None


def _finish(trace: Any, options: Any) -> None:
    from hooktrace.record.launch import discard_empty, sigterm_held_at_exit, write_outputs

    try:
        with sigterm_held_at_exit():  # (a SIGTERM now waits until the trace is written)
            trace.__exit__(None, None, None)
            if trace.modules_table():
                write_outputs(trace, options)
            else:
                discard_empty(trace)  # (quietly: a launcher's parent process, say)
    except Exception as e:
        print(f"hooktrace: error: HOOKTRACE=1: could not write the trace: {e}", file=sys.stderr)


try:
    _start()
except (Exception, SystemExit) as e:  # argparse's errors too: never exit the program
    print(f"hooktrace: error: HOOKTRACE=1: not tracing this process: {e}", file=sys.stderr)
