// The fixed-size event record shared by the recorder (writer) and the trace
// file (reader). It is written as-is into per-thread chunks on the hot path and
// copied as-is into the .htrace file, so its layout is part of the file format:
// changing it means bumping hooktrace.format.FORMAT_VERSION.
//
//   offset size  field
//   ------ ----  -------------------------------------------------------------
//        0    8  t       raw approximate-clock ticks, c10::getApproximateTime()
//                        (the clock torch.profiler uses); converted to Unix ns
//                        by the session's clock conversion, never on the hot path
//        8    8  seq     forward: at::sequence_number::peek() on the calling
//                        thread at the event; backward node: the node's seqNr();
//                        kStep: the number of the step that just ended;
//                        kMemCpu/kMemCuda: bytes allocated now (int64)
//       16    4  id      forward: module slot in the session's module table;
//                        kNodeBegin: index into the node-name table;
//                        kNodeEnd: the autograd graph task id (backward.h);
//                        kStep: 0; kMem*: low 32 bits of the peak bytes;
//                        kKernel*: the kernel call site
//       20    4  tid     OS thread id (gettid) of the recording thread
//       24    4  rf_tid  forward: at::RecordFunction::currentThreadId() of the
//                        recording thread; backward node: forwardThreadId();
//                        kMem*: high 32 bits of the peak bytes
//       28    1  kind    EventKind below
//       29    1  flags   EventFlags below
//       30    2  pad     always zero
//   total  32 bytes, little-endian, no implicit padding (static_assert below)
#pragma once

#include <cstddef>
#include <cstdint>

namespace hooktrace {

enum EventKind : uint8_t {
  kEnter = 1,      // module forward call begins
  kExit = 2,       // module forward call returns (or raises: kFlagError)
  kNodeBegin = 3,  // autograd node starts running in backward
  kNodeEnd = 4,    // autograd node finished
  kStep = 5,       // a training step ended (Trace.step() or Optimizer.step())
  // Memory samples (trace(memory=True), memory.h): recorded right after the
  // enter/exit/node event they belong to, on the same thread, with its `t`.
  // kMemCpu: CPU bytes allocated now through hooktrace's counting allocator, and
  // the peak since the previous CPU sample (any thread's). kMemCuda: the CUDA
  // device's allocated bytes now, and its high-water mark.
  kMemCpu = 6,
  kMemCuda = 7,
  // Kernel marks (kernel_marks.h): a kernel of compiled code that hooktrace
  // instrumented starts / ends; id = its call site (the trace's kernel_sites
  // table), seq = 0.
  kKernelBegin = 8,
  kKernelEnd = 9,
  // Shape signatures of a forward call (shapes.h): after its EXIT, same thread.
  // id = module slot; seq = input signature | output signature << 32 (indexes
  // into the trace's shape_signatures table).
  kShapes = 10,
  // (11: reserved)
  // Numeric health of a call (numerics.h): after a forward call's EXIT (same
  // thread), or when its inputs' gradients are complete (flag kNumBackward). id =
  // module slot; seq = abs-max | rms << 32 (float32 bits); rf_tid = non-finite
  // values; flags = numerics.h's NumericsFlags.
  kNumerics = 12,
  // The statistics of a deferred kNumerics event (flag kNumDeferred, numerics.h),
  // recorded when the session flushes them: id = the call's id (that event's rf_tid);
  // seq, rf_tid, flags as kNumerics'.
  kNumericsValue = 13,
  // Device time (trace(gpu=True), gpu_time.h). kGpuMark: a timing event was recorded
  // on the device stream, right after the ENTER (before the EXIT) of a forward call,
  // or in backward where the module of the autograd nodes changed, or around a kernel
  // call site of compiled code (kGpuKernel): id = module slot (kGpuNoModule: backward
  // left every module, the interval before it ends; kGpuKernel: the site), seq =
  // the stream id (c10::StreamId, int64), rf_tid = the mark's id (unique in the
  // session, modulo 2**32), flags = GpuMarkFlags (gpu_time.h).
  kGpuMark = 14,
  // The device time of a kGpuMark, recorded when the session resolved it (at the
  // next step mark or the end): id = the mark's id, seq = the time as int64 Unix ns
  // (the device's clock aligned to the host's), rf_tid = the device index.
  kGpuTime = 15,
  // Kernel busy time from CUPTI (trace(gpu=True) on CUDA, cupti.h, which lays out
  // their fields): a launch on the launching thread, an activity record (two events,
  // one after the other on the thread that recorded it), a graph node created or
  // cloned.
  kCuptiLaunch = 16,
  kCuptiKernel = 17,
  kCuptiKernelMore = 18,
  kCuptiGraphNode = 19,
};

enum EventFlags : uint8_t {
  kFlagError = 1,     // kExit: forward raised an exception
  kFlagNoGrad = 2,    // kEnter: grad mode was off (torch.no_grad, inference_mode)
  kFlagEvalMode = 4,  // kEnter: the module's `training` was False (module.eval())
};

struct Event {
  uint64_t t;
  uint64_t seq;
  uint32_t id;
  uint32_t tid;
  uint32_t rf_tid;
  uint8_t kind;
  uint8_t flags;
  uint16_t pad;
};

static_assert(sizeof(Event) == 32, "Event is part of the file format");
static_assert(offsetof(Event, seq) == 8 && offsetof(Event, id) == 16 &&
                  offsetof(Event, tid) == 20 && offsetof(Event, rf_tid) == 24 &&
                  offsetof(Event, kind) == 28 && offsetof(Event, flags) == 29,
              "Event layout is part of the file format");

}  // namespace hooktrace
