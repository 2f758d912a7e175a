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

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <utility>
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

// Whether a stream is being captured into a graph, where this torch's guard interface
// can tell (DeviceGuardImplInterface::isStreamCapturing; torch 2.11 lacks it: then
// false, and hooktrace's capture wrapper and the counted failures remain). C++17: the
// extension builds with it against older torch.
template <typename G, typename = void>
struct HasCapturing : std::false_type {};
template <typename G>
struct HasCapturing<G, std::void_t<decltype(std::declval<const G&>().isStreamCapturing(
                           std::declval<const c10::Stream&>()))>> : std::true_type {};

template <typename G>
bool stream_capturing(const G* impl, const c10::Stream& stream) {
  if constexpr (HasCapturing<G>::value) {
    return impl->isStreamCapturing(stream);
  } else {
    return false;
  }
}

constexpr int kMaxDevices = 64;

// --- the timer backends (the seam) ------------------------------------------------

// Slot k of the ring: one timing event per device that used it. Times are host Unix
// ns: a device's reference event has a known host time, and an event's time is the
// reference's plus the device time elapsed between them.
class TimerBackend {
 public:
  virtual ~TimerBackend() = default;
  virtual const char* name() const = 0;
  // Hot path: records slot k's event on the current stream of the current device.
  // Returns 1 when recorded, 0 when it failed, -1 when that stream is being captured.
  virtual int record(uint64_t k, int16_t* device, int64_t* stream) noexcept = 0;
  virtual bool done(uint64_t k, int16_t device) = 0;  // completed (no wait); may throw
  virtual void wait(uint64_t k, int16_t device) = 0;  // may throw
  virtual int64_t time_ns(uint64_t k, int16_t device) = 0;  // may throw
  // k's event (resolved: its time t) is the device's reference from now on.
  virtual void make_reference(uint64_t k, int16_t device, int64_t t) = 0;
  // Aligns a device's clock: a new reference bracketed by host readings. Without
  // `wait`: on an idle stream only (a probe seen complete microseconds after it was
  // recorded). With `wait`: the device's one wait of the trace (false once it is
  // spent): a probe waited for, whose bracket [recorded, wait returned] is the
  // alignment (an estimate), then an idle probe to tighten it. Returns whether it
  // aligned; *correction_ns: the new host time less the one the old reference gave
  // (0 for a first alignment).
  virtual bool realign(int16_t device, bool wait, int64_t* correction_ns) { return false; }
  // Aligns a device's clock without a wait, on a stream that never idles: a probe
  // recorded now, seen complete by a later call: [recorded (or last seen not done),
  // seen done]. Returns whether it aligned.
  virtual bool align_passive(int16_t device) { return false; }
  // bit d: device d has a pool not aligned yet (its marks wait for an alignment)
  virtual uint64_t unaligned() const { return 0; }
  // The bound of the alignment of every time resolved so far (worst device): the
  // bracket of the alignment each time descends from, plus the drift allowed since.
  virtual int64_t align_error_ns() const = 0;
  virtual uint64_t align_waits() const { return 0; }      // waits spent aligning
  virtual uint64_t align_estimates() const { return 0; }  // alignments no idle stream gave
  virtual uint32_t devices() const = 0;  // bit d: device d has a pool
};

// Drift the bound allows between alignments: the device clock against the host's,
// measured -3 to +11 ppm on an H200 over 2-4 minute runs (issue #36); twice the worst.
constexpr int64_t kDriftPpm = 22;
// The resolution of an elapsed time between two events (cudaEventElapsedTime: "around
// 0.5 microseconds"), added to every alignment's bound.
constexpr int64_t kElapsedResolutionNs = 500;

