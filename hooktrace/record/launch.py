"""Launching a traced process: the options ``hooktrace run`` and the environment
switch (``HOOKTRACE=1``, ``HOOKTRACE_OPTIONS``, :mod:`hooktrace._autostart`) share.

The options are parsed by :func:`add_options` and turned into a
:class:`RunOptions` by :func:`options_from_args`; :func:`start` starts the
process-wide recorder with them and :func:`write_outputs` writes what they ask
for. A recording option's flag comes from its declaration (its component's
``OPTIONS``, hooktrace/record/component.py): nothing here names one. An option of
the launch itself (an output: ``--pftrace``, ``--profile``) is one ``add_argument``
in :func:`add_options`, one field in :class:`RunOptions`, and its use in
:func:`start` or :func:`write_outputs`. The ``run`` verb
(``hooktrace/commands/run.py``) adds running the script.

The ``.htrace`` is streamed to the output file while the process runs (format version
3, ``hooktrace.trace(out=)``'s): memory stays within ``--capacity`` whatever the run's
length, and a process killed at any moment (SIGKILL, the OOM killer) leaves a file that
loads up to where it was cut. A normal end adds the FOOTER, then the exports. Kept in
memory and written at the end: ``--ring`` (the newest events: a ring recycles what a
stream would still be writing), ``--schedule`` (each window written as it ends), and an
output that is no regular file (``-``, ``/dev/null``, a pipe).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import stat
import sys
import threading
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hooktrace._args import finite_float
from hooktrace._naming import env_rank, output_path
from hooktrace._output import check_output_path, write_failure
from hooktrace.errors import NoDeviceError, OptionError, OutputPathError
from hooktrace.record.process_state import STATE
from hooktrace.text import open_hint

if TYPE_CHECKING:  # (imported when recording starts: `hooktrace --help` imports no torch)
    from hooktrace.record import GlobalTrace
    from hooktrace.record.component import Option
    from hooktrace.record.options import RecordOptions

__all__ = ["RunOptions", "add_options", "discard_empty", "options_from_args", "options_from_env",
           "print_aggregates", "sigterm_held_at_exit", "start", "stop_writing_on_sigterm",
           "streams", "write_outputs"]


def add_options(p: argparse.ArgumentParser, *, leave_out: Collection[str] = (),
                outputs: bool = True) -> None:
    """The tracing options shared by ``hooktrace run`` and ``HOOKTRACE_OPTIONS``: the
    outputs, and a flag per recording option that declares one (its component's
    ``OPTIONS``, hooktrace/record/component.py), in their order. ``leave_out``: the
    destinations of flags a verb does without (``hooktrace attach``: ``schedule``,
    ``profile``, ``steps``); :func:`options_from_args` takes their defaults. ``outputs``:
    False leaves out the files' flags (-o, --chrome, --pftrace, --summary: ``hooktrace
    top`` writes none)."""
    from hooktrace.record.options import RecordOptions

    if outputs:
        _add_outputs(p)
    if "schedule" not in leave_out:
        p.add_argument("--schedule", metavar="WAIT,WARMUP,ACTIVE[,REPEAT]", default=None,
                       help="record only some steps, as torch.profiler.schedule(wait, warmup, "
                            "active, repeat) would; each window is written as it ends to "
                            "OUTPUT's folder as <stem>.<last step>.htrace (with --profile, the "
                            "profiler records the same windows: <stem>.<last step>.merged.json "
                            "and .profiler.json beside it)")
    if "profile" not in leave_out:
        p.add_argument("--profile", action="store_true",
                       help="also run torch.profiler (CPU ops; CUDA kernels when CUDA is "
                            "available) and write <output stem>.merged.json (module spans on "
                            "the profiler's timeline, as hooktrace merge) and <output stem>"
                            ".profiler.json (for hooktrace summary --profiler); with "
                            "--schedule, one of each per window")
    recording = p.add_argument_group("recording (hooktrace.trace()'s options)")
    for option in RecordOptions.declared():
        if option.name not in leave_out:
            _add_flag(recording, option)


def _add_outputs(p: argparse.ArgumentParser) -> None:
    """The flags of the files a run writes (and --summary)."""
    p.add_argument("-o", "--output", metavar="PATH", default=None,
                   help="the .htrace file, or a folder for the default name "
                        "(default: ./hooktrace-<host>_<pid>[_rank<R>].htrace); {rank}, {pid} and "
                        "{host} are replaced; with RANK set and no {rank}, _rank<R> is added. "
                        "Streamed to while the script runs (constant memory; a killed run's "
                        "file loads up to the cut), except with --ring or --schedule")
    p.add_argument("--chrome", metavar="OUT.json", default=None,
                   help="also export Chrome trace JSON (.json or .json.gz) at exit; "
                        "same naming rules as --output")
    p.add_argument("--pftrace", metavar="OUT.pftrace", default=None,
                   help="also export a Perfetto protobuf trace at exit; same naming rules")
    p.add_argument("--summary", action="store_true",
                   help="print the per-module table to stderr at exit")


def _add_flag(p: Any, option: Option) -> None:
    """The option's flag, as its declaration says (record/component.py ``Flag``); its
    value lands in ``args.<option name>`` as the flag spells it (:func:`_from_flag`)."""
    flag = option.flag
    if flag is None:
        return
    common: dict[str, Any] = {"dest": option.name, "help": option.flag_help or option.help}
    if flag.form == "switch":
        p.add_argument(option.flag_name(), action="store_const", const=option.switch_value(),
                       default=option.default, **common)
    elif flag.form == "choice":
        assert flag.choices is not None
        default = next((word for word, value in flag.choices.items()
                        if value == option.default), None)
        p.add_argument(option.flag_name(), choices=list(flag.choices), default=default,
                       **common)
    else:
        convert = {"int": int, "float": finite_float, "str": None, "list": None}[flag.form]
        p.add_argument(option.flag_name(), default=None if flag.form == "list" else option.default,
                       metavar=option.metavar(), **({"type": convert} if convert else {}),
                       **common)


def _from_flag(option: Option, raw: Any) -> Any:
    """The option's value from its flag's (a choice's word, a comma-separated list)."""
    flag = option.flag
    assert flag is not None
    if flag.form == "choice" and raw is not None:
        assert flag.choices is not None
        return flag.choices[raw]
    if flag.form == "list":
        return tuple(w.strip() for w in raw.split(",")) if raw else ()
    return raw


def options_from_env(environ: Mapping[str, str]) -> RunOptions:
    """The options of the environment switch: ``HOOKTRACE_OPTIONS`` (``hooktrace run``'s
    flags) and ``HOOKTRACE_OUT`` (``-o``'s); raises ValueError (OptionError included)
    for a bad one, argparse's errors as they are."""
    parser = argparse.ArgumentParser(prog="HOOKTRACE_OPTIONS", add_help=False,
                                     exit_on_error=False)
    add_options(parser)
    args, unknown = parser.parse_known_args(shlex.split(environ.get("HOOKTRACE_OPTIONS", "")))
    if unknown:
        raise ValueError(f"unknown option(s) {' '.join(unknown)}")
    if args.output is None and environ.get("HOOKTRACE_OUT"):
        args.output = environ["HOOKTRACE_OUT"]
    return options_from_args(args)


@dataclass(frozen=True)
class RunOptions:
    """What to record and what to write; paths resolved for this process."""

    output: Path
    chrome: Path | None
    pftrace: Path | None
    ring: bool
    schedule: tuple[int, int, int, int] | None
    summary: bool
    record: RecordOptions  # what to record (checked once, hooktrace.record.options)
    profile: bool = False


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """Checks the options and resolves the output names; raises OptionError
    (NoDeviceError for --gpu without CUDA)."""
    if getattr(args, "aggregate", None) is not None and (args.chrome is not None
                                                         or args.pftrace is not None):
        # (issue #35: they exported the events after the last step only, an empty file)
        raise OptionError("--chrome and --pftrace export the trace in memory; with "
                          "--aggregate each step's events go into the aggregates: export a "
                          "step kept whole (DIR/steps/step-N_<run>.htrace), or hooktrace "
                          "report DIR for a page")
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
            raise OptionError(f"{flag}: {e}") from None
    ring = getattr(args, "policy", "drop") == "ring"
    schedule = None
    if getattr(args, "schedule", None) is not None:
        try:
            parts = [int(p) for p in args.schedule.split(",")]
        except ValueError:
            parts = []
        if len(parts) not in (3, 4) or min(parts) < 0 or parts[2] < 1:
            raise OptionError(f"--schedule must be WAIT,WARMUP,ACTIVE[,REPEAT] (integers, "
                           f"ACTIVE >= 1), got {args.schedule!r}")
        schedule = (parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else 0)
        if ring:
            raise OptionError("--schedule and --ring cannot be combined: windows are drained "
                           "as they end")
    from hooktrace.record.options import RecordOptions

    # the recording options, as their flags gave them (a flag not on this parser: the
    # option's default), then what a flag implies (--dump-on nonfinite: --numerics)
    values = {o.name: _from_flag(o, getattr(args, o.name, o.default))
              for o in RecordOptions.declared() if o.flag is not None}
    for declarer in RecordOptions.declarers():
        declarer.from_flags(values)
    # streamed (out=): its capacity's default is the stream's (record/core_options.py)
    # absolute: read back (and removed when empty) at exit, whatever the script's cwd then
    out = (os.path.abspath(output)
           if _streams(output, ring, schedule, values.get("aggregate")) else None)
    try:  # the recording options' own checks (hooktrace.record.options), as flags
        record = RecordOptions(**values, out=out)
    except OutputPathError as e:
        raise OptionError(f"--output: {e}") from None
    except (TypeError, ValueError) as e:
        raise OptionError(_as_flag(str(e))) from None
    if record.aggregate is not None and (ring or schedule is not None or record.max_disk):
        raise OptionError("--aggregate reduces each step in memory; it cannot be combined "
                          "with --ring, --schedule or --max-disk")
    if record.max_disk and (ring or schedule is not None or str(output) == "-"):
        raise OptionError("--max-disk bounds the streamed --output file; it cannot be combined "
                          "with --ring, --schedule or --output -")
    from hooktrace.record.registry import COMPONENTS

    try:  # what the components refuse, before the script runs (--gpu without CUDA:
        for component in COMPONENTS:  # NoDeviceError, which `run` ends with exit status 2)
            component.check(record)
    except NoDeviceError:
        raise
    except (TypeError, ValueError) as e:
        raise OptionError(_as_flag(str(e))) from None
    return RunOptions(output=output, chrome=chrome, pftrace=pftrace, ring=ring,
                      schedule=schedule, summary=args.summary, record=record,
                      profile=bool(getattr(args, "profile", False)))


def _as_flag(message: str) -> str:
    """RecordOptions' error (``capacity must be ...``) naming the flag (``--capacity must
    be ...``; ``dump_on: unknown ...`` as ``--dump-on: dump_on: unknown ...``)."""
    from hooktrace.record.options import RecordOptions

    name, sep, rest = message.partition(" ")
    if not sep:
        return message
    option = name.rstrip(":")
    flags = {o.name: o.flag_name() for o in RecordOptions.declared() if o.flag is not None}
    flag = flags.get(option) or "--" + option.replace("_", "-")
    return f"{flag}: {message}" if name.endswith(":") else f"{flag} {rest}"


def _streams(output: Path, ring: bool, schedule: object, aggregate: object = None) -> bool:
    if ring or schedule is not None or str(output) == "-" or aggregate is not None:
        return False
    try:
        return stat.S_ISREG(os.stat(output).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def streams(options: RunOptions) -> bool:
    """Whether the .htrace is streamed to ``options.output`` while the process runs (see
    the module docstring): not a ring, not windows, and a regular file (or a new one)."""
    return _streams(options.output, options.ring, options.schedule, options.record.aggregate)


def start(options: RunOptions, *,
          on_step: Callable[[int], None] | None = None) -> GlobalTrace:
    """A started global trace with these options; ``on_step(ended)`` after each step's
    mark, if given (``hooktrace attach`` counts the steps it was asked for)."""
    windows = _Windows(options) if options.schedule is not None else None
    from hooktrace.record import GlobalTrace

    # (options.record.out: the stream, when streamed, options_from_args)
    record = (options.record if windows is None else
              options.record.replace(schedule=windows.schedule, on_window=windows.write))
    trace = GlobalTrace(options=record)
    if windows is not None and options.profile:
        # --profile with --schedule: the profiler steps with the trace's steps, after
        # the trace's (as hooktrace.profile's step() does), so the profiler's windows are
        # the trace's and each is merged with the trace's window
        trace.add_step_listener(_step_profiler)
    if on_step is not None:
        trace.add_step_listener(on_step)
    if windows is not None:
        windows.trace = trace
    try:
        trace.__enter__()
    except RuntimeError as e:  # another global trace in this process
        raise OptionError(str(e).removeprefix("hooktrace: ")) from None
    _write_on_sigterm(trace, options)
    if options.profile:
        _start_profiler(windows)
    return trace


# torch.profiler of --profile, while it runs, is STATE.profiler
# (hooktrace.record.process_state).


def _step_profiler(ended: int) -> None:
    profiler = STATE.profiler
    if profiler is not None:
        with warnings.catch_warnings():  # each window has its own events: as asked
            warnings.filterwarnings("ignore", "Warning: Profiler clears events", UserWarning)
            profiler.step()


def _start_profiler(windows: _Windows | None) -> None:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    scheduled: dict[str, Any] = {} if windows is None else {
        "schedule": windows.schedule, "on_trace_ready": windows.profiler_window}
    profiler = torch.profiler.profile(activities=activities, **scheduled)
    STATE.profiler = profiler
    profiler.__enter__()


def _stop_profiler() -> Any:
    """Stops --profile's profiler, if running; returns it (its events are kept)."""
    prof, STATE.profiler = STATE.profiler, None
    if prof is not None:
        prof.__exit__(None, None, None)
    return prof


def _write_profile(result: Any, output: Path) -> list[str]:
    """Stops --profile's profiler and writes its trace and the merged one next to
    ``output``; returns the paths written."""
    from hooktrace.exporters.merged import merge_traces

    prof = _stop_profiler()
    if prof is None:
        return []
    stem = output.with_suffix("")
    raw = stem.with_name(stem.name + ".profiler.json")
    merged = stem.with_name(stem.name + ".merged.json")
    prof.export_chrome_trace(str(raw))
    merge_traces(result, raw, merged)
    return [str(merged), str(raw)]


# The SIGTERM handler installed by start(), while it is installed, is
# STATE.sigterm_handler (hooktrace.record.process_state).


def _write_on_sigterm(trace: GlobalTrace, options: RunOptions) -> None:
    """SIGTERM (a scheduler preempting the job, torchrun tearing the workers down after
    another rank failed, ``kill``) ends the process without running atexit or the
    script's ``finally`` blocks: end the trace and write what was recorded, then die of
    the signal as the program would have (exit status 128+15 / -15). Installed only
    where SIGTERM still has its default action, on the main thread; a handler the
    program installs later replaces it (and the trace is then written at exit)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        # a second SIGTERM while the trace is written does not cut the writing short (it
        # killed the process halfway through the aggregates' last part: issue #46): the
        # first one ends the process once it is written
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            trace.__exit__(None, None, None)
            if trace.modules_table():
                print("hooktrace: SIGTERM: writing the trace before exiting", file=sys.stderr)
                write_outputs(trace, options)
            else:
                discard_empty(trace)
        except BaseException as e:  # never keep a terminated process alive
            print(f"hooktrace: error: SIGTERM: could not write the trace: {e}", file=sys.stderr)
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    STATE.sigterm_handler = on_sigterm
    signal.signal(signal.SIGTERM, on_sigterm)


@contextlib.contextmanager
def sigterm_held_at_exit() -> Iterator[None]:
    """While the process's normal end ends the trace and writes it (``hooktrace run``,
    ``HOOKTRACE=1``): a SIGTERM then waits until that is done, and ends the process as
    it would have (exit status 128+15). SIGTERM's default action is back after. Where
    start()'s handler is no longer installed (the program set its own), nothing changes."""
    handler, STATE.sigterm_handler = STATE.sigterm_handler, None
    held: list[int] = []
    holding = handler is not None and signal.getsignal(signal.SIGTERM) is handler
    if holding:
        signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        if holding:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if held:
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGTERM)


