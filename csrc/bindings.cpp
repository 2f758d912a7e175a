// The only pybind11 translation unit: registers what the components provide.
// No logic here; lambdas only adapt Python types (buffers, enums) to C++ ones.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <memory>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "backward.h"
#include "chrome_writer.h"
#include "cupti.h"
#include "event.h"
#include "gpu_time.h"
#include "kernel_marks.h"
#include "lanes.h"
#include "memory.h"
#include "module_call.h"
#include "numerics.h"
#include "numerics_launch.h"
#include "shapes.h"
#include "slice_columns.h"
#include "tensor_walk.h"
#include "perfetto_writer.h"
#include "session.h"
#include "spans.h"
#include "stream_writer.h"

namespace py = pybind11;
using hooktrace::Policy;
using hooktrace::Session;
using hooktrace::StreamWriter;

namespace {

Policy parse_policy(const std::string& name) {
  if (name == "drop") return Policy::kDrop;
  if (name == "ring") return Policy::kRing;
  throw py::value_error("policy must be 'drop' or 'ring', got '" + name + "'");
}

// Session::drain as a uint8 array of the 32-byte events (Python views it as EVENT_DTYPE).
py::array_t<uint8_t> drain_events(Session& s) {
  std::vector<hooktrace::Event> events;
  s.drain(&events);
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(events.size() * sizeof(hooktrace::Event)));
  if (!events.empty()) std::memcpy(out.mutable_data(), events.data(), out.size());
  return out;
}

uint64_t copy_events_into(Session& s, const py::buffer& out) {
  py::buffer_info info = out.request(/*writable=*/true);
  if (info.itemsize * info.size % sizeof(hooktrace::Event) != 0)
    throw py::value_error("buffer size is not a multiple of the 32-byte event");
  const uint64_t n = info.itemsize * info.size / sizeof(hooktrace::Event);
  return s.copy_events(static_cast<hooktrace::Event*>(info.ptr), n);
}

}  // namespace

