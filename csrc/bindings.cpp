// The only pybind11 translation unit: registers what the components provide.
// No logic here; each function or type lives in its own csrc/<component>.cpp.
#include <pybind11/pybind11.h>

#include "chrome_writer.h"
#include "spans.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "hooktrace native core (private; use the hooktrace package)";
  // --- reader side (spans.h, chrome_writer.h) ---
  m.def("build_spans", &hooktrace::build_spans, "Pair ENTER/EXIT events into spans.");
  m.def("write_chrome_events", &hooktrace::write_chrome_events, "Stream spans as Chrome X events.");
  // --- recorder side (session.h, forward.h) ---
}
