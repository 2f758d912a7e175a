// Device time per module call (issues #28, #36): trace(model, gpu=True).
//
// What is timed. A forward call: one timing event on the current stream of the
// current device right after its ENTER, one right before its EXIT. Backward: one
// event where the module owning the autograd nodes changes (not two per node): the
// owner of a node is the innermost module whose forward call created it (its
// sequence number lies in the call's [enter, exit) range of sequence numbers on the
// forward thread, tracked here while timing is on), and a final callback of the
// graph task closes the last interval. Each event is followed by a kGpuMark event
// in the session (event.h); the reader (hooktrace/reading.py) pairs them into
// intervals.
//
// The hot path (module_call.cpp, backward.cpp; taken only while the session's
// kExtraGpu bit is set: one byte tested when off) takes a slot of a bounded ring with
// one compare-and-swap of an atomic counter (no lock, no allocation) and records the
// slot's event of the current device's pool. A full ring is counted (dropped) and the
// call goes untimed; never a wait. Every quarter ring, a half-full ring is resolved
// from the hot path if no resolution runs (try_lock: no step marks, e.g. inference).
//
// Devices. c10's device-generic events (DeviceGuardImplInterface: CUDA, HIP, XPU,
// PrivateUse1), one pool per device made at the first mark on it (no sync there).
// A pool is aligned to the host clock at the first step mark after it is made: an
// event recorded on an idle stream and seen complete between two host readings
// microseconds apart (after one wait for the stream's queued work if it is busy:
// once per device and trace, never again). A stream still busy after that wait (a
// device that never idles, issue #50) keeps the wait's bracket, [probe recorded, wait
// returned], as a bounded estimate; where no wait is allowed (the hot path's
// resolutions), a probe seen done at a later resolution gives one. Its marks are
// resolved once it is aligned: durations, elapsed times between a call's own events,
// never depend on it. Each later step mark that finds every mark resolved re-aligns an
// idle stream the same way without a wait (drift: -3 to +11 ppm measured on an H200).
// The bound reported (GpuStats::align_error_ns) covers every time resolved: its
// alignment's half bracket, the resolution of an elapsed time, and 22 ppm of drift
// since that alignment.
//
// Resolution. gpu_resolve(session, wait) turns completed events into kGpuTime
// events (device time as Unix ns) in slot order and frees their slots: one query per
// stream (stream order: its last pending event done means all are), then one elapsed
// time per event against the device's reference event, whose host time is known;
// the last resolved event becomes the reference (the float milliseconds span a step
// or two). An event whose query or elapsed time fails is counted (failed) and freed,
// never raised. wait=true (the end, a window's end, a timed aggregate step) waits for
// the last ones: once per stream, for its last pending event.
//
// Compiled regions: each kernel call site hooktrace marks (kernel_marks.h) gets one
// event before the kernel and one after it (kGpuKernel); the reader makes them
// intervals of the site's module.
//
// Graphs. Nothing is recorded while hooktrace knows a graph is being captured
// (gpu_set_capturing, raised by the Python component around
// torch.cuda.CUDAGraph.capture_begin/end) or the stream says it is capturing (where
// the guard interface has isStreamCapturing); such calls are counted.
//
// Timer backends, the seam: a device type ("cuda", "xpu", "privateuseone") and
// "host", whose events are host timestamps (tests: the whole pipeline on a machine
// without a device; tests/integration/test_fake_device.cpp drives the device backend
// on a fake PrivateUse1 device).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace hooktrace {

class Session;

// Flags of a kGpuMark event.
enum GpuMarkFlags : uint8_t {
  kGpuExit = 1,      // forward: the call's end (else its start)
  kGpuBackward = 2,  // backward: from here on the stream's work is this module's
  kGpuKernel = 4,    // a kernel site of compiled code (id: the site): its start, or
                     // with kGpuExit its end
};
// kGpuMark id in backward when the nodes left every module.
constexpr uint32_t kGpuNoModule = UINT32_MAX;

struct GpuStats {
  std::string timer;
  uint64_t dropped = 0;            // calls not timed: the pool was full (or a record failed)
  uint64_t skipped_capturing = 0;  // calls not timed: a graph was being captured
  uint64_t failed = 0;             // marks whose time could not be read (counted, freed)
  int64_t align_error_ns = 0;      // the bound of the clock alignment of every time resolved
                                   // (worst device): its bracket plus the drift allowed since
  uint64_t pending = 0;            // recorded, not resolved yet
  uint64_t resolved = 0;           // kGpuTime events recorded so far
  uint64_t pool = 0;               // the pool's size (per device)
  uint32_t devices = 0;            // bit d: device d has a pool (was timed)
  uint64_t queries = 0;            // event queries made by resolutions
  uint64_t realigned = 0;          // re-alignments of a device's clock at an idle stream
  int64_t max_realign_correction_ns = 0;  // the largest correction one of them made
  uint64_t opportunistic = 0;      // resolutions the hot path ran (pool half full)
  uint64_t align_waits = 0;        // waits spent aligning clocks (at most one per device)
  uint64_t align_estimated = 0;    // alignments no idle stream gave (a wait's or a passive
                                   // probe's bracket: a bounded estimate)
};

// Creates the session's timer (a device type, or "host") with a ring of
// `pool_events` slots (and a pool of as many events per device, at its first mark)
// and sets s->gpu_timer; touches no device. Throws std::invalid_argument (an unknown
// timer) or std::runtime_error (no such device, a timer already set). GIL held,
// before the kExtraGpu bit is set.
void gpu_start(const std::shared_ptr<Session>& s, const std::string& timer, uint64_t pool_events);
// Records the kGpuTime events of the completed marks (all of them, waiting, when
// `wait`). Returns how many. GIL held; not while another resolution runs.
uint64_t gpu_resolve(Session* s, bool wait);
GpuStats gpu_stats(Session* s);
// Process-wide: a CUDA graph is being captured (record nothing meanwhile).
void gpu_set_capturing(bool on);

// The hot path (s->gpu() is true, s->gpu_timer set).
void gpu_enter(Session* s, uint32_t slot);
void gpu_exit(Session* s, uint32_t slot);
// A backward node starts on this thread: `seq` its sequence number, `fwd_tid` its
// forward thread's RecordFunction id.
void gpu_node(Session* s, uint64_t seq, uint32_t fwd_tid);
// A kernel mark of compiled code (kernel_marks.h) starts / ends: `site` its call site.
void gpu_kernel(Session* s, uint32_t site, bool end);

}  // namespace hooktrace
