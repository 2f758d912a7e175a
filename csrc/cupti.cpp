#include "cupti.h"

#include <dlfcn.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "cupti_api.h"
#include "event.h"
#include "session.h"
#include "session_set.h"

namespace hooktrace {
namespace {

SessionSet g_sessions;
cupti::Api g_api;
void* g_lib = nullptr;
std::string g_library;
cupti::Subscriber g_subscriber = nullptr;
bool g_running = false;  // GIL held where written

std::atomic<uint64_t> g_launches{0}, g_records{0}, g_dropped{0}, g_refused{0}, g_nodes{0},
    g_other{0};

// Buffers: a bounded pool (a refused request makes CUPTI drop records, which it counts).
std::atomic<uint32_t> g_buffers_out{0};
uint64_t g_buffer_bytes = 4 << 20;
uint32_t g_max_buffers = 16;

// Kernel names, interned on the thread that completes a buffer (never the launcher's).
std::mutex g_names_mutex;
std::unordered_map<std::string, uint32_t> g_name_index;
std::vector<std::string> g_names;
std::vector<std::pair<uint64_t, int64_t>> g_clock_pairs;

template <class T>
T field(const uint8_t* record, size_t offset) {
  T v;
  std::memcpy(&v, record + offset, sizeof(T));
  return v;
}

int64_t unix_ns_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void sample_clock() {
  uint64_t c = 0;
  if (!g_api.timestamp || g_api.timestamp(&c) != cupti::kSuccess) return;
  const int64_t u = unix_ns_now();
  std::lock_guard<std::mutex> lock(g_names_mutex);
  g_clock_pairs.push_back(std::pair<uint64_t, int64_t>{c, u});
}

uint32_t name_index(const char* name) {
  std::string key = name ? name : "";
  std::lock_guard<std::mutex> lock(g_names_mutex);
  auto it = g_name_index.find(key);
  if (it != g_name_index.end()) return it->second;
  const uint32_t i = static_cast<uint32_t>(g_names.size());
  g_names.push_back(key);
  g_name_index.emplace(std::move(key), i);
  return i;
}

uint64_t node_id(void* node) {
  uint64_t id = 0;
  if (node && g_api.graph_node_id && g_api.graph_node_id(node, &id) == cupti::kSuccess) return id;
  return 0;
}

// Runs on the thread that calls the CUDA API (the launching thread): one event per
// session, nothing else.
void callback(void*, uint32_t domain, uint32_t cbid, const void* data) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (domain == cupti::kDomainResource) {
    const bool created = cbid == cupti::kResourceGraphNodeCreated;
    if (!created && cbid != cupti::kResourceGraphNodeCloned) return;
    auto* graph = field<uint8_t*>(bytes, cupti::kResourceDescriptorOffset);
    if (!graph) return;
    const uint64_t id = node_id(field<void*>(graph, cupti::kGraphNodeOffset));
    const uint64_t original = created ? 0 : node_id(field<void*>(graph, cupti::kGraphOriginalNodeOffset));
    g_nodes.fetch_add(1, std::memory_order_relaxed);
    g_sessions.for_each([&](Session* s) {
      s->record_gpu(kCuptiGraphNode, static_cast<uint32_t>(original), created ? 1 : 2, id,
                    static_cast<uint32_t>(original >> 32));
    });
    return;
  }
  if (field<uint32_t>(bytes, cupti::kCallbackSiteOffset) != cupti::kApiEnter) return;
  const uint32_t corr = field<uint32_t>(bytes, cupti::kCallbackCorrelationOffset);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  const uint64_t what = cbid | static_cast<uint64_t>(domain) << 32;
  g_sessions.for_each([&](Session* s) { s->record_gpu(kCuptiLaunch, corr, 0, what, 0); });
}

void buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;
  if (g_buffers_out.fetch_add(1) >= g_max_buffers) {
    g_buffers_out.fetch_sub(1);
    g_refused.fetch_add(1, std::memory_order_relaxed);
    *buffer = nullptr;
    *size = 0;
    return;
  }
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, g_buffer_bytes));
  *size = *buffer ? g_buffer_bytes : 0;
  if (!*buffer) g_buffers_out.fetch_sub(1);
}

