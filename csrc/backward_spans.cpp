#include "backward_spans.h"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <unordered_map>

namespace hooktrace {
namespace {

constexpr uint64_t kNoSeq = UINT64_MAX;  // AccumulateGrad, or no sequence number

// Each recompute span stands for the latest forward call of its module that
// started before it ("before" by (start, span index), so ties are decided).
void link_recomputes(SpanTable& s) {
  const size_t n = s.start_ns.size();
  s.owner.assign(n, -1);
  std::vector<size_t> fwd;
  bool any_recompute = false;
  for (size_t i = 0; i < n; ++i) {
    if (s.cat[i] == kCatForward) {
      s.owner[i] = static_cast<int64_t>(i);
      fwd.push_back(i);
    } else {
      any_recompute = true;
    }
  }
  if (!any_recompute) return;
  auto key = [&](size_t i) { return std::make_tuple(s.module[i], s.start_ns[i], i); };
  std::sort(fwd.begin(), fwd.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  for (size_t r = 0; r < n; ++r) {
    if (s.cat[r] != kCatRecompute) continue;
    auto it = std::lower_bound(fwd.begin(), fwd.end(), r,
                               [&](size_t f, size_t rr) { return key(f) < key(rr); });
    if (it != fwd.begin() && s.module[*(it - 1)] == s.module[r]) {
      s.owner[r] = static_cast<int64_t>(*(it - 1));
      s.call[r] = s.call[*(it - 1)];
    } else {
      s.call[r] = UINT32_MAX;  // no forward call of this module was recorded
    }
  }
}

// The calls of one forward thread as sequence-number ranges, outer before
// inner, with each range's enclosing range. The innermost range holding a
// sequence number is found by walking up from the last range starting at or
// before it, past the ranges that already ended (innermost()).
struct SeqIndex {
  std::vector<size_t> span;     // span index, sorted by (seq_enter, -seq_exit, span)
  std::vector<uint64_t> enter;  // seq_enter of span[k]
  std::vector<uint64_t> exit;   // seq_exit of span[k]
  std::vector<int64_t> up;      // k of the enclosing range, -1 if none

  // Queries must come in non-decreasing `seq`: a range that ended at or before
  // `seq` has ended for every later query too, so the walk's path is
  // compressed past it for good. Without that, D nested calls whose nodes all
  // lie below the deepest range cost D steps per node, O(D^2) in all.
  int64_t innermost(uint64_t seq) {
    const int64_t k = static_cast<int64_t>(
        std::upper_bound(enter.begin(), enter.end(), seq) - enter.begin()) - 1;
    int64_t r = k;
    while (r >= 0 && !(seq < exit[r])) r = up[r];
    for (int64_t x = k; x != r;) {  // every range passed over has ended: skip it from now on
      const int64_t next = up[x];
      up[x] = r;
      x = next;
    }
    return r < 0 ? -1 : static_cast<int64_t>(span[r]);
  }
};

std::unordered_map<uint32_t, SeqIndex> index_by_forward_thread(const SpanTable& s) {
  std::unordered_map<uint32_t, SeqIndex> out;
  for (size_t i = 0; i < s.start_ns.size(); ++i)
    if (s.seq_exit[i] > s.seq_enter[i]) out[s.rf_tid[i]].span.push_back(i);
  for (auto& kv : out) {
    SeqIndex& ix = kv.second;
    // Equal ranges (a module whose forward only calls another) are ordered by
    // span index: on one thread the later call is the nested one, and being
    // last it is the innermost the walk finds first.
    std::sort(ix.span.begin(), ix.span.end(), [&](size_t a, size_t b) {
      if (s.seq_enter[a] != s.seq_enter[b]) return s.seq_enter[a] < s.seq_enter[b];
      if (s.seq_exit[a] != s.seq_exit[b]) return s.seq_exit[a] > s.seq_exit[b];
      return a < b;
    });
    ix.enter.resize(ix.span.size());
    ix.exit.resize(ix.span.size());
    ix.up.assign(ix.span.size(), -1);
    std::vector<int64_t> open;
    for (size_t k = 0; k < ix.span.size(); ++k) {
      const size_t sp = ix.span[k];
      ix.enter[k] = s.seq_enter[sp];
      ix.exit[k] = s.seq_exit[sp];
      while (!open.empty() && ix.exit[open.back()] <= ix.enter[k]) open.pop_back();
      ix.up[k] = open.empty() ? -1 : open.back();
      open.push_back(static_cast<int64_t>(k));
    }
  }
  return out;
}

// The call each node is attributed to (a span index before owner mapping),
// -1 if none: the innermost call on the node's forward thread whose sequence
// range holds the node's sequence number. Queries run sorted by (forward
// thread, seq) so that SeqIndex::innermost can compress its paths.
std::vector<int64_t> innermost_calls(const SpanTable& s) {
  const NodeTable& nd = s.nodes;
  std::vector<int64_t> call(nd.start_ns.size(), -1);
  auto index = index_by_forward_thread(s);
  std::vector<size_t> q;
  q.reserve(nd.start_ns.size());
  for (size_t i = 0; i < nd.start_ns.size(); ++i)
    if (nd.seq[i] != kNoSeq && index.count(nd.fwd_tid[i])) q.push_back(i);
  std::sort(q.begin(), q.end(), [&](size_t a, size_t b) {
    if (nd.fwd_tid[a] != nd.fwd_tid[b]) return nd.fwd_tid[a] < nd.fwd_tid[b];
    return nd.seq[a] < nd.seq[b];
  });
  SeqIndex* ix = nullptr;
  for (size_t j = 0; j < q.size(); ++j) {
    const size_t i = q[j];
    if (j == 0 || nd.fwd_tid[i] != nd.fwd_tid[q[j - 1]]) ix = &index.find(nd.fwd_tid[i])->second;
    call[i] = ix->innermost(nd.seq[i]);
  }
  return call;
}

// Each outermost node's extent, hooks included (issue #16: a module's backward
// hooks are inside its backward span). The autograd engine runs a node's
// pre-hooks (tensor hooks; FSDP2's pre-backward unshard and its wait) on the
// node's thread just before the node's RecordFunction opens, and its
// post-hooks just after it closes: neither is inside any node. So the gap
// between two outermost nodes of one pass on one thread goes to the later
// node (its pre-hooks), except after a node named in `post_hook_names`
// (BackwardHookFunctionBackward, where register_full_backward_hook's hooks run
// as post-hooks), where it goes to that node. Extent only: self time stays the
// nodes' own, since a gap also holds the engine's work, which cannot be told
// apart from the hooks.
struct Extents {
  std::vector<int64_t> from, to;
};

Extents hook_extents(const NodeTable& nd, const std::vector<uint32_t>& post_hook_names) {
  const size_t n = nd.start_ns.size();
  Extents e{std::vector<int64_t>(nd.start_ns.begin(), nd.start_ns.end()),
            std::vector<int64_t>(nd.end_ns.begin(), nd.end_ns.end())};
  std::vector<size_t> outer;
  for (size_t i = 0; i < n; ++i)
    if (nd.parent[i] < 0) outer.push_back(i);
  std::sort(outer.begin(), outer.end(), [&](size_t a, size_t b) {
    return std::make_tuple(nd.tid[a], nd.pass[a], nd.start_ns[a], a) <
           std::make_tuple(nd.tid[b], nd.pass[b], nd.start_ns[b], b);
  });
  for (size_t j = 1; j < outer.size(); ++j) {
    const size_t prev = outer[j - 1], i = outer[j];
    if (nd.tid[prev] != nd.tid[i] || nd.pass[prev] != nd.pass[i] ||
        nd.end_ns[prev] > nd.start_ns[i])
      continue;
    const bool post = std::find(post_hook_names.begin(), post_hook_names.end(),
                                nd.name[prev]) != post_hook_names.end();
    if (post)
      e.to[prev] = nd.start_ns[i];
    else
      e.from[i] = nd.end_ns[prev];
  }
  return e;
}

struct Bwd {
  int64_t call_span;  // the forward span it belongs to
  uint32_t pass;
  int64_t start, end, self;
  uint32_t tid;         // thread of the earliest node (first by node index on ties)
  size_t first_node;    // that node's index, to break start ties as the node order does
  int64_t next;         // next Bwd of the same call_span (list headed by head[call_span])
};

}  // namespace

void add_backward_spans(SpanTable& s, const std::vector<uint32_t>& post_hook_names) {
  link_recomputes(s);
  NodeTable& nd = s.nodes;
  const size_t n_nodes = nd.start_ns.size();
  nd.pass.resize(n_nodes);
  nd.span.assign(n_nodes, -1);
  if (n_nodes == 0) return;
  // A node's parent was recorded before it on the same thread.
  for (size_t i = 0; i < n_nodes; ++i)
    nd.pass[i] = nd.parent[i] < 0 ? nd.task[i] : nd.pass[nd.parent[i]];

  const std::vector<int64_t> innermost = innermost_calls(s);
  std::vector<Bwd> bwd;
  std::unordered_map<uint64_t, size_t> bwd_of;  // (call span, pass) -> bwd
  std::vector<int64_t> head(s.start_ns.size(), -1);  // call span -> its first Bwd
  auto get = [&](int64_t call_span, uint32_t pass) {
    const uint64_t key = (static_cast<uint64_t>(call_span) << 32) ^ pass;
    auto it = bwd_of.find(key);
    if (it != bwd_of.end()) return it->second;
    bwd.push_back(Bwd{call_span, pass, INT64_MAX, INT64_MIN, 0, 0, SIZE_MAX, head[call_span]});
    head[call_span] = static_cast<int64_t>(bwd.size() - 1);
    bwd_of.emplace(key, bwd.size() - 1);
    return bwd.size() - 1;
  };
  // Widens b to cover [start, end), taking the tid of the earliest node.
  auto cover = [](Bwd& b, int64_t start, int64_t end, size_t node, uint32_t tid) {
    if (start < b.start || (start == b.start && node < b.first_node)) {
      b.start = start;
      b.first_node = node;
      b.tid = tid;
    }
    b.end = std::max(b.end, end);
  };

  const Extents ext = hook_extents(nd, post_hook_names);
  // Each node counts for its own call first ...
  for (size_t i = 0; i < n_nodes; ++i) {
    const int64_t call = innermost[i];
    const int64_t owner = call < 0 ? -1 : s.owner[call];
    if (owner < 0) continue;
    const size_t k = get(owner, nd.pass[i]);
    cover(bwd[k], ext.from[i], ext.to[i], i, nd.tid[i]);
    bwd[k].self += nd.self_ns[i];
    nd.span[i] = static_cast<int64_t>(k);  // remapped below
  }
  // ... and, in extent, for every enclosing call: a parent span's index is
  // below its children's (it was entered first), so one sweep from the last
  // span down folds each call's extent into its parent's once, instead of
  // walking every node's ancestors (O(nodes x depth)).
  for (size_t a = s.start_ns.size(); a-- > 0;) {
    const int64_t p = s.parent[a];
    if (p < 0) continue;
    for (int64_t k = head[a]; k >= 0; k = bwd[k].next) {
      const Bwd b = bwd[k];  // a copy: get() may grow `bwd`
      cover(bwd[get(p, b.pass)], b.start, b.end, b.first_node, b.tid);
    }
  }

  // Output order: (tid, start, depth) so that a parent precedes its children.
  std::vector<size_t> order(bwd.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Bwd &x = bwd[a], &y = bwd[b];
    if (x.tid != y.tid) return x.tid < y.tid;
    if (x.start != y.start) return x.start < y.start;
    if (x.end != y.end) return x.end > y.end;
    if (s.depth[x.call_span] != s.depth[y.call_span])
      return s.depth[x.call_span] < s.depth[y.call_span];
    return std::make_pair(x.call_span, x.pass) < std::make_pair(y.call_span, y.pass);
  });
  const size_t base = s.start_ns.size();
  std::vector<int64_t> out_index(bwd.size());
  for (size_t k = 0; k < order.size(); ++k) out_index[order[k]] = static_cast<int64_t>(base + k);
  for (size_t k = 0; k < order.size(); ++k) {
    const Bwd& b = bwd[order[k]];
    const size_t f = static_cast<size_t>(b.call_span);
    const int64_t fp = s.parent[f];
    int64_t parent = -1;
    if (fp >= 0) {
      auto it = bwd_of.find((static_cast<uint64_t>(fp) << 32) ^ b.pass);
      if (it != bwd_of.end()) parent = out_index[it->second];
    }
    s.start_ns.push_back(b.start);
    s.end_ns.push_back(b.end);
    s.self_ns.push_back(b.self);
    s.parent.push_back(parent);
    s.module.push_back(s.module[f]);
    s.tid.push_back(b.tid);
    s.depth.push_back(s.depth[f]);
    s.call.push_back(s.call[f]);
    s.flags.push_back(0);
    s.cat.push_back(kCatBackward);
    s.seq_enter.push_back(0);
    s.seq_exit.push_back(0);
    s.rf_tid.push_back(0);
    s.owner.push_back(static_cast<int64_t>(f));
  }
  for (size_t i = 0; i < n_nodes; ++i)
    if (nd.span[i] >= 0) nd.span[i] = out_index[static_cast<size_t>(nd.span[i])];
}

}  // namespace hooktrace
