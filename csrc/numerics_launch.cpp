#include "numerics_launch.h"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace hooktrace {
namespace {

// The CUDA stream of a c10::Stream: native_handle() where this torch has it (2.6 and
// later); on an older torch the launch is refused (the caller falls back to Triton's
// launcher), never queued on the legacy default stream.
template <class S>
auto stream_handle(const S& s, int) -> decltype(s.native_handle()) {
  return s.native_handle();
}
template <class S>
void* stream_handle(const S&, long) {
  throw std::runtime_error("this torch's c10::Stream has no native_handle (torch < 2.6)");
}

std::atomic<bool> g_on{true};
std::atomic<int> g_kernels_set{0};  // variants registered (a quick "none" on the hot path)
std::atomic<uint64_t> g_launches{0};
std::atomic<uint64_t> g_fallbacks{0};

// Everything below is read and changed under g_mutex: the variants, the functions
// loaded per (context, variant), the driver, the first failure.
std::mutex g_mutex;
NumericsKernel g_kernels[kNumericsKeys];
bool g_kernel_set[kNumericsKeys] = {};
struct Loaded {
  void* ctx;
  int key;
  void* function;
};
std::vector<Loaded> g_loaded;  // (a handful: variants used x contexts)
const NumericsDriver* g_test_driver = nullptr;
NumericsDriver g_real{};
bool g_real_tried = false, g_real_ok = false;
std::string g_error;

// The CUDA driver, from libcuda.so.1 (torch loaded it when it initialized CUDA).
const NumericsDriver* real_driver(std::string* why) {
  if (!g_real_tried) {
    g_real_tried = true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib) {
      auto sym = [&](const char* name) { return dlsym(lib, name); };
      g_real.ctx_get_current = reinterpret_cast<decltype(g_real.ctx_get_current)>(sym("cuCtxGetCurrent"));
      g_real.ctx_get_device = reinterpret_cast<decltype(g_real.ctx_get_device)>(sym("cuCtxGetDevice"));
      g_real.module_load_data =
          reinterpret_cast<decltype(g_real.module_load_data)>(sym("cuModuleLoadData"));
      g_real.module_get_function =
          reinterpret_cast<decltype(g_real.module_get_function)>(sym("cuModuleGetFunction"));
      g_real.launch_kernel = reinterpret_cast<decltype(g_real.launch_kernel)>(sym("cuLaunchKernel"));
      g_real.get_error_string =
          reinterpret_cast<decltype(g_real.get_error_string)>(sym("cuGetErrorString"));
      g_real_ok = g_real.ctx_get_current && g_real.ctx_get_device && g_real.module_load_data &&
                  g_real.module_get_function && g_real.launch_kernel;
    }
  }
  if (!g_real_ok) {
    *why = "the CUDA driver (libcuda.so.1) or one of its launch calls was not found";
    return nullptr;
  }
  return &g_real;
}

std::string driver_error(const NumericsDriver* d, const char* call, int code) {
  std::string msg = std::string(call) + " failed (CUresult " + std::to_string(code);
  const char* text = nullptr;
  if (d->get_error_string && d->get_error_string(code, &text) == 0 && text) msg += ": " + std::string(text);
  return msg + ")";
}

