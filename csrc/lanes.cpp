#include "lanes.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace hooktrace {
namespace {

struct Key {
  uint32_t group;
  int64_t start, end;
};

// Visiting order: (group, start asc, end desc, index asc).
bool before(const Key& a, size_t ia, const Key& b, size_t ib) {
  if (a.group != b.group) return a.group < b.group;
  if (a.start != b.start) return a.start < b.start;
  if (a.end != b.end) return a.end > b.end;
  return ia < ib;
}

}  // namespace

std::vector<uint32_t> assign_lane_table(const int64_t* start, const int64_t* end,
                                        const uint32_t* group, const int64_t* prefer, size_t n) {
  std::vector<Key> key(n);
  for (size_t i = 0; i < n; ++i) key[i] = Key{group[i], start[i], std::max(start[i], end[i])};
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // Backward spans arrive sorted by (tid, start, depth), which is nearly always
  // already this order: skip the O(n log n) sort when a linear check says so.
  bool sorted = true;
  for (size_t i = 1; i < n && sorted; ++i) sorted = before(key[i - 1], i - 1, key[i], i);
  if (!sorted) {
    std::sort(order.begin(), order.end(),
              [&key](size_t a, size_t b) { return before(key[a], a, key[b], b); });
  }

  constexpr uint32_t kUnplaced = UINT32_MAX;
  std::vector<uint32_t> lane(n, kUnplaced);
  // lanes[k]: ends of the open intervals of lane k, innermost last. Cleared,
  // not freed, between groups.
  std::vector<std::vector<int64_t>> lanes;
  size_t used = 0;  // lanes opened in the current group
  for (size_t pos = 0; pos < n; ++pos) {
    const size_t i = order[pos];
    const Key& k = key[i];
    if (pos > 0 && key[order[pos - 1]].group != k.group) {
      for (size_t l = 0; l < used; ++l) lanes[l].clear();
      used = 0;
    }
    auto fits = [&](size_t l) {
      std::vector<int64_t>& stack = lanes[l];
      while (!stack.empty() && stack.back() <= k.start) stack.pop_back();
      return stack.empty() || stack.back() >= k.end;
    };
    size_t l = used;
    if (prefer != nullptr && prefer[i] >= 0 && static_cast<size_t>(prefer[i]) < n) {
      const size_t p = static_cast<size_t>(prefer[i]);
      if (key[p].group == k.group && lane[p] != kUnplaced && fits(lane[p])) l = lane[p];
    }
    if (l == used) {
      for (l = 0; l < used; ++l) {
        if (fits(l)) break;
      }
    }
    if (l == used) {
      if (used == lanes.size()) lanes.emplace_back();
      ++used;
    }
    lanes[l].push_back(k.end);
    lane[i] = static_cast<uint32_t>(l);
  }
  return lane;
}

py::array_t<uint32_t> assign_lanes(py::array_t<int64_t> start_ns, py::array_t<int64_t> end_ns,
                                   py::array_t<uint32_t> group,
                                   std::optional<py::array_t<int64_t>> prefer) {
  const py::ssize_t n = start_ns.ndim() == 1 ? start_ns.shape(0) : -1;
  for (const py::array* a : {static_cast<const py::array*>(&start_ns),
                             static_cast<const py::array*>(&end_ns),
                             static_cast<const py::array*>(&group)}) {
    if (n < 0 || a->ndim() != 1 || a->shape(0) != n || !(a->flags() & py::array::c_style)) {
      throw std::invalid_argument(
          "assign_lanes: start_ns (int64), end_ns (int64) and group (uint32) must be "
          "contiguous 1-D arrays of one length");
    }
  }
  if (prefer && (prefer->ndim() != 1 || prefer->shape(0) != n ||
                 !(prefer->flags() & py::array::c_style))) {
    throw std::invalid_argument("assign_lanes: prefer must be a contiguous 1-D int64 array of "
                                "the same length as start_ns");
  }
  const int64_t* hint = prefer ? prefer->data() : nullptr;
  std::vector<uint32_t> lane;
  {
    py::gil_scoped_release nogil;
    lane = assign_lane_table(start_ns.data(), end_ns.data(), group.data(), hint,
                             static_cast<size_t>(n));
  }
  py::array_t<uint32_t> out(n);
  std::copy(lane.begin(), lane.end(), out.mutable_data());
  return out;
}

}  // namespace hooktrace