// Events are host timestamps: everything but the device calls, on any machine.
class HostBackend final : public TimerBackend {
 public:
  explicit HostBackend(uint64_t n) : t_(n, 0) {}
  const char* name() const override { return "host"; }
  int record(uint64_t k, int16_t* device, int64_t* stream) noexcept override {
    t_[k] = host_unix_ns();
    *device = 0;
    *stream = 0;
    return 1;
  }
  bool done(uint64_t, int16_t) override { return true; }
  void wait(uint64_t, int16_t) override {}
  int64_t time_ns(uint64_t k, int16_t) override { return t_[k]; }
  void make_reference(uint64_t, int16_t, int64_t) override {}
  int64_t align_error_ns() const override { return 0; }
  uint32_t devices() const override { return 1; }

 private:
  std::vector<int64_t> t_;
};

// Device events through c10's device-generic guard (CUDA, ROCm's HIP-as-CUDA, XPU, a
// PrivateUse1 backend): raw events of DeviceGuardImplInterface, timing on
// (EventFlag::BACKEND_DEFAULT), recorded on the current stream of the current device.
// One pool per device, made at the first mark on that device (issue #36: a trace
// started before torch.cuda.set_device(local_rank) timed nothing on ranks but 0, and
// opened a context on device 0): n + 3 events, slot k's is events[which[k]], plus
// the reference, a spare for the re-alignment probe and one for the passive probe
// (swapped by index: events never move). No sync inside the user's forward or
// backward: a pool is aligned at the first step mark after it was made (an event
// recorded and seen complete between two host readings microseconds apart, on a
// stream found idle or, once per device and trace, after one wait for its queued
// work; a device that does not idle even then keeps the wait's bracket as a bounded
// estimate, issue #50); its marks are resolved once it is aligned. Where no wait is
// allowed (resolutions from the hot path), a passive probe aligns it when seen done.
class DeviceBackend final : public TimerBackend {
 public:
  DeviceBackend(uint64_t n, c10::DeviceType type, std::string name)
      : impl_(type), raw_(c10::impl::getDeviceGuardImpl(type)), type_(type),
        name_(std::move(name)), n_(n) {
    if (impl_.deviceCount() <= 0) throw std::runtime_error("no " + name_ + " device");
    for (auto& p : pools_) p.store(nullptr, std::memory_order_relaxed);
  }
  ~DeviceBackend() override {
    for (auto& slot : pools_) {
      Pool* p = slot.load(std::memory_order_acquire);
      if (!p) continue;
      for (void* e : p->events)
        if (e) impl_.destroyEvent(e, p->index);
      delete p;
    }
  }
  const char* name() const override { return name_.c_str(); }

