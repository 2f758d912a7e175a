// The test-only binding of tests/integration/test_numerics_launch.py (issue #50): a fake
// CUDA driver for csrc/numerics_launch.h's NumericsDriver, so that everything of the
// numerics kernel's launch from C++ but the GPU runs in CPU-only CI, on CPU tensors:
//  * cuCtxGetCurrent: a fixed context (or none, set_no_context); cuCtxGetDevice: 0;
//  * cuModuleLoadData: an image that starts with "FAKE" (else CUDA_ERROR_INVALID_IMAGE,
//    or CUDA_ERROR_NO_BINARY_FOR_GPU while set_fail_load);
//  * cuModuleGetFunction: "fake_fp32", "fake_bf16", "fake_fp16": the kernel for that
//    dtype;
//  * cuLaunchKernel: reads the parameters as the compiled kernel takes them (x and out
//    64-bit pointers, row 32 bits, n 64 bits, then null pointers), checks the launch
//    shape (grid ceil(n / 4096), 128 threads, no `extra`), and runs the kernel's
//    arithmetic (hooktrace/record/fused_numerics.py _numerics_row) on the host, block
//    by block: per block, the finite abs-max (float32) and sum of squares (float64),
//    the NaN and inf counts, folded into out[row]. CUDA_ERROR_INVALID_VALUE for a
//    launch that breaks a check (or while set_fail_launch);
//  * counters of every call, and the last launch's shape.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "../../csrc/numerics_launch.h"

namespace fakecuda {

constexpr int kInvalidValue = 1, kInvalidImage = 200, kNoBinary = 209, kNotFound = 500;
constexpr int64_t kBlock = 4096;

std::atomic<bool> g_no_context{false}, g_fail_load{false}, g_fail_launch{false};
std::atomic<int64_t> g_ctx_calls{0}, g_loads{0}, g_functions{0}, g_launches{0}, g_rejected{0};
int g_context = 0;  // (its address is the context)
std::atomic<int64_t> g_last_grid{0}, g_last_threads{0}, g_last_shared{0};
std::string g_last_error;

struct Function {
  int dtype;  // 0 fp32, 1 bf16, 2 fp16
};
Function g_functions_by_dtype[3] = {{0}, {1}, {2}};
int g_module = 0;

int ctx_get_current(void** ctx) {
  ++g_ctx_calls;
  *ctx = g_no_context.load() ? nullptr : &g_context;
  return 0;
}
int ctx_get_device(int* device) {
  *device = 0;
  return 0;
}
int module_load_data(void** module, const void* image) {
  ++g_loads;
  if (g_fail_load.load()) return kNoBinary;
  if (std::memcmp(image, "FAKE", 4) != 0) return kInvalidImage;
  *module = &g_module;
  return 0;
}
int module_get_function(void** function, void* module, const char* name) {
  ++g_functions;
  if (module != &g_module) return kInvalidValue;
  const std::string n(name);
  for (int d = 0; d < 3; ++d)
    if (n == std::string("fake_") + (d == 0 ? "fp32" : d == 1 ? "bf16" : "fp16")) {
      *function = &g_functions_by_dtype[d];
      return 0;
    }
  return kNotFound;
}

float load(int dtype, const void* x, int64_t i) {
  switch (dtype) {
    case 0: return static_cast<const float*>(x)[i];
    case 1: return static_cast<float>(static_cast<const c10::BFloat16*>(x)[i]);
    default: return static_cast<float>(static_cast<const c10::Half*>(x)[i]);
  }
}

int reject(const char* why) {
  ++g_rejected;
  g_last_error = why;
  return kInvalidValue;
}

int launch_kernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                  unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  ++g_launches;
  if (g_fail_launch.load()) return reject("set_fail_launch");
  const auto* f = static_cast<const Function*>(function);
  if (f < g_functions_by_dtype || f >= g_functions_by_dtype + 3) return reject("function");
  if (extra != nullptr || stream != nullptr) return reject("extra or a stream (CPU tensors)");
  // the parameters as the kernel declares them: .u64 .ptr, .u64 .ptr, .u32, .u64, .u64 .ptr...
  uint64_t x, out, n, scratch0, scratch1;
  uint32_t row;
  std::memcpy(&x, params[0], 8);
  std::memcpy(&out, params[1], 8);
  std::memcpy(&row, params[2], 4);
  std::memcpy(&n, params[3], 8);
  std::memcpy(&scratch0, params[4], 8);
  std::memcpy(&scratch1, params[5], 8);
  if (scratch0 != 0 || scratch1 != 0) return reject("a scratch pointer");
  if (gx != (n + kBlock - 1) / kBlock || gy != 1 || gz != 1) return reject("grid");
  if (bx != 128 || by != 1 || bz != 1) return reject("block");
  g_last_grid = gx;
  g_last_threads = bx;
  g_last_shared = shared;
  const void* xp = reinterpret_cast<const void*>(x);
  double* o = reinterpret_cast<double*>(out) + 4 * static_cast<uint64_t>(row);
  for (unsigned pid = 0; pid < gx; ++pid) {
    float amax = 0.0f;
    double sumsq = 0.0;
    int nans = 0, infs = 0;
    const int64_t lo = pid * kBlock, hi = std::min<int64_t>(lo + kBlock, static_cast<int64_t>(n));
    for (int64_t i = lo; i < hi; ++i) {
      const float v = load(f->dtype, xp, i);
      const bool nan = v != v, inf = std::fabs(v) > 3.4028234663852886e38f;
      const float a = nan || inf ? 0.0f : std::fabs(v);
      amax = std::max(amax, a);
      sumsq += static_cast<double>(a) * static_cast<double>(a);
      nans += nan;
      infs += inf;
    }
    o[0] = std::max(o[0], static_cast<double>(amax));
    o[1] += sumsq;
    o[2] += nans;
    o[3] += infs;
  }
  return 0;
}

int get_error_string(int error, const char** text) {
  *text = error == kNoBinary    ? "no kernel image is available for execution on the device"
          : error == kInvalidImage ? "device kernel image is invalid"
          : error == kNotFound  ? "named symbol not found"
                                : "invalid argument";
  return 0;
}

hooktrace::NumericsDriver g_driver{ctx_get_current, ctx_get_device, module_load_data,
                                   module_get_function, launch_kernel, get_error_string};

}  // namespace fakecuda

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace fakecuda;
  m.def("driver", [] { return reinterpret_cast<uintptr_t>(&g_driver); });
  m.def("set_no_context", [](bool v) { g_no_context = v; });
  m.def("set_fail_load", [](bool v) { g_fail_load = v; });
  m.def("set_fail_launch", [](bool v) { g_fail_launch = v; });
  m.def("reset", [] {
    g_no_context = g_fail_load = g_fail_launch = false;
    g_ctx_calls = g_loads = g_functions = g_launches = g_rejected = 0;
    g_last_error.clear();
  });
  m.def("counters", [] {
    py::dict d;
    d["contexts"] = g_ctx_calls.load();
    d["loads"] = g_loads.load();
    d["functions"] = g_functions.load();
    d["launches"] = g_launches.load();
    d["rejected"] = g_rejected.load();
    d["last_error"] = g_last_error;
    d["grid"] = g_last_grid.load();
    d["threads"] = g_last_threads.load();
    d["shared"] = g_last_shared.load();
    return d;
  });
}
