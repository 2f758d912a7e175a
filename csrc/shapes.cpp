#include "shapes.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <deque>
#include <mutex>
#include <unordered_map>

#include "tensor_walk.h"

namespace hooktrace {
namespace {

// splitmix64's finalizer: every input bit reaches every output bit.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A Python error left set by a tensor subclass whose sizes raised (GIL held).
inline void clear_python_error() {
  if (PyErr_Occurred()) PyErr_Clear();
}

struct Hasher {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  int tensors = 0;
  uint32_t not_walked = 0;  // containers deeper than the walk goes (tensor_walk.h)
  void add(uint64_t word) { h = mix(h ^ word) + 0x632be59bd9b4e019ULL; }
  bool operator()(const at::Tensor& t) {
    ++tensors;
    if (tensors > kMaxShapeTensors) return true;  // counted only
    const uint64_t dtype = static_cast<uint64_t>(t.scalar_type());
    if (t.is_nested()) {  // (a nested tensor has no sizes: reading them throws)
      add(dtype | 2ULL << 40);
      return true;
    }
    const uint64_t saved = h;
    try {
      const int64_t dim = t.dim();
      add(dtype | static_cast<uint64_t>(dim) << 8 | 1ULL << 40);
      const auto sizes = t.sym_sizes();
      for (int64_t i = 0; i < dim; ++i) {
        const auto& s = sizes[i];
        // symbolic sizes (tracing): their hint if any, else a fixed marker
        const auto v = s.maybe_as_int();
        add(v ? static_cast<uint64_t>(*v) : 0xfffffffffffffff0ULL);
      }
    } catch (...) {  // a subclass whose sizes raise: "unreadable"
      clear_python_error();
      h = saved;
      add(dtype | 3ULL << 40);
    }
    return true;
  }
  uint64_t finish() {
    add(static_cast<uint64_t>(tensors));
    add(static_cast<uint64_t>(not_walked) | 4ULL << 40);
    return h | 1;  // never 0: 0 marks an empty cache entry
  }
};

// The signature's text: "dtype[sizes]" per tensor; a nested tensor (no sizes) is
// "dtype[nested]", one whose sizes could not be read "dtype[unreadable]".
struct Builder {
  std::string text;
  int tensors = 0;
  uint32_t not_walked = 0;
  bool operator()(const at::Tensor& t) {
    ++tensors;
    if (tensors > kMaxShapeTensors) return true;
    if (!text.empty()) text += ';';
    text += c10::getDtypeNames(t.scalar_type()).first;
    text += '[';
    if (t.is_nested()) {
      text += "nested]";
      return true;
    }
    const size_t mark = text.size();
    try {
      const auto sizes = t.sym_sizes();
      for (int64_t i = 0; i < t.dim(); ++i) {
        if (i) text += ',';
        const auto v = sizes[i].maybe_as_int();
        text += v ? std::to_string(*v) : std::string("?");
      }
    } catch (...) {
      clear_python_error();
      text.resize(mark);
      text += "unreadable";
    }
    text += ']';
    return true;
  }
  std::string finish() {
    if (tensors > kMaxShapeTensors)
      text += ";...+" + std::to_string(tensors - kMaxShapeTensors);
    if (not_walked)  // (parse_signature passes over both "..." parts)
      text += ";...not walked: " + std::to_string(not_walked) + " nested deeper than " +
              std::to_string(kMaxWalkDepth);
    return text;
  }
};

// The process's signature table (the miss path only).
std::mutex g_mutex;
std::unordered_map<uint64_t, uint32_t> g_index;  // hash -> index
std::deque<std::string> g_signatures;

// hash -> index, per thread: indexes never change, so entries never go stale.
struct CacheEntry {
  uint64_t hash;
  uint32_t index;
};
constexpr size_t kCacheSize = 1024;  // power of two
constexpr size_t kProbe = 8;
thread_local CacheEntry tl_cache[kCacheSize];

template <typename Walk>
uint32_t intern(uint64_t hash, Walk&& walk) {
  const size_t home = mix(hash) & (kCacheSize - 1);
  for (size_t i = 0; i < kProbe; ++i) {
    const CacheEntry& e = tl_cache[(home + i) & (kCacheSize - 1)];
    if (e.hash == hash) return e.index;
    if (e.hash == 0) break;
  }
  // Miss (rare): build the text, intern it under the mutex, cache the index.
  Builder b;
  walk(b);
  std::string text = b.finish();
  uint32_t index;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_index.find(hash);
    if (it != g_index.end()) {
      index = it->second;
    } else if (g_signatures.size() >= kMaxShapeSignatures) {
      return kShapeUnknown;  // (not cached: a later table can't make room anyway)
    } else {
      index = static_cast<uint32_t>(g_signatures.size());
      g_signatures.push_back(std::move(text));
      g_index.emplace(hash, index);
    }
  }
  size_t slot = home;
  for (size_t i = 0; i < kProbe; ++i) {
    slot = (home + i) & (kCacheSize - 1);
    if (tl_cache[slot].hash == 0) break;
  }
  tl_cache[slot] = CacheEntry{hash, index};  // (all probed slots full: replace the last)
  return index;
}

}  // namespace

// No C++ exception leaves a module call (it would abort the process): anything the
// walk or the table throws makes the signature unknown.
uint32_t input_signature(PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  try {
    Hasher h;
    walk_call_args(args, nargsf, kwnames, h, &h.not_walked);
    return intern(h.finish(), [&](Builder& b) {
      walk_call_args(args, nargsf, kwnames, b, &b.not_walked);
    });
  } catch (...) {
    clear_python_error();
    return kShapeUnknown;
  }
}

uint32_t output_signature(PyObject* result) {
  try {
    Hasher h;
    walk_tensors(result, 0, h, &h.not_walked);
    return intern(h.finish(), [&](Builder& b) { walk_tensors(result, 0, b, &b.not_walked); });
  } catch (...) {
    clear_python_error();
    return kShapeUnknown;
  }
}

std::vector<std::string> shape_signatures(size_t first) {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::string> out;
  for (size_t i = first; i < g_signatures.size(); ++i) out.push_back(g_signatures[i]);
  return out;
}

}  // namespace hooktrace
