#include "chrome_writer.h"

#include <charconv>
#include <stdexcept>
#include <string>
#include <vector>

#include "spans.h"

namespace py = pybind11;

namespace hooktrace {
namespace {

std::vector<std::string> to_strings(const py::sequence& seq) {
  std::vector<std::string> out;
  out.reserve(py::len(seq));
  for (auto item : seq) out.push_back(item.cast<std::string>());
  return out;
}

class Buffer {
 public:
  explicit Buffer(size_t capacity) { data_.reserve(capacity + 4096); }
  void add(const char* s, size_t n) { data_.append(s, n); }
  void add(const std::string& s) { data_.append(s); }
  template <size_t N>
  void lit(const char (&s)[N]) {
    data_.append(s, N - 1);
  }
  template <typename Int>
  void integer(Int v) {
    char tmp[24];
    auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    data_.append(tmp, r.ptr);
  }
  // The shortest decimal that reads back as v (finite v only).
  void real(double v) {
    char tmp[32];
    auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    data_.append(tmp, r.ptr);
  }
  // Integer nanoseconds as microseconds with exactly three decimals.
  void micros(int64_t ns) {
    uint64_t mag = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
    if (ns < 0) data_.push_back('-');
    integer(mag / 1000);
    const unsigned frac = static_cast<unsigned>(mag % 1000);
    const char digits[4] = {'.', static_cast<char>('0' + frac / 100),
                            static_cast<char>('0' + frac / 10 % 10),
                            static_cast<char>('0' + frac % 10)};
    data_.append(digits, 4);
  }
  size_t size() const { return data_.size(); }
  void flush(const py::object& write) {
    if (data_.empty()) return;
    write(py::bytes(data_.data(), data_.size()));
    data_.clear();
  }

 private:
  std::string data_;
};

}  // namespace

SliceColumns chrome_span_columns(const py::handle& columns, const py::handle& args) {
  SliceColumns c = SliceColumns::from_python(
      columns, "write_chrome_events", {"start_ns", "end_ns", "module", "tid", "call", "flags", "cat"},
      {"nodes", "extra"});
  c.add_args(args, "write_chrome_events");
  return c;
}

uint64_t write_chrome_events(const py::object& write, const SliceColumns& spans,
                             const py::sequence& names_json, const py::sequence& args_json,
                             const py::sequence& cat_names, const py::sequence& extra_json,
                             int64_t base_ns, uint32_t pid, size_t chunk_bytes) {
  const size_t n = spans.n;
  const int64_t* start = spans.start_ns;
  const int64_t* end = spans.end_ns;
  const uint32_t* mod = spans.module;
  const uint32_t* th = spans.tid;
  const uint32_t* cl = spans.call;
  const uint8_t* fl = spans.flags;
  const uint8_t* ct = spans.cat;
  // Forward-only traces pass no counts: a null column, no per-event branch cost
  // beyond one test.
  const int64_t* nd = spans.nodes;
  const int64_t* ex = spans.extra;
  // The argument columns with values, and their `,"name":` keys.
  std::vector<const ArgColumn*> arg_cols;
  std::vector<std::string> arg_keys;
  for (const ArgColumn& a : spans.args) {
    if (a.values == nullptr) continue;
    arg_cols.push_back(&a);
    arg_keys.push_back(",\"" + a.name + "\":");
  }
  const std::vector<std::string> names = to_strings(names_json);
  const std::vector<std::string> args = to_strings(args_json);
  const std::vector<std::string> extras = to_strings(extra_json);
  if (ex != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      if (ex[i] >= static_cast<int64_t>(extras.size()))
        throw std::invalid_argument("write_chrome_events: extra index out of range");
    }
  }
  const std::vector<std::string> cats = to_strings(cat_names);
  if (names.size() != args.size()) {
    throw std::invalid_argument("write_chrome_events: names_json and args_json differ in length");
  }
  // Checked up front so the formatting loop cannot index out of range.
  for (size_t i = 0; i < n; ++i) {
    if (mod[i] >= names.size()) {
      throw std::out_of_range("write_chrome_events: span " + std::to_string(i) + " has module " +
                              std::to_string(mod[i]) + " but the module table has " +
                              std::to_string(names.size()) + " entries");
    }
    if (ct[i] >= cats.size()) {
      throw std::out_of_range("write_chrome_events: span " + std::to_string(i) + " has cat " +
                              std::to_string(ct[i]) + " but only " +
                              std::to_string(cats.size()) + " categories are named");
    }
  }
  std::string pid_part = ",\"pid\":" + std::to_string(pid) + ",\"tid\":";