  int record(uint64_t k, int16_t* device, int64_t* stream) noexcept override {
    try {
      const c10::Device d = impl_.getDevice();
      const int idx = d.index();
      if (C10_UNLIKELY(idx < 0 || idx >= kMaxDevices)) return 0;
      const c10::Stream s = impl_.getStream(d);
      // an event recorded into a graph would be recorded again by every replay
      if (C10_UNLIKELY(stream_capturing(raw_, s))) return -1;
      Pool* p = pools_[idx].load(std::memory_order_acquire);
      if (C10_UNLIKELY(!p) && !broken_[idx].load(std::memory_order_relaxed)) p = make_pool(d, s);
      if (C10_UNLIKELY(!p)) return 0;
      impl_.record(&p->events[p->which[k]], s, d.index(), c10::EventFlag::BACKEND_DEFAULT);
      *device = static_cast<int16_t>(idx);
      *stream = s.id();
      return 1;
    } catch (...) {
      return 0;
    }
  }
  bool done(uint64_t k, int16_t device) override {
    Pool* p = pool(device);
    return impl_.queryEvent(p->events[p->which[k]]);
  }
  void wait(uint64_t k, int16_t device) override {
    Pool* p = pool(device);
    impl_.synchronizeEvent(p->events[p->which[k]]);
  }
  int64_t time_ns(uint64_t k, int16_t device) override {
    Pool* p = pool(device);
    const double ms = impl_.elapsedTime(p->events[p->reference], p->events[p->which[k]],
                                        p->index);
    return p->reference_ns + std::llround(ms * 1e6);
  }
  void make_reference(uint64_t k, int16_t device, int64_t t) override {
    Pool* p = pool(device);
    std::swap(p->reference, p->which[k]);
    p->reference_ns = t;
    // every time resolved so far descends from the last alignment: its bracket plus
    // the drift allowed since (t is the device's latest resolved time)
    const int64_t since = t > p->aligned_at_ns ? t - p->aligned_at_ns : p->aligned_at_ns - t;
    p->worst_ns = std::max(p->worst_ns, p->error_ns + since / 1'000'000 * kDriftPpm +
                                            since % 1'000'000 * kDriftPpm / 1'000'000);
  }
  bool realign(int16_t device, bool wait, int64_t* correction_ns) override {
    Pool* p = pool(device);
    const c10::Device d(type_, p->index);
    const c10::Stream s = impl_.getStream(d);
    if (stream_capturing(raw_, s)) return false;
    if (!wait) return idle_probe(p, s, correction_ns);
    // The one wait of this device and trace (issue #50: on a device that never idles,
    // every step mark waited 3 times and no mark was ever timed). A probe recorded at
    // host time h0 and waited for until h1 completed inside [h0, h1] (the device
    // cannot run it before it is queued): that bracket is the alignment, an estimate
    // within (h1 - h0) / 2. Most devices are idle after the wait: an idle probe then
    // tightens it to microseconds.
    if (p->waited) return false;
    p->waited = true;
    ++waits_;
    void*& probe = p->events[p->probe];
    const int64_t h0 = host_unix_ns();
    impl_.record(&probe, s, p->index, c10::EventFlag::BACKEND_DEFAULT);
    impl_.synchronizeEvent(probe);
    const int64_t h1 = host_unix_ns();
    std::swap(p->reference, p->probe);
    set_alignment(p, h0, h1, false);
    int64_t ignored = 0;
    if (!idle_probe(p, s, &ignored)) ++estimates_;  // (the stream did not idle even now)
    *correction_ns = 0;
    return true;
  }
  bool align_passive(int16_t device) override {
    Pool* p = pool(device);
    if (!p->passive_pending) {
      const c10::Device d(type_, p->index);
      const c10::Stream s = impl_.getStream(d);
      if (stream_capturing(raw_, s)) return false;
      p->passive_lo_ns = host_unix_ns();
      impl_.record(&p->events[p->passive], s, p->index, c10::EventFlag::BACKEND_DEFAULT);
      p->passive_pending = true;
      return false;
    }
    // not complete when asked: it completes after this reading
    const int64_t before = host_unix_ns();
    if (!impl_.queryEvent(p->events[p->passive])) {
      p->passive_lo_ns = before;
      return false;
    }
    const int64_t after = host_unix_ns();
    std::swap(p->reference, p->passive);
    p->passive_pending = false;
    set_alignment(p, p->passive_lo_ns, after, true);
    return true;
  }
  uint64_t unaligned() const override {
    uint64_t bits = 0;
    for (int i = 0; i < kMaxDevices; ++i) {
      Pool* p = pools_[i].load(std::memory_order_acquire);
      if (p && !p->aligned.load(std::memory_order_acquire)) bits |= 1ull << i;
    }
    return bits;
  }
  int64_t align_error_ns() const override {
    int64_t worst = 0;
    for (const auto& slot : pools_) {
      Pool* p = slot.load(std::memory_order_acquire);
      if (p && p->aligned.load(std::memory_order_acquire))
        worst = std::max(worst, std::max(p->worst_ns, p->error_ns));
    }
    return worst;
  }
  uint64_t align_waits() const override { return waits_; }
  uint64_t align_estimates() const override { return estimates_; }
  uint32_t devices() const override {
    uint32_t bits = 0;
    for (int i = 0; i < 32; ++i)
      if (pools_[i].load(std::memory_order_acquire)) bits |= 1u << i;
    return bits;
  }

