"""Decoding device time (issue #28): GPU_MARK / GPU_TIME events into GpuSpans
(hooktrace/analysis/device_time.py), on hand-made events: forward pairs, nested self time, marks
without a time, and a child on another stream."""

from __future__ import annotations

import numpy as np

from hooktrace._events import (ENTER, EVENT_DTYPE, EXIT, GPU_EXIT, GPU_KERNEL, GPU_MARK,
                               GPU_TIME, KERNEL_BEGIN, KERNEL_END, Clock)
from hooktrace.analysis.device_time import gpu_spans
from hooktrace.analysis.kernels import Kernels
from hooktrace.reading import CAT_FORWARD, GpuSpans, TraceData, site_modules

INFO = {"pid": 1, "hostname": "h", "dropped_events": 0, "overwritten_events": 0}
MODULES = [("", "Net"), ("a", "Linear"), ("b", "Linear")]


def _trace(rows: list[tuple[int, int, int, int, int, int]]) -> TraceData:
    """rows: (t, kind, id, seq, rf_tid, flags)"""
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, (t, kind, id_, seq, rf, flags) in enumerate(rows):
        ev[i] = (t, seq, id_, 7, rf, kind, flags, 0)
    return TraceData(ev, MODULES, [], Clock(0, 0, 1.0), INFO)


def _forward_rows(child_stream: int = 5) -> list[tuple[int, int, int, int, int, int]]:
    return [
        (0, ENTER, 0, 0, 0, 0), (1, GPU_MARK, 0, 5, 0, 0),
        (2, ENTER, 1, 0, 0, 0), (3, GPU_MARK, 1, child_stream, 1, 0),
        (9, GPU_MARK, 1, child_stream, 2, GPU_EXIT), (10, EXIT, 1, 0, 0, 0),
        (11, ENTER, 2, 0, 0, 0), (12, GPU_MARK, 2, 5, 3, 0),  # b: never resolved
        (13, GPU_MARK, 2, 5, 4, GPU_EXIT), (14, EXIT, 2, 0, 0, 0),
        (15, GPU_MARK, 0, 5, 5, GPU_EXIT), (16, EXIT, 0, 0, 0, 0),
        # resolution at the end: id = the mark's id, seq = device ns, rf_tid = device
        (20, GPU_TIME, 0, 100, 1, 0), (21, GPU_TIME, 1, 110, 1, 0),
        (22, GPU_TIME, 2, 150, 1, 0), (23, GPU_TIME, 5, 200, 1, 0),
    ]


def test_forward_intervals_pair_marks_and_subtract_children_on_the_same_stream() -> None:
    trace = _trace(_forward_rows())
    g = gpu_spans(trace)
    assert isinstance(g, GpuSpans) and len(g) == 2  # b's marks have no time: left out
    spans = trace.spans()
    by_module = {int(m): i for i, m in enumerate(g.module)}
    root, a = by_module[0], by_module[1]
    assert (g.start_ns[root], g.end_ns[root]) == (100, 200)
    assert (g.start_ns[a], g.end_ns[a]) == (110, 150)
    assert g.self_ns[a] == 40 and g.self_ns[root] == 100 - 40
    assert spans.module[g.span[root]] == 0 and spans.module[g.span[a]] == 1
    assert (g.cat == CAT_FORWARD).all() and (g.device == 1).all() and (g.stream == 5).all()


def test_a_child_on_another_stream_is_not_subtracted() -> None:
    g = gpu_spans(_trace(_forward_rows(child_stream=9)))
    root = int(np.flatnonzero(g.module == 0)[0])
    assert g.self_ns[root] == 100
    assert sorted(g.stream.tolist()) == [5, 9]


def test_no_marks_no_intervals() -> None:
    rows = [r for r in _forward_rows() if r[1] != GPU_TIME]
    assert len(gpu_spans(_trace(rows))) == 0
    assert len(gpu_spans(_trace([(0, ENTER, 0, 0, 0, 0), (1, EXIT, 0, 0, 0, 0)]))) == 0


