// Spans: pairs the recorded ENTER/EXIT events of each thread into nested call
// intervals (the reader side's core; see hooktrace/reading.py `Spans`).
//
// Rules (the pure-Python reference in tests/unit/test_spans.py states the same):
//  * events are grouped by tid, keeping recorded order within a thread;
//  * ENTER pushes a frame; EXIT pops the nearest frame with the same module id,
//    first closing the frames above it as unfinished (their EXIT was lost);
//  * an EXIT with no matching frame is an orphan (counted; no span) - normal at
//    the start of a flight-recorder ring buffer;
//  * frames still open at the end of a thread's stream become unfinished spans
//    ending at the last timestamp recorded on that thread;
//  * NODE_BEGIN/NODE_END pair the same way into autograd node executions
//    (nodes.*); an ENTER while a node runs on that thread is a forward call
//    recomputed by activation checkpointing (kCatRecompute);
//  * backward spans (kCatBackward) are then derived from the nodes, see
//    backward_spans.h.
//
// Output order: by tid ascending, then pre-order within the thread (start
// ascending, parent before child), which is the order Chrome nesting wants.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "event.h"

namespace hooktrace {

enum SpanFlags : uint8_t {
  kSpanError = 1,       // the EXIT carried kFlagError: forward raised
  kSpanUnfinished = 2,  // no matching EXIT was recorded; end is a lower bound
  kSpanClipped = 4,     // set by the exporters only: cut at a --start/--end/--steps edge
  // (8: reserved; was the exporters' FLOPs-counted flag, now an argument column)
  kSpanEval = 16,  // the ENTER carried kFlagNoGrad or kFlagEvalMode: an eval/inference call
};

enum SpanCat : uint8_t {
  kCatForward = 0,
  kCatBackward = 1,   // a module call's autograd nodes in one backward pass
  kCatRecompute = 2,  // a forward call re-run inside backward (checkpointing)
};

// One autograd node execution (a kNodeBegin/kNodeEnd pair).
struct NodeTable {
  std::vector<int64_t> start_ns, end_ns, self_ns;
  std::vector<uint64_t> seq;
  std::vector<uint32_t> name, tid, fwd_tid;
  std::vector<uint32_t> pass;    // backward pass (graph task of the outermost node)
  std::vector<int64_t> span;     // backward span it is attributed to, -1 if none
  // Working state for the builder.
  std::vector<int64_t> parent;   // enclosing node on the same thread, -1 if none
  std::vector<uint32_t> task;    // graph task id from kNodeEnd, UINT32_MAX if lost
};

// Structure of arrays, one entry per span, plus the run's anomaly counts.
struct SpanTable {
  std::vector<int64_t> start_ns, end_ns, self_ns, parent;
  std::vector<uint32_t> module, tid, depth, call;
  std::vector<uint8_t> flags, cat;
  std::vector<uint32_t> threads;  // every tid that recorded an event, ascending
  // Per span, for backward attribution: sequence numbers at ENTER and EXIT
  // (the autograd nodes the call created are [seq_enter, seq_exit)), the
  // recording thread's RecordFunction id, and the forward span a recompute
  // re-runs (itself for forward spans; -1 if none was found).
  std::vector<uint64_t> seq_enter, seq_exit;
  std::vector<uint32_t> rf_tid;
  std::vector<int64_t> owner;
  NodeTable nodes;
  uint64_t orphan_exits = 0;
  uint64_t unfinished = 0;
  uint64_t node_events = 0;
};

// `t_ns[i]` is events[i].t already converted to Unix ns (hooktrace.Clock).
// `post_hook_names`: node name ids whose post-hooks are their module's (see
// hook_extents in backward_spans.cpp).
SpanTable build_span_table(const Event* events, const int64_t* t_ns, size_t n,
                           const std::vector<uint32_t>& post_hook_names = {});

// Python entry: events is a contiguous EVENT_DTYPE array (any 32-byte records),
// t_ns a matching int64 array. Returns a dict of numpy arrays and counts.
pybind11::dict build_spans(pybind11::array events, pybind11::array_t<int64_t> t_ns,
                           std::vector<uint32_t> post_hook_names);

}  // namespace hooktrace
