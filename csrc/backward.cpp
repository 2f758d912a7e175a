#include "backward.h"

#include "gpu_time.h"
#include "session_set.h"

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

SessionSet g_sessions;
std::atomic<bool> g_compiling{false};

std::mutex g_mutex;  // guards everything below
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

std::unique_ptr<at::ObserverContext> on_node_start(const at::RecordFunction& fn) {
  if (g_compiling.load(std::memory_order_relaxed)) [[unlikely]] return nullptr;
  const uint32_t name = intern(fn.name());
  const uint64_t seq = static_cast<uint64_t>(fn.seqNr());
  const uint32_t fwd = static_cast<uint32_t>(fn.forwardThreadId());
  g_sessions.for_each([&](Session* s) {
    s->record_node(kNodeBegin, seq, name, fwd);
    if (C10_UNLIKELY(s->gpu())) gpu_node(s, seq, fwd);  // device time (gpu_time.h)
  });
  return nullptr;
}

void on_node_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (g_compiling.load(std::memory_order_relaxed)) [[unlikely]] return;
  const uint32_t task = static_cast<uint32_t>(torch::autograd::get_current_graph_task_id());
  const uint64_t seq = static_cast<uint64_t>(fn.seqNr());
  const uint32_t fwd = static_cast<uint32_t>(fn.forwardThreadId());
  g_sessions.for_each([&](Session* s) { s->record_node(kNodeEnd, seq, task, fwd); });
}

}  // namespace

void set_compiling(bool compiling) { g_compiling.store(compiling, std::memory_order_relaxed); }

void add_backward_session(const std::shared_ptr<Session>& s) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sessions.add(s, "backward");
  if (g_handle == at::INVALID_CALLBACK_HANDLE) {
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_node_start, on_node_end)
                                         .scopes({at::RecordScope::BACKWARD_FUNCTION}));
  }
}

void remove_backward_session(const Session* s) {
  // Outside g_mutex: remove() waits for callbacks still recording into `s`.
  if (!g_sessions.remove(s)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_handle != at::INVALID_CALLBACK_HANDLE) {
    at::removeCallback(g_handle);
    g_handle = at::INVALID_CALLBACK_HANDLE;
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
