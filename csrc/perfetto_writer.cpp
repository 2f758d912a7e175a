#include "perfetto_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "spans.h"

namespace py = pybind11;

namespace hooktrace {
namespace {

// Field numbers, from Perfetto's protos/perfetto/trace/ (stable by contract).
namespace f {
constexpr uint32_t kTracePacket = 1;  // Trace.packet
// TracePacket
constexpr uint32_t kClockSnapshot = 6, kTimestamp = 8, kSequenceId = 10, kTrackEvent = 11,
                   kInternedData = 12, kSequenceFlags = 13, kDefaults = 59;
// TracePacketDefaults / TrackEventDefaults
constexpr uint32_t kDefaultClockId = 58, kTrackEventDefaults = 11, kDefaultTrackUuid = 11;
// ClockSnapshot / ClockSnapshot.Clock
constexpr uint32_t kClocks = 1, kClockId = 1, kClockTimestamp = 2, kClockIncremental = 3;
// TrackEvent
constexpr uint32_t kCategoryIids = 3, kDebugAnnotations = 4, kType = 9, kNameIid = 10;
// DebugAnnotation
constexpr uint32_t kAnnNameIid = 1, kBoolValue = 2, kIntValue = 4, kDoubleValue = 5,
                   kStringValueIid = 17;
// InternedData; each entry is {iid = 1, name/str = 2}
constexpr uint32_t kEventCategories = 1, kEventNames = 2, kAnnotationNames = 3,
                   kAnnotationStrings = 29;
}  // namespace f

constexpr uint64_t kSeqIncrementalStateCleared = 1;
constexpr uint64_t kBootTime = 6;
// Clock ids 64-127 are sequence-scoped: each track's sequence defines its own.
constexpr uint64_t kIncrementalClock = 64;
constexpr uint64_t kSliceBegin = 1, kSliceEnd = 2;

// Debug annotation name iids; the argument names of the one convention
// (hooktrace/exporters/chrome.py), in the order Chrome's args list them.
enum Ann : uint64_t {
  kAnnModule = 1, kAnnType, kAnnCall, kAnnError, kAnnUnfinished, kAnnNodes, kAnnSeq, kAnnPass,
  kAnnClipped, kAnnFlops, kAnnTflops, kAnnFlopsCounted, kAnnKernel, kAnnDerived,
};
const char* const kAnnNames[] = {"module", "type",   "call",   "error",         "unfinished",
                                 "nodes",  "seq",    "pass",   "clipped",       "flops",
                                 "tflops", "flops_counted", "kernel", "derived"};

// Append-only protobuf encoding into a std::string.
class Proto {
 public:
  void varint(uint64_t v) {
    char tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
      tmp[n++] = static_cast<char>(v | 0x80);
      v >>= 7;
    }
    tmp[n++] = static_cast<char>(v);
    s_.append(tmp, n);
  }
  void uint(uint32_t field, uint64_t v) {
    varint(static_cast<uint64_t>(field) << 3);
    varint(v);
  }
  void bytes(uint32_t field, const char* p, size_t n) {
    varint((static_cast<uint64_t>(field) << 3) | 2);
    varint(n);
    s_.append(p, n);
  }
  void str(uint32_t field, const std::string& v) { bytes(field, v.data(), v.size()); }
  void message(uint32_t field, const Proto& m) { bytes(field, m.s_.data(), m.s_.size()); }
  // An {iid, name} interning entry.
  void entry(uint32_t field, uint64_t iid, const std::string& name) {
    Proto e;
    e.uint(1, iid);
    e.str(2, name);
    message(field, e);
  }
  size_t size() const { return s_.size(); }
  const char* data() const { return s_.data(); }
  bool empty() const { return s_.empty(); }
  void clear() { s_.clear(); }
  void flush(const py::object& write) {
    if (s_.empty()) return;
    write(py::bytes(s_.data(), s_.size()));
    s_.clear();
  }