void record_activity(const uint8_t* r) {
  const uint32_t kind = field<uint32_t>(r, 0);
  uint8_t what;
  uint64_t start, end, node;
  uint32_t device, stream, corr, name;
  if (kind == cupti::kActivityConcurrentKernel || kind == cupti::kActivityKernel) {
    using F = cupti::KernelFields;
    what = 1;
    start = field<uint64_t>(r, F::start), end = field<uint64_t>(r, F::end);
    device = field<uint32_t>(r, F::device), stream = field<uint32_t>(r, F::stream);
    corr = field<uint32_t>(r, F::correlation), node = field<uint64_t>(r, F::graph_node);
    name = name_index(field<const char*>(r, F::name));
  } else if (kind == cupti::kActivityMemcpy || kind == cupti::kActivityMemset) {
    using F = cupti::CopyFields;
    what = kind == cupti::kActivityMemcpy ? 2 : 3;
    start = field<uint64_t>(r, F::start), end = field<uint64_t>(r, F::end);
    device = field<uint32_t>(r, F::device), stream = field<uint32_t>(r, F::stream);
    corr = field<uint32_t>(r, F::correlation), node = field<uint64_t>(r, F::graph_node);
    name = name_index(what == 2 ? "[memcpy]" : "[memset]");
  } else {
    g_other.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  g_records.fetch_add(1, std::memory_order_relaxed);
  const uint64_t dur = end > start ? end - start : 0;
  const uint32_t dur32 = dur > 0xFFFFFFFFull ? 0xFFFFFFFFu : static_cast<uint32_t>(dur);
  const uint8_t flags = static_cast<uint8_t>(what | (device < 63 ? device : 63) << 2);
  g_sessions.for_each([&](Session* s) {
    s->record_gpu(kCuptiKernel, corr, flags, start, dur32);
    s->record_gpu(kCuptiKernelMore, stream, 0, node, name);
  });
}

// Runs on CUPTI's worker thread, or in cuptiActivityFlushAll's caller.
void buffer_completed(void* context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  if (buffer) {
    void* record = nullptr;
    while (g_api.next_record(buffer, valid, &record) == cupti::kSuccess)
      record_activity(static_cast<const uint8_t*>(record));
    std::free(buffer);
    g_buffers_out.fetch_sub(1);
  }
  size_t dropped = 0;
  if (g_api.dropped_records && g_api.dropped_records(context, stream, &dropped) == cupti::kSuccess)
    g_dropped.fetch_add(dropped, std::memory_order_relaxed);
}

std::string describe(cupti::Result r) {
  const char* text = nullptr;
  if (g_api.result_string && g_api.result_string(r, &text) == cupti::kSuccess && text)
    return std::string(text) + " (" + std::to_string(r) + ")";
  return "CUPTI error " + std::to_string(r);
}

template <class T>
bool load(void* lib, const char* name, T* fn) {
  *fn = reinterpret_cast<T>(dlsym(lib, name));
  return *fn != nullptr;
}

bool open_library(const std::string& path, std::string* why) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why = dlerror();
    return false;
  }
  cupti::Api api;
  const bool ok = load(lib, "cuptiSubscribe", &api.subscribe) &&
                  load(lib, "cuptiUnsubscribe", &api.unsubscribe) &&
                  load(lib, "cuptiEnableCallback", &api.enable_callback) &&
                  load(lib, "cuptiActivityRegisterCallbacks", &api.register_callbacks) &&
                  load(lib, "cuptiActivityEnable", &api.activity_enable) &&
                  load(lib, "cuptiActivityDisable", &api.activity_disable) &&
                  load(lib, "cuptiActivityFlushAll", &api.flush_all) &&
                  load(lib, "cuptiActivityGetNextRecord", &api.next_record) &&
                  load(lib, "cuptiGetTimestamp", &api.timestamp);
  if (!ok) {
    *why = path + " lacks CUPTI's activity API";
    dlclose(lib);
    return false;
  }
  load(lib, "cuptiActivityGetNumDroppedRecords", &api.dropped_records);
  load(lib, "cuptiGetGraphNodeId", &api.graph_node_id);
  load(lib, "cuptiGetResultString", &api.result_string);
  g_api = api;
  g_lib = lib;
  g_library = path;
  return true;
}