def stop_writing_on_sigterm() -> None:
    """Puts SIGTERM's default action back if start()'s handler is still installed
    (the trace is being written by the normal path)."""
    handler = STATE.sigterm_handler
    if handler is not None and signal.getsignal(signal.SIGTERM) is handler:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    STATE.sigterm_handler = None


class _Windows:
    """--schedule: the trace's schedule= and its on_window (:meth:`write`), writing
    <output stem>.<last step>.htrace beside the output. With --profile the profiler
    follows the same schedule and its on_trace_ready (:meth:`profiler_window`) merges
    each of its windows with the trace's, handed over just before (the pairing of
    hooktrace.profile), into <stem>.<last step>.merged.json and .profiler.json."""

    def __init__(self, options: RunOptions) -> None:
        import torch

        from hooktrace.record.profiling import MergedTraceHandler

        assert options.schedule is not None
        wait, warmup, active, repeat = options.schedule
        with warnings.catch_warnings():  # torch's "won't be using warmup": the user asked for 0
            warnings.simplefilter("ignore", UserWarning)
            self.schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active,
                                                    repeat=repeat)
        self.output = options.output
        self.trace: GlobalTrace | None = None
        self._window: Any = None  # the trace's window the profiler's next one merges with
        self._merge = MergedTraceHandler(
            self._run_for_window, options.output.parent, worker_name=options.output.stem,
            keep_profiler_traces=True, merged_suffix=".merged.json",
            number_by_window=True) if options.profile else None

    def write(self, window: Any) -> None:
        output = self.output
        path = output.with_name(f"{output.stem}.{window.info['window']['last_step']}"
                                f"{output.suffix}")
        try:
            window.save(path)
        except OSError as e:  # one line naming the file and the disk; training goes on
            print(f"hooktrace: error: could not write window {write_failure(path, e)}",
                  file=sys.stderr)
            return
        print(f"hooktrace: wrote window {path}", file=sys.stderr)
        if self._merge is not None:
            self._window = window

    def _run_for_window(self) -> Any:
        """The window the trace just handed over, else the trace as far as recorded."""
        window, self._window = self._window, None
        return window if window is not None else self.trace

    def profiler_window(self, prof: Any) -> None:
        assert self._merge is not None
        done = len(self._merge.outputs)
        try:
            self._merge(prof)
        except Exception as e:  # a failing write must not stop the training loop
            print(f"hooktrace: error: could not write the profiler's window: {e}",
                  file=sys.stderr)
            return
        for merged in self._merge.outputs[done:]:
            raw = merged.removesuffix(".merged.json") + ".profiler.json"
            print(f"hooktrace: wrote window {merged} and {raw}", file=sys.stderr)


