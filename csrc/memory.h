// Memory per module call (trace(model, memory=True), issue #12): the bytes
// allocated at every module enter/exit and autograd node begin/end, and the
// peak in between, recorded natively as memory-sample events right after the
// event they belong to (event.h: kMemCpu, kMemCuda).
//
// CPU. c10 keeps no CPU allocation statistics (ProfiledCPUMemoryReporter counts
// only while torch.profiler's profile_memory is on, under a mutex, and reports
// through a thread-local hook that torch.profiler owns). So hooktrace installs a
// counting CPU allocator (c10::SetCPUAllocator) while a memory trace records:
// it forwards each allocation to the allocator it replaced, 64 bytes larger,
// and keeps the size and the inner allocation's deleter in those 64 bytes, in
// front of the data (the data stays 64-byte aligned and data == context, so
// raw_allocate/raw_deallocate work). Two process-wide atomics follow it:
//   current  bytes alive among the allocations made through it;
//   peak     the highest `current` since the last memory sample took it
//            (sample: exchange(peak, current)).
// A tensor allocated before the allocator was installed is not counted when it
// is freed (like profile_memory's reporter, which warns about such frees). The
// allocator is process-wide: every thread's allocations count, and the reader
// orders all threads' samples by time to find the peak inside each call. It is
// uninstalled when the last memory trace stops (the blocks it made keep its
// deleter, which stays valid: the extension is never unloaded).
//
// CUDA. The caching allocator's own statistics for the device given to
// set_memory (c10::DeviceAllocator::getDeviceStats, device-agnostic, no CUDA
// headers): allocated_bytes current and the device's high-water mark. Resetting
// the high-water mark would change what torch.cuda.max_memory_allocated reports
// to the user, so it is read, never reset; hooktrace.analysis.memory explains how the
// reader turns it into a per-call peak.
#pragma once

#include <atomic>
#include <cstdint>

namespace c10 {
struct DeviceAllocator;
}

namespace hooktrace {

struct MemoryCounters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
};
extern MemoryCounters cpu_memory;

// Reference-counted: the counting allocator is installed by the first call and
// the replaced allocator restored by the matching last uninstall. Throws
// std::runtime_error when another allocator with a higher priority keeps the
// CPU slot.
void install_cpu_memory();
void uninstall_cpu_memory();
bool cpu_memory_installed();

// peak = max(peak, value), atomically (the allocator after each allocation, the
// sample below for an allocation that raced it).
inline void raise_cpu_peak(int64_t value) {
  int64_t p = cpu_memory.peak.load(std::memory_order_relaxed);
  while (p < value &&
         !cpu_memory.peak.compare_exchange_weak(p, value, std::memory_order_relaxed)) {
  }
}

// One CPU sample: bytes allocated now, and the highest value since the
// previous sample (>= now).
inline void sample_cpu_memory(int64_t* current, int64_t* peak) {
  int64_t now = cpu_memory.current.load(std::memory_order_relaxed);
  int64_t high = cpu_memory.peak.exchange(now, std::memory_order_relaxed);
  // An allocation between the two loads raised `current` after `now` was read:
  // keep it as the next interval's starting peak.
  int64_t after = cpu_memory.current.load(std::memory_order_relaxed);
  if (after > now) raise_cpu_peak(after);
  *current = now;
  *peak = high > now ? high : now;
}

// The CUDA caching allocator, or null when none is registered (a CPU-only torch).
c10::DeviceAllocator* cuda_device_allocator();
// One CUDA sample of `device`: bytes allocated now and the device's high-water
// mark (a copy of the allocator's statistics, taken under its mutex).
//
// Issue #50: this is the hot path's one lock (and, with CUDA graph pools, allocation:
// DeviceStats holds a hash map per private pool, copied too). No lock-free read exists
// in torch (2.9 to 2.13, read in the headers and the allocator's source): the
// device-generic DeviceAllocator has getDeviceStats only, which every allocator
// implements as a copy under its recursive mutex; the
// allocator's push of its total to the thread-local profiler reporter
// (c10::reportMemoryUsageToProfiler, per malloc and free) lives in the
// PROFILER_STATE slot that torch.profiler owns (torch reads whatever is there as its
// own ProfilerStateBase, and the pushes must nest with the profiler's); the CUDA
// allocator's trace tracker (attachAllocatorTraceTracker) needs CUDA headers at build,
// runs under the same mutex for every malloc and free, and cannot be detached. The
// cost is measured instead: memory_sample_ns below, benchmarks/gpu.py --memory,
// docs/beyond-time.md.
void sample_cuda_memory(c10::DeviceAllocator* allocator, int device, int64_t* current,
                        int64_t* peak);

// The cost of a sample (benchmarks/gpu.py): `n` samples in a loop of the CUDA
// allocator's statistics of `device` (device < 0: the CPU counters, lock-free);
// nanoseconds per sample. Throws std::runtime_error without a CUDA allocator.
double memory_sample_ns(int device, int64_t n);

}  // namespace hooktrace
