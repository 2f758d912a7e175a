"""Merge a hooktrace run into a torch.profiler (kineto) Chrome trace, and attribute its ops.

The output is the profiler's trace, every event kept with its bytes except its
``ts``, plus hooktrace's module spans on the profiler's timeline, so one
Perfetto view shows which module each ``aten::`` op, autograd node and kernel
belongs to.

**Time base (measured with torch 2.13's kineto on CPU).** The profiler writes
``"baseTimeNanoseconds"`` (a whole second, weeks before the run: 1790857026 s
in two different processes on one day) and every ``ts`` as microseconds since
it with three decimals, i.e. exact nanoseconds, as decimal text
(``"ts": 4389865968648.250``). Both recorders read ``c10::getApproximateTime``
converted to Unix ns by ``ApproximateClockToUnixTimeConverter``, so a span's
Unix ns minus the base is directly a profiler ``ts``: every ``aten::linear`` of
a ``Linear.forward`` lies inside that call's span, to the nanosecond. All
arithmetic here is on integers; ``ts`` is never parsed as a float.

**Rebasing.** Perfetto turns each ``ts`` and ``dur`` into nanoseconds through a
double (``llround(x * 1000.0)``), exact for values below ~2**40 µs but not at
kineto's ~4.4e12 µs: there a span ending on its parent's nanosecond comes out
1 ns past it and Perfetto drops it (issue #7). So the merged file gets a new
``baseTimeNanoseconds`` (a whole second at least a minute before the run, or
before the profiler's first event) and every event's ``ts`` is rewritten in
integer nanoseconds relative to it: every time stays exactly the same Unix
nanosecond, and Perfetto reads all of them exactly. Only the ``ts`` number's
text changes; the original base is kept in the ``"hooktrace"`` block.

**Threads.** Host slices use the OS pid and the OS thread id (``gettid``, the
``threading.get_native_id()``) as ``pid``/``tid``, the same ids hooktrace
records, so hooktrace spans go to the profiler's own thread row. The
``"Fwd thread id"`` arg of autograd nodes is *not* an OS tid but
``RecordFunction::currentThreadId()`` (1, 2, ...), which hooktrace records as
``rf_tid`` next to the OS tid. The profiler records only the threads where it
is enabled (the thread that started it and autograd's workers), not other
Python threads.

**Rows** follow the convention of ``hooktrace.exporters.chrome`` (its
:class:`~hooktrace.exporters._layout.TrackLayout`, categories and track names). Perfetto
needs the slices of a row to nest strictly: a forward span shares its thread's
row when it nests with every profiler slice on it (the usual case: a module
call contains its ops); one that would cross a profiler slice goes to the
track "T forward" instead. Backward spans always go to "T backward" tracks
and unattributed autograd nodes to "T autograd (unattributed)".

**Window.** Spans are clipped to the profiler's window (its "PyTorch Profiler
(N)" span, else the extent of its events): with ``torch.profiler.schedule``
each exported trace gets the spans of its own active steps only. A trace that
does not overlap the run's recording interval (from its start to its stop,
not the extent of its spans: a full buffer must not make a run look shorter),
or of another process, is refused.

**Memory.** The profiler trace is streamed (see ``hooktrace.format._kineto``): read in
4 MiB blocks, each event decoded on its own and its original bytes copied to
the output; only compact columns of the run's own host slices are kept (about
64 bytes per slice) plus the run's spans. A 1 GB trace is never held as text,
let alone as parsed JSON. The output goes through ``hooktrace._output``, so a
refused merge leaves nothing behind.

Example::

    import torch, hooktrace
    from hooktrace.exporters.merged import merge_traces
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with hooktrace.trace(model) as tr, torch.profiler.profile() as prof:
        model(torch.randn(4, 8))
    prof.export_chrome_trace("profiler.json")
    merge_traces(tr, "profiler.json", "merged.json.gz")   # open in ui.perfetto.dev
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hooktrace.format._profiler_events import collect
from hooktrace.exporters._profiler_merge import (  # the merge itself (a shared helper)
    BASE_MARGIN_NS,
    MergeError,
    MergeResult,
    ProfilerTraceError,
    RunLike,
    as_run,
    assign_lanes,
    check_compatible,
    crossing,
    merge_traces,
    place_spans,
    run_interval,
    write_spans,
)

if TYPE_CHECKING:
    from hooktrace.analysis.attribution import Attribution

__all__ = [
    "BASE_MARGIN_NS",
    "MergeError",
    "MergeResult",
    "ProfilerTraceError",
    "RunLike",
    "as_run",
    "assign_lanes",
    "attribute",
    "check_compatible",
    "crossing",
    "merge_traces",
    "place_spans",
    "run_interval",
    "write_spans",
]


# -- attribution -----------------------------------------------------------


def attribute(
    run_or_path: RunLike, profiler_path: str | os.PathLike[str], *, top_ops: int = 3
) -> Attribution:
    """Attribute the profiler's ops (and kernels) to the run's modules.

    See :mod:`hooktrace.analysis.attribution`. Example::

        table = attribute("run.htrace", "profiler.json.gz")
        print(table.to_text())
    """
    from hooktrace.analysis.attribution import attribute_events

    run = as_run(run_or_path)
    run_name = os.fspath(run_or_path) if isinstance(run_or_path, (str, os.PathLike)) else "the run"
    p = collect(profiler_path, pid=run.pid)
    check_compatible(run, p, run_name)
    return attribute_events(run, p, top_ops=top_ops)
