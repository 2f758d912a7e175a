// The test-only binding of tests/integration/test_fake_device.py (issue #36): a fake
// accelerator for CPU-only CI, a DeviceGuardImplInterface for PrivateUse1 whose events
// behave like CUDA's (as c10/cuda/impl/CUDAGuardImpl.h + the CUDA runtime), so that
// hooktrace's real device path (csrc/gpu_time.cpp's DeviceBackend) runs in CI:
//  * EventFlag::PYTORCH_DEFAULT -> timing disabled, BACKEND_DEFAULT -> timing on;
//  * record: checks the event's device index against the stream's (same message as CUDA);
//  * an event "completes" lag_ns after it was recorded (host clock), in stream order:
//    a device running that far behind; after a wait has drained a stream, the next
//    event on it completes at once (an idle stream);
//  * queryEvent: no wait; synchronizeEvent / synchronizeStream: wait (counted);
//  * elapsedTime: both recorded, both timing, both complete (else throws like
//    cudaErrorNotReady / cudaErrorInvalidResourceHandle); float milliseconds, quantized
//    to resolution_ns (CUDA documents ~0.5 us);
//  * isStreamCapturing: a settable flag; recording a timing event while "capturing"
//    marks it captured, and query/elapsed on a captured event throw (as CUDA does);
//  * "poisoned" records: events recorded while set behave as captured ones (query and
//    elapsed throw) though isStreamCapturing says no: a capture nobody could see;
//  * drift: elapsed times scaled by (1 + ppm / 1e6), a device clock running fast;
//  * never idle (issue #50): a wait does not leave the stream idle, every event
//    completes lag_ns after its record even right after a wait (a GPU shared with
//    other processes, a host that always queues ahead);
//  * counters for every call, so a test can assert "no sync between step marks".
// Two fake devices; current device and current stream are thread-local.
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/extension.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

