// Backward spans: attributes autograd node executions to module calls and
// derives one kCatBackward span per (module call, backward pass).
//
// Attribution (issue #3): a node created in forward carries the sequence
// number it got and the RecordFunction id of the thread that created it. The
// module calls of that thread whose [seq_enter, seq_exit) contain the node's
// sequence number form a chain (ranges on one thread nest like the calls do);
// the node belongs to the innermost. Matching on the sequence number alone is
// ambiguous across threads, and on time alone impossible (backward runs later,
// possibly on another thread). Nodes with no such call (the loss, anything
// created outside the model) and AccumulateGrad (sequence number UINT64_MAX)
// stay unattributed: node span = -1, reported, never dropped.
//
// A recompute span (a forward re-run inside backward by activation
// checkpointing) stands for the latest earlier forward call of its module: its
// `call` is that call's, and nodes created by the recompute count for it.
//
// Backward span of call C in pass P: from the first start to the last end of
// the nodes of P attributed to C or to any call below C; self = the nodes'
// own time (durations minus nested nodes) attributed to C directly. The pass
// is the graph task of the outermost node running on that thread, so a
// reentrant backward (reentrant checkpointing) belongs to the pass that
// triggered it; retain_graph=True passes stay apart.
#pragma once

#include "spans.h"

namespace hooktrace {

// Appends the backward spans to `s` (sorted by tid, start, depth) and fills
// s.owner, the recompute spans' call, s.nodes.pass and s.nodes.span.
// `post_hook_names`: node name ids whose post-hooks belong to the node's module
// (BackwardHookFunctionBackward: register_full_backward_hook runs there).
void add_backward_spans(SpanTable& s, const std::vector<uint32_t>& post_hook_names = {});

}  // namespace hooktrace
