"""``hooktrace run [options] script.py [args...]`` / ``hooktrace run [options] -m module [args...]``.

Runs the script as ``python script.py args...`` would (same ``sys.argv``,
``__main__``, ``sys.path[0]``, exit code; an uncaught exception prints its
traceback and exits 1) while recording every ``nn.Module`` call of the process
(:mod:`hooktrace.record`), and writes the trace when the script ends,
whether it returned, raised or called ``sys.exit``.

The tracing options, starting the recorder and writing its files are
:mod:`hooktrace.record.launch`, shared with ``HOOKTRACE=1`` (:mod:`hooktrace._autostart`);
this verb adds running the script as python would.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import Any

from hooktrace.commands import CliError
from hooktrace.errors import NoDeviceError
from hooktrace.record.launch import (  # (imports no torch until start())
    add_options,
    options_from_args,
    sigterm_held_at_exit,
    start,
    write_outputs,
)

NAME = "run"
HELP = "run a Python script (or -m module) and trace every nn.Module it calls"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p)
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, default=None,
                   metavar="MODULE [ARGS]", help="run a module as python -m does")
    p.add_argument("script", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the script and its arguments")


def run(args: argparse.Namespace) -> None:
    if args.module is not None:
        if not args.module:
            raise CliError("-m needs a module name, e.g. hooktrace run -m package.train")
        target, argv, is_module = args.module[0], args.module[1:], True
        _check_module(target)
    elif args.script:
        target, argv, is_module = args.script[0], args.script[1:], False
        if not os.path.isfile(target):
            raise CliError(f"{target}: no such script file")
    else:
        raise CliError("give a script to run (hooktrace run train.py ARGS) or -m MODULE")
    try:
        options = options_from_args(args)
    except NoDeviceError as e:  # --gpu without CUDA: one line, exit status 2
        # (the recorder's message names the API's gpu=True: the flag's words here)
        print(f"hooktrace: error: {str(e).replace('gpu=True', '--gpu')}", file=sys.stderr)
        raise SystemExit(2) from None
    autostart = sys.modules.get("hooktrace._autostart")
    if autostart is not None:  # HOOKTRACE=1 is set too: this command's options win
        autostart.cancel()
    trace = start(options)
    code: Any = 0
    failure: BaseException | None = None
    try:
        _run_main(target, argv, is_module)
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # the script's own exception: reported as python would
        failure = e
    finally:
        # a SIGTERM from here on waits until the trace is written (issue #46)
        with sigterm_held_at_exit():
            # the script's exception goes in, so that dump_on="exception" dumps it
            trace.__exit__(*((type(failure), failure, failure.__traceback__)
                             if failure is not None else (None, None, None)))
            # The script's traceback ends stderr, as python's would, after the line saying
            # what hooktrace wrote; but when nothing is written (no module was called), that
            # line follows the traceback, so it does not read as the failure's cause
            # (issue #38)
            reported = failure is not None and not isinstance(failure, KeyboardInterrupt) \
                and not trace.modules_table()
            if reported and failure is not None:
                _print_script_error(failure)
            try:
                write_outputs(trace, options)
            except Exception as e:
                # (the exit status stays the script's, as docs/script.md says: a full disk
                # at exit turned a successful run's into 1: issue #46)
                print(f"hooktrace: error: could not write the trace: {e}", file=sys.stderr)
    if isinstance(failure, KeyboardInterrupt):
        raise failure  # python's own exit for Ctrl-C (status 130)
    if failure is not None:
        if not reported:
            _print_script_error(failure)
        code = 1
    if code not in (0, None):
        raise SystemExit(code)


def _print_script_error(failure: BaseException) -> None:
    """The script's exception as python prints it (its frames only)."""
    sys.stdout.flush()
    tb = _script_frames(failure.__traceback__)
    sys.excepthook(type(failure), failure.with_traceback(tb), tb)


def _check_module(name: str) -> None:
    import importlib.util

    saved = sys.path[:]
    sys.path[:1] = [os.getcwd()]  # as python -m sees it (_run_main sets the same)
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path[:] = saved
    if not found:
        raise CliError(f"-m {name}: no module named {name!r} (looked in sys.path from {os.getcwd()})")


def _run_main(target: str, argv: list[str], is_module: bool) -> None:
    """Runs the script or module as __main__ with python's sys.argv and sys.path[0]."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [target, *argv]  # (-m: runpy puts the module's file in argv[0], as python -m)
    sys.path[:1] = [os.getcwd() if is_module else os.path.dirname(os.path.realpath(target))]
    try:
        if is_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            _run_script(target)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _run_script(path: str) -> None:
    """Executes a script file as python's __main__: ``__file__`` and traceback paths
    absolute, ``sys.argv[0]`` as given (runpy.run_path would make both the same)."""
    import builtins
    import importlib.machinery
    import types

    filename = os.path.abspath(path)
    with open(filename, "rb") as f:  # as python does: the source's coding cookie applies
        code = compile(f.read(), filename, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=filename, __builtins__=builtins, __cached__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", filename))
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickle finds the script's classes in __main__
    try:
        exec(code, main.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _script_frames(tb: Any) -> Any:
    """The traceback from the script's first frame on, as python would print it
    (hooktrace's and runpy's frames left out)."""
    skip = {os.path.realpath(runpy.__file__), os.path.realpath(__file__)}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<frozen runpy") or os.path.realpath(name) in skip):
            break
        tb = tb.tb_next
    return tb