constexpr uint32_t kActivityKinds[] = {cupti::kActivityConcurrentKernel, cupti::kActivityMemcpy,
                                       cupti::kActivityMemset};

void enable_callbacks(uint32_t on) {
  for (uint32_t id : cupti::kRuntimeLaunches)
    g_api.enable_callback(on, g_subscriber, cupti::kDomainRuntime, id);
  for (uint32_t id : cupti::kDriverLaunches)
    g_api.enable_callback(on, g_subscriber, cupti::kDomainDriver, id);
  g_api.enable_callback(on, g_subscriber, cupti::kDomainResource, cupti::kResourceGraphNodeCreated);
  g_api.enable_callback(on, g_subscriber, cupti::kDomainResource, cupti::kResourceGraphNodeCloned);
}

}  // namespace

std::string cupti_start(const std::vector<std::string>& candidates, uint64_t buffer_bytes,
                        uint32_t max_buffers) {
  if (g_running) return "";
  if (!g_lib) {
    std::string why = "no candidate given";
    for (const auto& path : candidates)
      if (open_library(path, &why)) break;
    if (!g_lib) return "libcupti could not be loaded: " + why;
  }
  g_buffer_bytes = buffer_bytes < 4096 ? 4096 : buffer_bytes;
  g_max_buffers = max_buffers ? max_buffers : 1;
  cupti::Result r = g_api.subscribe(&g_subscriber, callback, nullptr);
  if (r != cupti::kSuccess) {
    g_subscriber = nullptr;
    if (r == cupti::kErrorMultipleSubscribers)
      return "CUPTI is held by another tool (torch.profiler's Kineto, Nsight, ...): " + describe(r);
    return "cuptiSubscribe failed: " + describe(r);
  }
  enable_callbacks(1);
  r = g_api.register_callbacks(buffer_requested, buffer_completed);
  for (uint32_t kind : kActivityKinds)
    if (r == cupti::kSuccess) r = g_api.activity_enable(kind);
  if (r != cupti::kSuccess) {
    for (uint32_t kind : kActivityKinds) g_api.activity_disable(kind);
    enable_callbacks(0);
    g_api.unsubscribe(g_subscriber);
    g_subscriber = nullptr;
    return "CUPTI's activity API refused: " + describe(r);
  }
  g_running = true;
  sample_clock();
  return "";
}

void cupti_flush(bool forced) {
  if (!g_lib) return;
  g_api.flush_all(forced ? 1 : 0);
  sample_clock();
}

void cupti_set_enabled(bool on) {
  if (!g_running) return;
  for (uint32_t kind : kActivityKinds)
    on ? g_api.activity_enable(kind) : g_api.activity_disable(kind);
  enable_callbacks(on ? 1 : 0);
}

void cupti_stop() {
  if (!g_running) return;
  g_api.flush_all(1);
  sample_clock();
  for (uint32_t kind : kActivityKinds) g_api.activity_disable(kind);
  enable_callbacks(0);
  g_api.unsubscribe(g_subscriber);
  g_subscriber = nullptr;
  g_running = false;
}

void cupti_add_session(const std::shared_ptr<Session>& s) { g_sessions.add(s, "cupti"); }

void cupti_remove_session(const Session* s) { g_sessions.remove(s); }

CuptiStats cupti_stats() {
  CuptiStats st;
  st.running = g_running;
  st.library = g_library;
  st.launches = g_launches.load();
  st.records = g_records.load();
  st.cupti_dropped = g_dropped.load();
  st.buffers_refused = g_refused.load();
  st.graph_nodes = g_nodes.load();
  st.other_kinds = g_other.load();
  std::lock_guard<std::mutex> lock(g_names_mutex);
  st.names = g_names;
  st.clock_pairs = g_clock_pairs;
  return st;
}

}  // namespace hooktrace