  Buffer buf(chunk_bytes);
  for (size_t i = 0; i < n; ++i) {
    buf.lit(",\n{\"ph\":\"X\",\"cat\":\"");
    buf.add(cats[ct[i]]);
    buf.lit("\",\"name\":");
    buf.add(names[mod[i]]);
    buf.add(pid_part);
    buf.integer(th[i]);
    buf.lit(",\"ts\":");
    buf.micros(start[i] - base_ns);
    buf.lit(",\"dur\":");
    buf.micros(end[i] - start[i]);
    buf.lit(",\"args\":");
    buf.add(args[mod[i]]);
    buf.lit(",\"call\":");
    buf.integer(cl[i]);
    if (fl[i] & kSpanError) buf.lit(",\"error\":true");
    if (fl[i] & kSpanUnfinished) buf.lit(",\"unfinished\":true");
    if (nd != nullptr && nd[i] >= 0) {
      buf.lit(",\"nodes\":");
      buf.integer(nd[i]);
    }
    for (size_t k = 0; k < arg_cols.size(); ++k) {
      const ArgColumn& a = *arg_cols[k];
      if (!a.present(i)) continue;
      buf.add(arg_keys[k]);
      if (a.type == ArgColumn::kInt) {
        buf.integer(a.integer(i));
      } else if (a.type == ArgColumn::kReal) {
        buf.real(a.real(i));
      } else {
        buf.lit("true");
      }
    }
    if (fl[i] & kSpanClipped) buf.lit(",\"clipped\":true");
    if (ex != nullptr && ex[i] >= 0) buf.add(extras[static_cast<size_t>(ex[i])]);
    buf.lit("}}");
    if (buf.size() >= chunk_bytes) buf.flush(write);
  }
  buf.flush(write);
  return n;
}

SliceColumns chrome_node_columns(const py::handle& columns) {
  return SliceColumns::from_python(
      columns, "write_chrome_nodes",
      {"start_ns", "end_ns", "name", "tid", "seq", "pass_id", "span_module"}, {"flags"});
}

uint64_t write_chrome_nodes(const py::object& write, const SliceColumns& nodes,
                            const py::sequence& node_names_json,
                            const py::sequence& module_names_json, const std::string& cat,
                            int64_t base_ns, uint32_t pid, size_t chunk_bytes) {
  const size_t n = nodes.n;
  const int64_t* start = nodes.start_ns;
  const int64_t* end = nodes.end_ns;
  const uint32_t* nm = nodes.name;
  const uint32_t* th = nodes.tid;
  const uint64_t* sq = nodes.seq;
  const uint32_t* ps = nodes.pass_id;
  const int64_t* mod = nodes.span_module;
  // Only filtered exports pass flags (kSpanClipped).
  const uint8_t* fl = nodes.flags;
  const std::vector<std::string> names = to_strings(node_names_json);
  const std::vector<std::string> modules = to_strings(module_names_json);
  for (size_t i = 0; i < n; ++i) {
    if (nm[i] >= names.size()) {
      throw std::out_of_range("write_chrome_nodes: node " + std::to_string(i) + " has name " +
                              std::to_string(nm[i]) + " but only " +
                              std::to_string(names.size()) + " node names are given");
    }
    if (mod[i] >= static_cast<int64_t>(modules.size())) {
      throw std::out_of_range("write_chrome_nodes: node " + std::to_string(i) + " has module " +
                              std::to_string(mod[i]) + " but the module table has " +
                              std::to_string(modules.size()) + " entries");
    }
  }
  const std::string head = ",\n{\"ph\":\"X\",\"cat\":\"" + cat + "\",\"name\":";
  const std::string pid_part = ",\"pid\":" + std::to_string(pid) + ",\"tid\":";

  Buffer buf(chunk_bytes);
  for (size_t i = 0; i < n; ++i) {
    buf.add(head);
    buf.add(names[nm[i]]);
    buf.add(pid_part);
    buf.integer(th[i]);
    buf.lit(",\"ts\":");
    buf.micros(start[i] - base_ns);
    buf.lit(",\"dur\":");
    buf.micros(end[i] - start[i]);
    buf.lit(",\"args\":{\"seq\":");
    buf.integer(sq[i]);
    buf.lit(",\"module\":");
    if (mod[i] >= 0) {
      buf.add(modules[static_cast<size_t>(mod[i])]);
    } else {
      buf.lit("\"\"");
    }
    buf.lit(",\"pass\":");
    if (ps[i] == UINT32_MAX) {
      buf.lit("null");
    } else {
      buf.integer(ps[i]);
    }
    if (fl != nullptr && (fl[i] & kSpanClipped)) buf.lit(",\"clipped\":true");
    buf.lit("}}");
    if (buf.size() >= chunk_bytes) buf.flush(write);
  }
  buf.flush(write);
  return n;
}

}  // namespace hooktrace
