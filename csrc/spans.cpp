#include "spans.h"

#include "backward_spans.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace py = pybind11;

namespace hooktrace {
namespace {

struct Frame {
  size_t span;        // index into the SpanTable
  int64_t child_sum;  // total duration of the direct children closed so far
};

// Stable grouping by tid in O(n): distinct tids are few, and consecutive events
// usually share a tid, so a one-entry cache in front of the hash map makes the
// lookup nearly free. Returns event indices ordered by (tid, recorded order) and
// fills `threads` (ascending) and `bounds` (group g = order[bounds[g]..bounds[g+1])).
std::vector<size_t> group_by_tid(const Event* events, size_t n, std::vector<uint32_t>& threads,
                                 std::vector<size_t>& bounds) {
  std::unordered_map<uint32_t, uint32_t> group_of;
  std::vector<uint32_t> group(n);
  std::vector<uint32_t> first_seen;  // tid per provisional group
  uint32_t last_tid = 0, last_group = UINT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t tid = events[i].tid;
    if (tid != last_tid || last_group == UINT32_MAX) {
      auto it = group_of.find(tid);
      if (it == group_of.end()) {
        it = group_of.emplace(tid, static_cast<uint32_t>(first_seen.size())).first;
        first_seen.push_back(tid);
      }
      last_tid = tid;
      last_group = it->second;
    }
    group[i] = last_group;
  }
  // Renumber groups so that they follow ascending tid.
  const size_t n_groups = first_seen.size();
  std::vector<uint32_t> by_tid(n_groups);
  for (uint32_t g = 0; g < n_groups; ++g) by_tid[g] = g;
  std::sort(by_tid.begin(), by_tid.end(),
            [&](uint32_t a, uint32_t b) { return first_seen[a] < first_seen[b]; });
  std::vector<uint32_t> rank(n_groups);
  threads.resize(n_groups);
  for (uint32_t r = 0; r < n_groups; ++r) {
    rank[by_tid[r]] = r;
    threads[r] = first_seen[by_tid[r]];
  }
  bounds.assign(n_groups + 1, 0);
  for (size_t i = 0; i < n; ++i) ++bounds[rank[group[i]] + 1];
  for (size_t g = 0; g < n_groups; ++g) bounds[g + 1] += bounds[g];
  std::vector<size_t> next(bounds.begin(), bounds.end() - 1);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[next[rank[group[i]]]++] = i;
  return order;
}

// How many open frames each key (module id, or node sequence number) has on
// a thread's stack. An EXIT whose module has no open frame is an orphan, known
// in O(1): scanning the stack for it would make D ENTERs followed by D stray
// EXITs (a damaged or crafted stream) cost O(D^2). When the key is open, the
// scan down to it closes every frame it passes, so it is paid for once per frame.
template <typename Key>
class OpenCount {
 public:
  // Keys below `dense` are counted in a vector, the rest in a hash map.
  explicit OpenCount(size_t dense) : dense_(dense, 0) {}
  void add(Key k) {
    if (k < dense_.size()) {
      ++dense_[static_cast<size_t>(k)];
    } else {
      ++sparse_[k];
    }
  }
  void remove(Key k) {  // k is open
    if (k < dense_.size()) {
      --dense_[static_cast<size_t>(k)];
    } else {
      auto it = sparse_.find(k);
      if (--it->second == 0) sparse_.erase(it);  // the map holds open keys only
    }
  }
  bool open(Key k) const {
    return k < dense_.size() ? dense_[static_cast<size_t>(k)] != 0 : sparse_.count(k) != 0;
  }

 private:
  std::vector<uint32_t> dense_;
  std::unordered_map<Key, uint32_t> sparse_;
};

// call = ordinal of a forward span among its module's forward spans, by
// (start, output index); output index is (tid, pre-order), so ties across
// threads break by tid. Recompute spans get theirs in backward_spans.cpp.
void assign_call_index(SpanTable& s) {
  const size_t n_all = s.module.size();
  s.call.assign(n_all, 0);
  std::vector<size_t> fwd;
  fwd.reserve(n_all);
  for (size_t i = 0; i < n_all; ++i)
    if (s.cat[i] == kCatForward) fwd.push_back(i);
  const size_t n = fwd.size();
  if (n == 0) return;
  const int64_t* start = s.start_ns.data();
  auto earlier = [start](size_t a, size_t b) {
    return start[a] < start[b] || (start[a] == start[b] && a < b);
  };
  uint32_t max_module = 0;
  for (size_t i : fwd) max_module = std::max(max_module, s.module[i]);
  const size_t n_modules = static_cast<size_t>(max_module) + 1;
  std::vector<size_t> order(n);
  if (n_modules > 2 * n + 4096) {
    // Sparse ids (not from a validated file): a comparison sort, not buckets.
    order = fwd;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return s.module[a] < s.module[b] || (s.module[a] == s.module[b] && earlier(a, b));
    });
    uint32_t k = 0;
    for (size_t j = 0; j < n; ++j) {
      if (j > 0 && s.module[order[j]] != s.module[order[j - 1]]) k = 0;
      s.call[order[j]] = k++;
    }
    return;
  }
  std::vector<size_t> bounds(n_modules + 1, 0);
  for (size_t i : fwd) ++bounds[s.module[i] + 1];
  for (size_t m = 0; m < n_modules; ++m) bounds[m + 1] += bounds[m];
  std::vector<size_t> next(bounds.begin(), bounds.end() - 1);
  for (size_t i : fwd) order[next[s.module[i]]++] = i;
  for (size_t m = 0; m < n_modules; ++m) {
    auto first = order.begin() + bounds[m], last = order.begin() + bounds[m + 1];
    // Already sorted in the common single-thread, monotonic-clock case.
    if (!std::is_sorted(first, last, earlier)) std::sort(first, last, earlier);
    uint32_t k = 0;
    for (auto it = first; it != last; ++it) s.call[*it] = k++;
  }
}

