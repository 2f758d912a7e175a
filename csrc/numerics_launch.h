// The fused numerics kernel launched from C++ (issue #50): numerics=True on a CUDA model
// reduces each module output with one fused Triton kernel (hooktrace/record/
// fused_numerics.py); Triton's Python launcher cost ~24 us of host time per tensor
// (+14.6 % per step on GPT-2 124M, an H200). Here the same kernel, compiled once per
// (dtype, variant) by Triton, is loaded with cuModuleLoadData and queued with
// cuLaunchKernel on the tensor's current stream: no Python, no GIL, a few us.
//
// Why not batching per phase (torch._foreach_*, or one launch over a pointer table):
// a module's output is measured as it was when the call returned. A launch queued
// then reads it in stream order, before a later in-place op (ReLU(inplace=True), an
// optimizer step) changes it; a batch launched at the phase's end would read the
// changed values, or need a copy of every output (and hold every output until then:
// in inference, each is freed as soon as the next module used it).
//
// No CUDA toolkit at build: the driver API is resolved at run time (dlopen of
// libcuda.so.1, loaded by torch already), behind NumericsDriver, which a test replaces
// with a fake (tests/integration/test_numerics_launch.cpp) to run everything but the
// GPU on CPU tensors. Any failure (no driver, a module that does not load, a launch
// the driver refuses) turns the native launch off for the process, keeps the first
// failure's message (one line) and counts; that tensor and every later one take
// Triton's own launcher, as before.
//
// A launch, the parameters as the kernel takes them (Triton compiles the signature
// fixed by fused_numerics.py; its PTX's parameter list, read there, is the layout):
//
//   param  kind  bytes  value
//   0      'p'   8      x: the tensor's first element (a dense range of numel elements)
//   1      'p'   8      out: the [rows, 4] float64 buffer's first element
//   2      'i'   4      row: the call's row of `out`
//   3      'l'   8      n: numel
//   4...   'p'   8      Triton's hidden scratch pointers: null (the kernel uses none)
//
// grid (ceil(n / block), 1, 1), block (32 * num_warps, 1, 1), `shared` bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hooktrace {

// The driver API calls a launch needs, as the CUDA driver declares them (CUresult is
// an int-sized enum, 0 = CUDA_SUCCESS; CUcontext, CUmodule, CUfunction, CUstream are
// pointers; CUdevice an int).
struct NumericsDriver {
  int (*ctx_get_current)(void** ctx);
  int (*ctx_get_device)(int* device);
  int (*module_load_data)(void** module, const void* image);
  int (*module_get_function)(void** function, void* module, const char* name);
  int (*launch_kernel)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                       unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared,
                       void* stream, void** params, void** extra);
  int (*get_error_string)(int error, const char** text);  // (may be null)
};

// One compiled variant of the kernel: `image` (a cubin), its entry point `name`, the
// launch shape and the parameter layout (above: "ppil" then 'p' per hidden pointer).
struct NumericsKernel {
  std::string image;
  std::string name;
  std::string layout;
  int num_warps = 4;
  int shared = 0;
  int64_t block = 4096;
};

// Variants: per dtype (float32, bfloat16, float16), "aligned" (x 16-byte aligned and
// numel a multiple of 16: Triton's vectorized loads) and "any".
constexpr int kNumericsKeys = 6;
// The variant a tensor takes: 2 * dtype + (aligned ? 0 : 1); -1 for another dtype.
int numerics_kernel_key(c10::ScalarType dtype, uintptr_t data, int64_t numel);

// A launch's arguments, packed (params[i] points into slots[i]).
constexpr int kNumericsMaxParams = 8;
struct NumericsLaunch {
  uint32_t grid = 0, threads = 0, shared = 0;
  int nparams = 0;
  uint64_t slots[kNumericsMaxParams] = {};
  void* params[kNumericsMaxParams] = {};
};
// Packs a launch of `k` (false: a layout or shape this code does not launch).
bool plan_numerics_launch(const NumericsKernel& k, uintptr_t x, uintptr_t out, int64_t row,
                          int64_t n, NumericsLaunch* launch);
// Whether `k` can be launched here (the layout, the shape); else why not.
std::string check_numerics_kernel(const NumericsKernel& k);

// Registers a variant (throws std::invalid_argument for one check_numerics_kernel
// refuses). GIL held.
void set_numerics_kernel(int key, const NumericsKernel& k);
// Forgets every variant and loaded module handle (the modules stay loaded: a context
// may still run them), and turns the native launch back on. GIL held.
void reset_numerics_native();
// Whether the native launch is tried (set_numerics_native(false): never).
void set_numerics_native(bool on);

// Queues x's reduction into out[row] (out: float64 [rows, 4] on x's device) on x's
// device's current stream. False: not launched (no variant registered for x, native
// launch off or failed: the caller takes Triton's launcher). No exception leaves; no
// GIL needed. CUDA tensors; CPU tensors too while a test's driver is installed.
bool launch_numerics_native(const at::Tensor& x, const at::Tensor& out, int64_t row);

struct NumericsNativeState {
  bool on = true;          // tried for the next tensor
  int kernels = 0;         // variants registered
  uint64_t launches = 0;   // tensors launched natively
  uint64_t fallbacks = 0;  // tensors a registered variant could not take (no current
                           // context of the tensor's device, a failure)
  std::string error;       // the first failure, one line ("": none)
};
NumericsNativeState numerics_native_state();

// Tests: the driver (a NumericsDriver* as an integer; 0: the real one, found at the
// first launch).
void set_numerics_driver_for_tests(uintptr_t driver);

}  // namespace hooktrace
