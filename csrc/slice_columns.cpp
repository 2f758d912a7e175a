#include "slice_columns.h"

#include <pybind11/numpy.h>

#include <cctype>
#include <cmath>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace hooktrace {
namespace {

bool listed(std::initializer_list<const char*> names, const std::string& key) {
  for (const char* name : names) {
    if (key == name) return true;
  }
  return false;
}

template <typename T>
const char* dtype_name();
template <>
const char* dtype_name<int64_t>() { return "int64"; }
template <>
const char* dtype_name<uint64_t>() { return "uint64"; }
template <>
const char* dtype_name<uint32_t>() { return "uint32"; }
template <>
const char* dtype_name<uint8_t>() { return "uint8"; }
template <>
const char* dtype_name<double>() { return "float64"; }

// "int32 array of shape (5,)", "list", ...: what a column was given as.
std::string describe(const py::handle& v) {
  if (!py::isinstance<py::array>(v)) return Py_TYPE(v.ptr())->tp_name;
  auto a = py::reinterpret_borrow<py::array>(v);
  std::string shape;
  for (py::ssize_t d = 0; d < a.ndim(); ++d) {
    shape += (d ? ", " : "") + std::to_string(a.shape(d));
  }
  if (a.ndim() == 1) shape += ",";
  std::string s = py::str(a.dtype()).cast<std::string>() + " array of shape (" + shape + ")";
  if (!(a.flags() & py::array::c_style)) s += ", not contiguous";
  return s;
}

class Reader {
 public:
  Reader(const py::dict& columns, const char* writer, std::initializer_list<const char*> required,
         std::initializer_list<const char*> optional, std::vector<py::object>* keep)
      : columns_(columns), writer_(writer), required_(required), optional_(optional),
        keep_(keep) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(std::string(writer_) + ": " + what);
  }

  // Every given column is one this writer reads.
  void check_names() const {
    for (auto item : columns_) {
      const std::string key = py::str(item.first).cast<std::string>();
      if (!listed(required_, key) && !listed(optional_, key)) {
        fail("unknown column '" + key + "'");
      }
    }
  }

  // Points `slot` at column `key` if this writer reads it; the first column taken
  // (start_ns) sets the row count.
  template <typename T>
  void take(const char* key, const T*& slot) {
    const bool required = listed(required_, key);
    if (!required && !listed(optional_, key)) return;
    py::object v = columns_.contains(key) ? py::object(columns_[key]) : py::none();
    if (v.is_none()) {
      if (required) fail(std::string("column '") + key + "' is missing");
      return;
    }
    if (!py::array_t<T, py::array::c_style>::check_(v) ||
        py::reinterpret_borrow<py::array>(v).ndim() != 1) {
      fail(std::string("column '") + key + "' must be a C-contiguous 1-D " + dtype_name<T>() +
           " array, got " + describe(v));
    }
    auto a = py::reinterpret_borrow<py::array>(v);
    const size_t rows = static_cast<size_t>(a.shape(0));
    if (!required && rows == 0) return;  // an optional column given empty: none
    if (!have_rows_) {
      rows_ = rows;
      have_rows_ = true;
    } else if (rows != rows_) {
      fail(std::string("column '") + key + "' has " + std::to_string(rows) +
           " rows but start_ns has " + std::to_string(rows_));
    }
    slot = static_cast<const T*>(a.data());
    keep_->push_back(std::move(v));
  }

  size_t rows() const { return rows_; }

 private:
  const py::dict& columns_;
  const char* writer_;
  std::initializer_list<const char*> required_, optional_;
  std::vector<py::object>* keep_;
  size_t rows_ = 0;
  bool have_rows_ = false;
};

}  // namespace

SliceColumns SliceColumns::from_python(const py::handle& columns, const char* writer,
                                       std::initializer_list<const char*> required,
                                       std::initializer_list<const char*> optional) {
  if (!py::isinstance<py::dict>(columns)) {
    throw py::type_error(std::string(writer) + ": columns must be a dict of numpy arrays, got " +
                         Py_TYPE(columns.ptr())->tp_name);
  }
  SliceColumns c;
  const auto dict = py::reinterpret_borrow<py::dict>(columns);
  Reader r(dict, writer, required, optional, &c.keep_);
  r.check_names();
  if (!listed(required, "start_ns")) r.fail("start_ns must be a required column");
  r.take("start_ns", c.start_ns);  // first: it sets the row count
  r.take("end_ns", c.end_ns);
  r.take("cat", c.cat);
  r.take("flags", c.flags);
  r.take("module", c.module);
  r.take("tid", c.tid);
  r.take("call", c.call);
  r.take("nodes", c.nodes);
  r.take("track", c.track);
  r.take("name", c.name);
  r.take("str_a", c.str_a);
  r.take("str_b", c.str_b);
  r.take("int_a", c.int_a);
  r.take("int_b", c.int_b);
  r.take("seq", c.seq);
  r.take("pass_id", c.pass_id);
  r.take("span_module", c.span_module);
  r.take("extra", c.extra);
  c.n = r.rows();
  return c;
}

bool ArgColumn::present(size_t i) const {
  switch (type) {
    case kInt: return integer(i) >= 0;
    case kReal: return std::isfinite(real(i));
    case kBool: return static_cast<const bool*>(values)[i];
  }
  return false;
}

bool any_values(const std::vector<ArgColumn>& args) {
  for (const ArgColumn& a : args) {
    if (a.values != nullptr) return true;
  }
  return false;
}

void SliceColumns::add_args(const py::handle& args, const char* writer) {
  auto fail = [writer](const std::string& what) {
    throw std::invalid_argument(std::string(writer) + ": " + what);
  };
  for (auto item : py::reinterpret_borrow<py::sequence>(args)) {
    if (!py::isinstance<py::tuple>(item) || py::len(item) != 2 ||
        !py::isinstance<py::str>(item.cast<py::tuple>()[0])) {
      fail("an argument column must be a (name, array) pair, got " + describe(item));
    }
    const auto pair = item.cast<py::tuple>();
    ArgColumn a;
    a.name = pair[0].cast<std::string>();
    bool safe = !a.name.empty();
    for (char ch : a.name) safe &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
    if (!safe) fail("argument column name '" + a.name + "' is not letters, digits and '_'");
    for (const ArgColumn& b : this->args) {
      if (b.name == a.name) fail("argument column '" + a.name + "' is given twice");
    }
    py::object v = pair[1];
    if (!v.is_none()) {
      const bool one_d = py::isinstance<py::array>(v) &&
                         py::reinterpret_borrow<py::array>(v).ndim() == 1;
      if (one_d && py::array_t<int64_t, py::array::c_style>::check_(v)) {
        a.type = ArgColumn::kInt;
      } else if (one_d && py::array_t<double, py::array::c_style>::check_(v)) {
        a.type = ArgColumn::kReal;
      } else if (one_d && py::array_t<bool, py::array::c_style>::check_(v)) {
        a.type = ArgColumn::kBool;
      } else {
        fail("argument column '" + a.name +
             "' must be a C-contiguous 1-D int64, float64 or bool array, got " + describe(v));
      }
      auto arr = py::reinterpret_borrow<py::array>(v);
      const size_t rows = static_cast<size_t>(arr.shape(0));
      if (rows != 0 && rows != n) {
        fail("argument column '" + a.name + "' has " + std::to_string(rows) +
             " rows but start_ns has " + std::to_string(n));
      }
      if (rows != 0) {
        a.values = arr.data();
        keep_.push_back(std::move(v));
      }
    }
    this->args.push_back(std::move(a));
  }
}

}  // namespace hooktrace
