// One validated view of the per-slice columns the trace writers read
// (chrome_writer.h, perfetto_writer.h), instead of a dozen positional arrays.
//
// Python passes the columns by name, a dict of 1-D numpy arrays
// (hooktrace/exporters/chrome.py, perfetto.py); bindings.cpp builds the view once
// with SliceColumns::from_python, which checks every column (a known name, the
// column's dtype, C-contiguous, one dimension, as many rows as start_ns) and throws
// a one-line ValueError naming the column otherwise. The writers then read plain
// pointers and never check a column again.
//
// Optional columns (see each writer) may be left out, None, or empty: the pointer
// is then null, which a writer reads as "none" (e.g. a forward-only run's node counts).
//
// Argument columns (ArgColumn): the slices' arguments no writer names, each a
// recorded quantity's (hooktrace.analysis.column_provider's export_args, e.g. FLOPs),
// given as a list of (name, array) pairs and written after a slice's own arguments, in
// the order given, where present.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace hooktrace {

// One named per-slice argument: an int64 (absent where < 0), float64 (absent where
// not finite, written as the shortest round-trip decimal) or bool (absent where
// false, written as true) array. Given as None or empty: absent on every slice.
struct ArgColumn {
  enum Type : uint8_t { kInt, kReal, kBool };
  std::string name;  // letters, digits and '_' (JSON-safe as is)
  Type type = kInt;
  const void* values = nullptr;  // null: absent on every slice

  bool present(size_t i) const;
  int64_t integer(size_t i) const { return static_cast<const int64_t*>(values)[i]; }
  double real(size_t i) const { return static_cast<const double*>(values)[i]; }
};

// Whether any column of `args` has values.
bool any_values(const std::vector<ArgColumn>& args);

struct SliceColumns {
  size_t n = 0;  // rows: the length of start_ns
  // Every writer's
  const int64_t* start_ns = nullptr;
  const int64_t* end_ns = nullptr;
  const uint8_t* cat = nullptr;    // index into the writer's category names
  const uint8_t* flags = nullptr;  // kSpan* (spans.h), kSlice* (perfetto_writer.h)
  // Chrome spans (write_chrome_events)
  const uint32_t* module = nullptr;  // module slot
  const uint32_t* tid = nullptr;     // the row drawn on
  const uint32_t* call = nullptr;
  const int64_t* nodes = nullptr;  // optional
  // Perfetto slices (write_perfetto_slices)
  const uint32_t* track = nullptr;
  const uint32_t* name = nullptr;
  const int64_t* str_a = nullptr;
  const int64_t* str_b = nullptr;
  const int64_t* int_a = nullptr;
  const int64_t* int_b = nullptr;
  // Autograd nodes (write_chrome_nodes; also `name`, `tid`)
  const uint64_t* seq = nullptr;
  const uint32_t* pass_id = nullptr;
  const int64_t* span_module = nullptr;  // the attributed span's module slot, -1: none
  // Optional, both writers
  const int64_t* extra = nullptr;  // index into the writer's extra fragments, -1: none
  std::vector<ArgColumn> args;     // the argument columns (add_args), in order

  // The view of `columns` (a dict: column name -> numpy array) for `writer` (its
  // name starts every error message): each of `required` must be given, each
  // given column must be one of `required` or `optional`.
  static SliceColumns from_python(const pybind11::handle& columns, const char* writer,
                                  std::initializer_list<const char*> required,
                                  std::initializer_list<const char*> optional);
  // Reads `args` (a sequence of (name, array or None) pairs) into `args`: each array a
  // C-contiguous 1-D int64, float64 or bool array of n rows (empty: absent), each name
  // as ArgColumn's; otherwise a one-line ValueError naming it.
  void add_args(const pybind11::handle& args, const char* writer);

 private:
  std::vector<pybind11::object> keep_;  // the arrays, alive as long as the view
};

}  // namespace hooktrace
