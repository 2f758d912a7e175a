#include "backward.h"

#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace torch::autograd {
// graph_task.h (not included: it pulls in most of ATen). Returns the running
// GraphTask's id, unique per backward pass, or -1 outside the engine.
int get_current_graph_task_id();
}  // namespace torch::autograd

namespace hooktrace {
namespace {

std::array<std::atomic<Session*>, kMaxBackwardSessions> g_slots{};
// Callbacks currently reading g_slots; removal waits for it to reach zero.
std::atomic<uint32_t> g_inflight{0};
std::atomic<bool> g_compiling{false};

std::mutex g_mutex;  // guards everything below
std::vector<std::shared_ptr<Session>> g_owned;
at::CallbackHandle g_handle = at::INVALID_CALLBACK_HANDLE;
std::vector<std::string> g_names;

// --- node names: a process-wide string table with a per-thread cache --------

uint64_t fnv1a(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h | 1;  // 0 marks an empty cache entry
}

uint32_t intern_slow(const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < g_names.size(); ++i)
    if (g_names[i] == name) return static_cast<uint32_t>(i);
  g_names.emplace_back(name);
  return static_cast<uint32_t>(g_names.size() - 1);
}

// Open addressing keyed by the 64-bit name hash: a hit costs one hash of the
// name (~20 bytes) and one probe. A 64-bit collision between two node names
// would merge them; with a few hundred names that is ~1e-15 likely.
struct NameCache {
  static constexpr uint32_t kSize = 512;
  uint64_t hash[kSize] = {};
  uint32_t id[kSize] = {};
};
thread_local NameCache tls_names;

uint32_t intern(const char* name) {
  const uint64_t h = fnv1a(name);
  for (uint32_t i = 0; i < NameCache::kSize; ++i) {
    const uint32_t k = (h + i) & (NameCache::kSize - 1);
    if (tls_names.hash[k] == h) return tls_names.id[k];
    if (tls_names.hash[k] == 0) {
      tls_names.hash[k] = h;
      return tls_names.id[k] = intern_slow(name);
    }
  }
  return intern_slow(name);  // cache full: correct, just slower
}

// --- the callback -------------------------------------------------------------

struct InflightGuard {
  InflightGuard() { g_inflight.fetch_add(1, std::memory_order_acq_rel); }
  ~InflightGuard() { g_inflight.fetch_sub(1, std::memory_order_acq_rel); }
};

std::unique_ptr<at::ObserverContext> on_node_start(const at::RecordFunction& fn) {
  if (g_compiling.load(std::memory_order_relaxed)) [[unlikely]] return nullptr;
  InflightGuard guard;
  const uint32_t name = intern(fn.name());
  const uint64_t seq = static_cast<uint64_t>(fn.seqNr());
  const uint32_t fwd = static_cast<uint32_t>(fn.forwardThreadId());
  for (auto& slot : g_slots)
    if (Session* s = slot.load(std::memory_order_acquire)) s->record_node(kNodeBegin, seq, name, fwd);
  return nullptr;
}

void on_node_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (g_compiling.load(std::memory_order_relaxed)) [[unlikely]] return;
  InflightGuard guard;
  const uint32_t task = static_cast<uint32_t>(torch::autograd::get_current_graph_task_id());
  const uint64_t seq = static_cast<uint64_t>(fn.seqNr());
  const uint32_t fwd = static_cast<uint32_t>(fn.forwardThreadId());
  for (auto& slot : g_slots)
    if (Session* s = slot.load(std::memory_order_acquire)) s->record_node(kNodeEnd, seq, task, fwd);
}

}  // namespace

void set_compiling(bool compiling) { g_compiling.store(compiling, std::memory_order_relaxed); }

void add_backward_session(const std::shared_ptr<Session>& s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& slot : g_slots) {
    Session* expected = nullptr;
    if (slot.compare_exchange_strong(expected, s.get())) {
      g_owned.push_back(s);
      if (g_handle == at::INVALID_CALLBACK_HANDLE) {
        g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_node_start, on_node_end)
                                             .scopes({at::RecordScope::BACKWARD_FUNCTION}));
      }
      return;
    }
  }
  throw std::runtime_error("hooktrace: at most 8 traces can record backward at once");
}

void remove_backward_session(const Session* s) {
  std::shared_ptr<Session> release;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    bool any = false;
    for (auto& slot : g_slots) {
      if (slot.load() == s) slot.store(nullptr);
      any = any || slot.load() != nullptr;
    }
    if (!any && g_handle != at::INVALID_CALLBACK_HANDLE) {
      at::removeCallback(g_handle);
      g_handle = at::INVALID_CALLBACK_HANDLE;
    }
    for (auto it = g_owned.begin(); it != g_owned.end(); ++it) {
      if (it->get() == s) {
        release = std::move(*it);
        g_owned.erase(it);
        break;
      }
    }
  }
  // A callback that loaded `s` before the store above may still be writing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (g_inflight.load(std::memory_order_acquire) != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      new std::shared_ptr<Session>(std::move(release));  // never freed, by design
      return;
    }
    std::this_thread::yield();
  }
}

std::vector<std::string> node_names() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_names;
}

std::vector<std::string> node_names_since(size_t first) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (first >= g_names.size()) return {};
  return std::vector<std::string>(g_names.begin() + first, g_names.end());
}

}  // namespace hooktrace
