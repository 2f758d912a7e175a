// A recording session: bounded per-thread event buffers and the hot-path
// record() every module call goes through.
//
// Memory layout. Each thread that records into a session owns a ThreadBuffer:
// a list of fixed-size Chunks that only that thread appends to. The hot path is
// a thread-local cache hit, a bounds check and a 32-byte store, published with
// one release store of the chunk's count; no lock, no allocation, no Python
// object. The rare path (a chunk is full, or the first event of a thread)
// takes the session mutex to allocate or recycle a chunk.
//
// Capacity is session-wide, rounded up to whole chunks (a capacity below one
// chunk shrinks the chunk, so it is exact). When it is reached:
//   Policy::kDrop  further events are not recorded and are counted in
//                  dropped (the default: the trace is an exact prefix).
//   Policy::kRing  the thread recycles its own oldest chunk (flight recorder:
//                  the trace is an exact suffix); recycled events are counted
//                  in overwritten. A thread holding no chunk yet drops. A
//                  ring allocates one chunk more than the capacity, so a
//                  thread recording alone keeps at least `capacity` newest
//                  events after recycling.
//
// Streaming (enable_streaming(), issue #9): a consumer (csrc/stream_writer.h)
// drains the chunks while recording goes on, so the capacity bounds the chunks
// in flight rather than the run. Each ThreadBuffer then has a consumer cursor
// and the session a pool of free chunks:
//   begin_collect()  under the mutex: the unconsumed events of every thread,
//                    from its cursor up to each chunk's acquire-loaded count;
//   (the consumer reads them WITHOUT the mutex: refill takes it, and I/O under
//    it would stall every recording thread that crosses a chunk boundary)
//   end_collect()    under the mutex: advances the cursors; chunks that are
//                    fully consumed and no longer their owner's current chunk
//                    go to the free pool, which refill() takes from first.
// A chunk handed out by begin_collect is never freed or reused before the
// matching end_collect: only end_collect frees chunks, and refill reuses a
// thread's current chunk in place only once it is fully consumed (so no
// outstanding segment points into it). When no chunk is free the event is
// dropped and counted, as in drop mode; a ring is refused (it would recycle
// chunks the consumer may be reading). The hot path is unchanged: all of this
// lives on the refill path, which runs once per chunk. Each recording thread
// keeps its current chunk, so a capacity of k chunks serves at most k threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/SequenceNumber.h>
#include <c10/macros/Macros.h>

#include "clock.h"
#include "event.h"
#include "memory.h"

namespace hooktrace {

class GpuTimer;  // gpu_time.h

enum class Policy { kDrop, kRing };

struct Chunk {
  explicit Chunk(uint32_t capacity) : events(new Event[capacity]) {}
  std::unique_ptr<Event[]> events;
  // Events [0, count) are complete; release-stored by the owning thread after
  // each event so a collector never reads a half-written record.
  std::atomic<uint32_t> count{0};
};

struct ThreadBuffer {
  // Hot-path state, touched by the owning thread only.
  Chunk* chunk = nullptr;  // the chunk being filled (null until first refill)
  uint32_t pos = 0;        // == chunk->count, without the atomic load
  uint32_t limit = 0;      // == chunk capacity; 0 while there is no chunk
  uint32_t tid = 0;        // gettid()
  uint32_t rf_tid = 0;     // at::RecordFunction::currentThreadId()
  // Written by the owning thread, read by collectors: relaxed atomics whose
  // increments compile to plain load/add/store (no lock prefix) since only the
  // owner writes them.
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> overwritten{0};
  // Guarded by Session::mutex_. Oldest first once rotated in ring mode.
  std::vector<std::unique_ptr<Chunk>> chunks;
  size_t head = 0;  // index of the oldest chunk in `chunks`
  // Streaming only, guarded by Session::mutex_: the consumer cursor. chunks[0]
  // is consumed up to read_pos (chunks behind it were freed); `consumed` counts
  // the thread's events consumed so far (the index of the next one handed
  // out); taken_* is what the begin_collect in progress handed out.
  uint32_t read_pos = 0;
  uint64_t consumed = 0;
  uint32_t taken_chunks = 0;  // chunks[0, taken_chunks) were read from,
  uint32_t taken_end = 0;     // the last of them up to this count,
  uint64_t taken_events = 0;  // that many events in all
  // Streaming: set (under the mutex) when this thread found no free chunk, so
  // its next events drop without taking the mutex; cleared by end_collect()
  // once anything was consumed. Per thread, not full_: a thread whose own
  // chunk became reusable must not be kept out by others that have none.
  std::atomic<bool> starved{false};
};

// Wakes a stream consumer: notified by refill() when chunks run short, and by
// the consumer's own controls (flush, stop). Its mutex is only ever taken
// innermost (refill holds the session mutex when it notifies), so the
// consumer must never hold it while calling into the Session.
struct Wakeup {
  std::mutex mutex;
  std::condition_variable cv;
  bool pending = false;  // guarded by mutex
  void notify() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      pending = true;
    }
    cv.notify_one();
  }
};

