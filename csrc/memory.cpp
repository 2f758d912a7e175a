#include "memory.h"

#include <chrono>
#include <cstddef>
#include <mutex>
#include <stdexcept>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceType.h>
#include <torch/version.h>

// c10::DeviceAllocator (getDeviceStats without CUDA headers) exists from torch 2.9 on;
// with an older torch, CUDA memory is not sampled (set_memory says so) and CPU memory is.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#define HOOKTRACE_DEVICE_ALLOCATOR 1
#include <c10/core/CachingDeviceAllocator.h>
#endif

namespace hooktrace {

MemoryCounters cpu_memory;

namespace {

// In front of every block the counting allocator hands out. 64 bytes keep the
// data at the default CPU allocator's alignment (c10::gAlignment).
constexpr size_t kHeader = 64;

struct Header {
  void* inner_context;
  c10::DeleterFnPtr inner_deleter;
  size_t nbytes;
};
static_assert(sizeof(Header) <= kHeader, "the header must fit in front of the data");

void count_alloc(int64_t n) {
  raise_cpu_peak(cpu_memory.current.fetch_add(n, std::memory_order_relaxed) + n);
}

void counting_delete(void* data) {
  if (data == nullptr) return;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  cpu_memory.current.fetch_sub(static_cast<int64_t>(h->nbytes), std::memory_order_relaxed);
  c10::DeleterFnPtr deleter = h->inner_deleter;
  void* context = h->inner_context;
  if (deleter != nullptr) deleter(context);
}

struct CountingCPUAllocator final : c10::Allocator {
  c10::Allocator* inner = nullptr;  // set under install_mutex before installation

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return inner->allocate(0);
    c10::DataPtr block = inner->allocate(nbytes + kHeader);
    char* base = static_cast<char*>(block.get());
    c10::Device device = block.device();
    c10::DeleterFnPtr deleter = block.get_deleter();
    void* context = block.release_context();  // ownership moves into the header
    auto* h = reinterpret_cast<Header*>(base);
    h->inner_context = context;
    h->inner_deleter = deleter;
    h->nbytes = nbytes;
      count_alloc(static_cast<int64_t>(nbytes));
    void* data = base + kHeader;
    return {data, data, &counting_delete, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counting_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// Static storage: blocks made by the allocator outlive any trace.
CountingCPUAllocator counting_allocator;
std::mutex install_mutex;
int installs = 0;                       // guarded by install_mutex
c10::Allocator* replaced = nullptr;     // guarded by install_mutex
// torch's own highest priority for the CPU slot (Context::setDefaultMobileCPUAllocator):
// equal priority replaces it, and lets torch replace it back later.
constexpr uint8_t kPriority = 100;

}  // namespace

void install_cpu_memory() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (installs > 0) {
    ++installs;
    return;
  }
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == &counting_allocator) {
    // Put back by somebody else after an uninstall found their allocator on top:
    // it still forwards to the allocator it replaced first.
    replaced = counting_allocator.inner;
    installs = 1;
    return;
  }
  counting_allocator.inner = current;
  c10::SetCPUAllocator(&counting_allocator, kPriority);
  if (c10::GetCPUAllocator() != &counting_allocator) {
    throw std::runtime_error(
        "memory=True needs to count CPU allocations, but another CPU allocator was "
        "installed with a priority above torch's own (c10::SetCPUAllocator)");
  }
  replaced = current;
  installs = 1;
}

void uninstall_cpu_memory() {
  std::lock_guard<std::mutex> lock(install_mutex);
  if (installs == 0) return;
  if (--installs > 0) return;
  // Somebody else may have replaced the allocator meanwhile: theirs stays.
  if (c10::GetCPUAllocator() == &counting_allocator) c10::SetCPUAllocator(replaced, kPriority);
  replaced = nullptr;
}

bool cpu_memory_installed() {
  std::lock_guard<std::mutex> lock(install_mutex);
  return installs > 0;
}

c10::DeviceAllocator* cuda_device_allocator() {
#ifdef HOOKTRACE_DEVICE_ALLOCATOR
  // allocator_array's slot: null in a CPU-only build (GetAllocator checks in debug
  // builds only)
  c10::Allocator* a = c10::GetAllocator(c10::DeviceType::CUDA);
  return a == nullptr ? nullptr : dynamic_cast<c10::DeviceAllocator*>(a);
#else
  return nullptr;
#endif
}

void sample_cuda_memory(c10::DeviceAllocator* allocator, int device, int64_t* current,
                        int64_t* peak) {
#ifdef HOOKTRACE_DEVICE_ALLOCATOR
  auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(device));
  const auto& bytes = stats.allocated_bytes[0];  // StatType::AGGREGATE
  *current = bytes.current;
  *peak = bytes.peak;
#else
  (void)allocator, (void)device;  // never called: cuda_device_allocator() is null
  *current = *peak = 0;
#endif
}

double memory_sample_ns(int device, int64_t n) {
  if (n <= 0) return 0.0;
  c10::DeviceAllocator* cuda = nullptr;
  if (device >= 0) {
    cuda = cuda_device_allocator();
    if (cuda == nullptr)
      throw std::runtime_error("no CUDA allocator is registered (a CPU-only torch build, or torch < 2.9)");
  }
  int64_t current = 0, peak = 0, sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    if (cuda)
      sample_cuda_memory(cuda, device, &current, &peak);
    else
      sample_cpu_memory(&current, &peak);
    sink += current ^ peak;
  }
  const auto t1 = std::chrono::steady_clock::now();
  volatile int64_t keep = sink;  // (the loop is not optimized away)
  (void)keep;
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

}  // namespace hooktrace
