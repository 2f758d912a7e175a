#include "numerics.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <mutex>
#include <unordered_map>

#include "event.h"
#include "session.h"
#include "tensor_walk.h"

namespace torch::autograd {
// graph_task.h (as in backward.cpp): the running GraphTask's id, -1 outside the engine.
int get_current_graph_task_id();
}  // namespace torch::autograd

namespace hooktrace {
namespace {

// set_numerics_deferred(): every tensor takes the deferred path (tests, on CPU).
std::atomic<bool> g_force_deferred{false};

// The tensor this thread reduced last (held weakly: its storage is not kept alive).
struct Last {
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> impl;
  const c10::TensorImpl* raw = nullptr;
  int64_t version = -1;
  double absmax = 0.0, sumsq = 0.0;
  uint64_t nonfinite = 0;
};

// Statistics of several tensors, combined: abs-max is the max (NaN sticks), the
// 2-norm adds up as squares, non-finite values add up.
struct Stats {
  double absmax = 0.0;
  double sumsq = 0.0;
  uint64_t numel = 0;
  uint64_t nonfinite = 0;
  uint32_t tensors = 0;  // floating (or complex) tensors reduced
  bool failed = false;
  // Deferred (a tensor off the CPU, or set_numerics_deferred): per tensor, a [3]
  // float64 tensor (abs-max, sum of squares, non-finite count) where it lives,
  // read at the session's next flush_numerics().
  std::vector<at::Tensor> parts;

  void add(const at::Tensor& t) {
    if (!t.defined() || !(t.is_floating_point() || t.is_complex())) return;
    ++tensors;
    const int64_t n = t.numel();
    if (n == 0) return;
    if (C10_UNLIKELY(g_force_deferred.load(std::memory_order_relaxed) || !t.is_cpu())) {
      try {
        parts.push_back(reduce_deferred(t));
        numel += static_cast<uint64_t>(n);
      } catch (...) {
        failed = true;
      }
      return;
    }
    double a, sq;
    uint64_t bad;
    if (!reduce(t, &a, &sq, &bad)) {
      failed = true;
      return;
    }
    merge(a, sq, bad);
    numel += static_cast<uint64_t>(n);
  }

  // Adds one tensor's reductions: abs-max is the max (a NaN sticks), squares and
  // non-finite counts add up.
  void merge(double a, double sq, uint64_t bad) {
    if (std::isnan(a) || std::isnan(absmax))
      absmax = std::numeric_limits<double>::quiet_NaN();
    else
      absmax = std::max(absmax, a);
    sumsq += sq;
    nonfinite += bad;
  }

  // One tensor's abs-max, sum of squares and non-finite count. Kernels (CPU, 2 x 64 x
  // 128 floats, one thread, measured): aminmax 5 us where linalg_vector_norm(inf)
  // takes 90 us (not vectorized); the 2-norm 8 us; isfinite().sum() only when a
  // value is not finite. A tensor reduced last on this thread and unchanged since
  // (same TensorImpl alive, same version: a parent returning its child's output) is
  // not reduced again.
  static bool reduce(const at::Tensor& t, double* a, double* sq, uint64_t* bad) {
    thread_local Last last;
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const bool cacheable = !t.is_inference();  // (inference tensors have no version)
    const int64_t version = cacheable ? t._version() : -1;
    if (cacheable && last.impl && last.version == version && last.raw == impl) {
      auto alive = last.impl->lock();
      if (alive.get() == impl) {
        *a = last.absmax;
        *sq = last.sumsq;
        *bad = last.nonfinite;
        return true;
      }
    }
    try {
      c10::AutoGradMode no_grad(false);
      std::optional<at::ScalarType> acc;
      if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) acc = at::kFloat;
      if (t.is_complex()) {
        *a = at::abs(t).max().item<double>();
      } else {
        const auto [mn, mx] = at::aminmax(t);
        const double lo = mn.item<double>(), hi = mx.item<double>();
        *a = std::isnan(lo) || std::isnan(hi) ? std::numeric_limits<double>::quiet_NaN()
                                              : std::max(-lo, hi);
      }
      const double norm = at::linalg_vector_norm(t, 2, std::nullopt, false, acc).item<double>();
      *sq = norm * norm;
      *bad = 0;
      if (!std::isfinite(*a) || !std::isfinite(norm))
        *bad = static_cast<uint64_t>(t.numel() - at::isfinite(t).sum().item<int64_t>());
    } catch (...) {
      return false;
    }
    if (!cacheable) return true;
    last.impl = c10::weak_intrusive_ptr<c10::TensorImpl>(
        c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(impl));
    last.raw = impl;
    last.version = version;
    last.absmax = *a;
    last.sumsq = *sq;
    last.nonfinite = *bad;
    return true;
  }

