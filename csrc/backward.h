// Backward recording: a global RecordFunction callback limited to
// RecordScope::BACKWARD_FUNCTION records each autograd node's start and end
// (kNodeBegin / kNodeEnd) into every session registered here.
//
// Why not register_full_backward_hook: it wraps module outputs in
// BackwardHookFunction views, which breaks in-place ops on them and skips
// modules returning dataclasses, and costs ~56 us per module forward (issue
// #3). A node carries seqNr() and forwardThreadId(); the reader attributes it
// to the innermost module call whose [enter, exit) sequence-number range on
// that forward thread contains it.
//
// kNodeBegin: seq = seqNr(), rf_tid = forwardThreadId(), id = node name
//             (index into node_names())
// kNodeEnd:   seq = seqNr(), rf_tid = forwardThreadId(), id = the autograd
//             graph task id (one per backward pass: splits passes that run the
//             same node, e.g. retain_graph=True)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "session.h"

namespace hooktrace {

// The first registration installs the callback; the last removal uninstalls
// it, so untraced programs pay nothing. Throws std::runtime_error when
// SessionSet::kMaxSessions sessions record backward already.
void add_backward_session(const std::shared_ptr<Session>& s);
// Returns once no callback can still touch `s` (or after 1 s, in which case
// the session is kept alive forever rather than risk a use after free).
void remove_backward_session(const Session* s);

// While torch.compile compiles, AOTAutograd traces the backward graph through
// the autograd engine on fake tensors: those nodes are not the program's
// backward, so they are not recorded (issue #16: they made a second "backward"
// span inside the forward of each newly compiled module). Set by the Dynamo
// compile-start/-end callbacks (hooktrace/record/dispatch.py). Process-wide, as
// the swap of nn.Module.__call__ is: another thread's real backward during a
// compile is not recorded.
void set_compiling(bool compiling);

// Process-wide table of autograd node names seen so far; ids never change.
std::vector<std::string> node_names();
// The names from index `first` on (the table only grows): what a stream
// writer has not written yet.
std::vector<std::string> node_names_since(size_t first);

}  // namespace hooktrace