  // A re-alignment counts only when its bracket is this narrow.
  static constexpr int64_t kRealignBracketNs = 50'000;

 private:
  struct Pool {
    c10::DeviceIndex index = 0;
    std::vector<void*> events;    // n + 3, created by their first record
    std::vector<uint32_t> which;  // slot k -> events index
    uint32_t reference = 0;
    uint32_t probe = 0;
    uint32_t passive = 0;
    int64_t reference_ns = 0;
    int64_t error_ns = 0;       // the bound of the last alignment
    int64_t aligned_at_ns = 0;  // its host time
    int64_t worst_ns = 0;       // the largest bound a resolved time has had
    bool waited = false;        // the one wait of this device is spent
    bool passive_pending = false;
    int64_t passive_lo_ns = 0;  // the passive probe completes after this
    std::atomic<bool> aligned{false};
  };

  // The reference (just swapped in) completed inside [lo, hi] on the host clock: its
  // host time is the middle, within half the bracket and the resolution of an elapsed
  // time (the times resolved against it carry that bound, make_reference).
  void set_alignment(Pool* p, int64_t lo, int64_t hi, bool estimate) {
    p->reference_ns = lo + (hi - lo) / 2;
    p->error_ns = (hi - lo + 1) / 2 + kElapsedResolutionNs;
    p->aligned_at_ns = p->reference_ns;
    estimates_ += estimate;
    p->aligned.store(true, std::memory_order_release);
  }

  // A probe on an idle stream: seen complete within kRealignBracketNs of its record,
  // a few queries, never a wait.
  bool idle_probe(Pool* p, const c10::Stream& s, int64_t* correction_ns) {
    void*& probe = p->events[p->probe];
    const int64_t before = host_unix_ns();
    impl_.record(&probe, s, p->index, c10::EventFlag::BACKEND_DEFAULT);
    bool ok = false;
    int64_t after = before;
    for (int i = 0; i < 4 && !ok; ++i) {
      ok = impl_.queryEvent(probe);
      after = host_unix_ns();
    }
    if (!ok || after - before > kRealignBracketNs) return false;
    const int64_t host = before + (after - before) / 2;
    *correction_ns = 0;
    if (p->aligned.load(std::memory_order_relaxed)) {
      const double ms = impl_.elapsedTime(p->events[p->reference], probe, p->index);
      *correction_ns = host - (p->reference_ns + std::llround(ms * 1e6));
    }
    std::swap(p->reference, p->probe);
    set_alignment(p, before, after, false);
    return true;
  }

  Pool* pool(int16_t device) {
    Pool* p = (device >= 0 && device < kMaxDevices) ? pools_[device].load(std::memory_order_acquire)
                                                    : nullptr;
    if (!p) throw std::runtime_error("no event pool on this device");
    return p;
  }

  // The rare path: the first mark on a device. Every event is created now (recorded
  // once on the stream: the hot path then never creates one); no sync. Null when it
  // failed (the mark goes untimed and is counted; the device is not tried again).
  Pool* make_pool(const c10::Device& d, const c10::Stream& s) {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    const int idx = d.index();
    if (Pool* p = pools_[idx].load(std::memory_order_acquire)) return p;
    if (broken_[idx].load(std::memory_order_relaxed)) return nullptr;
    auto p = std::make_unique<Pool>();
    p->index = d.index();
    p->events.assign(n_ + 3, nullptr);
    p->which.resize(n_);
    for (uint64_t i = 0; i < n_; ++i) p->which[i] = static_cast<uint32_t>(i);
    p->reference = static_cast<uint32_t>(n_);
    p->probe = static_cast<uint32_t>(n_ + 1);
    p->passive = static_cast<uint32_t>(n_ + 2);
    try {
      for (auto& e : p->events) impl_.record(&e, s, d.index(), c10::EventFlag::BACKEND_DEFAULT);
    } catch (...) {
      for (void* e : p->events)
        if (e) impl_.destroyEvent(e, d.index());
      broken_[idx].store(true, std::memory_order_relaxed);
      return nullptr;
    }
    Pool* raw = p.release();
    pools_[idx].store(raw, std::memory_order_release);
    return raw;
  }