// The first failure turns the native launch off for the process (g_mutex held).
void fail_locked(const std::string& why) {
  if (g_error.empty()) {
    g_error = why.substr(0, why.find('\n'));
    if (g_error.size() > 300) g_error = g_error.substr(0, 300) + "...";
  }
  g_on.store(false, std::memory_order_release);
  g_fallbacks.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

int numerics_kernel_key(c10::ScalarType dtype, uintptr_t data, int64_t numel) {
  int d;
  switch (dtype) {
    case c10::ScalarType::Float: d = 0; break;
    case c10::ScalarType::BFloat16: d = 1; break;
    case c10::ScalarType::Half: d = 2; break;
    default: return -1;
  }
  const bool aligned = data % 16 == 0 && numel % 16 == 0;
  return 2 * d + (aligned ? 0 : 1);
}

std::string check_numerics_kernel(const NumericsKernel& k) {
  if (k.image.empty() || k.name.empty()) return "no image or entry point";
  if (k.layout.size() < 4 || k.layout.compare(0, 4, "ppil") != 0 ||
      k.layout.size() > static_cast<size_t>(kNumericsMaxParams))
    return "parameters '" + k.layout + "', not x, out, row (32-bit), n (64-bit) and at most " +
           std::to_string(kNumericsMaxParams - 4) + " hidden pointers";
  for (size_t i = 4; i < k.layout.size(); ++i)
    if (k.layout[i] != 'p') return "a hidden parameter that is not a pointer: '" + k.layout + "'";
  if (k.num_warps < 1 || k.num_warps > 32) return "num_warps " + std::to_string(k.num_warps);
  // (above 48 KiB a kernel needs cuFuncSetAttribute first: this one uses bytes)
  if (k.shared < 0 || k.shared > 48 * 1024) return "shared memory " + std::to_string(k.shared);
  if (k.block <= 0) return "block " + std::to_string(k.block);
  return "";
}

bool plan_numerics_launch(const NumericsKernel& k, uintptr_t x, uintptr_t out, int64_t row,
                          int64_t n, NumericsLaunch* l) {
  if (!check_numerics_kernel(k).empty() || n <= 0 || row < 0 || row > INT32_MAX) return false;
  const int64_t grid = (n + k.block - 1) / k.block;
  if (grid > INT32_MAX) return false;  // (2^31 - 1 programs of 4096 elements)
  l->grid = static_cast<uint32_t>(grid);
  l->threads = static_cast<uint32_t>(32 * k.num_warps);
  l->shared = static_cast<uint32_t>(k.shared);
  l->nparams = static_cast<int>(k.layout.size());
  // each value in a 64-bit slot; a 32-bit parameter is the slot's first 4 bytes (the
  // driver copies as many bytes as the parameter has: little-endian, the value)
  const uint64_t values[4] = {static_cast<uint64_t>(x), static_cast<uint64_t>(out),
                              static_cast<uint64_t>(static_cast<uint32_t>(row)),
                              static_cast<uint64_t>(n)};
  for (int i = 0; i < l->nparams; ++i) {
    l->slots[i] = i < 4 ? values[i] : 0;
    l->params[i] = &l->slots[i];
  }
  return true;
}

void set_numerics_kernel(int key, const NumericsKernel& k) {
  if (key < 0 || key >= kNumericsKeys)
    throw std::invalid_argument("numerics kernel variant " + std::to_string(key) + " (0 to 5)");
  const std::string why = check_numerics_kernel(k);
  if (!why.empty()) throw std::invalid_argument("cannot launch this numerics kernel: " + why);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kernels[key] = k;
  for (auto it = g_loaded.begin(); it != g_loaded.end();)  // (a new image: load it again)
    it = it->key == key ? g_loaded.erase(it) : it + 1;
  if (!g_kernel_set[key]) {
    g_kernel_set[key] = true;
    g_kernels_set.fetch_add(1, std::memory_order_release);
  }
}

void reset_numerics_native() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int i = 0; i < kNumericsKeys; ++i) {
    g_kernels[i] = NumericsKernel{};
    g_kernel_set[i] = false;
  }
  g_kernels_set.store(0, std::memory_order_release);
  g_loaded.clear();
  g_error.clear();
  g_launches.store(0, std::memory_order_relaxed);
  g_fallbacks.store(0, std::memory_order_relaxed);
  g_on.store(true, std::memory_order_release);
}

void set_numerics_native(bool on) { g_on.store(on, std::memory_order_release); }

