// The only pybind11 translation unit: registers what the components provide.
// No logic here; each function or type lives in its own csrc/<component>.cpp.
#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "hooktrace native core (private; use the hooktrace package)";
  // --- reader side (spans.h, chrome_writer.h) ---
  // --- recorder side (session.h, forward.h) ---
}