 private:
  std::string s_;
};

// The hot path writes each packet straight into the output buffer: sizes are
// computed first, so no intermediate message is copied (3.5x faster than
// building nested Proto messages, measured on 1 M spans).
inline char* put_varint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}
inline size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
inline char* put_uint(char* p, uint32_t field, uint64_t v) {
  return put_varint(put_varint(p, static_cast<uint64_t>(field) << 3), v);
}
inline char* put_double(char* p, uint32_t field, double v) {  // wire type 1 (I64)
  p = put_varint(p, (static_cast<uint64_t>(field) << 3) | 1);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (int k = 0; k < 8; ++k) *p++ = static_cast<char>(bits >> (8 * k));  // little-endian
  return p;
}
inline char* put_len(char* p, uint32_t field, size_t n) {
  return put_varint(put_varint(p, (static_cast<uint64_t>(field) << 3) | 2), n);
}
// A length-delimited field whose body is [body, body_end).
inline char* put_message(char* p, uint32_t field, const char* body, const char* body_end) {
  const size_t n = static_cast<size_t>(body_end - body);
  p = put_len(p, field, n);
  std::memcpy(p, body, n);
  return p + n;
}

// Output bytes, flushed to write() in ~chunk_bytes pieces.
class Out {
 public:
  explicit Out(size_t chunk_bytes) : buf_(chunk_bytes + 65536, '\0') {}
  // Room for `need` more bytes; write them, then commit() the end pointer.
  char* room(size_t need) {
    if (n_ + need > buf_.size()) buf_.resize(std::max(2 * buf_.size(), n_ + need));
    return &buf_[n_];
  }
  void commit(const char* end) { n_ = static_cast<size_t>(end - buf_.data()); }
  void append(const Proto& m, uint32_t field);
  size_t size() const { return n_; }
  void flush(const py::object& write) {
    if (n_ == 0) return;
    write(py::bytes(buf_.data(), n_));
    n_ = 0;
  }

 private:
  std::string buf_;
  size_t n_ = 0;
};

void Out::append(const Proto& m, uint32_t field) {
  char* p = room(m.size() + 20);
  commit(put_message(p, field, m.data(), m.data() + m.size()));
}

std::vector<std::string> to_strings(const py::sequence& seq) {
  std::vector<std::string> out;
  out.reserve(py::len(seq));
  for (auto item : seq) out.push_back(item.cast<std::string>());
  return out;
}

template <typename T>
const T* checked(const py::array_t<T>& a, size_t n, const char* what) {
  if (a.ndim() != 1 || static_cast<size_t>(a.shape(0)) != n ||
      !(a.flags() & py::array::c_style)) {
    throw std::invalid_argument(std::string("write_perfetto_slices: ") + what +
                                " must be a contiguous 1-D array of length " + std::to_string(n));
  }
  return a.data();
}

void check_index(int64_t v, size_t size, size_t i, const char* what, bool allow_negative) {
  if ((v < 0 && !allow_negative) || (v >= 0 && static_cast<size_t>(v) >= size)) {
    throw std::out_of_range("write_perfetto_slices: slice " + std::to_string(i) + " has " + what +
                            " " + std::to_string(v) + " but the table has " +
                            std::to_string(size) + " entries");
  }
}

}  // namespace

