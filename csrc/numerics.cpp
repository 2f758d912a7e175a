#include "numerics.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "event.h"
#include "numerics_launch.h"
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

// A Python error left set by a tensor subclass whose op raised (its C++ exception
// caught here): cleared, else the user's call would return a result with an
// exception set (SystemError). Takes the GIL (a backward hook runs without it).
void clear_python_error() {
  if (!Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyErr_Occurred()) PyErr_Clear();
  PyGILState_Release(gil);
}

// The fused path (numerics.h set_numerics_fused): the launcher, owned, read and
// changed with the GIL held; g_fused_on mirrors "registered" for a check without it.
std::atomic<bool> g_fused_on{false};
std::atomic<bool> g_fused_cpu{false};
PyObject* g_fused = nullptr;
std::string g_fused_error;  // the first failure since the last registration (GIL)

// Rows of a fused buffer: float64 [kFusedRows, 4] (abs-max, sum of squares, NaNs,
// infs per tensor) on one device, zeroed before its rows are handed out. A chunk
// goes back to its device's spares when its rows are used up, and is zeroed again
// (one launch) once no queued tensor holds a row of it.
constexpr int64_t kFusedRows = 1024;
struct FusedChunk {
  at::Tensor buf;
  int64_t used = 0;
};
struct FusedArena {
  c10::Device device;
  std::shared_ptr<FusedChunk> current;
  std::vector<std::shared_ptr<FusedChunk>> spare;
};
std::mutex g_arena_mutex;
std::vector<FusedArena> g_arenas;

FusedArena& arena_of(const c10::Device& d) {  // (g_arena_mutex held)
  for (auto& a : g_arenas)
    if (a.device == d) return a;
  g_arenas.push_back(FusedArena{d, nullptr, {}});
  return g_arenas.back();
}

// A free row on t's device. Allocation and zeroing run without the mutex (an op may
// call into Python: a dispatch mode).
std::pair<std::shared_ptr<FusedChunk>, int64_t> take_row(const at::Tensor& t) {
  const c10::Device d = t.device();
  std::shared_ptr<FusedChunk> fresh;
  {
    std::lock_guard<std::mutex> lock(g_arena_mutex);
    FusedArena& a = arena_of(d);
    if (a.current && a.current->used < kFusedRows) return {a.current, a.current->used++};
    if (a.current) a.spare.push_back(std::move(a.current));
    for (auto it = a.spare.begin(); it != a.spare.end(); ++it) {
      if (it->use_count() == 1) {  // no queued tensor holds a row of it
        fresh = std::move(*it);
        a.spare.erase(it);
        break;
      }
    }
  }
  if (fresh) {
    fresh->buf.zero_();
  } else {
    fresh = std::make_shared<FusedChunk>();
    fresh->buf = at::zeros({kFusedRows, 4}, t.options().dtype(at::kDouble));
  }
  fresh->used = 0;
  std::lock_guard<std::mutex> lock(g_arena_mutex);
  FusedArena& a = arena_of(d);
  if (!a.current || a.current->used >= kFusedRows) {
    if (a.current) a.spare.push_back(std::move(a.current));
    a.current = fresh;
  } else {
    a.spare.push_back(fresh);  // (another thread installed one meanwhile)
  }
  return {a.current, a.current->used++};
}

// One tensor's deferred reductions, where it lives (no host sync), read at the flush:
// ATen path: abs-max, the 2-norm of the tensor scaled by it, and the count of its
// non-zeros (reduce_deferred); fused path: `row` of `chunk` (reduce_fused).
struct Part {
  at::Tensor absmax, scaled_norm, nonzero;
  std::shared_ptr<FusedChunk> chunk;
  int64_t row = -1;
};

