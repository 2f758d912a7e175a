#include "session.h"

#include <ATen/record_function.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace hooktrace {

thread_local TlsEntry tls_buffers[kTlsEntries];

namespace {
std::atomic<uint64_t> next_session_id{1};
}  // namespace

namespace {
// Capacity is rounded up to whole chunks; a capacity below one chunk shrinks the
// chunk instead, so small capacities are exact.
uint32_t chunk_size(uint64_t capacity_events, uint32_t chunk_events) {
  if (chunk_events == 0) throw std::invalid_argument("chunk_events must be > 0");
  if (capacity_events == 0) throw std::invalid_argument("capacity must be > 0");
  return static_cast<uint32_t>(std::min<uint64_t>(chunk_events, capacity_events));
}

uint64_t chunks_for(uint64_t capacity_events, uint32_t chunk_events) {
  return capacity_events / chunk_events + (capacity_events % chunk_events != 0);
}
}  // namespace

Session::Session(uint64_t capacity_events, Policy policy, uint32_t chunk_events)
    : id_(next_session_id.fetch_add(1)),
      policy_(policy),
      chunk_events_(chunk_size(capacity_events, chunk_events)),
      capacity_chunks_(chunks_for(capacity_events, chunk_events_)),
      // A ring recycles a whole chunk at a time: one spare chunk keeps at least
      // `capacity_chunks_` full chunks (>= capacity events) after each recycle,
      // instead of a one-chunk ring emptying itself at every wrap.
      max_chunks_(static_cast<uint32_t>(std::min<uint64_t>(
          UINT32_MAX, capacity_chunks_ + (policy == Policy::kRing ? 1 : 0)))) {
  if (capacity_chunks_ + 1 > UINT32_MAX)
    throw std::invalid_argument("capacity too large: " + std::to_string(capacity_events) +
                                " events");
}

Session::~Session() {
  if (cpu_counting_) uninstall_cpu_memory();
}

void Session::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if ((memory_ & kMemoryCpu) && !cpu_counting_) {
    install_cpu_memory();  // throws before anything is recorded
    cpu_counting_ = true;
  }
  clock_capture_ = std::make_shared<ClockCapture>();
  active_.store(true, std::memory_order_release);
}

void Session::set_memory(bool cpu, int cuda_device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active()) throw std::logic_error("set_memory must be called before start()");
  c10::DeviceAllocator* cuda = nullptr;
  if (cuda_device >= 0) {
    cuda = cuda_device_allocator();
    if (cuda == nullptr)
      throw std::runtime_error("no CUDA allocator is registered (a CPU-only torch build, or torch < 2.9)");
  }
  memory_ = static_cast<uint8_t>((cpu ? kMemoryCpu : 0) | (cuda ? kMemoryCuda : 0));
  cuda_allocator_ = cuda;
  cuda_device_ = cuda_device;
}

void Session::record_memory(ThreadBuffer* b, uint64_t t) {
  int64_t current = 0, peak = 0;
  if (memory_ & kMemoryCpu) {
    sample_cpu_memory(&current, &peak);
    write_memory(b, t, kMemCpu, current, peak);
  }
  if (cuda_allocator_ != nullptr) {
    sample_cuda_memory(cuda_allocator_, cuda_device_, &current, &peak);
    write_memory(b, t, kMemCuda, current, peak);
  }
}

void Session::write_memory(ThreadBuffer* b, uint64_t t, uint8_t kind, int64_t current,
                           int64_t peak) {
  const auto p = static_cast<uint64_t>(peak);  // (a drop is counted by store)
  store(b, kind, 0, static_cast<uint64_t>(current), static_cast<uint32_t>(p),
        static_cast<uint32_t>(p >> 32), t);
}

void Session::stop() {
  active_.store(false, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mutex_);
  if (cpu_counting_) {
    uninstall_cpu_memory();
    cpu_counting_ = false;
  }
  if (clock_capture_) {
    clock_ = clock_capture_->current();
    clock_capture_.reset();
  }
}

