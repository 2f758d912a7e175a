"""``hooktrace run [options] script.py [args...]`` / ``hooktrace run [options] -m module [args...]``.

Runs the script as ``python script.py args...`` would (same ``sys.argv``,
``__main__``, ``sys.path[0]``, exit code; an uncaught exception prints its
traceback and exits 1) while recording every ``nn.Module`` call of the process
(:mod:`hooktrace.global_recording`), and writes the trace when the script ends,
whether it returned, raised or called ``sys.exit``.

The options are parsed by :func:`add_options` and turned into a
:class:`RunOptions` by :func:`options_from_args`; ``HOOKTRACE_OPTIONS`` (the
environment switch, :mod:`hooktrace._autostart`) goes through the same two
functions. A new option (``--schedule``, ``--ring``/``--dump-on``,
``--pftrace``) is one ``add_argument`` in :func:`add_options`, one field in
:class:`RunOptions`, and its use in :func:`start` or :func:`write_outputs`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hooktrace.commands import OPEN_HINT, CliError

if TYPE_CHECKING:
    from hooktrace.global_recording import GlobalTrace

NAME = "run"
HELP = "run a Python script (or -m module) and trace every nn.Module it calls"


def add_options(p: argparse.ArgumentParser) -> None:
    """The tracing options shared by ``hooktrace run`` and ``HOOKTRACE_OPTIONS``."""
    p.add_argument("-o", "--output", metavar="PATH", default=None,
                   help="the .htrace file, or a folder for the default name "
                        "(default: ./hooktrace-<host>_<pid>[_rank<R>].htrace); {rank}, {pid} and "
                        "{host} are replaced; with RANK set and no {rank}, _rank<R> is added")
    p.add_argument("--no-backward", dest="backward", action="store_false",
                   help="do not record autograd nodes (forward spans only)")
    p.add_argument("--steps", choices=("optimizer", "none"), default="optimizer",
                   help="what ends a training step: the first optimizer's step() (default) "
                        "or nothing")
    p.add_argument("--chrome", metavar="OUT.json", default=None,
                   help="also export Chrome trace JSON (.json or .json.gz) at exit; "
                        "same naming rules as --output")
    p.add_argument("--pftrace", metavar="OUT.pftrace", default=None,
                   help="also export a Perfetto protobuf trace at exit; same naming rules")
    p.add_argument("--schedule", metavar="WAIT,WARMUP,ACTIVE[,REPEAT]", default=None,
                   help="record only some steps, as torch.profiler.schedule(wait, warmup, "
                        "active, repeat) would; each window is written as it ends to "
                        "OUTPUT's folder as <stem>.<last step>.htrace")
    p.add_argument("--ring", action="store_true",
                   help="flight recorder: keep the newest --capacity events, not the oldest")
    p.add_argument("--dump-on", metavar="WHEN", default=None,
                   help="flight-recorder dumps, any of exception,signal,hang (comma-separated): "
                        "the events, Python stacks and open module calls of every thread, "
                        "to --dump-dir; with --ring, the newest events")
    p.add_argument("--dump-dir", metavar="DIR", default="hooktrace-dumps",
                   help="where dumps go (default: %(default)s)")
    p.add_argument("--hang-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="with --dump-on hang: seconds without a module call or step that "
                        "count as a hang (default: %(default)s)")
    p.add_argument("--memory", action="store_true",
                   help="also record the bytes allocated at every module call and the peak "
                        "inside it (CPU, and the current CUDA device when there is one)")
    p.add_argument("--summary", action="store_true",
                   help="print the per-module table to stderr at exit")
    p.add_argument("--capacity", type=int, default=None, metavar="N",
                   help="events held (32 bytes each; default 8 Mi); later events are dropped "
                        "and counted")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p)
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, default=None,
                   metavar="MODULE [ARGS]", help="run a module as python -m does")
    p.add_argument("script", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the script and its arguments")


@dataclass(frozen=True)
class RunOptions:
    """What to record and what to write; paths resolved for this process."""

    output: Path
    chrome: Path | None
    pftrace: Path | None
    ring: bool
    schedule: tuple[int, int, int, int] | None
    dump_on: tuple[str, ...]
    dump_dir: str
    hang_timeout: float
    backward: bool
    steps: Literal["optimizer"] | None
    summary: bool
    capacity: int | None
    memory: bool = False


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """Checks the options and resolves the output names; raises CliError."""
    from hooktrace._naming import env_rank, output_path
    from hooktrace._output import check_output_path
    from hooktrace.errors import OutputPathError

    if args.capacity is not None and not 1 <= args.capacity <= 1 << 40:
        raise CliError(f"--capacity must be between 1 and 2**40 events, got {args.capacity}")
    rank = env_rank()
    output = output_path(args.output, ".htrace", rank)
    chrome = output_path(args.chrome, ".json", rank) if args.chrome is not None else None
    pftrace = output_path(args.pftrace, ".pftrace", rank) if args.pftrace is not None else None
    for flag, path in (("--output", output), ("--chrome", chrome), ("--pftrace", pftrace)):
        if path is None:
            continue
        try:  # checked before the script runs, not after hours of training
            path.parent.mkdir(parents=True, exist_ok=True)  # out/ or out/run.htrace: made
            check_output_path(path)
        except (OutputPathError, OSError) as e:
            raise CliError(f"{flag}: {e}") from None
    from hooktrace.flight import check_dump_on

    dump_on = tuple(w.strip() for w in args.dump_on.split(",")) if args.dump_on else ()
    try:
        check_dump_on(dump_on)
    except (TypeError, ValueError) as e:
        raise CliError(f"--dump-on: {e}") from None
    if not args.hang_timeout > 0:
        raise CliError(f"--hang-timeout must be a positive number of seconds, got "
                       f"{args.hang_timeout}")
    schedule = None
    if args.schedule is not None:
        try:
            parts = [int(p) for p in args.schedule.split(",")]
        except ValueError:
            parts = []
        if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
            raise CliError(f"--schedule must be WAIT,WARMUP,ACTIVE[,REPEAT] (integers, "
                           f"ACTIVE >= 1), got {args.schedule!r}")
        schedule = (parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else 0)
        if args.ring:
            raise CliError("--schedule and --ring cannot be combined: windows are drained "
                           "as they end")
    return RunOptions(output=output, chrome=chrome, pftrace=pftrace, ring=args.ring,
                      schedule=schedule,
                      dump_on=dump_on, dump_dir=args.dump_dir, hang_timeout=args.hang_timeout,
                      backward=args.backward,
                      steps="optimizer" if args.steps == "optimizer" else None,
                      summary=args.summary, capacity=args.capacity,
                      memory=bool(getattr(args, "memory", False)))


def start(options: RunOptions) -> GlobalTrace:
    """A started global trace with these options."""
    from hooktrace.global_recording import GlobalTrace
    from hooktrace.recording import DEFAULT_CAPACITY

    trace = GlobalTrace(capacity=options.capacity or DEFAULT_CAPACITY,
                        policy="ring" if options.ring else "drop",
                        backward=options.backward, steps=options.steps,
                        dump_on=options.dump_on, dump_dir=options.dump_dir,
                        hang_timeout=options.hang_timeout, memory=options.memory,
                        **_windows(options))
    try:
        trace.__enter__()
    except RuntimeError as e:  # another global trace in this process
        raise CliError(str(e).removeprefix("hooktrace: ")) from None
    return trace


def _windows(options: RunOptions) -> dict[str, Any]:
    """schedule= and an on_window writing <output stem>.<last step>.htrace beside it."""
    if options.schedule is None:
        return {}
    import torch

    wait, warmup, active, repeat = options.schedule
    output = options.output

    def write(window: Any) -> None:
        path = output.with_name(f"{output.stem}.{window.info['window']['last_step']}"
                                f"{output.suffix}")
        window.save(path)
        print(f"hooktrace: wrote window {path}", file=sys.stderr)

    return {"schedule": torch.profiler.schedule(wait=wait, warmup=warmup, active=active,
                                                repeat=repeat),
            "on_window": write}


def write_outputs(trace: GlobalTrace, options: RunOptions) -> None:
    """Writes the files asked for, and the summary to stderr; a line on stderr says what."""
    trace.save(options.output)
    written = [str(options.output)]
    if options.chrome is not None:
        trace.export_chrome(options.chrome)
        written.append(str(options.chrome))
    if options.pftrace is not None:
        trace.export_perfetto(options.pftrace)
        written.append(str(options.pftrace))
    if options.summary:
        print(trace.summary(), file=sys.stderr)
    print(f"hooktrace: wrote {' and '.join(written)} ({len(trace.modules)} modules, "
          f"{len(trace.events)} events); {OPEN_HINT}, or: hooktrace summary {written[0]}",
          file=sys.stderr)


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
    options = options_from_args(args)
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
        # the script's exception goes in, so that dump_on="exception" dumps it
        trace.__exit__(*((type(failure), failure, failure.__traceback__) if failure is not None
                         else (None, None, None)))
        try:
            write_outputs(trace, options)
        except Exception as e:
            print(f"hooktrace: error: could not write the trace: {e}", file=sys.stderr)
            if failure is None and code in (0, None):
                code = 1
    if isinstance(failure, KeyboardInterrupt):
        raise failure  # python's own exit for Ctrl-C (status 130)
    if failure is not None:
        sys.stdout.flush()
        tb = _script_frames(failure.__traceback__)
        sys.excepthook(type(failure), failure.with_traceback(tb), tb)
        code = 1
    if code not in (0, None):
        raise SystemExit(code)


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
    if is_module:
        sys.argv = [target, *argv]  # runpy puts the module's file in argv[0], as python -m
        path0 = os.getcwd()
    else:
        sys.argv = [target, *argv]
        path0 = os.path.dirname(os.path.realpath(target))
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.insert(0, path0)
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