namespace fakedev {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

constexpr DeviceIndex kDevices = 2;
std::atomic<int64_t> g_lag_ns{0};
std::atomic<int64_t> g_resolution_ns{500};
std::atomic<bool> g_capturing{false};
std::atomic<bool> g_poison{false};
std::atomic<int64_t> g_drift_ppm{0};
std::atomic<bool> g_never_idle{false};
std::atomic<int64_t> g_records{0}, g_queries{0}, g_syncs{0}, g_elapsed{0}, g_live{0},
    g_creates{0}, g_destroys{0};
thread_local DeviceIndex t_device = 0;
thread_local std::array<c10::StreamId, kDevices> t_stream{};
// per (device, stream id < 64): completion time of the last work recorded there
std::array<std::array<std::atomic<int64_t>, 64>, kDevices> g_stream_done{};
// per (device, stream): a wait drained it and nothing was recorded since: the next
// event completes at once (an idle GPU stream), not `lag` later
std::array<std::array<std::atomic<bool>, 64>, kDevices> g_stream_idle{};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct FakeEvent {
  bool timing;
  DeviceIndex device;
  c10::StreamId stream = 0;
  bool recorded = false;
  bool captured = false;
  int64_t done_ns = 0;
};

struct FakeGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr DeviceType static_type = DeviceType::PrivateUse1;
  FakeGuardImpl() = default;
  explicit FakeGuardImpl(DeviceType t) { TORCH_CHECK(t == static_type); }
  DeviceType type() const override { return static_type; }
  Device exchangeDevice(Device d) const override {
    Device old(static_type, t_device);
    t_device = d.index();
    return old;
  }
  Device getDevice() const override { return Device(static_type, t_device); }
  void setDevice(Device d) const override {
    TORCH_CHECK(d.index() >= 0 && d.index() < kDevices, "fake device index out of range");
    t_device = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override { t_device = d.index(); }
  Stream getStream(Device d) const override {
    return Stream(Stream::UNSAFE, Device(static_type, d.index()), t_stream[d.index()]);
  }
  Stream getDefaultStream(Device d) const override {
    return Stream(Stream::UNSAFE, Device(static_type, d.index()), 0);
  }
  Stream getStreamFromGlobalPool(Device d, bool = false) const override {
    return Stream(Stream::UNSAFE, Device(static_type, d.index()), 1);
  }
  Stream getNewStream(Device d, int = 0) const override {
    return Stream(Stream::UNSAFE, Device(static_type, d.index()), 1);
  }
  Stream exchangeStream(Stream s) const override {
    Stream old = getStream(s.device());
    t_stream[s.device_index()] = s.id();
    return old;
  }
  DeviceIndex deviceCount() const noexcept override { return kDevices; }

  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    if (!event) return;
    delete static_cast<FakeEvent*>(event);
    g_live--;
    g_destroys++;
  }
  void record(void** event, const Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                device_index, " does not match recording stream's device index ",
                stream.device_index(), ".");
    auto* e = static_cast<FakeEvent*>(*event);
    if (!e) {
      TORCH_CHECK(flag == c10::EventFlag::PYTORCH_DEFAULT || flag == c10::EventFlag::BACKEND_DEFAULT,
                  "fake event received unknown flag");
      e = new FakeEvent{flag == c10::EventFlag::BACKEND_DEFAULT, stream.device_index()};
      g_live++;
      g_creates++;
    }
    g_records++;
    // stream order: done no earlier than the stream's previous work
    auto& last = g_stream_done[stream.device_index()][stream.id() & 63];
    const bool idle = g_stream_idle[stream.device_index()][stream.id() & 63].exchange(false);
    int64_t done = now_ns() + (idle ? 0 : g_lag_ns.load());
    int64_t prev = last.load();
    while (done > prev && !last.compare_exchange_weak(prev, done)) {
    }
    e->done_ns = std::max(done, prev);
    e->stream = stream.id();
    e->recorded = true;
    e->captured = g_capturing.load() || g_poison.load();
    *event = e;
  }
  void block(void* event, const Stream& stream) const override {}
  bool queryEvent(void* event) const override {
    if (!event) return true;
    auto* e = static_cast<FakeEvent*>(event);
    g_queries++;
    TORCH_CHECK(!e->captured, "fake CUDA error: operation not permitted on a captured event");
    return now_ns() >= e->done_ns;
  }
  bool queryStream(const Stream& s) const override {
    return now_ns() >= g_stream_done[s.device_index()][s.id() & 63].load();
  }
  void synchronizeStream(const Stream& s) const override {
    g_syncs++;
    while (now_ns() < g_stream_done[s.device_index()][s.id() & 63].load())
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (!g_never_idle.load()) g_stream_idle[s.device_index()][s.id() & 63] = true;
  }
  bool isStreamCapturing(const Stream&) const override { return g_capturing.load(); }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    g_syncs++;
    auto* e = static_cast<FakeEvent*>(event);
    TORCH_CHECK(!e->captured, "fake CUDA error: synchronize on a captured event");
    while (now_ns() < e->done_ns) std::this_thread::sleep_for(std::chrono::microseconds(20));
    // (the stream is idle if this was its last work)
    if (!g_never_idle.load() && g_stream_done[e->device][e->stream & 63].load() <= e->done_ns)
      g_stream_idle[e->device][e->stream & 63] = true;
  }
  void synchronizeDevice(const DeviceIndex) const override { g_syncs++; }
  double elapsedTime(void* event1, void* event2, const DeviceIndex) const override {
    TORCH_CHECK(event1 && event2, "Both events must be recorded before calculating elapsed time.");
    auto* a = static_cast<FakeEvent*>(event1);
    auto* b = static_cast<FakeEvent*>(event2);
    g_elapsed++;
    TORCH_CHECK(a->timing && b->timing, "fake CUDA error: invalid resource handle (timing disabled)");
    TORCH_CHECK(!a->captured && !b->captured, "fake CUDA error: invalid argument (captured event)");
    const int64_t t = now_ns();
    TORCH_CHECK(t >= a->done_ns && t >= b->done_ns, "fake CUDA error: device not ready");
    const int64_t res = std::max<int64_t>(1, g_resolution_ns.load());
    const int64_t qa = (a->done_ns / res) * res, qb = (b->done_ns / res) * res;
    const double scale = 1.0 + static_cast<double>(g_drift_ppm.load()) / 1e6;
    const float ms = static_cast<float>(static_cast<double>(qb - qa) * scale / 1e6);  // float, as CUDA
    return static_cast<double>(ms);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FakeGuardImpl);

}  // namespace fakedev

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace fakedev;
  m.def("set_lag_ns", [](int64_t v) { g_lag_ns = v; });
  m.def("set_resolution_ns", [](int64_t v) { g_resolution_ns = v; });
  m.def("set_capturing", [](bool v) { g_capturing = v; });
  m.def("set_poison", [](bool v) { g_poison = v; });
  m.def("set_drift_ppm", [](int64_t v) { g_drift_ppm = v; });
  m.def("set_never_idle", [](bool v) { g_never_idle = v; });
  m.def("set_device", [](int d) { t_device = static_cast<DeviceIndex>(d); });
  m.def("current_device", [] { return static_cast<int>(t_device); });
  m.def("counters", [] {
    py::dict d;
    d["records"] = g_records.load();
    d["queries"] = g_queries.load();
    d["syncs"] = g_syncs.load();
    d["elapsed"] = g_elapsed.load();
    d["live"] = g_live.load();
    d["creates"] = g_creates.load();
    d["destroys"] = g_destroys.load();
    return d;
  });
}