ClockConversion Session::clock() {
  std::shared_ptr<ClockCapture> capture;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!clock_capture_) return clock_;
    capture = clock_capture_;
  }
  // While recording, measured now: a snapshot's conversion is exact up to now.
  return capture->current();
}

ThreadBuffer* Session::buffer_slow() {
  // Another cache entry may hold this session: move it to the front.
  for (int i = 1; i < kTlsEntries; ++i) {
    if (tls_buffers[i].session_id == id_) {
      std::swap(tls_buffers[0], tls_buffers[i]);
      return tls_buffers[0].buffer;
    }
  }
  const uint32_t tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  ThreadBuffer* found = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& b : buffers_) {
      if (b->tid == tid) {
        found = b.get();
        break;
      }
    }
    if (!found) {
      buffers_.push_back(std::make_unique<ThreadBuffer>());
      found = buffers_.back().get();
      found->tid = tid;
      found->rf_tid = static_cast<uint32_t>(at::RecordFunction::currentThreadId());
    }
  }
  // Evict the last entry; shift the others down so the newest is first.
  for (int i = kTlsEntries - 1; i > 0; --i) tls_buffers[i] = tls_buffers[i - 1];
  tls_buffers[0] = TlsEntry{id_, found};
  return found;
}

bool Session::refill(ThreadBuffer* b) {
  if (wakeup_) {
    if (b->starved.load(std::memory_order_relaxed)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return refill_streaming(b);
  }
  if (full_.load(std::memory_order_relaxed) &&
      (policy_ == Policy::kDrop || b->chunks.empty()))
    return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (chunks_allocated_ < max_chunks_) {
    ++chunks_allocated_;
    b->chunks.push_back(std::make_unique<Chunk>(chunk_events_));
    b->chunk = b->chunks.back().get();
    b->pos = 0;
    b->limit = chunk_events_;
    return true;
  }
  full_.store(true, std::memory_order_relaxed);
  if (policy_ == Policy::kDrop || b->chunks.empty()) return false;
  // Ring: recycle this thread's oldest chunk; it becomes the newest.
  Chunk* oldest = b->chunks[b->head].get();
  b->overwritten.store(b->overwritten.load(std::memory_order_relaxed) +
                           oldest->count.load(std::memory_order_relaxed),
                       std::memory_order_relaxed);
  oldest->count.store(0, std::memory_order_release);
  b->head = (b->head + 1) % b->chunks.size();
  b->chunk = oldest;
  b->pos = 0;
  b->limit = chunk_events_;
  return true;
}

void Session::enable_streaming(std::shared_ptr<Wakeup> wakeup) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (policy_ == Policy::kRing)
    throw std::invalid_argument(
        "streaming cannot use the ring policy: a ring recycles chunks the writer may be reading");
  if (active() || !buffers_.empty())
    throw std::logic_error("enable_streaming() must come before the session starts");
  wakeup_ = std::move(wakeup);
}

bool Session::refill_streaming(ThreadBuffer* b) {
  // The current chunk, once the consumer has taken all of it, is reused in
  // place: otherwise a thread whose chunk is the whole capacity could never
  // move on (its current chunk is never freed).
  if (b->chunk && b->chunks.size() == 1 && b->read_pos == b->limit) {
    b->chunk->count.store(0, std::memory_order_relaxed);  // readers take mutex_ first
    b->read_pos = 0;
    b->pos = 0;
    return true;
  }
  std::unique_ptr<Chunk> c;
  if (!free_chunks_.empty()) {
    c = std::move(free_chunks_.back());
    free_chunks_.pop_back();
  } else if (chunks_allocated_ < max_chunks_) {
    ++chunks_allocated_;
    c = std::make_unique<Chunk>(chunk_events_);
  } else {
    // The writer is behind: drop (counted by the caller) until end_collect()
    // consumes something and clears `starved`, which keeps drops off the mutex.
    b->starved.store(true, std::memory_order_relaxed);
    wakeup_->notify();
    return false;
  }
  b->chunks.push_back(std::move(c));
  b->chunk = b->chunks.back().get();
  b->pos = 0;
  b->limit = chunk_events_;
  // Half the capacity in flight: wake the writer now rather than at its next
  // period. Once per chunk at most, and a notify without a waiter is no syscall.
  if (2 * (chunks_allocated_ - free_chunks_.size()) >= max_chunks_) wakeup_->notify();
  return true;
}

