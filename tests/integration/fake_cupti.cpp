// A fake libcupti for CI (issue #49): the entry points hooktrace's CUPTI layer
// (csrc/cupti.cpp) looks up, with the behaviour that hurts in the real one. Records
// arrive late (held back for `late_flushes` unforced flushes), out of order
// (shuffled in each buffer), and lost (every `lose_every`-th record, and every record
// a refused buffer could not hold: both reported by cuptiActivityGetNumDroppedRecords,
// as CUPTI does); a second subscriber is refused (`other_holds`). Timestamps are in a
// clock of their own (CLOCK_REALTIME + 1 s), as CUPTI's need not be the host's.
//
// The test drives it through fake_cupti_* (ctypes): a launch calls the subscriber's
// callback on the calling thread, then queues a record of the layout CUPTI 12
// delivers (CUpti_ActivityKernel9: 208 bytes; memcpy/memset records: 80).
//
// Built by tests/integration/test_cupti.py with the system compiler; no CUDA needed.
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace {

using Callback = void (*)(void*, uint32_t, uint32_t, const void*);
using Requested = void (*)(uint8_t**, size_t*, size_t*);
using Completed = void (*)(void*, uint32_t, uint8_t*, size_t, size_t);

constexpr size_t kKernelSize = 208, kCopySize = 80;

struct Pending {
  std::vector<uint8_t> bytes;
  int wait;  // unforced flushes to hold it back
};

std::mutex g_mutex;
Callback g_callback = nullptr;
void* g_userdata = nullptr;
bool g_subscribed = false;
std::vector<std::pair<uint32_t, uint32_t>> g_enabled;  // (domain, cbid)
std::vector<uint32_t> g_kinds;
Requested g_requested = nullptr;
Completed g_completed = nullptr;
std::vector<Pending> g_pending;
uint32_t g_corr = 0;
uint64_t g_dropped = 0, g_lost = 0, g_records = 0, g_delivered = 0;
int64_t g_other_holds = 0, g_lose_every = 0, g_late_flushes = 0, g_buffer_records = 64;
std::mt19937 g_rng(1234);

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec + 1000000000ull;
}

std::vector<std::pair<uint32_t, uint64_t>> g_stream_end;  // a stream runs one thing at a time

// When work queued now on `stream` starts (g_mutex held): after the stream's last.
uint64_t start_on(uint32_t stream, uint64_t dur) {
  uint64_t t = now_ns();
  for (auto& [s, end] : g_stream_end)
    if (s == stream) {
      t = std::max(t, end);
      end = t + dur;
      return t;
    }
  g_stream_end.emplace_back(stream, t + dur);
  return t;
}

bool enabled(uint32_t domain, uint32_t cbid) {
  return g_subscribed && std::find(g_enabled.begin(), g_enabled.end(),
                                   std::make_pair(domain, cbid)) != g_enabled.end();
}
bool kind_on(uint32_t kind) { return std::find(g_kinds.begin(), g_kinds.end(), kind) != g_kinds.end(); }

template <class T>
void put(std::vector<uint8_t>& b, size_t off, T v) { std::memcpy(b.data() + off, &v, sizeof(T)); }

std::vector<std::string>& names() {
  static std::vector<std::string> n;  // stable storage: records point into it
  return n;
}

const char* intern(const char* name) {
  auto& n = names();
  for (auto& s : n)
    if (s == name) return s.c_str();
  n.reserve(4096);  // never reallocates under the pointers handed out (tests stay below)
  n.emplace_back(name);
  return n.back().c_str();
}