  // The three statistics as one [3] float64 tensor on t's device: no host sync.
  static at::Tensor reduce_deferred(const at::Tensor& t) {
    c10::AutoGradMode no_grad(false);
    std::optional<at::ScalarType> acc;
    if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) acc = at::kFloat;
    at::Tensor a;
    if (t.is_complex()) {
      a = at::abs(t).max();
    } else {
      const auto [mn, mx] = at::aminmax(t);
      a = at::maximum(mn.neg(), mx);  // (NaN propagates)
    }
    const at::Tensor norm = at::linalg_vector_norm(t, 2, std::nullopt, false, acc);
    const at::Tensor bad = at::logical_not(at::isfinite(t)).sum();
    return at::stack({a.to(at::kDouble), norm.to(at::kDouble).square(), bad.to(at::kDouble)});
  }

  void add(const Stats& o) {
    parts.insert(parts.end(), o.parts.begin(), o.parts.end());
    merge(o.absmax, o.sumsq, o.nonfinite);
    numel += o.numel;
    tensors += o.tensors;
    failed = failed || o.failed;
  }
};

// Sessions' first-non-finite callbacks (owned references). Looked up only when a
// session sees its first non-finite value.
std::mutex g_callbacks_mutex;
std::vector<std::pair<Session*, PyObject*>> g_callbacks;

void first_nonfinite(Session* s, uint32_t slot, bool backward) {
  if (!s->claim_first_nonfinite()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* callback = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_callbacks_mutex);
    for (auto& [session, cb] : g_callbacks)
      if (session == s) callback = cb;
    Py_XINCREF(callback);
  }
  if (callback) {
    PyObject* saved_type;
    PyObject* saved_value;
    PyObject* saved_tb;
    PyErr_Fetch(&saved_type, &saved_value, &saved_tb);
    PyObject* r = PyObject_CallFunction(callback, "kO", static_cast<unsigned long>(slot),
                                        backward ? Py_True : Py_False);
    if (!r) PyErr_WriteUnraisable(callback);
    Py_XDECREF(r);
    Py_DECREF(callback);
    PyErr_Restore(saved_type, saved_value, saved_tb);
  }
  PyGILState_Release(gil);
}

uint32_t float_bits(double v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Calls whose statistics wait on a device (Stats::parts), per session.
struct DeferredItem {
  Stats stats;  // the host part, and the parts to read
  uint32_t id = 0;
  uint32_t slot = 0;
  uint8_t flags = 0;
};
struct DeferredStore {
  std::mutex mutex;
  std::vector<DeferredItem> items;
  uint32_t next_id = 0;
};
std::mutex g_deferred_mutex;
std::unordered_map<const Session*, std::shared_ptr<DeferredStore>> g_deferred;

std::shared_ptr<DeferredStore> deferred_store(const Session* s, bool create) {
  std::lock_guard<std::mutex> lock(g_deferred_mutex);
  auto it = g_deferred.find(s);
  if (it != g_deferred.end()) return it->second;
  if (!create) return nullptr;
  auto store = std::make_shared<DeferredStore>();
  g_deferred.emplace(s, store);
  return store;
}

void record_deferred(Session* s, uint32_t slot, uint8_t flags, const Stats& st) {
  auto store = deferred_store(s, true);
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(store->mutex);
    id = store->next_id++;
    DeferredItem item;
    item.stats = st;
    item.id = id;
    item.slot = slot;
    item.flags = flags;
    store->items.push_back(std::move(item));
  }
  s->record_numerics(slot, flags | kNumDeferred, 0, id);
}

// A call's statistics as an event's fields: flags (with kNumSkipped / kNumFailed),
// seq = abs-max | rms << 32 (float32 bits), the non-finite count (saturating).
struct Encoded {
  uint8_t flags;
  uint64_t seq;
  uint32_t nonfinite;
};
Encoded encode(uint8_t flags, const Stats& st) {
  uint8_t f = flags;
  if (st.tensors == 0) f |= kNumSkipped;
  if (st.failed) f |= kNumFailed;
  const double rms = st.numel ? std::sqrt(st.sumsq / static_cast<double>(st.numel)) : 0.0;
  return {f,
          static_cast<uint64_t>(float_bits(st.absmax)) |
              (static_cast<uint64_t>(float_bits(rms)) << 32),
          static_cast<uint32_t>(
              std::min<uint64_t>(st.nonfinite, std::numeric_limits<uint32_t>::max()))};
}

void record(Session* s, uint32_t slot, uint8_t flags, const Stats& st) {
  if (!s) return;
  if (C10_UNLIKELY(!st.parts.empty())) {
    if (s->active()) record_deferred(s, slot, flags, st);
    return;
  }
  const Encoded e = encode(flags, st);
  s->record_numerics(slot, e.flags, e.seq, e.nonfinite);
  if (C10_UNLIKELY(st.nonfinite > 0) && s->active()) first_nonfinite(s, slot, flags & kNumBackward);
}

// The gradients of one call's inputs, gathered by their hooks.
struct Pending {
  std::shared_ptr<Session> a, b;
  uint32_t slot_a = 0, slot_b = 0;
  std::mutex mutex;
  int remaining = 0;
  Stats stats;
};

}  // namespace

