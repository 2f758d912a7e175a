#include "gpu_time.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "event.h"
#include "session.h"

namespace hooktrace {

namespace {

int64_t host_unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// --- the timer backends (the seam) ------------------------------------------------

class TimerBackend {
 public:
  virtual ~TimerBackend() = default;
  virtual const char* name() const = 0;
  // Aligns the clocks: returns the reference's host time (Unix ns) and its bound.
  virtual int64_t start(int64_t* error_ns) = 0;
  // Hot path: records slot k's event on the current stream; false when it failed.
  virtual bool record(uint64_t k, int16_t* device, int64_t* stream) noexcept = 0;
  virtual bool done(uint64_t k) = 0;  // completed on the device (no wait)
  virtual void wait(uint64_t k) = 0;
  virtual int64_t since_reference_ns(uint64_t k) = 0;  // k's time minus the reference's
  virtual void make_reference(uint64_t k) = 0;         // k's event is the reference now
};

// Events are host timestamps: everything but the device calls, on any machine.
class HostBackend final : public TimerBackend {
 public:
  explicit HostBackend(uint64_t n) : t_(n, 0) {}
  const char* name() const override { return "host"; }
  int64_t start(int64_t* error_ns) override {
    *error_ns = 0;
    return reference_ = host_unix_ns();
  }
  bool record(uint64_t k, int16_t* device, int64_t* stream) noexcept override {
    t_[k] = host_unix_ns();
    *device = 0;
    *stream = 0;
    return true;
  }
  bool done(uint64_t) override { return true; }
  void wait(uint64_t) override {}
  int64_t since_reference_ns(uint64_t k) override { return t_[k] - reference_; }
  void make_reference(uint64_t k) override { reference_ = t_[k]; }

 private:
  std::vector<int64_t> t_;
  int64_t reference_ = 0;
};

// c10::Event with timing on, on the current stream of the current CUDA device. The
// pool holds n + 1 events: slot k uses events_[which_[k]], the reference the spare
// one; make_reference swaps the two indexes (the events themselves never move).
class DeviceBackend final : public TimerBackend {
 public:
  explicit DeviceBackend(uint64_t n) : impl_(c10::DeviceType::CUDA), which_(n) {
    if (impl_.deviceCount() <= 0) throw std::runtime_error("no CUDA device");
    events_.reserve(n + 1);
    for (uint64_t i = 0; i <= n; ++i) {
      events_.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      if (i < n) which_[i] = i;
    }
    reference_ = n;
  }
  const char* name() const override { return "cuda"; }
  int64_t start(int64_t* error_ns) override {
    const c10::Device device = impl_.getDevice();
    const c10::Stream stream = impl_.getStream(device);
    // Create every event now (c10::Event creates its backend event on first
    // record): the hot path then never creates one.
    for (auto& e : events_) e.record(stream);
    stream.synchronize();  // the one sync at the start: the stream is idle now
    const int64_t before = host_unix_ns();
    events_[reference_].record(stream);
    events_[reference_].synchronize();
    const int64_t after = host_unix_ns();
    *error_ns = (after - before + 1) / 2;
    return before + (after - before) / 2;
  }
  bool record(uint64_t k, int16_t* device, int64_t* stream) noexcept override {
    try {
      const c10::Device d = impl_.getDevice();
      const c10::Stream s = impl_.getStream(d);
      events_[which_[k]].record(s);
      *device = d.index();
      *stream = s.id();
      return true;
    } catch (...) {  // (another device than the pool's events: not timed, counted)
      return false;
    }
  }
  bool done(uint64_t k) override { return events_[which_[k]].query(); }
  void wait(uint64_t k) override { events_[which_[k]].synchronize(); }
  int64_t since_reference_ns(uint64_t k) override {
    return std::llround(events_[reference_].elapsedTime(events_[which_[k]]) * 1e6);
  }
  void make_reference(uint64_t k) override { std::swap(reference_, which_[k]); }