  c10::impl::VirtualGuardImpl impl_;
  const c10::impl::DeviceGuardImplInterface* raw_;  // (isStreamCapturing, where it has it)
  const c10::DeviceType type_;
  const std::string name_;
  const uint64_t n_;
  std::mutex pools_mutex_;
  std::array<std::atomic<Pool*>, kMaxDevices> pools_;
  std::array<std::atomic<bool>, kMaxDevices> broken_{};  // its pool could not be made
  uint64_t waits_ = 0;      // (the timer's resolve_mutex_, as everything aligning)
  uint64_t estimates_ = 0;  // (likewise)
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
  // which call of its module owns the sequence number: a module called again (by
  // itself, or twice in a row) has its calls' backward nodes back to back, and each
  // call's backward gets its own mark (issue #35: one stretch took all four calls'
  // nodes of a module three deep in itself)
  std::unique_ptr<uint32_t[]> call{new uint32_t[kRing]};
  uint64_t filled = 0;  // owner[] holds sequence numbers [filled - kRing, filled)
  bool any = false;
  uint32_t stack[kDepth];
  uint32_t stack_call[kDepth];
  uint32_t depth = 0;
  uint32_t calls = 0;   // module calls entered on this thread (wraps)
  // backward
  uint64_t task = UINT64_MAX;
  uint32_t bw_slot = kGpuNoModule;
  uint32_t bw_call = 0;
  bool bw_open = false;
  bool bw_queued = false;
};

enum SlotState : uint8_t { kFree = 0, kReady = 1, kFailed = 2 };

}  // namespace