// Whether the fused launcher takes t (and a launcher is registered).
bool fused_takes(const at::Tensor& t) {
  if (!g_fused_on.load(std::memory_order_acquire)) return false;
  const auto type = t.scalar_type();
  if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf) return false;
  if (!(t.is_cuda() || (g_fused_cpu.load(std::memory_order_relaxed) && t.is_cpu()))) return false;
  if (t.layout() != at::kStrided || t.is_nested()) return false;
  // a tensor subclass dispatching to Python (fake tensors too), a functorch or
  // functionalization wrapper, an efficient zero tensor (no data): no plain memory to
  // hand a kernel
  const auto keys = t.key_set();
  if (keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::FuncTorchBatched) ||
      keys.has(c10::DispatchKey::FuncTorchGradWrapper) ||
      keys.has(c10::DispatchKey::Functionalize) || keys.has(c10::DispatchKey::ZeroTensor) ||
      !t.has_storage())
    return false;
  return true;
}

// The launcher's exception (set): kept as the first failure and the launcher
// unregistered; a KeyboardInterrupt is handed back to the interpreter instead (the
// user's Ctrl-C) and the launcher kept. GIL held.
void fused_failed() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (type && PyErr_GivenExceptionMatches(type, PyExc_KeyboardInterrupt)) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_SetInterrupt();
    return;
  }
  std::string msg = type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "error";
  if (value) {
    PyObject* str = PyObject_Str(value);
    const char* c = str ? PyUnicode_AsUTF8(str) : nullptr;
    if (c && *c) msg += std::string(": ") + c;
    Py_XDECREF(str);
    if (PyErr_Occurred()) PyErr_Clear();
  }
  const size_t nl = msg.find('\n');
  if (nl != std::string::npos) msg = msg.substr(0, nl);
  if (msg.size() > 300) msg = msg.substr(0, 300) + "...";
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (g_fused_error.empty()) g_fused_error = msg;
  g_fused_on.store(false, std::memory_order_release);
  PyObject* old = g_fused;
  g_fused = nullptr;
  Py_XDECREF(old);
}

// t reduced by the fused launcher into a row (one launch; a copy first when t's
// elements do not fill one dense range). False: not taken (no launcher, or it
// failed: then the ATen path). No exception leaves; no Python error is left set.
bool reduce_fused(const at::Tensor& t, Part* p) {
  if (!fused_takes(t)) return false;
  c10::AutoGradMode no_grad(false);
  // any order of a dense range will do: the statistics do not depend on it. Else a
  // copy: contiguous(), not reshape(-1), which returns a strided view where it can
  // (x[:, ::2] is one with stride 2) and the kernel would read the skipped elements
  // (found on an H200: a NaN of a column the slice leaves out).
  const at::Tensor x = t.is_non_overlapping_and_dense() ? t : t.contiguous();
  auto [chunk, row] = take_row(x);
  const c10::OptionalDeviceGuard device(x.device());  // (kernels launch on the current one)
  // the kernel loaded once and queued from here (numerics_launch.h): no Python, no GIL
  if (launch_numerics_native(x, chunk->buf, row)) {
    p->chunk = std::move(chunk);
    p->row = row;
    return true;
  }
  if (!Py_IsInitialized()) return false;
  PyGILState_STATE gil = PyGILState_Ensure();
  bool ok = false;
  PyObject *saved_type, *saved_value, *saved_tb;
  PyErr_Fetch(&saved_type, &saved_value, &saved_tb);
  PyObject* launcher = g_fused;
  if (launcher) {
    Py_INCREF(launcher);
    PyObject* xo = THPVariable_Wrap(x);
    // a tensor subclass (its own Python object) is handed over as a plain alias
    if (xo && Py_TYPE(xo) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
      Py_DECREF(xo);
      xo = nullptr;
      try {
        xo = THPVariable_Wrap(at::alias(x));
      } catch (...) {
      }
    }
    PyObject* bo = xo ? THPVariable_Wrap(chunk->buf) : nullptr;
    PyObject* r = bo ? PyObject_CallFunction(launcher, "OOL", xo, bo, static_cast<long long>(row))
                     : nullptr;
    if (r) {
      ok = true;
      Py_DECREF(r);
    } else if (PyErr_Occurred()) {
      fused_failed();
    }
    Py_XDECREF(xo);
    Py_XDECREF(bo);
    Py_DECREF(launcher);
  }
  PyErr_Restore(saved_type, saved_value, saved_tb);
  PyGILState_Release(gil);
  if (!ok) return false;
  p->chunk = std::move(chunk);
  p->row = row;
  return true;
}