py::dict write_perfetto_slices(py::object write, py::array_t<int64_t> start_ns,
                               py::array_t<int64_t> end_ns, py::array_t<uint32_t> track,
                               py::array_t<uint32_t> name, py::array_t<uint8_t> cat,
                               py::array_t<uint8_t> flags, py::array_t<int64_t> str_a,
                               py::array_t<int64_t> str_b, py::array_t<int64_t> int_a,
                               py::array_t<int64_t> int_b, py::array_t<int64_t> flops,
                               py::array_t<double> tflops, py::array_t<uint64_t> track_uuid,
                               py::sequence names, py::sequence strings, py::sequence cat_names,
                               uint32_t first_sequence_id, size_t chunk_bytes,
                               py::array_t<int64_t> extra, py::sequence extra_annotations) {
  const size_t n = static_cast<size_t>(start_ns.shape(0));
  const int64_t* start = checked(start_ns, n, "start_ns");
  const int64_t* end = checked(end_ns, n, "end_ns");
  const uint32_t* tr = checked(track, n, "track");
  const uint32_t* nm = checked(name, n, "name");
  const uint8_t* ct = checked(cat, n, "cat");
  const uint8_t* fl = checked(flags, n, "flags");
  const int64_t* sa = checked(str_a, n, "str_a");
  const int64_t* sb = checked(str_b, n, "str_b");
  const int64_t* ia = checked(int_a, n, "int_a");
  const int64_t* ib = checked(int_b, n, "int_b");
  const int64_t* fp = flops.size() == 0 ? nullptr : checked(flops, n, "flops");
  const double* tf = tflops.size() == 0 ? nullptr : checked(tflops, n, "tflops");
  const size_t n_tracks = static_cast<size_t>(track_uuid.shape(0));
  const uint64_t* uuid = checked(track_uuid, n_tracks, "track_uuid");
  const std::vector<std::string> name_table = to_strings(names);
  const std::vector<std::string> string_table = to_strings(strings);
  const std::vector<std::string> cats = to_strings(cat_names);
  const int64_t* ex = extra.size() == 0 ? nullptr : checked(extra, n, "extra");
  const std::vector<std::string> extras = to_strings(extra_annotations);
  // Checked up front so the encoding loop cannot index out of range.
  bool has_kernels = false;
  for (size_t i = 0; i < n; ++i) {
    check_index(tr[i], n_tracks, i, "track", false);
    check_index(nm[i], name_table.size(), i, "name", false);
    check_index(ct[i], cats.size(), i, "cat", false);
    check_index(sa[i], string_table.size(), i, "str_a", true);
    check_index(sb[i], string_table.size(), i, "str_b", true);
    if (ex != nullptr) check_index(ex[i], extras.size(), i, "extra", true);
    if (fl[i] & kSliceKernel) {
      check_index(sa[i], string_table.size(), i, "str_a", false);
      check_index(sb[i], string_table.size(), i, "str_b", false);
      check_index(ia[i], string_table.size(), i, "int_a", false);
      has_kernels = true;
    }
  }

  // Group by track, keeping input order within a track (counting sort).
  std::vector<size_t> first(n_tracks + 1, 0);
  for (size_t i = 0; i < n; ++i) ++first[tr[i] + 1];
  for (size_t t = 0; t < n_tracks; ++t) first[t + 1] += first[t];
  std::vector<size_t> order(n);
  {
    std::vector<size_t> next(first.begin(), first.end() - 1);
    for (size_t i = 0; i < n; ++i) order[next[tr[i]]++] = i;
  }
  // A slice with end < start (a clock that went backwards) is drawn empty, as
  // lanes.h treats it.
  auto stop = [&](size_t i) { return std::max(start[i], end[i]); };
  auto before = [&](size_t a, size_t b) {
    return start[a] < start[b] || (start[a] == start[b] && stop(a) > stop(b));
  };

  Out out(chunk_bytes);
  Proto pkt, interned;
  std::vector<uint8_t> name_seen(name_table.size()), string_seen(string_table.size());
  std::vector<size_t> stack;
  uint64_t written = 0, not_nested = 0;

  for (size_t t = 0; t < n_tracks; ++t) {
    auto b = order.begin() + static_cast<std::ptrdiff_t>(first[t]);
    auto e = order.begin() + static_cast<std::ptrdiff_t>(first[t + 1]);
    if (b == e) continue;
    // Spans come in pre-order already (spans.h): sort only the tracks that
    // need it (backward lanes holding autograd nodes).
    if (!std::is_sorted(b, e, before)) std::stable_sort(b, e, before);
    const uint64_t seq = first_sequence_id + t;
    const int64_t t0 = start[*b];
    int64_t last = t0;

    pkt.clear();
    pkt.uint(f::kSequenceId, seq);
    pkt.uint(f::kSequenceFlags, kSeqIncrementalStateCleared);
    {
      Proto defaults, te_defaults;
      te_defaults.uint(f::kDefaultTrackUuid, uuid[t]);
      defaults.uint(f::kDefaultClockId, kIncrementalClock);
      defaults.message(f::kTrackEventDefaults, te_defaults);
      pkt.message(f::kDefaults, defaults);
    }
    interned.clear();
    for (size_t c = 0; c < cats.size(); ++c) interned.entry(f::kEventCategories, c + 1, cats[c]);
    // (the FLOP and kernel argument names only when there are FLOPs / kernel slices:
    // a run without them is written byte for byte as before they existed)
    const uint64_t n_ann = has_kernels ? sizeof kAnnNames / sizeof kAnnNames[0]
                           : fp != nullptr || tf != nullptr ? kAnnFlopsCounted
                                                            : kAnnClipped;
    for (uint64_t a = 0; a < n_ann; ++a) {
      interned.entry(f::kAnnotationNames, a + 1, kAnnNames[a]);
    }
    pkt.message(f::kInternedData, interned);
    out.append(pkt, f::kTracePacket);

    pkt.clear();
    pkt.uint(f::kSequenceId, seq);
    {
      Proto snapshot, clock;
      clock.uint(f::kClockId, kIncrementalClock);
      clock.uint(f::kClockTimestamp, static_cast<uint64_t>(t0));
      clock.uint(f::kClockIncremental, 1);
      snapshot.message(f::kClocks, clock);
      clock.clear();
      clock.uint(f::kClockId, kBootTime);
      clock.uint(f::kClockTimestamp, static_cast<uint64_t>(t0));
      snapshot.message(f::kClocks, clock);
      pkt.message(f::kClockSnapshot, snapshot);
    }
    out.append(pkt, f::kTracePacket);
    std::fill(name_seen.begin(), name_seen.end(), 0);
    std::fill(string_seen.begin(), string_seen.end(), 0);

    // One TracePacket {timestamp: delta, seq, [interned_data], track_event: ev}.
    auto emit = [&](int64_t ts, const char* ev, const char* ev_end) {
      const uint64_t delta = static_cast<uint64_t>(ts - last);
      const size_t ev_len = static_cast<size_t>(ev_end - ev);
      size_t body = 2 + varint_size(delta) + varint_size(seq) + 1 + varint_size(ev_len) + ev_len;
      if (!interned.empty()) body += 1 + varint_size(interned.size()) + interned.size();
      char* p = out.room(body + 11);
      p = put_len(p, f::kTracePacket, body);
      p = put_uint(p, f::kTimestamp, delta);
      p = put_uint(p, f::kSequenceId, seq);
      if (!interned.empty()) {
        p = put_message(p, f::kInternedData, interned.data(), interned.data() + interned.size());
      }
      out.commit(put_message(p, f::kTrackEvent, ev, ev_end));
      last = ts;
      if (out.size() >= chunk_bytes) out.flush(write);
    };
    const char end_event[] = {static_cast<char>(f::kType << 3), static_cast<char>(kSliceEnd)};
    auto emit_end = [&](size_t i) {
      interned.clear();
      emit(stop(i), end_event, end_event + sizeof end_event);
    };
    // DebugAnnotation {name_iid, <value_field>: v} appended at q.
    auto annotate = [](char* q, uint64_t name_iid, uint32_t value_field, uint64_t v) {
      char a[24];
      char* r = put_uint(put_uint(a, f::kAnnNameIid, name_iid), value_field, v);
      return put_message(q, f::kDebugAnnotations, a, r);
    };
    auto annotate_double = [](char* q, uint64_t name_iid, double v) {
      char a[24];
      char* r = put_double(put_uint(a, f::kAnnNameIid, name_iid), f::kDoubleValue, v);
      return put_message(q, f::kDebugAnnotations, a, r);
    };
    auto string_iid = [&](size_t s) -> uint64_t {
      if (!string_seen[s]) {
        string_seen[s] = 1;
        interned.entry(f::kAnnotationStrings, s + 1, string_table[s]);
      }
      return s + 1;
    };
    auto emit_begin = [&](size_t i) {
      interned.clear();
      // type, name_iid, category_iids (<= 2+6+6 bytes) and at most 10 annotations of
      // <= 2+1+2+10 bytes
      char ev[192];
      char* q = put_uint(ev, f::kType, kSliceBegin);
      if (!name_seen[nm[i]]) {
        name_seen[nm[i]] = 1;
        interned.entry(f::kEventNames, nm[i] + 1ull, name_table[nm[i]]);
      }
      q = put_uint(q, f::kNameIid, nm[i] + 1ull);
      q = put_uint(q, f::kCategoryIids, ct[i] + 1ull);
      if (fl[i] & kSliceKernel) {
        q = annotate(q, kAnnModule, f::kStringValueIid, string_iid(static_cast<size_t>(sa[i])));
        q = annotate(q, kAnnType, f::kStringValueIid, string_iid(static_cast<size_t>(sb[i])));
        q = annotate(q, kAnnKernel, f::kStringValueIid, string_iid(static_cast<size_t>(ia[i])));
        q = annotate(q, kAnnDerived, f::kBoolValue, 1);
      } else if (fl[i] & kSliceNode) {
        q = annotate(q, kAnnSeq, f::kIntValue, static_cast<uint64_t>(ia[i]));
        if (sa[i] >= 0) {
          q = annotate(q, kAnnModule, f::kStringValueIid, string_iid(static_cast<size_t>(sa[i])));
        }
        if (ib[i] >= 0) q = annotate(q, kAnnPass, f::kIntValue, static_cast<uint64_t>(ib[i]));
      } else {
        if (sa[i] >= 0) {
          q = annotate(q, kAnnModule, f::kStringValueIid, string_iid(static_cast<size_t>(sa[i])));
        }
        if (sb[i] >= 0) {
          q = annotate(q, kAnnType, f::kStringValueIid, string_iid(static_cast<size_t>(sb[i])));
        }
        q = annotate(q, kAnnCall, f::kIntValue, static_cast<uint64_t>(ia[i]));
        if (fl[i] & kSpanError) q = annotate(q, kAnnError, f::kBoolValue, 1);
        if (fl[i] & kSpanUnfinished) q = annotate(q, kAnnUnfinished, f::kBoolValue, 1);
        if (ib[i] >= 0) q = annotate(q, kAnnNodes, f::kIntValue, static_cast<uint64_t>(ib[i]));
        if (fp != nullptr && fp[i] >= 0) {
          q = annotate(q, kAnnFlops, f::kIntValue, static_cast<uint64_t>(fp[i]));
        }
        if (tf != nullptr && std::isfinite(tf[i])) q = annotate_double(q, kAnnTflops, tf[i]);
        if (fl[i] & kSpanFlopsCounted) q = annotate(q, kAnnFlopsCounted, f::kBoolValue, 1);
      }
      if (fl[i] & kSpanClipped) q = annotate(q, kAnnClipped, f::kBoolValue, 1);
      if (ex != nullptr && ex[i] >= 0) {  // encoded debug_annotations fields, appended
        std::string with(ev, q);
        with += extras[static_cast<size_t>(ex[i])];
        emit(start[i], with.data(), with.data() + with.size());
        return;
      }
      emit(start[i], ev, q);
    };

    stack.clear();
    for (auto it = b; it != e; ++it) {
      const size_t i = *it;
      while (!stack.empty() && stop(stack.back()) <= start[i]) {
        emit_end(stack.back());
        stack.pop_back();
      }
      if (!stack.empty() && stop(i) > stop(stack.back())) {
        ++not_nested;
        continue;
      }
      emit_begin(i);
      stack.push_back(i);
      ++written;
    }
    while (!stack.empty()) {
      emit_end(stack.back());
      stack.pop_back();
    }
  }
  out.flush(write);
  py::dict result;
  result["slices"] = written;
  result["not_nested"] = not_nested;
  return result;
}

}  // namespace hooktrace