// One thread's run of unconsumed events, as begin_collect() hands it out.
struct Segment {
  uint32_t thread;     // index of the thread's buffer in the session (stable)
  uint32_t tid;        // gettid() of the thread
  uint64_t first;      // index of events[0] among the thread's recorded events
  const Event* events;
  uint32_t count;
};

struct SessionStats {
  uint64_t events = 0;       // complete events currently held
  uint64_t dropped = 0;      // events not recorded (capacity reached)
  uint64_t overwritten = 0;  // events recorded, then recycled (ring mode)
  uint64_t threads = 0;
  uint64_t chunks = 0;       // chunks allocated (in use or in the free pool)
  uint64_t free_chunks = 0;  // streaming: chunks in the free pool
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // 4096 events x 32 B = 128 KiB per chunk: the refill's mutex and allocation
  // then cost < 1 ns per event amortized (refill measured ~2 us).
  static constexpr uint32_t kDefaultChunkEvents = 4096;

  Session(uint64_t capacity_events, Policy policy, uint32_t chunk_events);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start();
  void stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }

  uint64_t id() const { return id_; }
  // The effective capacity: the requested one rounded up to whole chunks (a
  // ring's spare chunk not counted).
  uint64_t capacity_events() const { return capacity_chunks_ * chunk_events_; }
  uint32_t chunk_events() const { return chunk_events_; }
  Policy policy() const { return policy_; }
  // The tick -> Unix ns conversion: final once stopped, measured up to now while
  // recording (for live snapshots).
  ClockConversion clock();

  // Module names for profiler emission (profiler_emit.h), by slot. Emission is
  // on once set_emit_names() was called, before start(): a model scope names
  // every slot then, a process scope appends each slot's name as it names the
  // module (under the GIL, as every reader). A deque: names never move, so a
  // RecordFunction may keep pointing at one.
  void set_emit_names(std::vector<std::string> names) {
    emit_ = true;
    emit_names_.assign(names.begin(), names.end());
  }
  void add_emit_name(std::string name) { emit_names_.push_back(std::move(name)); }
  bool emits() const { return emit_; }
  const char* emit_name(uint32_t slot) const {
    return slot < emit_names_.size() ? emit_names_[slot].c_str() : "<module>";
  }

  // Streaming mode (see the top of this file). Before start(); throws
  // std::invalid_argument for a ring. `wakeup` is notified when half the
  // capacity is in flight or an event had to be dropped.
  void enable_streaming(std::shared_ptr<Wakeup> wakeup);
  bool streaming() const { return wakeup_ != nullptr; }
  // Appends the unconsumed events of every thread to `out` (one or more
  // segments per thread, in recorded order). One collection at a time; each
  // must be followed by end_collect() once the consumer is done reading.
  void begin_collect(std::vector<Segment>* out);
  void end_collect();
  // Copies every unconsumed event into `out` (cleared first), thread by thread in
  // recorded order, and consumes them: begin_collect + copy + end_collect. For
  // schedule windows (hooktrace/record/windows.py): each window's events are drained at
  // its end, so memory holds one window at most.
  void drain(std::vector<Event>* out);

  // Schedule windows: stop/resume recording between windows without touching the
  // clock conversion (start()/stop() measure it): a paused session costs every
  // module call what a disabled one does (one relaxed load, record()'s first test).
  void pause() { active_.store(false, std::memory_order_release); }
  void resume() { active_.store(true, std::memory_order_release); }

  SessionStats stats();
  // Copies every complete event, thread by thread in recorded order (oldest
  // first), into out[0, max_events). Returns how many were copied.
  uint64_t copy_events(Event* out, uint64_t max_events);

  // The hot path: one module enter/exit. Inline so the caller in module_call.cpp
  // get it without a call.
  inline void record(uint32_t id, uint8_t kind, uint8_t flags) {
    if (C10_UNLIKELY(!active())) return;
    ThreadBuffer* b = buffer();
    const uint64_t t = store(b, kind, flags, &at::sequence_number::peek, id,
                             [b] { return b->rf_tid; });
    if (C10_UNLIKELY(memory_) && t != kDropped) record_memory(b, t);
  }

  // An autograd node event from the backward callback (backward.cpp): `seq`
  // is the node's sequence number, `fwd_tid` its forward thread's
  // RecordFunction id, `id` the node name (kNodeBegin) or graph task (kNodeEnd).
  inline void record_node(uint8_t kind, uint64_t seq, uint32_t id, uint32_t fwd_tid) {
    if (C10_UNLIKELY(!active())) return;
    ThreadBuffer* b = buffer();
    const uint64_t t = store(b, kind, 0, seq, id, fwd_tid);
    if (C10_UNLIKELY(memory_ && kind != kStep) && t != kDropped) record_memory(b, t);
  }

  // A kernel mark of instrumented compiled code (kernel_marks.h): `site` is the
  // kernel call site; no memory sample (the region's own events carry those).
  inline void record_kernel(uint8_t kind, uint32_t site) {
    if (C10_UNLIKELY(!active())) return;
    ThreadBuffer* b = buffer();
    store(b, kind, 0, 0, site, [b] { return b->rf_tid; });
  }

  // Per-call extras, tested once per module call (module_call.cpp): shapes
  // (shapes.h; fixed before start()) and numerics (numerics.h; set before start()
  // and between steps when sampling, numerics_every).
  static constexpr uint8_t kExtraShapes = 1, kExtraNumerics = 2, kExtraGpu = 4;
  uint8_t extras() const { return extras_.load(std::memory_order_relaxed); }
  void set_shapes(bool on) { set_extra(kExtraShapes, on); }
  bool shapes() const { return extras() & kExtraShapes; }
  void set_numerics(bool on) { set_extra(kExtraNumerics, on); }
  bool numerics() const { return extras() & kExtraNumerics; }
  // A call's statistics (numerics.h): `stats` = abs-max | rms << 32 as float32 bits.
  inline void record_numerics(uint32_t slot, uint8_t flags, uint64_t stats, uint32_t nonfinite) {
    record_extra(kNumerics, slot, flags, stats, nonfinite);
  }
  // A deferred call's statistics (numerics.h flush_numerics): id = the call's id.
  inline void record_numerics_value(uint32_t id, uint8_t flags, uint64_t stats, uint32_t nonfinite) {
    record_extra(kNumericsValue, id, flags, stats, nonfinite);
  }
  // Device time (gpu_time.h): set_gpu toggles the timing of calls (gpu_every); the
  // kGpuMark / kGpuTime events it records.
  void set_gpu(bool on) { set_extra(kExtraGpu, on); }
  bool gpu() const { return extras() & kExtraGpu; }
  inline void record_gpu(uint8_t kind, uint32_t id, uint8_t flags, uint64_t seq, uint32_t rf) {
    record_extra(kind, id, flags, seq, rf);
  }
  // The session's device timer (gpu_time.h): set once by gpu_start(), under the GIL,
  // before the kExtraGpu bit is first set; lives as long as the session.
  std::shared_ptr<GpuTimer> gpu_timer;
  // A call's shape signatures (shapes.h): input | output << 32.
  inline void record_shapes(uint32_t slot, uint32_t in_sig, uint32_t out_sig) {
    record_extra(kShapes, slot, 0, static_cast<uint64_t>(in_sig) | static_cast<uint64_t>(out_sig) << 32, 0);
  }
  // True once: for the first caller that saw a non-finite value in this session.
  bool claim_first_nonfinite() { return !nonfinite_seen_.exchange(true); }

  // A step boundary (Python's Trace.step(), never per module call): `step` is
  // the number of the step that just ended.
  void record_step(uint64_t step) { record_node(kStep, step, 0, 0); }

  // Memory per call (memory.h), before start(): `cpu` counts CPU allocations
  // (the counting allocator is installed from start() to stop()); `cuda_device`
  // >= 0 also samples that CUDA device's allocator. Throws std::runtime_error
  // when CUDA is asked for and no CUDA allocator is registered.
  void set_memory(bool cpu, int cuda_device);
  bool memory_cpu() const { return memory_ & kMemoryCpu; }
  int memory_cuda_device() const { return cuda_allocator_ ? cuda_device_ : -1; }

  bool refill(ThreadBuffer* b);

 private:
  void set_extra(uint8_t bit, bool on) {
    if (on)
      extras_.fetch_or(bit, std::memory_order_relaxed);
    else
      extras_.fetch_and(static_cast<uint8_t>(~bit), std::memory_order_relaxed);
  }
  inline void record_extra(uint8_t kind, uint32_t slot, uint8_t flags, uint64_t seq, uint32_t rf) {
    if (C10_UNLIKELY(!active())) return;
    store(buffer(), kind, flags, seq, slot, rf);
  }
  inline ThreadBuffer* buffer();
  ThreadBuffer* buffer_slow();
  bool refill_streaming(ThreadBuffer* b);  // mutex_ held
  // The memory samples following an event at tick `t` (memory.h); out of line:
  // only memory traces take it.
  void record_memory(ThreadBuffer* b, uint64_t t);
  void write_memory(ThreadBuffer* b, uint64_t t, uint8_t kind, int64_t current, int64_t peak);

  // The slot for the thread's next event, or null when it must be dropped
  // (counted). The event becomes visible to collectors at publish().
  inline Event* next_slot(ThreadBuffer* b) {
    if (C10_UNLIKELY(b->pos == b->limit) && !refill(b)) {
      b->dropped.store(b->dropped.load(std::memory_order_relaxed) + 1,
                       std::memory_order_relaxed);
      return nullptr;
    }
    return &b->chunk->events[b->pos];
  }
  template <typename T>
  static inline auto value(T v) {
    if constexpr (std::is_invocable_v<T>) {
      return v();
    } else {
      return v;
    }
  }
  static inline void publish(ThreadBuffer* b) {
    b->chunk->count.store(++b->pos, std::memory_order_release);
  }
  // The one write of an event into the store, every kind's: the thread's next slot
  // (or a counted drop), the fields of event.h (tid: the thread's), the publish. `t`:
  // the event's tick, or kNow: the clock read once the slot is taken (a refill's
  // cost falls before the event). `seq`, `rf_tid`: values, or functions called after
  // the clock is read (record's forward sequence number and the thread's RecordFunction
  // id, read where they were). Returns the tick written, kDropped when dropped. Inline:
  // on the hot path (record) it compiles to the code of the stores it replaced.
  static constexpr uint64_t kNow = 0, kDropped = 0;  // (the clock never reads 0)
  template <typename Seq, typename Rf>
  inline uint64_t store(ThreadBuffer* b, uint8_t kind, uint8_t flags, Seq seq, uint32_t id,
                        Rf rf_tid, uint64_t t = kNow) {
    Event* e = next_slot(b);
    if (C10_UNLIKELY(!e)) return kDropped;
    if (t == kNow) t = now_ticks();
    e->t = t;
    e->seq = static_cast<uint64_t>(value(seq));
    e->id = id;
    e->tid = b->tid;
    e->rf_tid = static_cast<uint32_t>(value(rf_tid));
    e->kind = kind;
    e->flags = flags;
    e->pad = 0;
    publish(b);
    return t;
  }

  const uint64_t id_;
  const Policy policy_;
  const uint32_t chunk_events_;
  const uint64_t capacity_chunks_;
  const uint32_t max_chunks_;  // capacity_chunks_, plus the ring's spare chunk
  std::atomic<bool> active_{false};
  std::atomic<uint8_t> extras_{0};
  std::atomic<bool> nonfinite_seen_{false};
  // Memory sampling (set_memory), fixed before start(): read on the hot path.
  static constexpr uint8_t kMemoryCpu = 1, kMemoryCuda = 2;
  uint8_t memory_ = 0;
  bool cpu_counting_ = false;  // guarded by mutex_: start() installed the counting allocator
  c10::DeviceAllocator* cuda_allocator_ = nullptr;
  int cuda_device_ = -1;
  // Set once capacity is exhausted in drop mode, so the full-buffer path
  // counts the drop without taking the mutex.
  std::atomic<bool> full_{false};

  std::mutex mutex_;
  uint32_t chunks_allocated_ = 0;                       // guarded by mutex_
  std::vector<std::unique_ptr<Chunk>> free_chunks_;     // guarded by mutex_ (streaming)
  std::shared_ptr<Wakeup> wakeup_;                      // set before start(): streaming
  std::vector<std::unique_ptr<ThreadBuffer>> buffers_;  // guarded by mutex_
  bool emit_ = false;
  std::deque<std::string> emit_names_;
  // Shared so that clock() measures (~1000 clock pairs, tens of us) outside
  // mutex_, which every thread's refill takes: the stream writer asks for the
  // clock while recording goes on.
  std::shared_ptr<ClockCapture> clock_capture_;
  ClockConversion clock_;
};

// Per-thread cache of (session id, buffer). Session ids are never reused, so a
// stale entry of a destroyed session can never match a live one.
struct TlsEntry {
  uint64_t session_id = 0;
  ThreadBuffer* buffer = nullptr;
};
constexpr int kTlsEntries = 4;
extern thread_local TlsEntry tls_buffers[kTlsEntries];

inline ThreadBuffer* Session::buffer() {
  TlsEntry& e = tls_buffers[0];
  if (C10_LIKELY(e.session_id == id_)) return e.buffer;
  return buffer_slow();
}

}  // namespace hooktrace