 private:
  c10::impl::VirtualGuardImpl impl_;
  std::vector<c10::Event> events_;
  std::vector<uint64_t> which_;
  uint64_t reference_;
};

std::atomic<bool> g_capturing{false};

constexpr uint32_t kRingBits = 16;  // sequence numbers remembered per forward thread
constexpr uint64_t kRing = 1ull << kRingBits;
constexpr uint32_t kDepth = 256;    // module nesting tracked per forward thread
constexpr uint32_t kOutside = 0;    // owner: no module (else slot + 1)
constexpr uint32_t kUnknown = UINT32_MAX;
constexpr int kMaxThreads = 32;

// Per recording thread: the owners of its sequence numbers (forward) and the
// module its backward nodes are in.
struct ThreadState {
  uint64_t rf_tid = 0;
  std::unique_ptr<uint32_t[]> owner{new uint32_t[kRing]};
  uint64_t filled = 0;  // owner[] holds sequence numbers [filled - kRing, filled)
  bool any = false;
  uint32_t stack[kDepth];
  uint32_t depth = 0;
  // backward
  uint64_t task = UINT64_MAX;
  uint32_t bw_slot = kGpuNoModule;
  bool bw_open = false;
  bool bw_queued = false;
};

enum SlotState : uint8_t { kFree = 0, kReady = 1, kFailed = 2 };

}  // namespace

class GpuTimer {
 public:
  GpuTimer(std::unique_ptr<TimerBackend> backend, uint64_t n)
      : backend_(std::move(backend)), n_(n), state_(new std::atomic<uint8_t>[n]),
        device_(new int16_t[n]) {
    for (uint64_t i = 0; i < n; ++i) state_[i].store(kFree, std::memory_order_relaxed);
  }