void set_nonfinite_callback(Session* s, PyObject* callback) {
  PyObject* old = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_callbacks_mutex);
    for (auto it = g_callbacks.begin(); it != g_callbacks.end(); ++it) {
      if (it->first == s) {
        old = it->second;
        g_callbacks.erase(it);
        break;
      }
    }
    if (callback && callback != Py_None) {
      Py_INCREF(callback);
      g_callbacks.emplace_back(s, callback);
    }
  }
  Py_XDECREF(old);  // (outside the lock: a finalizer may run)
}

void set_numerics_deferred(bool on) { g_force_deferred.store(on, std::memory_order_relaxed); }

size_t flush_numerics(Session* s) {
  auto store = deferred_store(s, false);
  if (!store) return 0;
  std::vector<DeferredItem> items;
  {
    std::lock_guard<std::mutex> lock(store->mutex);
    items.swap(store->items);
  }
  if (items.empty()) return 0;
  // One read per device for the whole step: its parts stacked where they live, then
  // one copy to the host (a copy per part would wait on the device once per part).
  // A device whose parts cannot be read (a meta tensor has no data) fails its calls.
  std::vector<c10::Device> devices;
  std::vector<std::vector<at::Tensor>> stacks;
  std::vector<std::pair<size_t, size_t>> where;  // per part, in order: (device, row)
  for (const auto& item : items) {
    for (const auto& p : item.stats.parts) {
      const auto it = std::find(devices.begin(), devices.end(), p.device());
      const size_t d = static_cast<size_t>(it - devices.begin());
      if (it == devices.end()) {
        devices.push_back(p.device());
        stacks.emplace_back();
      }
      where.emplace_back(d, stacks[d].size());
      stacks[d].push_back(p);
    }
  }
  std::vector<at::Tensor> host(stacks.size());
  for (size_t d = 0; d < stacks.size(); ++d) {
    try {
      host[d] = at::stack(stacks[d]).to(at::kCPU).contiguous();
    } catch (...) {
      // (left undefined: these calls are recorded as failed)
    }
  }
  size_t k = 0;
  for (auto& item : items) {
    Stats& st = item.stats;  // its host part, then the parts read above
    const size_t n = st.parts.size();
    st.parts.clear();
    for (size_t i = 0; i < n; ++i, ++k) {
      const auto [d, row] = where[k];
      if (!host[d].defined()) {
        st.failed = true;
        continue;
      }
      const double* v = host[d].data_ptr<double>() + 3 * row;
      st.merge(v[0], v[1], static_cast<uint64_t>(v[2]));
    }
    // the value event names the call by its id (the NUMERICS event's rf_tid)
    const Encoded e = encode(item.flags, st);
    s->record_numerics_value(item.id, e.flags, e.seq, e.nonfinite);
    if (st.nonfinite > 0 && s->active()) first_nonfinite(s, item.slot, item.flags & kNumBackward);
  }
  return items.size();
}

void forget_numerics(const Session* s) {
  std::lock_guard<std::mutex> lock(g_deferred_mutex);
  g_deferred.erase(s);
}

void numerics_exit(PyObject* result, Session* a, uint32_t slot_a, Session* b, uint32_t slot_b) {
  Stats st;
  auto add = [&st](const at::Tensor& t) {
    st.add(t);
    return true;
  };
  walk_tensors(result, 0, add);
  record(a, slot_a, 0, st);
  record(b, slot_b, 0, st);
}

void numerics_enter(PyObject* const* args, size_t nargsf, PyObject* kwnames, Session* a,
                    uint32_t slot_a, Session* b, uint32_t slot_b) {
  // Grad off: no gradient will come. Inside the engine: a forward recomputed in
  // backward (activation checkpointing), whose inputs' gradients are the original
  // call's, already hooked.
  if (!c10::GradMode::is_enabled() || torch::autograd::get_current_graph_task_id() >= 0) return;
  std::vector<at::Tensor> inputs;
  auto add = [&inputs](const at::Tensor& t) {
    if (t.defined() && t.requires_grad()) inputs.push_back(t);
    return true;
  };
  walk_call_args(args, nargsf, kwnames, add);
  if (inputs.empty()) return;  // nothing can carry a gradient: no backward event
  auto pending = std::make_shared<Pending>();
  if (a) pending->a = a->shared_from_this();
  if (b) pending->b = b->shared_from_this();
  pending->slot_a = slot_a;
  pending->slot_b = slot_b;
  pending->remaining = static_cast<int>(inputs.size());
  for (const at::Tensor& t : inputs) {
    try {
      t.register_hook([pending](const at::TensorBase& grad) {
        Stats one;
        if (grad.defined()) one.add(at::Tensor(grad));
        std::lock_guard<std::mutex> lock(pending->mutex);
        pending->stats.add(one);
        if (--pending->remaining == 0) {
          record(pending->a.get(), pending->slot_a, kNumBackward, pending->stats);
          record(pending->b.get(), pending->slot_b, kNumBackward, pending->stats);
        }
      });
    } catch (...) {  // (a tensor that takes no hooks: counted as never reported)
      std::lock_guard<std::mutex> lock(pending->mutex);
      --pending->remaining;
    }
  }
}

}  // namespace hooktrace