void set_numerics_driver_for_tests(uintptr_t driver) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_test_driver = reinterpret_cast<const NumericsDriver*>(driver);
  g_loaded.clear();  // (handles of another driver)
}

bool launch_numerics_native(const at::Tensor& x, const at::Tensor& out, int64_t row) {
  if (!g_on.load(std::memory_order_acquire) || g_kernels_set.load(std::memory_order_acquire) == 0)
    return false;
  try {
    const int64_t n = x.numel();
    const auto xp = reinterpret_cast<uintptr_t>(x.const_data_ptr());
    const auto op = reinterpret_cast<uintptr_t>(out.const_data_ptr());
    const int key = numerics_kernel_key(x.scalar_type(), xp, n);
    if (key < 0 || n <= 0 || out.scalar_type() != c10::ScalarType::Double || op % 16 != 0 ||
        out.device() != x.device() || !out.is_contiguous() || row < 0 || row >= out.size(0))
      return false;
    const bool cuda = x.is_cuda();
    std::unique_lock<std::mutex> lock(g_mutex);
    if (!g_kernel_set[key] || !g_on.load(std::memory_order_relaxed)) return false;
    const NumericsDriver* d = g_test_driver;
    if (!d) {
      if (!cuda) return false;  // (CPU tensors: a test's driver only)
      std::string why;
      d = real_driver(&why);
      if (!d) {
        fail_locked(why);
        return false;
      }
    }
    // the context current on this thread must be the tensor's device's (the caller's
    // device guard made it so; a thread the runtime never set up has none): else this
    // tensor takes Triton's launcher, counted
    void* ctx = nullptr;
    int device = -1;
    if (d->ctx_get_current(&ctx) != 0 || ctx == nullptr ||
        (cuda && (d->ctx_get_device(&device) != 0 || device != x.get_device()))) {
      g_fallbacks.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    void* function = nullptr;
    for (const Loaded& l : g_loaded)
      if (l.ctx == ctx && l.key == key) function = l.function;
    const NumericsKernel& k = g_kernels[key];
    if (!function) {  // the rare path: this variant's first launch in this context
      void* module = nullptr;
      int r = d->module_load_data(&module, k.image.data());
      if (r != 0) {
        fail_locked(driver_error(d, "cuModuleLoadData", r));
        return false;
      }
      r = d->module_get_function(&function, module, k.name.c_str());
      if (r != 0 || !function) {
        fail_locked(driver_error(d, "cuModuleGetFunction", r));
        return false;
      }
      g_loaded.push_back(Loaded{ctx, key, function});
    }
    NumericsLaunch launch;
    if (!plan_numerics_launch(k, xp, op, row, n, &launch)) return false;
    lock.unlock();
    void* stream = nullptr;
    if (cuda) {
      const c10::impl::VirtualGuardImpl impl(x.device().type());
      stream = stream_handle(impl.getStream(x.device()), 0);
    }
    const int r = d->launch_kernel(function, launch.grid, 1, 1, launch.threads, 1, 1, launch.shared,
                                   stream, launch.params, nullptr);
    if (r != 0) {
      lock.lock();
      fail_locked(driver_error(d, "cuLaunchKernel", r));
      return false;
    }
    g_launches.fetch_add(1, std::memory_order_relaxed);
    return true;
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(g_mutex);
    fail_locked(e.what());
  } catch (...) {
    std::lock_guard<std::mutex> lock(g_mutex);
    fail_locked("an unknown exception");
  }
  return false;
}

NumericsNativeState numerics_native_state() {
  std::lock_guard<std::mutex> lock(g_mutex);
  NumericsNativeState st;
  st.on = g_on.load(std::memory_order_relaxed);
  st.kernels = g_kernels_set.load(std::memory_order_relaxed);
  st.launches = g_launches.load(std::memory_order_relaxed);
  st.fallbacks = g_fallbacks.load(std::memory_order_relaxed);
  st.error = g_error;
  return st;
}

}  // namespace hooktrace