void Session::begin_collect(std::vector<Segment>* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < buffers_.size(); ++i) {
    ThreadBuffer* b = buffers_[i].get();
    b->taken_chunks = 0;
    b->taken_end = 0;
    b->taken_events = 0;
    uint64_t first = b->consumed;
    for (size_t k = 0; k < b->chunks.size(); ++k) {
      Chunk* c = b->chunks[k].get();
      const uint32_t from = k == 0 ? b->read_pos : 0;
      const uint32_t count = c->count.load(std::memory_order_acquire);
      if (count <= from) continue;  // only chunk 0 (consumed) or a fresh last one
      out->push_back(Segment{static_cast<uint32_t>(i), b->tid, first, c->events.get() + from,
                             count - from});
      first += count - from;
      b->taken_events += count - from;
      b->taken_chunks = static_cast<uint32_t>(k + 1);
      b->taken_end = count;
    }
  }
}

void Session::drain(std::vector<Event>* out) {
  std::vector<Segment> segments;
  begin_collect(&segments);
  size_t total = 0;
  for (const Segment& seg : segments) total += seg.count;
  out->clear();
  out->reserve(total);
  for (const Segment& seg : segments) out->insert(out->end(), seg.events, seg.events + seg.count);
  end_collect();
}

void Session::end_collect() {
  std::lock_guard<std::mutex> lock(mutex_);
  bool consumed_any = false;
  for (auto& bp : buffers_) {
    ThreadBuffer* b = bp.get();
    if (b->taken_chunks == 0) continue;
    consumed_any = true;
    b->consumed += b->taken_events;
    // Chunks before the last one read are full (a thread moves on only from a
    // full chunk) and now consumed; the last one is consumed up to taken_end.
    size_t drop = b->taken_chunks - 1;
    b->read_pos = b->taken_end;
    if (b->read_pos == chunk_events_ && b->chunks[drop].get() != b->chunk) {
      ++drop;
      b->read_pos = 0;
    }
    for (size_t k = 0; k < drop; ++k) {
      b->chunks[k]->count.store(0, std::memory_order_relaxed);
      free_chunks_.push_back(std::move(b->chunks[k]));
    }
    b->chunks.erase(b->chunks.begin(), b->chunks.begin() + drop);
    b->taken_chunks = 0;
    b->taken_events = 0;
  }
  // Any consumed event may make a chunk reusable (freed, or reusable in place).
  if (consumed_any)
    for (auto& b : buffers_) b->starved.store(false, std::memory_order_relaxed);
}

SessionStats Session::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  SessionStats s;
  s.threads = buffers_.size();
  s.chunks = chunks_allocated_;
  s.free_chunks = free_chunks_.size();
  for (auto& b : buffers_) {
    s.dropped += b->dropped.load(std::memory_order_relaxed);
    s.overwritten += b->overwritten.load(std::memory_order_relaxed);
    for (auto& c : b->chunks) s.events += c->count.load(std::memory_order_acquire);
  }
  return s;
}

uint64_t Session::copy_events(Event* out, uint64_t max_events) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t n = 0;
  for (auto& b : buffers_) {
    const size_t k = b->chunks.size();
    for (size_t i = 0; i < k; ++i) {
      Chunk* c = b->chunks[(b->head + i) % k].get();
      const uint64_t count = c->count.load(std::memory_order_acquire);
      const uint64_t take = std::min<uint64_t>(count, max_events - n);
      std::memcpy(out + n, c->events.get(), take * sizeof(Event));
      n += take;
      if (n == max_events) return n;
    }
  }
  return n;
}

}  // namespace hooktrace