// Statistics of several tensors, combined: abs-max is the max (NaN sticks), the
// 2-norm adds up as squares, non-finite values add up.
struct Stats {
  double absmax = 0.0;
  double sumsq = 0.0;
  uint64_t numel = 0;
  uint64_t nonfinite = 0;
  uint32_t tensors = 0;  // floating (or complex) tensors reduced
  uint32_t not_walked = 0;  // containers deeper than the walk goes (tensor_walk.h)
  bool failed = false;
  // Deferred (a tensor off the CPU, or set_numerics_deferred): per tensor, its
  // reductions where it lives, read at the session's next flush_numerics().
  std::vector<Part> parts;

  // No exception leaves (a subclass may raise from any query): counted as not reduced.
  void add(const at::Tensor& t) {
    try {
      add_unguarded(t);
    } catch (...) {
      clear_python_error();
      failed = true;
    }
  }

  void add_unguarded(const at::Tensor& t) {
    if (!t.defined() || !(t.is_floating_point() || t.is_complex())) return;
    ++tensors;
    // a nested tensor has no single size to reduce over: counted as not reduced
    if (t.is_nested()) {
      failed = true;
      return;
    }
    int64_t n;
    try {
      n = t.numel();
    } catch (...) {
      clear_python_error();
      failed = true;
      return;
    }
    if (n == 0) return;
    if (C10_UNLIKELY(g_force_deferred.load(std::memory_order_relaxed) || !t.is_cpu())) {
      try {
        Part p;
        parts.push_back(reduce_fused(t, &p) ? std::move(p) : reduce_deferred(t));
        numel += static_cast<uint64_t>(n);
      } catch (...) {  // a subclass without these ops (its Python error cleared)
        clear_python_error();
        failed = true;
      }
      return;
    }
    double a, sq;
    uint64_t bad;
    if (!reduce(t, &a, &sq, &bad)) {
      clear_python_error();
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

  // abs-max from a tensor's min and max: NaN when either is.
  static double absmax_of(double lo, double hi) {
    return std::isnan(lo) || std::isnan(hi) ? std::numeric_limits<double>::quiet_NaN()
                                            : std::max(-lo, hi);
  }

  // One tensor's abs-max, sum of squares and non-finite count. Kernels (CPU, 2 x 64 x
  // 128 floats, one thread, measured): aminmax 5 us where linalg_vector_norm(inf)
  // takes 90 us (not vectorized); the 2-norm 8 us; isfinite().sum() only when a
  // value is not finite. The 2-norm accumulates in the tensor's width (float32 for
  // float32, bfloat16 and half): when it overflows (or underflows to 0) while abs-max
  // is finite, it is computed again in float64 (no finite input overflows there).
  // (No cache of a tensor reduced before: a write through .data or a numpy view
  // changes a tensor without its version, so "unchanged" cannot be known.)
  static bool reduce(const at::Tensor& t, double* a, double* sq, uint64_t* bad) {
    try {
      c10::AutoGradMode no_grad(false);
      std::optional<at::ScalarType> acc;
      if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) acc = at::kFloat;
      if (t.is_complex()) {
        *a = at::abs(t).max().item<double>();
      } else {
        const auto [mn, mx] = at::aminmax(t);
        *a = absmax_of(mn.item<double>(), mx.item<double>());
      }
      double norm = at::linalg_vector_norm(t, 2, std::nullopt, false, acc).item<double>();
      if (std::isfinite(*a) && (!std::isfinite(norm) || (norm == 0.0 && *a > 0.0)))
        norm = at::linalg_vector_norm(t, 2, std::nullopt, false, at::kDouble).item<double>();
      *sq = norm * norm;
      *bad = 0;
      if (!std::isfinite(*a) || !std::isfinite(norm))
        *bad = static_cast<uint64_t>(t.numel() - at::isfinite(t).sum().item<int64_t>());
    } catch (...) {
      return false;
    }
    return true;
  }

  // The reductions queued where t lives, no host sync: five kernels, two passes over
  // t and two over one temporary of its size.
  //   A = max |t| (linalg_vector_norm, ord inf: NaN-propagating on CPU and CUDA);
  //   D = A, or inf where A is NaN or inf (nan_to_num on the 0-d A);
  //   s = t / D: |s| <= 1 when A is finite, so its 2-norm cannot overflow (nor
  //       underflow where t's would) in the float32 accumulation a GPU does in-kernel
  //       for bf16/half (float64 would cast t first: a copy 2-4x its size); when A is
  //       not finite, s is 0 where t is finite and NaN where it is not;
  //   ||s||_2 (sum of squares = (A ||s||_2)^2 when A is finite) and ||s||_0 (the
  //   non-finite count when A is not finite: float32, exact up to 2^24).
  // (A = 0: s is NaN, unused: the sum of squares and the count are 0.)
  static Part reduce_deferred(const at::Tensor& t) {
    c10::AutoGradMode no_grad(false);
    std::optional<at::ScalarType> acc;
    if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) acc = at::kFloat;
    const double inf = std::numeric_limits<double>::infinity();
    Part p;
    p.absmax = at::linalg_vector_norm(t, inf, std::nullopt, false, acc);
    const at::Tensor scaled = at::div(t, at::nan_to_num(p.absmax, inf, inf, inf));
    p.scaled_norm = at::linalg_vector_norm(scaled, 2, std::nullopt, false, acc);
    p.nonzero = at::linalg_vector_norm(scaled, 0, std::nullopt, false, acc);
    return p;
  }