// The torch this core was built against (setup.py: -DHOOKTRACE_TORCH_VERSION=<version>):
// hooktrace._native refuses to load it into another torch (issue #47: a build for 2.13
// loaded silently under 2.14.1).
#define HOOKTRACE_STR2(x) #x
#define HOOKTRACE_STR(x) HOOKTRACE_STR2(x)
#ifdef HOOKTRACE_TORCH_VERSION
#define HOOKTRACE_BUILT_TORCH HOOKTRACE_STR(HOOKTRACE_TORCH_VERSION)
#else
#define HOOKTRACE_BUILT_TORCH ""
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "hooktrace native core (private; use the hooktrace package)";
  m.attr("EVENT_SIZE") = sizeof(hooktrace::Event);
  m.attr("BUILT_TORCH_VERSION") = HOOKTRACE_BUILT_TORCH;
  // event.h's kinds and the flags each kind's events carry (event.h, numerics.h,
  // gpu_time.h), under hooktrace/_events.py's names: tests/unit/test_event_kinds.py
  // holds the two equal.
  {
    namespace h = hooktrace;
    py::dict kinds, flags;
    for (auto [name, value] : std::initializer_list<std::pair<const char*, int>>{
             {"ENTER", h::kEnter}, {"EXIT", h::kExit}, {"NODE_BEGIN", h::kNodeBegin},
             {"NODE_END", h::kNodeEnd}, {"STEP", h::kStep}, {"MEM_CPU", h::kMemCpu},
             {"MEM_CUDA", h::kMemCuda}, {"KERNEL_BEGIN", h::kKernelBegin},
             {"KERNEL_END", h::kKernelEnd}, {"SHAPES", h::kShapes}, {"NUMERICS", h::kNumerics},
             {"NUMERICS_VALUE", h::kNumericsValue}, {"GPU_MARK", h::kGpuMark},
             {"GPU_TIME", h::kGpuTime}, {"CUPTI_LAUNCH", h::kCuptiLaunch},
             {"CUPTI_KERNEL", h::kCuptiKernel}, {"CUPTI_KERNEL_MORE", h::kCuptiKernelMore},
             {"CUPTI_GRAPH_NODE", h::kCuptiGraphNode}})
      kinds[name] = value;
    for (auto [name, value] : std::initializer_list<std::pair<const char*, int>>{
             {"FLAG_ERROR", h::kFlagError}, {"FLAG_NO_GRAD", h::kFlagNoGrad},
             {"FLAG_EVAL_MODE", h::kFlagEvalMode}, {"NUM_BACKWARD", h::kNumBackward},
             {"NUM_SKIPPED", h::kNumSkipped}, {"NUM_FAILED", h::kNumFailed},
             {"NUM_DEFERRED", h::kNumDeferred}, {"NUM_NOT_WALKED", h::kNumNotWalked},
             {"GPU_EXIT", h::kGpuExit}, {"GPU_BACKWARD", h::kGpuBackward},
             {"GPU_KERNEL", h::kGpuKernel}})
      flags[name] = value;
    m.attr("EVENT_KINDS") = kinds;
    m.attr("EVENT_FLAGS") = flags;
  }
  hooktrace::init_tensor_walk();

  // --- reader side (spans.h, lanes.h, chrome_writer.h, perfetto_writer.h) ---
  m.def("build_spans", &hooktrace::build_spans, "Pair ENTER/EXIT events into spans.",
        py::arg("events"), py::arg("t_ns"), py::arg("post_hook_names") = std::vector<uint32_t>{});
  m.def("assign_lanes", &hooktrace::assign_lanes, "Lanes in which intervals nest strictly.",
        py::arg("start_ns"), py::arg("end_ns"), py::arg("group"), py::arg("prefer") = py::none());
  // The writers' columns come as a dict of named arrays, checked once here (slice_columns.h).
  m.def(
      "write_chrome_events",
      [](const py::object& write, const py::handle& columns, const py::sequence& names_json,
         const py::sequence& args_json, const py::sequence& cat_names,
         const py::sequence& extra_json, int64_t base_ns, uint32_t pid, size_t chunk_bytes,
         const py::sequence& args) {
        return hooktrace::write_chrome_events(write, hooktrace::chrome_span_columns(columns, args),
                                              names_json, args_json, cat_names, extra_json,
                                              base_ns, pid, chunk_bytes);
      },
      "Stream spans as Chrome X events.", py::arg("write"), py::arg("columns"), py::kw_only(),
      py::arg("names_json"), py::arg("args_json"), py::arg("cat_names"), py::arg("extra_json"),
      py::arg("base_ns"), py::arg("pid"), py::arg("chunk_bytes"), py::arg("args") = py::tuple());
  m.def(
      "write_chrome_nodes",
      [](const py::object& write, const py::handle& columns, const py::sequence& node_names_json,
         const py::sequence& module_names_json, const std::string& cat, int64_t base_ns,
         uint32_t pid, size_t chunk_bytes) {
        return hooktrace::write_chrome_nodes(write, hooktrace::chrome_node_columns(columns),
                                             node_names_json, module_names_json, cat, base_ns,
                                             pid, chunk_bytes);
      },
      "Stream autograd nodes as Chrome X events.", py::arg("write"), py::arg("columns"),
      py::kw_only(), py::arg("node_names_json"), py::arg("module_names_json"), py::arg("cat"),
      py::arg("base_ns"), py::arg("pid"), py::arg("chunk_bytes"));
  m.def(
      "write_perfetto_slices",
      [](const py::object& write, const py::handle& columns, py::array_t<uint64_t> track_uuid,
         const py::sequence& names, const py::sequence& strings, const py::sequence& cat_names,
         const py::sequence& extra_annotations, uint32_t first_sequence_id, size_t chunk_bytes,
         const py::sequence& args) {
        return hooktrace::write_perfetto_slices(write,
                                                hooktrace::perfetto_slice_columns(columns, args),
                                                track_uuid, names, strings, cat_names,
                                                extra_annotations, first_sequence_id, chunk_bytes);
      },
      "Stream slices as Perfetto TrackEvent packets, one sequence per track.", py::arg("write"),
      py::arg("columns"), py::kw_only(), py::arg("track_uuid"), py::arg("names"),
      py::arg("strings"), py::arg("cat_names"), py::arg("extra_annotations"),
      py::arg("first_sequence_id"), py::arg("chunk_bytes"), py::arg("args") = py::tuple());

  // --- recorder side (session.h, module_call.h) ---
  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init([](uint64_t capacity, const std::string& policy, uint32_t chunk_events) {
             return std::make_shared<Session>(capacity, parse_policy(policy), chunk_events);
           }),
           py::arg("capacity"), py::arg("policy") = "drop",
           py::arg("chunk_events") = Session::kDefaultChunkEvents)
      .def_property_readonly("id", &Session::id)
      .def_property_readonly("active", &Session::active)
      .def_property_readonly("capacity", &Session::capacity_events)
      .def_property_readonly("chunk_events", &Session::chunk_events)
      .def("start", &Session::start)
      .def("stop", &Session::stop)
      .def("stats",
           [](Session& s) {
             auto st = s.stats();
             py::dict d;
             d["events"] = st.events;
             d["dropped"] = st.dropped;
             d["overwritten"] = st.overwritten;
             d["threads"] = st.threads;
             d["chunks"] = st.chunks;
             d["free_chunks"] = st.free_chunks;
             return d;
           })
      .def("clock",
           [](Session& s) {
             const auto& c = s.clock();
             return py::make_tuple(c.ticks0, c.unix_ns0, c.ns_per_tick);
           })
      .def("copy_events", &copy_events_into, py::arg("out"))
      .def("record_step", &Session::record_step, py::arg("step"))
      .def("enable_collection",
           [](Session& s) { s.enable_streaming(std::make_shared<hooktrace::Wakeup>()); })
      .def("drain", &drain_events)
      .def("pause", &Session::pause)
      .def("resume", &Session::resume)
      .def("set_emit_names", &Session::set_emit_names, py::arg("names"))
      .def("add_emit_name", &Session::add_emit_name, py::arg("name"))
      .def("set_memory", &Session::set_memory, py::arg("cpu"), py::arg("cuda_device") = -1)
      .def_property_readonly("memory_cpu", &Session::memory_cpu)
      .def_property_readonly("memory_cuda_device", &Session::memory_cuda_device)
      .def_property_readonly("emits", &Session::emits)
      .def("set_shapes", &Session::set_shapes, py::arg("on"))
      .def_property_readonly("shapes", &Session::shapes)
      .def("set_gpu", &Session::set_gpu, py::arg("on"))
      .def_property_readonly("gpu", &Session::gpu)
      .def("set_numerics", &Session::set_numerics, py::arg("on"))
      .def_property_readonly("numerics", &Session::numerics)
      .def("set_nonfinite_callback",
           [](Session& s, py::object callback) {
             hooktrace::set_nonfinite_callback(&s, callback.ptr());
           },
           py::arg("callback"));
  // --- streaming (stream_writer.h): waits release the GIL, the writer never takes it ---
  py::class_<StreamWriter>(m, "StreamWriter")
      .def(py::init<std::shared_ptr<Session>, int, uint32_t>(), py::arg("session"), py::arg("fd"),
           py::arg("period_ms") = 10)
      .def("start", &StreamWriter::start)
      .def("set_rolling", [](StreamWriter& w, std::string path, std::string stem, py::bytes prefix,
                             uint64_t segment_bytes, uint64_t max_bytes) {
        w.set_rolling(std::move(path), std::move(stem), std::string(prefix), segment_bytes,
                      max_bytes);
      }, py::arg("path"), py::arg("stem"), py::arg("prefix"), py::arg("segment_bytes"),
         py::arg("max_bytes"))
      .def("fd", &StreamWriter::fd)
      .def("set_modules", &StreamWriter::set_modules, py::arg("first"), py::arg("entries"))
      // with the GIL held: no other Python thread is inside set_modules() meanwhile
      .def("before_fork", &StreamWriter::before_fork)
      .def("after_fork", &StreamWriter::after_fork, py::arg("in_child"))
      .def("flush", &StreamWriter::flush, py::call_guard<py::gil_scoped_release>())
      .def("stop", &StreamWriter::stop, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](StreamWriter& w) {
        auto st = w.stats();
        py::dict d;
        d["rounds"] = st.rounds;
        d["events"] = st.events;
        d["bytes"] = st.bytes;
        d["blocks"] = st.blocks;
        d["lost_events"] = st.lost_events;
        d["busy_ns"] = st.busy_ns;
        d["cpu_ns"] = st.cpu_ns;
        d["error"] = st.error;
        d["segments"] = st.segments;
        d["rolled_off_segments"] = st.rolled_off_segments;
        d["rolled_off_events"] = st.rolled_off_events;
        d["rolled_off_bytes"] = st.rolled_off_bytes;
        d["segment_events"] = st.segment_events;
        d["full_disk_rolled_off_segments"] = st.full_disk_rolled_off_segments;
        d["full_disk_lost_events"] = st.full_disk_lost_events;
        return d;
      });
  m.def("add_backward_session", &hooktrace::add_backward_session, py::arg("session"));
  m.def("remove_backward_session", &hooktrace::remove_backward_session, py::arg("session"));
  m.def("add_kernel_session", &hooktrace::add_kernel_session, py::arg("session"));
  m.def("remove_kernel_session", &hooktrace::remove_kernel_session, py::arg("session"));
  m.def("set_compiling", &hooktrace::set_compiling, py::arg("compiling"));
  m.def("node_names", &hooktrace::node_names);
  m.def("flush_numerics", [](std::shared_ptr<Session> s) { return hooktrace::flush_numerics(s.get()); },
        py::arg("session"), "Record the deferred numerics of the session (numerics.h).");
  m.def("forget_numerics", [](std::shared_ptr<Session> s) { hooktrace::forget_numerics(s.get()); },
        py::arg("session"));
  m.def("set_numerics_deferred", &hooktrace::set_numerics_deferred, py::arg("on"),
        "Tests: take the deferred numerics path on CPU too.");
  m.def("set_numerics_fused",
        [](py::object launcher, bool cpu) {
          hooktrace::set_numerics_fused(launcher.is_none() ? nullptr : launcher.ptr(), cpu);
        },
        py::arg("launcher"), py::arg("cpu") = false,
        "The fused deferred numerics launcher, or None (numerics.h).");
  m.def("numerics_fused_state", [] {
    auto [on, error] = hooktrace::numerics_fused_state();
    return py::make_tuple(on, error.empty() ? py::object(py::none()) : py::object(py::str(error)));
  }, "(a fused launcher is registered, the first failure's message or None).");
  m.def("numerics_leaf_hooks", &hooktrace::numerics_leaf_hooks,
        "Tests: leaf tensors holding a numerics gradient hook (numerics.h).");
  // --- the numerics kernel launched from C++ (numerics_launch.h) ---
  m.def("set_numerics_kernel",
        [](int key, py::bytes image, std::string name, std::string layout, int num_warps,
           int shared, int64_t block) {
          hooktrace::set_numerics_kernel(
              key, hooktrace::NumericsKernel{std::string(image), std::move(name), std::move(layout),
                                             num_warps, shared, block});
        },
        py::arg("key"), py::arg("image"), py::arg("name"), py::arg("layout"), py::arg("num_warps"),
        py::arg("shared"), py::arg("block"),
        "Register a compiled variant of the fused numerics kernel (numerics_launch.h).");
  m.def("reset_numerics_native", &hooktrace::reset_numerics_native,
        "Forget the registered numerics kernels and the failure; native launch on again.");
  m.def("set_numerics_native", &hooktrace::set_numerics_native, py::arg("on"),
        "Whether the fused numerics kernel is launched from C++ (numerics_launch.h).");
  m.def("numerics_native_state", [] {
    const auto st = hooktrace::numerics_native_state();
    py::dict d;
    d["on"] = st.on;
    d["kernels"] = st.kernels;
    d["launches"] = st.launches;
    d["fallbacks"] = st.fallbacks;
    d["error"] = st.error.empty() ? py::object(py::none()) : py::object(py::str(st.error));
    return d;
  }, "The native numerics launch: on, kernels, launches, fallbacks, error (numerics_launch.h).");
  m.def("numerics_kernel_key", [](py::handle x) {
    if (!THPVariable_Check(x.ptr())) throw py::type_error("numerics_kernel_key takes a tensor");
    const at::Tensor& t = THPVariable_Unpack(x.ptr());
    return hooktrace::numerics_kernel_key(t.scalar_type(), reinterpret_cast<uintptr_t>(t.const_data_ptr()),
                                          t.numel());
  }, py::arg("x"), "The kernel variant a dense tensor takes (-1: none).");
  m.def("numerics_launch_native", [](py::handle x, py::handle out, int64_t row) {
    if (!THPVariable_Check(x.ptr()) || !THPVariable_Check(out.ptr()))
      throw py::type_error("numerics_launch_native takes two tensors and a row");
    return hooktrace::launch_numerics_native(THPVariable_Unpack(x.ptr()), THPVariable_Unpack(out.ptr()),
                                             row);
  }, py::arg("x"), py::arg("out"), py::arg("row"),
        "Queue the fused numerics kernel from C++; False: not launched (numerics_launch.h).");
  m.def("numerics_launch_plan",
        [](std::string layout, int num_warps, int shared, int64_t block, uint64_t x, uint64_t out,
           int64_t row, int64_t n) -> py::object {
          hooktrace::NumericsKernel k{"-", "-", std::move(layout), num_warps, shared, block};
          hooktrace::NumericsLaunch l;
          if (!hooktrace::plan_numerics_launch(k, x, out, row, n, &l)) return py::none();
          py::list params;
          for (int i = 0; i < l.nparams; ++i)
            params.append(py::bytes(static_cast<const char*>(l.params[i]), sizeof(uint64_t)));
          py::dict d;
          d["grid"] = l.grid;
          d["threads"] = l.threads;
          d["shared"] = l.shared;
          d["params"] = params;
          return d;
        },
        py::arg("layout"), py::arg("num_warps"), py::arg("shared"), py::arg("block"), py::arg("x"),
        py::arg("out"), py::arg("row"), py::arg("n"),
        "Tests: a launch's shape and parameters as packed (8 bytes each), or None.");
  m.def("set_numerics_driver_for_tests", &hooktrace::set_numerics_driver_for_tests,
        py::arg("driver"), "Tests: a NumericsDriver* (as an int) in place of CUDA's; 0: CUDA's.");
  // --- device time (gpu_time.h) ---
  m.def("gpu_start", &hooktrace::gpu_start, py::arg("session"), py::arg("timer"),
        py::arg("pool_events"),
        "Create the session's timer: a device type ('cuda', 'xpu', 'privateuseone'), or "
        "'host' (tests).");
  m.def("gpu_resolve",
        [](std::shared_ptr<Session> s, bool wait) { return hooktrace::gpu_resolve(s.get(), wait); },
        py::arg("session"), py::arg("wait") = false,
        "Record the device times of the completed marks (all of them when wait).");
  m.def("gpu_stats", [](std::shared_ptr<Session> s) {
    auto st = hooktrace::gpu_stats(s.get());
    py::dict d;
    d["timer"] = st.timer;
    d["dropped"] = st.dropped;
    d["skipped_capturing"] = st.skipped_capturing;
    d["align_error_ns"] = st.align_error_ns;
    d["pending"] = st.pending;
    d["resolved"] = st.resolved;
    d["pool"] = st.pool;
    d["failed"] = st.failed;
    py::list devices;
    for (int i = 0; i < 32; ++i)
      if (st.devices >> i & 1) devices.append(i);
    d["devices"] = devices;
    d["queries"] = st.queries;
    d["realigned"] = st.realigned;
    d["max_realign_correction_ns"] = st.max_realign_correction_ns;
    d["opportunistic"] = st.opportunistic;
    d["align_waits"] = st.align_waits;
    d["align_estimated"] = st.align_estimated;
    return d;
  }, py::arg("session"));
  m.def("gpu_set_capturing", &hooktrace::gpu_set_capturing, py::arg("on"),
        "A CUDA graph is being captured: record no device time meanwhile.");
  // --- kernel busy time (cupti.h) ---
  m.def("cupti_start", &hooktrace::cupti_start, py::arg("candidates"), py::arg("buffer_bytes"),
        py::arg("max_buffers"), "Load libcupti and subscribe: '' or why not.");
  m.def("cupti_flush", &hooktrace::cupti_flush, py::arg("forced"),
        py::call_guard<py::gil_scoped_release>(), "Deliver completed activity records.");
  m.def("cupti_set_enabled", &hooktrace::cupti_set_enabled, py::arg("on"),
        "Callbacks and activity kinds on/off between timed steps.");
  m.def("cupti_stop", &hooktrace::cupti_stop, py::call_guard<py::gil_scoped_release>(),
        "Flush, disable and unsubscribe.");
  m.def("cupti_add_session", &hooktrace::cupti_add_session, py::arg("session"));
  m.def("cupti_remove_session", &hooktrace::cupti_remove_session, py::arg("session"));
  m.def("cupti_stats", [] {
    auto st = hooktrace::cupti_stats();
    py::dict d;
    d["running"] = st.running;
    d["library"] = st.library;
    d["launches"] = st.launches;
    d["records"] = st.records;
    d["cupti_dropped"] = st.cupti_dropped;
    d["buffers_refused"] = st.buffers_refused;
    d["graph_nodes"] = st.graph_nodes;
    d["other_kinds"] = st.other_kinds;
    d["names"] = st.names;
    d["clock_pairs"] = st.clock_pairs;
    return d;
  });
  m.def("shape_signatures", &hooktrace::shape_signatures, py::arg("first") = 0,
        "The process's shape signatures from index `first` (shapes.h).");
  m.def("now_ticks", &hooktrace::now_ticks);
  m.def("memory_sample_ns", &hooktrace::memory_sample_ns, py::arg("device"), py::arg("n"),
        py::call_guard<py::gil_scoped_release>(),
        "Benchmarks: ns per memory sample, CUDA allocator of `device` (< 0: CPU counters).");
  m.def("cpu_memory_installed", &hooktrace::cpu_memory_installed,
        "Whether hooktrace's counting CPU allocator is installed (memory=True).");
  m.def("cpu_memory_current", [] {
    return hooktrace::cpu_memory.current.load(std::memory_order_relaxed);
  }, "CPU bytes alive among the allocations hooktrace's counting allocator made.");

  if (hooktrace::add_module_call_type(m.ptr()) < 0) throw py::error_already_set();
  if (hooktrace::add_kernel_mark_functions(m.ptr()) < 0) throw py::error_already_set();
}