def test_kernel_sites_are_intervals_of_their_module_and_leave_the_regions_self() -> None:
    # root's forward is a compiled region running one kernel of site 0 (module "a")
    g = gpu_spans(_one_kernel("a", MODULES))
    assert len(g) == 2
    root, k = (int(np.flatnonzero(g.module == m)[0]) for m in (0, 1))
    assert (g.start_ns[root], g.end_ns[root], g.self_ns[root]) == (100, 200, 50)
    assert (g.start_ns[k], g.end_ns[k], g.self_ns[k], g.span[k]) == (120, 170, 50, -1)
    assert g.cat[k] == CAT_FORWARD


def _one_kernel(path: str, modules: list[tuple[str, str]]) -> TraceData:
    """The root's compiled forward runs one kernel of a site naming ``path``."""
    rows = [
        (0, ENTER, 0, 0, 0, 0), (1, GPU_MARK, 0, 5, 0, 0),
        (2, KERNEL_BEGIN, 0, 0, 0, 0), (3, GPU_MARK, 0, 5, 1, GPU_KERNEL),
        (4, GPU_MARK, 0, 5, 2, GPU_KERNEL | GPU_EXIT), (5, KERNEL_END, 0, 0, 0, 0),
        (6, GPU_MARK, 0, 5, 3, GPU_EXIT), (7, EXIT, 0, 0, 0, 0),
        (20, GPU_TIME, 0, 100, 0, 0), (21, GPU_TIME, 1, 120, 0, 0),
        (22, GPU_TIME, 2, 170, 0, 0), (23, GPU_TIME, 3, 200, 0, 0),
    ]
    ev = np.zeros(len(rows), EVENT_DTYPE)
    for i, (t, kind, id_, seq, rf, flags) in enumerate(rows):
        ev[i] = (t, seq, id_, 7, rf, kind, flags, 0)
    info = {**INFO, "kernel_sites": [["triton_poi_fused_0", path, "forward"]]}
    return TraceData(ev, modules, [], Clock(0, 0, 1.0), info)


NESTED = [("", "Net"), ("blocks", "ModuleList"), ("blocks.0", "Block"), ("blocks.1", "Block")]


def test_a_kernel_fusing_two_list_entries_counts_on_the_same_row_host_and_device() -> None:
    # "blocks" is a container (never called, no row): its parent, the region, takes it
    # on the host (analysis.kernels) and on the device alike; so does a site naming the
    # region itself ("") or a module the table lacks ("gone")
    for path in ("blocks", "", "gone"):
        trace = _one_kernel(path, NESTED)
        assert Kernels.from_trace(trace).module.tolist() == [0], path
        g = gpu_spans(trace)
        # no interval of its own: the kernel is the region's own device time
        assert g.module.tolist() == [0] and g.self_ns.tolist() == [100], path


def test_a_site_naming_a_module_below_a_list_is_that_modules_on_both_sides() -> None:
    trace = _one_kernel("blocks.1", NESTED)
    assert Kernels.from_trace(trace).module.tolist() == [3]
    g = gpu_spans(trace)
    assert sorted(g.module.tolist()) == [0, 3]
    assert g.self_ns[g.module == 0].tolist() == [50] and g.span[g.module == 3].tolist() == [-1]


def test_site_modules_climbs_containers_and_falls_back_to_the_region() -> None:
    modules = [*NESTED, ("enc", "Enc"), ("enc.layers", "ModuleList"), ("enc.layers.0", "L")]
    sites = [("k", "layers", "forward"), ("k", "layers.0", "forward"), ("k", "nope", "forward"),
             ("k", "", "backward")]
    region = np.array([4, 4, 4, 4, -1, 4])
    slot, named = site_modules(modules, sites, region, np.array([0, 1, 2, 3, 1, 9]))
    assert slot.tolist() == [4, 6, 4, 4, -1, -1]
    assert named.tolist() == [True, True, False, True, False, False]