  void add(const Stats& o) {
    parts.insert(parts.end(), o.parts.begin(), o.parts.end());
    merge(o.absmax, o.sumsq, o.nonfinite);
    numel += o.numel;
    tensors += o.tensors;
    not_walked += o.not_walked;
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
  if (st.not_walked) f |= kNumNotWalked;
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

// The gradients of one call's inputs, gathered by their hooks. The sessions are held
// weakly: a hook that outlives the trace (on a tensor the user keeps) keeps no
// session's buffers alive, and records nothing.
struct Pending {
  std::weak_ptr<Session> a, b;
  uint32_t slot_a = 0, slot_b = 0;
  std::mutex mutex;
  int remaining = 0;
  Stats stats;

  void deliver(const Stats& one) {
    std::lock_guard<std::mutex> lock(mutex);
    stats.add(one);
    if (--remaining == 0) {
      const auto sa = a.lock(), sb = b.lock();
      record(sa.get(), slot_a, kNumBackward, stats);
      record(sb.get(), slot_b, kNumBackward, stats);
    }
  }
};

// A leaf tensor (a parameter passed to a submodule, a learned initial state) lives
// past the trace: a hook per call on it would stay there, one more per call. Such a
// tensor gets one hook per session, registered at its first call, which hands its
// gradient to every call waiting on it; the session's end (forget_numerics) removes
// it. (Its hooks fire with the leaf's whole gradient, summed over its uses, as a
// hook per call did.)
struct LeafWaiters {
  std::mutex mutex;
  std::vector<std::shared_ptr<Pending>> calls;
};
struct LeafHook {
  c10::weak_intrusive_ptr<c10::TensorImpl> impl;
  unsigned index;  // register_hook's handle
  std::shared_ptr<LeafWaiters> waiters;
};
std::mutex g_leaf_mutex;
// per session (the call's first numerics session), per leaf
std::unordered_map<const Session*, std::unordered_map<const c10::TensorImpl*, LeafHook>>
    g_leaf_hooks;

// Queues `pending` on the leaf `t`'s gradient; false: the leaf takes no hooks.
bool wait_on_leaf(const Session* owner, const at::Tensor& t,
                  const std::shared_ptr<Pending>& pending) {
  std::shared_ptr<LeafWaiters> waiters;
  {
    std::lock_guard<std::mutex> lock(g_leaf_mutex);
    auto& hooks = g_leaf_hooks[owner];
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto it = hooks.find(impl);
    if (it != hooks.end() && it->second.impl.lock().get() != impl) {
      hooks.erase(it);  // (a dead leaf's address, reused)
      it = hooks.end();
    }
    if (it == hooks.end()) {
      auto w = std::make_shared<LeafWaiters>();
      const unsigned index = t.register_hook([w](const at::TensorBase& grad) {
        std::vector<std::shared_ptr<Pending>> calls;
        {
          std::lock_guard<std::mutex> lock(w->mutex);
          calls.swap(w->calls);
        }
        if (calls.empty()) return;
        Stats one;
        if (grad.defined()) one.add(at::Tensor(grad));
        for (const auto& p : calls) p->deliver(one);
      });
      it = hooks.emplace(impl, LeafHook{c10::weak_intrusive_ptr<c10::TensorImpl>(
                                            c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(impl)),
                                        index, std::move(w)})
               .first;
    }
    waiters = it->second.waiters;
  }
  std::lock_guard<std::mutex> lock(waiters->mutex);
  waiters->calls.push_back(pending);
  return true;
}

// Removes the session's leaf hooks (the model is left as it was).
void remove_leaf_hooks(const Session* s) {
  std::unordered_map<const c10::TensorImpl*, LeafHook> hooks;
  {
    std::lock_guard<std::mutex> lock(g_leaf_mutex);
    auto it = g_leaf_hooks.find(s);
    if (it == g_leaf_hooks.end()) return;
    hooks.swap(it->second);
    g_leaf_hooks.erase(it);
  }
  for (auto& [raw, hook] : hooks) {
    auto alive = hook.impl.lock();
    if (!alive) continue;  // (its hooks went with it)
    try {
      at::Tensor(std::move(alive)).remove_hook(hook.index);
    } catch (...) {
    }
  }
}

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

void set_numerics_fused(PyObject* launcher, bool cpu) {
  PyObject* old = g_fused;
  if (launcher) Py_INCREF(launcher);
  g_fused = launcher;
  g_fused_cpu.store(cpu, std::memory_order_relaxed);
  g_fused_error.clear();
  g_fused_on.store(launcher != nullptr, std::memory_order_release);
  Py_XDECREF(old);
}

std::pair<bool, std::string> numerics_fused_state() {
  return {g_fused != nullptr, g_fused_error};
}

namespace {

// A flush's reads (flush_numerics): where each part's statistics are on the host.
struct FlushReads {
  // fused parts: one copy per buffer (rows from the lowest to the highest queued)
  std::vector<std::pair<FusedChunk*, std::pair<int64_t, int64_t>>> chunks;
  std::vector<at::Tensor> chunk_host;  // per buffer; undefined: its read failed
  std::vector<at::Tensor> host;        // per device (the other parts); undefined: failed
  std::vector<std::pair<size_t, size_t>> where;  // per part, in order: (buffer or device, row)
};

size_t chunk_index(const FlushReads& r, const FusedChunk* chunk) {
  return static_cast<size_t>(
      std::find_if(r.chunks.begin(), r.chunks.end(),
                   [&](const auto& x) { return x.first == chunk; }) -
      r.chunks.begin());
}

// The fused parts' buffers, each read once (the rows its parts use).
void read_fused(const std::vector<DeferredItem>& items, FlushReads* r) {
  auto& chunks = r->chunks;
  for (const auto& item : items) {
    for (const auto& p : item.stats.parts) {
      if (!p.chunk) continue;
      auto it = std::find_if(chunks.begin(), chunks.end(),
                             [&](const auto& c) { return c.first == p.chunk.get(); });
      if (it == chunks.end())
        chunks.push_back({p.chunk.get(), {p.row, p.row}});
      else
        it->second = {std::min(it->second.first, p.row), std::max(it->second.second, p.row)};
    }
  }
  r->chunk_host.resize(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    try {
      c10::AutoGradMode no_grad(false);
      const auto [lo, hi] = chunks[c].second;
      r->chunk_host[c] = chunks[c].first->buf.slice(0, lo, hi + 1).to(at::kCPU).contiguous();
    } catch (...) {
      clear_python_error();  // (left undefined: these calls are recorded as failed)
    }
  }
}

// The other parts: one read per device for the whole step, its parts' fields stacked
// where they live, then one copy to the host (a copy per part would wait on the device
// once per part). A device whose parts cannot be read (a meta tensor has no data)
// fails its calls. Fills r->where for every part (the fused ones too).
void read_devices(const std::vector<DeferredItem>& items, FlushReads* r) {
  std::vector<c10::Device> devices;
  std::vector<std::array<std::vector<at::Tensor>, 3>> stacks;
  for (const auto& item : items) {
    for (const auto& p : item.stats.parts) {
      if (p.chunk) {
        const size_t c = chunk_index(*r, p.chunk.get());
        r->where.emplace_back(c, static_cast<size_t>(p.row - r->chunks[c].second.first));
        continue;
      }
      const auto it = std::find(devices.begin(), devices.end(), p.absmax.device());
      const size_t d = static_cast<size_t>(it - devices.begin());
      if (it == devices.end()) {
        devices.push_back(p.absmax.device());
        stacks.emplace_back();
      }
      auto& st = stacks[d];
      r->where.emplace_back(d, st[0].size());
      st[0].push_back(p.absmax);  // (stack promotes: float32 and float64 parts, one stack)
      st[1].push_back(p.scaled_norm);
      st[2].push_back(p.nonzero);
    }
  }
  r->host.resize(stacks.size());
  for (size_t d = 0; d < stacks.size(); ++d) {
    try {
      c10::AutoGradMode no_grad(false);
      auto field = [&](int f) { return at::stack(stacks[d][f]).to(at::kDouble); };
      r->host[d] = at::stack({field(0), field(1), field(2)}, 1)
                       .to(at::kCPU)
                       .contiguous();
    } catch (...) {
      clear_python_error();  // (left undefined: these calls are recorded as failed)
    }
  }
}

// Merges the read statistics of `st`'s parts (they follow where[*k]) into its host
// part; the parts are released.
void merge_parts(Stats& st, const FlushReads& r, size_t* k) {
  const size_t n = st.parts.size();
  std::vector<Part> parts;
  parts.swap(st.parts);
  for (size_t i = 0; i < n; ++i, ++*k) {
    const auto [d, row] = r.where[*k];
    if (parts[i].chunk) {  // fused: abs-max, sum of squares over finite values; NaNs, infs
      if (!r.chunk_host[d].defined()) {
        st.failed = true;
        continue;
      }
      const double* v = r.chunk_host[d].data_ptr<double>() + 4 * row;
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const double inf = std::numeric_limits<double>::infinity();
      const double a = v[2] > 0 ? nan : (v[3] > 0 ? inf : v[0]);
      const double sq = v[2] > 0 ? nan : (v[3] > 0 ? inf : v[1]);
      st.merge(a, sq, static_cast<uint64_t>(v[2]) + static_cast<uint64_t>(v[3]));
      continue;
    }
    if (!r.host[d].defined()) {
      st.failed = true;
      continue;
    }
    const double* v = r.host[d].data_ptr<double>() + 3 * row;
    const double a = v[0];
    if (std::isfinite(a)) {  // (no non-finite value; A = 0: all zeros)
      st.merge(a, a > 0.0 ? (a * v[1]) * (a * v[1]) : 0.0, 0);
    } else {  // the sum of squares is NaN or inf as the tensor's own would be
      st.merge(a, std::isnan(a) ? a : std::numeric_limits<double>::infinity(),
               static_cast<uint64_t>(v[2]));
    }
  }
}

}  // namespace

size_t flush_numerics(Session* s) {
  auto store = deferred_store(s, false);
  if (!store) return 0;
  std::vector<DeferredItem> items;
  {
    std::lock_guard<std::mutex> lock(store->mutex);
    items.swap(store->items);
  }
  if (items.empty()) return 0;
  FlushReads reads;
  read_fused(items, &reads);
  read_devices(items, &reads);
  size_t k = 0;
  for (auto& item : items) {
    Stats& st = item.stats;  // its host part, then the parts read above
    merge_parts(st, reads, &k);
    // the value event names the call by its id (the NUMERICS event's rf_tid)
    const Encoded e = encode(item.flags, st);
    s->record_numerics_value(item.id, e.flags, e.seq, e.nonfinite);
    if (st.nonfinite > 0 && s->active()) first_nonfinite(s, item.slot, item.flags & kNumBackward);
  }
  return items.size();
}

void forget_numerics(const Session* s) {
  remove_leaf_hooks(s);
  std::lock_guard<std::mutex> lock(g_deferred_mutex);
  g_deferred.erase(s);
}

size_t numerics_leaf_hooks() {
  std::lock_guard<std::mutex> lock(g_leaf_mutex);
  size_t n = 0;
  for (const auto& [s, hooks] : g_leaf_hooks) n += hooks.size();
  return n;
}

void numerics_exit(PyObject* result, Session* a, uint32_t slot_a, Session* b, uint32_t slot_b) {
  Stats st;
  auto add = [&st](const at::Tensor& t) {
    st.add(t);
    return true;
  };
  try {  // (no C++ exception may leave a module call: it would abort the process)
    walk_tensors(result, 0, add, &st.not_walked);
    record(a, slot_a, 0, st);
    record(b, slot_b, 0, st);
  } catch (...) {
    clear_python_error();
  }
}

namespace {
void enter_unguarded(PyObject* const* args, size_t nargsf, PyObject* kwnames, Session* a,
                     uint32_t slot_a, Session* b, uint32_t slot_b);
}  // namespace

void numerics_enter(PyObject* const* args, size_t nargsf, PyObject* kwnames, Session* a,
                    uint32_t slot_a, Session* b, uint32_t slot_b) {
  // Grad off: no gradient will come. Inside the engine: a forward recomputed in
  // backward (activation checkpointing), whose inputs' gradients are the original
  // call's, already hooked.
  if (!c10::GradMode::is_enabled() || torch::autograd::get_current_graph_task_id() >= 0) return;
  try {  // (no C++ exception may leave a module call: it would abort the process)
    enter_unguarded(args, nargsf, kwnames, a, slot_a, b, slot_b);
  } catch (...) {
    clear_python_error();
  }
}

namespace {
void enter_unguarded(PyObject* const* args, size_t nargsf, PyObject* kwnames, Session* a,
                     uint32_t slot_a, Session* b, uint32_t slot_b) {
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
  const Session* owner = a ? a : b;
  for (const at::Tensor& t : inputs) {
    try {
      if (t.is_leaf()) {
        wait_on_leaf(owner, t, pending);
      } else {  // (a hook on a non-leaf goes with the tensor)
        t.register_hook([pending](const at::TensorBase& grad) {
          Stats one;
          if (grad.defined()) one.add(at::Tensor(grad));
          pending->deliver(one);
        });
      }
    } catch (...) {  // (a tensor that takes no hooks: counted as never reported)
      clear_python_error();
      std::lock_guard<std::mutex> lock(pending->mutex);
      --pending->remaining;
    }
  }
}
}  // namespace

}  // namespace hooktrace
