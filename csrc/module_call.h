// Module calls (issue #16): the one native path every recorded module call goes
// through, for both scopes of hooktrace.trace() (the given models) and
// `hooktrace run` / global_trace() (every module in the process).
//
//   ModuleCall(wrapped)
//       Replaces `nn.Module.__call__` (the class attribute, once, for every
//       subclass that does not override it) while any recorder is active.
//       Transparent: `wrapped` is the original `_wrapped_call_impl`; what it
//       does (call `_compiled_call_impl` if set, else `_call_impl`, with exactly
//       the arguments received) is done in C when the module's class would run
//       exactly `wrapped`, one Python frame fewer; anything else calls
//       `wrapped` itself. A method descriptor
//       (Py_TPFLAGS_METHOD_DESCRIPTOR), so `m(x)` reaches it through
//       slot_tp_call with `m` prepended and no bound method is created.
//       `__code__`, `__name__`, `__qualname__`, `__doc__`, `__module__` and
//       `__wrapped__` are the wrapped function's, so `torch.compile(m)`, which
//       wraps `m.__call__` and asks for its `__code__`, compiles the same frame
//       as untraced (torch/_dynamo/eval_frame.py, "optimize is called on a non
//       function object").
//
// One definition of a span: a module's forward span is its whole call, global
// and module forward pre-hooks, `forward` (or `_compiled_call_impl`) and
// forward hooks, whichever scope records it. FSDP2's unshard (a pre-hook)
// therefore lands inside the block that needs it.
//
// Per call: one lookup of the instance in an open-addressing table keyed by its
// address. An entry holds the module's slot in at most one model-scope session
// (trace(): a module is claimed by one trace at a time) and its slot in the
// process-scope session (at most one per process), so a model traced inside
// `hooktrace run` is recorded into both. No lock (only code holding the GIL
// calls modules; inserts and removals happen under it too), no allocation, no
// Python object, no thread-local state of its own.
//
// The process scope names modules lazily: a module's first call while it
// records takes the rare path into `resolve(module)`, which names it, calls
// `register(m, slot)` for it (and its subtree) and returns its slot (-1: do
// not record it, ask again next time). Entries are removed by
// `forget(address)` from each module's weakref callback, which runs before its
// memory can be reused, by `release(session)` when a model scope ends and by
// `clear_global()` when the process scope ends.
#pragma once

#include <Python.h>

namespace hooktrace {

// Readies the ModuleCall type and adds it to `module`. Returns -1 with a
// Python error set on failure.
int add_module_call_type(PyObject* module);

}  // namespace hooktrace