template <typename T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(owned->size()), owned->data(), free_when_done);
}

}  // namespace

SpanTable build_span_table(const Event* events, const int64_t* t_ns, size_t n,
                           const std::vector<uint32_t>& post_hook_names) {
  SpanTable s;
  std::vector<size_t> bounds;
  const std::vector<size_t> order = group_by_tid(events, n, s.threads, bounds);

  size_t n_enter = 0;
  uint32_t max_module = 0;
  for (size_t i = 0; i < n; ++i) {
    if (events[i].kind != kEnter) continue;
    ++n_enter;
    max_module = std::max(max_module, events[i].id);
  }
  // Validated files have dense module ids; sparse ones (synthetic) use the map.
  OpenCount<uint32_t> open_modules(max_module < 2 * n + 4096 ? size_t{max_module} + 1 : 0);
  OpenCount<uint64_t> open_nodes(0);
  for (auto* v : {&s.start_ns, &s.end_ns, &s.self_ns, &s.parent}) v->reserve(n_enter);
  for (auto* v : {&s.module, &s.tid, &s.depth, &s.rf_tid}) v->reserve(n_enter);
  s.seq_enter.reserve(n_enter);
  s.seq_exit.reserve(n_enter);
  s.flags.reserve(n_enter);
  s.cat.reserve(n_enter);

  std::vector<Frame> stack;
  auto close_top = [&](int64_t end, uint8_t flags) {
    const Frame f = stack.back();
    stack.pop_back();
    open_modules.remove(s.module[f.span]);
    const int64_t dur = end - s.start_ns[f.span];
    s.end_ns[f.span] = end;
    s.self_ns[f.span] = dur - f.child_sum;
    s.flags[f.span] |= flags;
    if (flags & kSpanUnfinished) ++s.unfinished;
    if (!stack.empty()) stack.back().child_sum += dur;
  };

  NodeTable& nd = s.nodes;
  std::vector<Frame> node_stack;  // Frame::span indexes nd here
  auto close_node = [&](int64_t end, uint32_t task, bool unfinished) {
    const Frame f = node_stack.back();
    node_stack.pop_back();
    open_nodes.remove(nd.seq[f.span]);
    const int64_t dur = end - nd.start_ns[f.span];
    nd.end_ns[f.span] = end;
    nd.self_ns[f.span] = dur - f.child_sum;
    nd.task[f.span] = task;
    if (unfinished) ++s.unfinished;
    if (!node_stack.empty()) node_stack.back().child_sum += dur;
  };

  for (size_t g = 0; g + 1 < bounds.size(); ++g) {
    const uint32_t tid = s.threads[g];
    stack.clear();  // both empty already: the previous thread closed all its frames
    node_stack.clear();
    int64_t last_t = 0;
    for (size_t k = bounds[g]; k < bounds[g + 1]; ++k) {
      const size_t i = order[k];
      const Event& e = events[i];
      const int64_t t = t_ns[i];
      last_t = t;
      switch (e.kind) {
        case kEnter: {
          const size_t span = s.start_ns.size();
          s.start_ns.push_back(t);
          s.end_ns.push_back(t);
          s.self_ns.push_back(0);
          s.parent.push_back(stack.empty() ? -1 : static_cast<int64_t>(stack.back().span));
          s.module.push_back(e.id);
          s.tid.push_back(tid);
          s.depth.push_back(static_cast<uint32_t>(stack.size()));
          s.flags.push_back((e.flags & (kFlagNoGrad | kFlagEvalMode)) ? kSpanEval : 0);
          s.cat.push_back(node_stack.empty() ? kCatForward : kCatRecompute);
          s.seq_enter.push_back(e.seq);
          s.seq_exit.push_back(e.seq);  // until the EXIT: an empty range
          s.rf_tid.push_back(e.rf_tid);
          stack.push_back(Frame{span, 0});
          open_modules.add(e.id);
          break;
        }
        case kExit: {
          if (!open_modules.open(e.id)) {
            ++s.orphan_exits;
            break;
          }
          size_t match = stack.size();
          while (s.module[stack[match - 1].span] != e.id) --match;
          // Frames above the matching one lost their EXIT (e.g. the buffer
          // dropped it): close them here rather than mis-pair this EXIT.
          while (stack.size() > match) close_top(t, kSpanUnfinished);
          s.seq_exit[stack.back().span] = e.seq;
          close_top(t, (e.flags & kFlagError) ? kSpanError : 0);
          break;
        }
        case kNodeBegin: {
          ++s.node_events;
          const size_t node = nd.start_ns.size();
          nd.start_ns.push_back(t);
          nd.end_ns.push_back(t);
          nd.self_ns.push_back(0);
          nd.seq.push_back(e.seq);
          nd.name.push_back(e.id);
          nd.tid.push_back(tid);
          nd.fwd_tid.push_back(e.rf_tid);
          nd.parent.push_back(node_stack.empty() ? -1 : static_cast<int64_t>(node_stack.back().span));
          nd.task.push_back(UINT32_MAX);
          node_stack.push_back(Frame{node, 0});
          open_nodes.add(e.seq);
          break;
        }
        case kNodeEnd: {
          ++s.node_events;
          if (!open_nodes.open(e.seq)) {
            ++s.orphan_exits;
            break;
          }
          size_t match = node_stack.size();
          while (nd.seq[node_stack[match - 1].span] != e.seq) --match;
          while (node_stack.size() > match) close_node(t, UINT32_MAX, true);
          close_node(t, e.id, false);
          break;
        }
        default:
          break;  // unknown kinds are rejected by the trace file reader
      }
    }
    while (!stack.empty()) close_top(last_t, kSpanUnfinished);
    while (!node_stack.empty()) close_node(last_t, UINT32_MAX, true);
  }
  assign_call_index(s);
  add_backward_spans(s, post_hook_names);
  return s;
}

