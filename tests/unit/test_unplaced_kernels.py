"""Kernels and autograd nodes outside any recorded module call (issue #26): a compiled
region entered where no traced module's call is open leaves kernel marks with no
enclosing span, or a run with no module span at all. The export and the profiler
attribution place them nowhere instead of indexing out of range."""

from __future__ import annotations

import io

import numpy as np
from conftest import build_events, build_trace

from hooktrace._events import ENTER, EXIT, KERNEL_BEGIN, KERNEL_END, NODE_BEGIN, NODE_END
from hooktrace.analysis.attribution import _SeqOwner
from hooktrace.exporters._layout import kernel_slices, plan_export
from hooktrace.exporters.chrome import write_chrome
from hooktrace.analysis.kernels import Kernels

SITES = [["cpp_fused_0", "0", "forward"], ["extern_kernels.addmm", "2", "forward"]]


def _kernels_only() -> list[tuple[int, int, int, int]]:
    return [(1, KERNEL_BEGIN, 0, 100), (1, KERNEL_END, 0, 200),
            (1, KERNEL_BEGIN, 1, 300), (1, KERNEL_END, 1, 450)]


def test_kernels_with_no_span_at_all_export_nothing_and_do_not_raise() -> None:
    trace = build_trace(build_events(_kernels_only()), [("", "Sequential"), ("0", "Linear")],
                        kernel_sites=SITES)
    assert len(trace.spans()) == 0 and len(Kernels.from_trace(trace)) == 2
    ks = kernel_slices(trace, np.array([], np.int64), np.array([], np.int64),
                       np.array([], np.int64), np.array([], np.int64))
    assert len(ks.start) == 0
    buf = io.BytesIO()
    write_chrome(trace, buf)  # raised IndexError in kernel_slices
    assert b'"traceEvents"' in buf.getvalue()


def test_kernels_outside_every_span_are_left_out_and_those_inside_kept() -> None:
    # a span of module 0 from 1000 to 2000; one kernel inside it, two before it
    rows = _kernels_only() + [(1, ENTER, 0, 1000), (1, KERNEL_BEGIN, 1, 1100),
                              (1, KERNEL_END, 1, 1300), (1, EXIT, 0, 2000)]
    trace = build_trace(build_events(rows), [("", "Sequential"), ("0", "Linear"),
                                             ("2", "Linear")], kernel_sites=SITES)
    plan = plan_export(trace)
    ks = kernel_slices(trace, plan.spans, plan.start, plan.end, plan.row)
    assert len(ks.start) == 1 and int(ks.module[0]) == 2  # site 1's module "2"


def test_sequence_owner_of_a_run_without_module_calls_is_none() -> None:
    # autograd nodes only (no ENTER/EXIT): _SeqOwner indexed an empty event array
    trace = build_trace(build_events([(1, NODE_BEGIN, 0, 10), (1, NODE_END, 0, 20)]),
                        [("", "Net")], node_names=["SumBackward0"])
    owner = _SeqOwner(trace)
    assert owner.owner(1, 5) == -1


def test_sequence_owner_before_the_first_recorded_sequence_is_none() -> None:
    ev = build_events([(1, ENTER, 0, 10), (1, EXIT, 0, 20)])
    ev["seq"] = [7, 8]
    owner = _SeqOwner(build_trace(ev, [("", "Net")]))
    assert owner.owner(1, 3) == -1 and owner.owner(1, 7) == 0