// Queues a record (g_mutex held); every lose_every-th one is lost (counted as dropped).
void queue(uint32_t kind, uint32_t corr, uint32_t stream, uint64_t start, uint64_t dur,
           const char* name, uint64_t node) {
  ++g_records;
  if (g_lose_every > 0 && g_records % g_lose_every == 0) {
    ++g_lost;
    ++g_dropped;
    return;
  }
  const bool kernel = kind == 10 || kind == 3;
  std::vector<uint8_t> b(kernel ? kKernelSize : kCopySize, 0);
  put<uint32_t>(b, 0, kind);
  put<uint64_t>(b, 16, start);
  put<uint64_t>(b, 24, start + dur);
  if (kernel) {
    put<uint32_t>(b, 40, 0);  // device
    put<uint32_t>(b, 48, stream);
    put<uint32_t>(b, 92, corr);
    put<const char*>(b, 104, intern(name));
    put<uint64_t>(b, 144, node);
  } else {
    put<uint32_t>(b, 32, 0);
    put<uint32_t>(b, 40, stream);
    put<uint32_t>(b, 44, corr);
    put<uint64_t>(b, 64, node);
  }
  g_pending.push_back({std::move(b), static_cast<int>(g_late_flushes)});
}

void call(uint32_t domain, uint32_t cbid, uint32_t corr) {
  uint8_t data[128] = {};
  for (uint32_t site : {0u, 1u}) {
    std::memcpy(data, &site, 4);
    std::memcpy(data + 64, &corr, 4);
    g_callback(g_userdata, domain, cbid, data);
  }
}

}  // namespace

extern "C" {

int cuptiSubscribe(void** subscriber, Callback cb, void* userdata) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_other_holds || g_subscribed) return 39;  // CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
  g_subscribed = true;
  g_callback = cb;
  g_userdata = userdata;
  *subscriber = &g_subscribed;
  return 0;
}

int cuptiUnsubscribe(void*) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_subscribed = false;
  g_enabled.clear();
  return 0;
}

int cuptiEnableCallback(uint32_t on, void*, uint32_t domain, uint32_t cbid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto key = std::make_pair(domain, cbid);
  g_enabled.erase(std::remove(g_enabled.begin(), g_enabled.end(), key), g_enabled.end());
  if (on) g_enabled.push_back(key);
  return 0;
}

int cuptiActivityRegisterCallbacks(Requested r, Completed c) {
  g_requested = r;
  g_completed = c;
  return 0;
}

int cuptiActivityEnable(uint32_t kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!kind_on(kind)) g_kinds.push_back(kind);
  return 0;
}

int cuptiActivityDisable(uint32_t kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kinds.erase(std::remove(g_kinds.begin(), g_kinds.end(), kind), g_kinds.end());
  return 0;
}

// Delivers what is due (everything when forced), shuffled, in buffers of at most
// buffer_records records; a refused buffer drops what it would have held.
int cuptiActivityFlushAll(uint32_t flag) {
  std::vector<Pending> due;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<Pending> keep;
    for (auto& p : g_pending) {
      if (flag & 1 || p.wait <= 0)
        due.push_back(std::move(p));
      else {
        --p.wait;
        keep.push_back(std::move(p));
      }
    }
    g_pending.swap(keep);
    std::shuffle(due.begin(), due.end(), g_rng);
  }
  size_t i = 0;
  while (i < due.size()) {
    uint8_t* buffer = nullptr;
    size_t size = 0, max_records = 0;
    g_requested(&buffer, &size, &max_records);
    size_t used = 0, n = 0;
    for (; i < due.size() && n < static_cast<size_t>(g_buffer_records); ++i, ++n) {
      const auto& b = due[i].bytes;
      if (!buffer || used + b.size() > size) {
        if (!buffer) {
          std::lock_guard<std::mutex> lock(g_mutex);
          ++g_dropped;
          ++g_lost;
          continue;
        }
        break;
      }
      std::memcpy(buffer + used, b.data(), b.size());
      used += b.size();
    }
    if (buffer) {
      g_delivered += n;
      g_completed(nullptr, 0, buffer, size, used);
    } else {
      g_completed(nullptr, 0, nullptr, 0, 0);
    }
  }
  return 0;
}

int cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, void** record) {
  uint8_t* next = buffer;
  if (*record) {
    auto* r = static_cast<uint8_t*>(*record);
    uint32_t kind;
    std::memcpy(&kind, r, 4);
    next = r + ((kind == 10 || kind == 3) ? kKernelSize : kCopySize);
  }
  if (next >= buffer + valid) return 12;  // CUPTI_ERROR_MAX_LIMIT_REACHED
  *record = next;
  return 0;
}

int cuptiActivityGetNumDroppedRecords(void*, uint32_t, size_t* dropped) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *dropped = g_dropped;
  g_dropped = 0;
  return 0;
}

int cuptiGetTimestamp(uint64_t* t) {
  *t = now_ns();
  return 0;
}

int cuptiGetGraphNodeId(void* node, uint64_t* id) {
  *id = reinterpret_cast<uintptr_t>(node);
  return 0;
}

int cuptiGetResultString(int result, const char** text) {
  *text = result == 39 ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED" : "CUPTI_ERROR_UNKNOWN";
  return 0;
}

// --- the test's controls ---

// A launch through (domain, cbid) on the calling thread; its record (`kind`: 10
// kernel, 1 memcpy, 2 memset) runs `dur` ns from now. Returns its correlation id,
// 0 when nothing was subscribed for it.
uint32_t fake_cupti_launch(uint32_t domain, uint32_t cbid, uint32_t kind, const char* name,
                           uint32_t stream, uint64_t dur) {
  uint32_t corr;
  bool traced, record;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    corr = ++g_corr;
    traced = enabled(domain, cbid);
    record = kind_on(kind == 3 ? 10 : kind);
    if (record) queue(kind, corr, stream, start_on(stream, dur), dur, name, 0);
  }
  if (traced) call(domain, cbid, corr);
  return traced ? corr : 0;
}

// A graph node created during a capture (original 0) or cloned from `original`
// at instantiation: the resource callback, on the calling thread.
void fake_cupti_graph_node(uint64_t node, uint64_t original) {
  const uint32_t cbid = original ? 20 : 13;
  if (!enabled(3, cbid)) return;
  uint8_t graph[64] = {};
  uint8_t resource[32] = {};
  void* n = reinterpret_cast<void*>(node);
  void* o = reinterpret_cast<void*>(original);
  std::memcpy(graph + 16, &n, 8);
  std::memcpy(graph + 24, &o, 8);
  void* g = graph;
  std::memcpy(resource + 16, &g, 8);
  g_callback(g_userdata, 3, cbid, resource);
}

// A replay (cudaGraphLaunch) of `n` kernel nodes: one correlation id, one record per
// node carrying the node's id, each `dur` ns, one after the other.
uint32_t fake_cupti_graph_launch(const uint64_t* nodes, int n, uint32_t stream, uint64_t dur) {
  uint32_t corr;
  bool traced;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    corr = ++g_corr;
    traced = enabled(2, 311);
    if (kind_on(10)) {
      for (int i = 0; i < n; ++i)
        queue(10, corr, stream, start_on(stream, dur), dur, "graph_kernel", nodes[i]);
    }
  }
  if (traced) call(2, 311, corr);
  return corr;
}

void fake_cupti_set(const char* knob, int64_t value) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::string k = knob;
  if (k == "other_holds") g_other_holds = value;
  else if (k == "lose_every") g_lose_every = value;
  else if (k == "late_flushes") g_late_flushes = value;
  else if (k == "buffer_records") g_buffer_records = value;
  else if (k == "seed") g_rng.seed(static_cast<uint32_t>(value));
}

uint64_t fake_cupti_get(const char* what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::string k = what;
  if (k == "lost") return g_lost;
  if (k == "records") return g_records;
  if (k == "delivered") return g_delivered;
  if (k == "pending") return g_pending.size();
  if (k == "subscribed") return g_subscribed;
  return 0;
}

}  // extern "C"