py::dict build_spans(py::array events, py::array_t<int64_t> t_ns,
                     std::vector<uint32_t> post_hook_names) {
  if (events.ndim() != 1 || events.itemsize() != sizeof(Event) ||
      !(events.flags() & py::array::c_style)) {
    throw std::invalid_argument("build_spans: events must be a contiguous 1-D array of " +
                                std::to_string(sizeof(Event)) + "-byte records");
  }
  if (t_ns.ndim() != 1 || t_ns.shape(0) != events.shape(0) ||
      !(t_ns.flags() & py::array::c_style)) {
    throw std::invalid_argument("build_spans: t_ns must be a contiguous int64 array of length " +
                                std::to_string(events.shape(0)));
  }
  const auto* ev = static_cast<const Event*>(events.data());
  const int64_t* t = t_ns.data();
  const size_t n = static_cast<size_t>(events.shape(0));
  SpanTable s;
  {
    py::gil_scoped_release nogil;
    s = build_span_table(ev, t, n, post_hook_names);
  }
  py::dict out;
  out["start_ns"] = to_numpy(std::move(s.start_ns));
  out["end_ns"] = to_numpy(std::move(s.end_ns));
  out["self_ns"] = to_numpy(std::move(s.self_ns));
  out["parent"] = to_numpy(std::move(s.parent));
  out["module"] = to_numpy(std::move(s.module));
  out["tid"] = to_numpy(std::move(s.tid));
  out["depth"] = to_numpy(std::move(s.depth));
  out["call"] = to_numpy(std::move(s.call));
  out["flags"] = to_numpy(std::move(s.flags));
  out["cat"] = to_numpy(std::move(s.cat));
  out["threads"] = to_numpy(std::move(s.threads));
  NodeTable& nd = s.nodes;
  out["node_start_ns"] = to_numpy(std::move(nd.start_ns));
  out["node_end_ns"] = to_numpy(std::move(nd.end_ns));
  out["node_self_ns"] = to_numpy(std::move(nd.self_ns));
  out["node_seq"] = to_numpy(std::move(nd.seq));
  out["node_name"] = to_numpy(std::move(nd.name));
  out["node_tid"] = to_numpy(std::move(nd.tid));
  out["node_fwd_tid"] = to_numpy(std::move(nd.fwd_tid));
  out["node_pass"] = to_numpy(std::move(nd.pass));
  out["node_span"] = to_numpy(std::move(nd.span));
  out["orphan_exits"] = s.orphan_exits;
  out["unfinished"] = s.unfinished;
  out["node_events"] = s.node_events;
  return out;
}

}  // namespace hooktrace