class GpuTimer {
 public:
  GpuTimer(std::unique_ptr<TimerBackend> backend, uint64_t n)
      : backend_(std::move(backend)), n_(n), state_(new std::atomic<uint8_t>[n]),
        device_(new int16_t[n]), stream_(new int64_t[n]) {
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
        // full: with no step marks coming (inference), free what the device has done
        if ((dropped_.fetch_add(1, std::memory_order_relaxed) & 63) == 0) maybe_resolve(s);
        return;
      }
    } while (!next_.compare_exchange_weak(i, i + 1, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    const uint64_t k = i % n_;
    int16_t device = 0;
    int64_t stream = 0;
    const int r = backend_->record(k, &device, &stream);
    if (C10_UNLIKELY(r != 1)) {
      (r < 0 ? skipped_capturing_ : dropped_).fetch_add(1, std::memory_order_relaxed);
      state_[k].store(kFailed, std::memory_order_release);
      return;
    }
    device_[k] = device;
    stream_[k] = stream;
    s->record_gpu(kGpuMark, slot, flags, static_cast<uint64_t>(stream), static_cast<uint32_t>(i));
    state_[k].store(kReady, std::memory_order_release);
    // No step marks (inference, a loop without an optimizer): every quarter of the
    // pool, resolve what the device has done if the pool is half full (issue #36: it
    // filled after 16,384 marks and timed nothing more).
    if (C10_UNLIKELY((i & check_mask_) == 0) && i - resolved_.load() >= n_ / 2) maybe_resolve(s);
  }

  // From the hot path, rarely: a resolution without a wait, unless one runs already.
  void maybe_resolve(Session* s) {
    std::unique_lock<std::mutex> lock(resolve_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    opportunistic_.fetch_add(1, std::memory_order_relaxed);
    resolve_locked(s, false, false);
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

  // A step mark or the end (not the hot path): a device not aligned yet is aligned
  // now, with one wait if its stream is busy (once per device and trace).
  uint64_t resolve(Session* s, bool wait) {
    std::lock_guard<std::mutex> lock(resolve_mutex_);
    return resolve_locked(s, wait, true);
  }

  // Resolution (resolve_mutex_ held). Stream order: when a stream's last pending event
  // has completed, all its earlier ones have, so one query per stream (issue #36: 4
  // driver calls per event before); an event whose query or elapsed time fails (an
  // event recorded inside a graph capture hooktrace did not see, a device error) is
  // counted, its slot freed, and never raised into the user's step.
  uint64_t resolve_locked(Session* s, bool wait, bool align_wait) {
    align_devices(wait || align_wait);
    const uint64_t unaligned = backend_->unaligned();
    const uint64_t end = next_.load(std::memory_order_acquire);
    const uint64_t first = resolved_.load(std::memory_order_relaxed);
    Streams streams;
    const uint64_t limit = stream_lasts(first, end, &streams);
    uint64_t i = first, count = 0;
    uint64_t last_k[kMaxDevices];
    int64_t last_t[kMaxDevices];
    uint64_t devices_seen = 0;  // bit d (d < 64): last_k[d] set
    for (; i < limit; ++i) {
      const uint64_t k = i % n_;
      if (state_[k].load(std::memory_order_acquire) == kReady) {
        int64_t t = 0;
        const Outcome o = time_of(i, wait, unaligned, &streams, &t);
        if (o == Outcome::kLater) break;
        if (o == Outcome::kFailed) {
          failed_.fetch_add(1, std::memory_order_relaxed);
        } else {
          const int16_t dev = device_[k];
          s->record_gpu(kGpuTime, static_cast<uint32_t>(i), 0, static_cast<uint64_t>(t),
                        static_cast<uint32_t>(static_cast<uint16_t>(dev)));
          ++count;
          if (dev >= 0 && dev < kMaxDevices) {
            last_k[dev] = k;
            last_t[dev] = t;
            devices_seen |= 1ull << dev;
          }
        }
      }
      state_[k].store(kFree, std::memory_order_relaxed);
    }
    // the last resolved event of each device is its reference from now on: the float
    // milliseconds of an elapsed time then span less than a step or two
    for (int d = 0; d < kMaxDevices; ++d)
      if (devices_seen >> d & 1) backend_->make_reference(last_k[d], static_cast<int16_t>(d), last_t[d]);
    resolved_.store(i, std::memory_order_release);
    resolved_count_ += count;
    // every mark resolved: where a device's stream is idle now, re-align its clock
    // (drift, issue #36: ~1 ppm measured on an H200), bracketed, without a wait
    if (i == end && count) realign_idle(devices_seen);
    return count;
  }

 private:
  // Devices whose pools are not aligned yet: now if their streams are idle, else with
  // the device's one wait where `may_wait` (a step mark, the end: tight if the stream
  // idles after it, else the wait's bracket), else by a passive probe seen done since
  // an earlier resolution; else their marks wait for later.
  void align_devices(bool may_wait) {
    const uint64_t unaligned = backend_->unaligned();
    for (int d = 0; unaligned && d < kMaxDevices; ++d) {
      if (!(unaligned >> d & 1)) continue;
      const auto dev = static_cast<int16_t>(d);
      int64_t correction = 0;
      try {
        if (backend_->realign(dev, false, &correction)) continue;
        if (may_wait && backend_->realign(dev, true, &correction)) continue;
        backend_->align_passive(dev);
      } catch (...) {
      }
    }
  }

  // A stream's last pending event in a resolution, and whether it is done.
  struct StreamLast {
    int16_t device;
    int64_t stream;
    uint64_t last;
    bool done;
    bool wait_failed;  // (its last event cannot be waited for: each one is, then)
  };
  struct Streams {
    static constexpr int kMax = 16;  // (more streams: queried event by event)
    StreamLast at[kMax];
    int n = 0;
    StreamLast* find(int16_t device, int64_t stream) {
      for (int j = 0; j < n; ++j)
        if (at[j].device == device && at[j].stream == stream) return &at[j];
      return nullptr;
    }
  };

  // The marks [first, limit) recorded so far (limit: the first taken, not recorded
  // yet, or `end`), returned; each stream's last of them queried once into `streams`.
  uint64_t stream_lasts(uint64_t first, uint64_t end, Streams* streams) {
    uint64_t limit = first;
    for (; limit < end; ++limit) {
      const uint64_t k = limit % n_;
      const uint8_t st = state_[k].load(std::memory_order_acquire);
      if (st == kFree) break;  // taken, not recorded yet
      if (st != kReady) continue;
      StreamLast* last = streams->find(device_[k], stream_[k]);
      if (last == nullptr) {
        if (streams->n == Streams::kMax) continue;
        last = &(streams->at[streams->n++] = StreamLast{device_[k], stream_[k], limit, false, false});
      }
      last->last = limit;
    }
    for (int j = 0; j < streams->n; ++j) {
      StreamLast& last = streams->at[j];
      try {
        last.done = backend_->done(last.last % n_, last.device);
        ++queries_;
      } catch (...) {
        last.done = false;  // (asked again event by event below)
      }
    }
    return limit;
  }

  enum class Outcome { kTimed, kLater, kFailed };
  // The device time of ready mark i into *t: kLater when it is not done (or its device
  // not aligned) and the resolution may not `wait`, kFailed when it cannot be read.
  Outcome time_of(uint64_t i, bool wait, uint64_t unaligned, Streams* streams, int64_t* t) {
    const uint64_t k = i % n_;
    const int16_t dev = device_[k];
    if (C10_UNLIKELY(dev >= 0 && dev < kMaxDevices && (unaligned >> dev & 1))) {
      // (its time needs the device's alignment: later; waiting, none came)
      return wait ? Outcome::kFailed : Outcome::kLater;
    }
    StreamLast* last = streams->find(dev, stream_[k]);
    bool done = last != nullptr && last->done && i <= last->last;
    try {
      if (!done) {
        done = backend_->done(k, dev);
        ++queries_;
      }
      if (!done) {
        if (!wait) return Outcome::kLater;
        // one wait per stream: for its last pending event (stream order: then
        // every earlier one is done too)
        bool waited = false;
        if (last != nullptr && i <= last->last && !last->wait_failed) {
          try {
            backend_->wait(last->last % n_, dev);
            last->done = waited = true;
          } catch (...) {  // (e.g. recorded into a capture: the others may be fine)
            last->wait_failed = true;
          }
        }
        if (!waited) backend_->wait(k, dev);
      }
      *t = backend_->time_ns(k, dev);
    } catch (...) {
      return Outcome::kFailed;
    }
    return Outcome::kTimed;
  }

  // Re-aligns the clock of each device in `devices` whose stream is idle now.
  void realign_idle(uint64_t devices) {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (!(devices >> d & 1)) continue;
      int64_t correction = 0;
      try {
        if (backend_->realign(static_cast<int16_t>(d), false, &correction)) {
          ++realigned_;
          max_correction_ns_ = std::max(max_correction_ns_, std::abs(correction));
        }
      } catch (...) {
      }
    }
  }

 public:
  GpuStats stats() {
    GpuStats st;
    st.timer = backend_->name();
    st.dropped = dropped_.load(std::memory_order_relaxed);
    st.skipped_capturing = skipped_capturing_.load(std::memory_order_relaxed);
    st.failed = failed_.load(std::memory_order_relaxed);
    st.align_error_ns = backend_->align_error_ns();
    st.pending = next_.load() - resolved_.load();
    st.resolved = resolved_count_;
    st.pool = n_;
    st.devices = backend_->devices();
    st.queries = queries_;
    st.realigned = realigned_;
    st.max_realign_correction_ns = max_correction_ns_;
    st.opportunistic = opportunistic_.load(std::memory_order_relaxed);
    st.align_waits = backend_->align_waits();
    st.align_estimated = backend_->align_estimates();
    return st;
  }

 private:
  // a power of two minus one, about a quarter of the pool: how often a mark checks
  // whether the pool needs a resolution from the hot path
  static uint64_t quarter_mask(uint64_t n) {
    uint64_t p = 1;
    while (p * 2 <= n / 4) p *= 2;
    return p - 1;
  }

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
  const uint64_t check_mask_ = quarter_mask(n_);
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<int16_t[]> device_;
  std::unique_ptr<int64_t[]> stream_;
  std::atomic<uint64_t> next_{0};      // marks taken
  std::atomic<uint64_t> resolved_{0};  // marks resolved (their slots free)
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> skipped_capturing_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> opportunistic_{0};
  std::mutex resolve_mutex_;
  uint64_t resolved_count_ = 0;  // (resolve_mutex_)
  uint64_t queries_ = 0;         // (resolve_mutex_)
  uint64_t realigned_ = 0;       // (resolve_mutex_)
  int64_t max_correction_ns_ = 0;  // (resolve_mutex_)
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
  const uint32_t call = d ? t->stack_call[d - 1] : 0;
  if (!t->any) {
    t->any = true;
    t->filled = upto;
  }
  if (upto - t->filled > kRing) t->filled = upto - kRing;
  for (uint64_t q = t->filled; q < upto; ++q) {
    t->owner[q & (kRing - 1)] = owner;
    t->call[q & (kRing - 1)] = call;
  }
  if (upto > t->filled) t->filled = upto;
}

uint32_t owner_of(ThreadState* t, uint64_t seq, uint32_t* call) {
  if (!t || !t->any || seq >= t->filled || t->filled - seq > kRing) return kUnknown;
  *call = t->call[seq & (kRing - 1)];
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
  } else {
    // a device type as torch names it: "cuda", "xpu", "privateuseone" (or the name a
    // PrivateUse1 backend registered; "privateuse1" is taken too)
    c10::DeviceType type;
    try {
      type = c10::Device(timer == "privateuse1" ? std::string("privateuseone") : timer).type();
    } catch (...) {
      throw std::invalid_argument("the device timer must be 'host' or a device type torch "
                                  "knows (cuda, xpu, privateuseone), got '" + timer + "'");
    }
    if (!c10::impl::hasDeviceGuardImpl(type))
      throw std::runtime_error("no " + timer + " device (torch was built without it)");
    // (no device is touched here: each device's pool is made at its first mark)
    backend = std::make_unique<DeviceBackend>(pool_events, type, timer);
  }
  s->gpu_timer = std::make_shared<GpuTimer>(std::move(backend), pool_events);
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
    if (t->depth < kDepth) {
      t->stack[t->depth] = slot;
      t->stack_call[t->depth] = ++t->calls;
    }
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
  uint32_t call = 0;
  const uint32_t owner = owner_of(g->forward_thread(fwd_tid), seq, &call);
  if (owner == kUnknown) return;  // (AccumulateGrad, nodes of an untimed forward)
  ThreadState* t = g->thread();
  if (!t) return;
  const uint64_t task = static_cast<uint64_t>(torch::autograd::get_current_graph_task_id());
  if (task != t->task) {
    t->task = task;
    t->bw_open = false;
    t->bw_queued = false;
    t->bw_slot = kGpuNoModule;
    t->bw_call = 0;
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
  if (t->bw_open && t->bw_slot == slot && t->bw_call == call) return;
  g->mark(s, slot, kGpuBackward);
  t->bw_open = true;
  t->bw_slot = slot;
  t->bw_call = call;
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
