// Kernel busy time from CUPTI (issue #49): trace(model, gpu=True) on CUDA.
//
// What is recorded. Three kinds of events, joined to module spans by the reader
// (hooktrace/analysis/kernel_time.py), never on the launching thread:
//
//   kCuptiLaunch  CUPTI's API-enter callback of a kernel launch, copy, set or graph
//                 launch (runtime and driver APIs: Inductor, Triton and NCCL launch
//                 through the driver), on the thread that launches: id = the
//                 launch's correlation id, seq = cbid | domain << 32. The reader finds
//                 the innermost module span of that thread holding that time (the
//                 backward span on an autograd device thread, a compiled region's
//                 kernel site between its marks).
//   kCuptiKernel  one activity record (a kernel, memcpy or memset) as CUPTI delivers
//                 it, on whichever thread completes the buffer: id = correlation id,
//                 seq = start (CUPTI ns), rf_tid = duration ns (saturated at
//                 2**32-1), flags = kind (1 kernel, 2 memcpy, 3 memset) | device << 2;
//                 always followed on the same thread by
//   kCuptiKernelMore  id = the stream id, seq = the graph node id (0: not from a
//                 graph), rf_tid = the kernel's name (index into the names table).
//   kCuptiGraphNode  a graph node was created (flags 1, on the capturing thread, so
//                 the reader joins it like a launch) or cloned into an executable
//                 graph (flags 2): seq = its node id, id / rf_tid = low / high 32 bits
//                 of the original node's id (cloned only). A replay's kernels carry
//                 their node's id: node -> original -> the span open at capture.
//
// The launch callback costs the launching thread one event store (the session's
// per-thread buffer: no lock, no allocation) per launch. Records arrive late, out
// of order or not at all: buffers come from a bounded pool (a refused buffer and
// CUPTI's own dropped records are counted), and the reader joins by correlation id.
//
// One subscriber. CUPTI allows one callback subscriber per process (before CUDA
// 13.3); when torch.profiler's Kineto, Nsight or another tool holds it, start()
// fails with a reason and the caller falls back to event intervals.
//
// The seam: the library is whatever path the caller gives (HOOKTRACE_CUPTI_LIB in
// the tests: tests/integration/fake_cupti.cpp, a fake libcupti that delivers
// records late, out of order and lost).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hooktrace {

class Session;

struct CuptiStats {
  bool running = false;
  std::string library;          // the path loaded
  uint64_t launches = 0;        // launch callbacks seen (recorded into each session)
  uint64_t records = 0;         // activity records delivered (kernels, copies, sets)
  uint64_t cupti_dropped = 0;   // records CUPTI reported dropped
  uint64_t buffers_refused = 0; // buffer requests the bounded pool refused
  uint64_t graph_nodes = 0;     // graph node callbacks (created or cloned)
  uint64_t other_kinds = 0;     // records of kinds not read
  std::vector<std::string> names;  // kernel names, by index
  // (cupti ns, Unix ns) pairs sampled at start and at each flush: the clock map
  std::vector<std::pair<uint64_t, int64_t>> clock_pairs;
};

// Loads `library` (first of the candidates that dlopens and has every entry point),
// subscribes and enables the callbacks and activity kinds. Returns "" on success,
// else why not (one line: "libcupti not found", "CUPTI is held by another tool
// (torch.profiler, Nsight): ..."). Process-wide; GIL held.
std::string cupti_start(const std::vector<std::string>& candidates, uint64_t buffer_bytes,
                        uint32_t max_buffers);
// Flushes completed records into the sessions (forced: incomplete buffers too), and
// samples the clock pair. GIL held (released by the binding while CUPTI flushes).
void cupti_flush(bool forced);
// Between timed steps (gpu_every): callbacks and activity kinds off / on again.
void cupti_set_enabled(bool on);
// Flushes, disables and unsubscribes (yields CUPTI to another tool).
void cupti_stop();
// Sessions the callbacks record into.
void cupti_add_session(const std::shared_ptr<Session>& s);
void cupti_remove_session(const Session* s);
CuptiStats cupti_stats();

}  // namespace hooktrace