def discard_empty(trace: GlobalTrace) -> None:
    """A trace that ended with no module called leaves no file: its stream goes."""
    if trace.out is not None and not trace.modules_table():
        with contextlib.suppress(OSError):
            trace.discard_stream()


def write_outputs(trace: GlobalTrace, options: RunOptions) -> None:
    """Writes the files asked for, and the summary to stderr; a line on stderr says what.

    A streamed ``.htrace`` is complete by now (the trace has ended); it is read back only
    for what needs its events (exports, ``--summary``, ``--profile``)."""
    if options.schedule is not None:
        _stop_profiler()  # its window being recorded, if any, is merged and written now
    if trace.streamed_by_parent():
        _stop_profiler()
        print(f"hooktrace: a forked child of the traced process: {options.output} is the "
              "parent's stream; nothing written", file=sys.stderr)
        return
    if not trace.modules_table():
        _stop_profiler()
        discard_empty(trace)
        print("hooktrace: no nn.Module was called; nothing written", file=sys.stderr)
        return
    streamed = trace.out is not None
    needed = (not streamed or options.chrome is not None or options.pftrace is not None
              or options.profile or options.summary)
    result = trace.result if needed else None
    if result is not None and options.schedule is not None and not len(result.events):
        print("hooktrace: each window was written as it ended; nothing was recorded after the "
              f"last one, so there is no {options.output}", file=sys.stderr)
        return
    if result is not None and options.record.aggregate is not None:
        # every step went into the aggregates: no .htrace of the events after the last
        # one (it read as the run's trace, in the working folder: issues #35, #47); they
        # are counted, as the trainer callbacks do
        profiled = _write_profile(result, options.output) if options.profile else []
        if profiled:
            print(f"hooktrace: wrote {' and '.join(profiled)}", file=sys.stderr)
        print_aggregates(result.info, options.summary, tail=len(result.events))
        return
    if not streamed:
        assert result is not None
        with _writing(options.output):
            result.save(options.output)
    written = [str(options.output)]
    for path, export in ((options.chrome, "export_chrome"), (options.pftrace, "export_perfetto")):
        if path is not None:
            assert result is not None
            with _writing(path):
                getattr(result, export)(path)
            written.append(str(path))
    if options.profile and options.schedule is None:
        assert result is not None
        written += _write_profile(result, options.output)
    if options.summary:
        assert result is not None
        print(result.summary(), file=sys.stderr)
    if result is not None:
        counts = {"modules": len(result.modules), "events": len(result.events),
                  "dropped_events": result.dropped_events,
                  "overwritten_events": result.overwritten_events,
                  "rolled_off_events": int((result.info.get("rolling") or {})
                                           .get("rolled_off_events", 0))}
    else:
        counts = {"modules": len(trace.modules_table()), **trace.stream_counts()}
    if streamed:  # what the stream's writer could not write (result: counted as dropped)
        counts["write_lost_events"] = trace.stream_counts().get("write_lost_events", 0)
    print(exit_line(written, counts), file=sys.stderr)
    if trace.stream_failure is not None:
        print(f"hooktrace: error: could not write {trace.stream_failure}", file=sys.stderr)


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A write of ``path`` that fails (a full disk, a read-only folder) is one line naming
    the file and, when there was no room, the disk (issue #46)."""
    try:
        yield
    except OSError as e:
        raise OutputPathError(write_failure(path, e)) from None


def print_aggregates(info: dict[str, Any], summary: bool, tail: int = 0, *,
                     hints: bool = True) -> None:
    """What an ``aggregate=`` recording wrote, on stderr; with ``summary``, the folder's
    table first (the run's events are in the aggregates, not in the trace: issue #35).
    ``tail``: the events after the last step (not aggregated); ``hints``: the rows a full
    disk lost and how to look at the folder (``hooktrace run``'s line; the trainer
    callbacks' says neither)."""
    agg = info.get("aggregate") or {}
    folder = str(agg.get("dir", "?"))
    if summary and "dir" in agg:
        from hooktrace._naming import has_aggregate_parts
        from hooktrace.data.aggregates import aggregate_summary

        print(aggregate_summary(folder) if has_aggregate_parts(folder) else
              f"hooktrace: no step was aggregated in {folder}: no summary", file=sys.stderr)
    lost = ""
    if hints and (agg.get("lost_rows") or agg.get("lost_steps")):  # a full disk, read-only
        lost = (f" ({agg.get('lost_rows', 0)} rows and {agg.get('lost_steps', 0)} kept steps "
                f"lost: {agg.get('write_error')})")
    after = f"; {tail} events after the last step not aggregated" if tail else ""
    look = (f"; the table: hooktrace summary {folder}; the page: hooktrace report {folder} -o "
            "report.html" if hints else "")
    print(f"hooktrace: {agg.get('steps', 0)} steps aggregated in "
          f"{os.path.join(folder, 'aggregates')}, {len(agg.get('detail', []))} kept whole "
          f"in {os.path.join(folder, 'steps')}{lost}{after}{look}", file=sys.stderr)


def exit_line(written: list[str], counts: dict[str, int]) -> str:
    """What a finished run says: the files, their size, what was lost, and how to look at
    them (a .htrace is hooktrace's own file: Perfetto opens the exports, not it).
    ``counts``: modules, events, dropped_events, overwritten_events."""
    # events the disk lost (a full disk: its name is in the failure's line) are not the
    # buffer's: no --capacity would have kept them (issue #46)
    disk = counts.get("write_lost_events", 0)
    dropped = max(0, counts["dropped_events"] - disk)
    lost = [f"{n} {what}" for n, what in ((dropped, "events dropped (buffer full: raise "
                                                    "--capacity)"),
                                          (disk, "events lost: the file could not be written"),
                                          (counts["overwritten_events"], "overwritten (ring)"),
                                          (counts.get("rolled_off_events", 0),
                                           "rolled off (oldest segments deleted: --max-disk)"))
            if n]
    counts_text = ", ".join([f"{counts['modules']} modules", f"{counts['events']} events",
                             *lost])
    views = written[1:]
    look = (open_hint(views[0]) if views else
            f"for Perfetto: hooktrace export {written[0]} -o "
            f"{Path(written[0]).with_suffix('.pftrace')}")
    return (f"hooktrace: wrote {' and '.join(written)} ({counts_text}); {look}; the table: "
            f"hooktrace summary {written[0]}")