  // Hot path: one timing event and its kGpuMark.
  inline void mark(Session* s, uint32_t slot, uint8_t flags) {
    if (C10_UNLIKELY(g_capturing.load(std::memory_order_relaxed))) {
      skipped_capturing_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    uint64_t i = next_.load(std::memory_order_relaxed);
    do {
      if (i - resolved_.load(std::memory_order_acquire) >= n_) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    } while (!next_.compare_exchange_weak(i, i + 1, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    const uint64_t k = i % n_;
    int16_t device = 0;
    int64_t stream = 0;
    if (C10_UNLIKELY(!backend_->record(k, &device, &stream))) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      state_[k].store(kFailed, std::memory_order_release);
      return;
    }
    device_[k] = device;
    s->record_gpu(kGpuMark, slot, flags, static_cast<uint64_t>(stream), static_cast<uint32_t>(i));
    state_[k].store(kReady, std::memory_order_release);
  }

  ThreadState* thread() {
    if (C10_LIKELY(tls_.timer == id_)) return tls_.state;
    return thread_slow();
  }

  // The forward thread whose RecordFunction id is `rf_tid` (null: none recorded).
  ThreadState* forward_thread(uint64_t rf_tid) {
    const int n = nthreads_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
      if (threads_[i]->rf_tid == rf_tid) return threads_[i].get();
    return nullptr;
  }

  uint64_t resolve(Session* s, bool wait) {
    std::lock_guard<std::mutex> lock(resolve_mutex_);
    const uint64_t end = next_.load(std::memory_order_acquire);
    uint64_t i = resolved_.load(std::memory_order_relaxed);
    uint64_t count = 0, last = UINT64_MAX;
    int64_t last_t = 0;
    for (; i < end; ++i) {
      const uint64_t k = i % n_;
      const uint8_t st = state_[k].load(std::memory_order_acquire);
      if (st == kFree) break;  // taken, not recorded yet
      if (st == kReady) {
        if (!backend_->done(k)) {
          if (!wait) break;
          backend_->wait(k);
        }
        const int64_t t = reference_ns_ + backend_->since_reference_ns(k);
        s->record_gpu(kGpuTime, static_cast<uint32_t>(i), 0, static_cast<uint64_t>(t),
                      static_cast<uint32_t>(static_cast<uint16_t>(device_[k])));
        ++count;
        last = k;
        last_t = t;
      }
      state_[k].store(kFree, std::memory_order_relaxed);
    }
    if (last != UINT64_MAX) {
      backend_->make_reference(last);
      reference_ns_ = last_t;
    }
    resolved_.store(i, std::memory_order_release);
    resolved_count_ += count;
    return count;
  }

  void start() { reference_ns_ = backend_->start(&align_error_ns_); }

  GpuStats stats() {
    GpuStats st;
    st.timer = backend_->name();
    st.dropped = dropped_.load(std::memory_order_relaxed);
    st.skipped_capturing = skipped_capturing_.load(std::memory_order_relaxed);
    st.align_error_ns = align_error_ns_;
    st.pending = next_.load() - resolved_.load();
    st.resolved = resolved_count_;
    st.pool = n_;
    return st;
  }

 private:
  struct Tls {
    uint64_t timer = 0;
    ThreadState* state = nullptr;
  };
  static thread_local Tls tls_;

  ThreadState* thread_slow() {
    std::lock_guard<std::mutex> lock(threads_mutex_);  // rare: a thread's first call
    const uint64_t rf = at::RecordFunction::currentThreadId();
    ThreadState* found = nullptr;
    const int n = nthreads_.load(std::memory_order_relaxed);
    for (int i = 0; i < n && !found; ++i)
      if (threads_[i]->rf_tid == rf) found = threads_[i].get();
    if (!found) {
      if (n == kMaxThreads) return nullptr;
      threads_[n] = std::make_unique<ThreadState>();
      threads_[n]->rf_tid = rf;
      found = threads_[n].get();
      nthreads_.store(n + 1, std::memory_order_release);
    }
    tls_.timer = id_;  // (ids are never reused: a stale entry never matches)
    tls_.state = found;
    return found;
  }

  static std::atomic<uint64_t> ids_;
  const uint64_t id_ = ids_.fetch_add(1) + 1;
  std::unique_ptr<TimerBackend> backend_;
  const uint64_t n_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<int16_t[]> device_;
  std::atomic<uint64_t> next_{0};      // marks taken
  std::atomic<uint64_t> resolved_{0};  // marks resolved (their slots free)
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> skipped_capturing_{0};
  std::mutex resolve_mutex_;
  int64_t reference_ns_ = 0;
  int64_t align_error_ns_ = 0;
  uint64_t resolved_count_ = 0;
  std::mutex threads_mutex_;
  std::unique_ptr<ThreadState> threads_[kMaxThreads];
  std::atomic<int> nthreads_{0};
};

thread_local GpuTimer::Tls GpuTimer::tls_;
std::atomic<uint64_t> GpuTimer::ids_{0};

namespace {

// The owner of the sequence numbers since the thread's last module boundary.
inline void fill_owner(ThreadState* t, uint64_t upto) {
  const uint32_t d = t->depth < kDepth ? t->depth : kDepth;
  const uint32_t owner = d ? t->stack[d - 1] + 1 : kOutside;
  if (!t->any) {
    t->any = true;
    t->filled = upto;
  }
  if (upto - t->filled > kRing) t->filled = upto - kRing;
  for (uint64_t q = t->filled; q < upto; ++q) t->owner[q & (kRing - 1)] = owner;
  if (upto > t->filled) t->filled = upto;
}

uint32_t owner_of(ThreadState* t, uint64_t seq) {
  if (!t || !t->any || seq >= t->filled || t->filled - seq > kRing) return kUnknown;
  return t->owner[seq & (kRing - 1)];
}

}  // namespace

void gpu_start(const std::shared_ptr<Session>& s, const std::string& timer, uint64_t pool_events) {
  if (s->gpu_timer) throw std::runtime_error("the session's GPU timer is already set");
  if (pool_events < 2 || pool_events > (1ull << 24))
    throw std::invalid_argument("the GPU event pool must hold 2 to 2**24 events");
  std::unique_ptr<TimerBackend> backend;
  if (timer == "host") {
    backend = std::make_unique<HostBackend>(pool_events);
  } else if (timer == "cuda") {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA))
      throw std::runtime_error("no CUDA device (torch was built without CUDA)");
    backend = std::make_unique<DeviceBackend>(pool_events);
  } else {
    throw std::invalid_argument("timer must be 'cuda' or 'host', got '" + timer + "'");
  }
  auto t = std::make_shared<GpuTimer>(std::move(backend), pool_events);
  t->start();
  s->gpu_timer = std::move(t);
}

uint64_t gpu_resolve(Session* s, bool wait) {
  return s->gpu_timer ? s->gpu_timer->resolve(s, wait) : 0;
}

GpuStats gpu_stats(Session* s) { return s->gpu_timer ? s->gpu_timer->stats() : GpuStats{}; }

void gpu_set_capturing(bool on) { g_capturing.store(on, std::memory_order_relaxed); }

void gpu_enter(Session* s, uint32_t slot) {
  GpuTimer* g = s->gpu_timer.get();
  if (!g || !s->active()) return;
  if (ThreadState* t = g->thread()) {
    fill_owner(t, at::sequence_number::peek());
    if (t->depth < kDepth) t->stack[t->depth] = slot;
    ++t->depth;
  }
  g->mark(s, slot, 0);
}

void gpu_exit(Session* s, uint32_t slot) {
  GpuTimer* g = s->gpu_timer.get();
  if (!g || !s->active()) return;
  g->mark(s, slot, kGpuExit);
  if (ThreadState* t = g->thread()) {
    if (t->depth) {
      // the call's own sequence numbers since its last child: the call's
      if (t->depth <= kDepth) t->stack[t->depth - 1] = slot;
      fill_owner(t, at::sequence_number::peek());
      --t->depth;
    }
  }
}

void gpu_kernel(Session* s, uint32_t site, bool end) {
  GpuTimer* g = s->gpu_timer.get();
  if (!g || !s->active()) return;
  g->mark(s, site, static_cast<uint8_t>(kGpuKernel | (end ? kGpuExit : 0)));
}

void gpu_node(Session* s, uint64_t seq, uint32_t fwd_tid) {
  GpuTimer* g = s->gpu_timer.get();
  if (!g || !s->active()) return;
  const uint32_t owner = owner_of(g->forward_thread(fwd_tid), seq);
  if (owner == kUnknown) return;  // (AccumulateGrad, nodes of an untimed forward)
  ThreadState* t = g->thread();
  if (!t) return;
  const uint64_t task = static_cast<uint64_t>(torch::autograd::get_current_graph_task_id());
  if (task != t->task) {
    t->task = task;
    t->bw_open = false;
    t->bw_queued = false;
    t->bw_slot = kGpuNoModule;
  }
  if (owner == kOutside) {
    if (t->bw_open) {
      g->mark(s, kGpuNoModule, kGpuBackward);
      t->bw_open = false;
      t->bw_slot = kGpuNoModule;
    }
    return;
  }
  const uint32_t slot = owner - 1;
  if (t->bw_open && t->bw_slot == slot) return;
  g->mark(s, slot, kGpuBackward);
  t->bw_open = true;
  t->bw_slot = slot;
  if (!t->bw_queued) {
    t->bw_queued = true;
    // The graph task's end closes its last interval (once per backward pass).
    std::weak_ptr<Session> weak = s->weak_from_this();
    try {
      torch::autograd::Engine::get_default_engine().queue_callback([weak, t, task] {
        std::shared_ptr<Session> live = weak.lock();
        if (!live || !live->gpu() || !live->gpu_timer || t->task != task || !t->bw_open) return;
        live->gpu_timer->mark(live.get(), kGpuNoModule, kGpuBackward);
        t->bw_open = false;
        t->bw_slot = kGpuNoModule;
      });
    } catch (...) {  // (not inside a graph task: the next backward mark closes it)
    }
  }
}

}  // namespace hooktrace
