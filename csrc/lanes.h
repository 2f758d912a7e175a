// Lanes: splits intervals that overlap without nesting onto separate rows.
//
// Chrome/Perfetto draw the "X" events of one (pid, tid) row as a stack and
// need every two of them to be either disjoint or nested; backward spans of
// sibling modules can interleave (autograd runs nodes in dependency order, not
// module order; issue #3), so each thread's backward track is split into lanes.
//
// Greedy rule (the pure-Python reference in tests/unit/test_lanes.py states the
// same): visit intervals by (group, start ascending, end descending, index);
// each lane keeps a stack of its open intervals. An interval goes into the
// first lane where, after popping the intervals that ended (end <= start), the
// stack is empty or its top contains it (top.end >= end); a new lane opens when
// none fits. Within one lane of one group, any two intervals are then disjoint
// or nested. Deterministic; lanes are numbered from 0 in each group.
//
// Optional hint: prefer[i] names another interval (its parent: the backward
// span of the parent call, or the span a node belongs to) whose lane is tried
// first, when that interval is in the same group and was placed before i. First
// fit alone would put a child wherever it fits, e.g. under an overlapping
// sibling of its parent in lane 0, which draws it inside the wrong module.
//
// An interval with end < start (a clock that went backwards) is treated as the
// empty interval [start, start].
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace hooktrace {

// lane[i] for interval i = [start[i], end[i]) of group[i]; all arrays length n;
// prefer is null or length n (-1: no hint).
std::vector<uint32_t> assign_lane_table(const int64_t* start, const int64_t* end,
                                        const uint32_t* group, const int64_t* prefer, size_t n);

// Python entry: contiguous int64, int64, uint32 arrays of one length, and
// optionally an int64 `prefer` array of that length.
pybind11::array_t<uint32_t> assign_lanes(pybind11::array_t<int64_t> start_ns,
                                         pybind11::array_t<int64_t> end_ns,
                                         pybind11::array_t<uint32_t> group,
                                         std::optional<pybind11::array_t<int64_t>> prefer);

}  // namespace hooktrace
