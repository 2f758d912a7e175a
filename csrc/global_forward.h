// Global mode (issue #10, `hooktrace run`): every nn.Module call in the process
// is recorded into one Session, with no per-call Python code.
//
//   GlobalCall(session, wrapped, resolve)
//       Replaces `nn.Module.__call__` (the class attribute, once, for every
//       subclass that does not override it) for the duration of the run.
//       Transparent: `wrapped` is the original `_wrapped_call_impl`, called
//       with exactly the arguments received. A method descriptor
//       (Py_TPFLAGS_METHOD_DESCRIPTOR), so `m(x)` reaches it through
//       slot_tp_call with `m` prepended and no bound method is created: the
//       same path, and the same allocations, as the untraced call.
//
// Why `__call__` and not each class's `forward`: one attribute to replace and
// restore instead of every subclass (and every class defined later); modules
// whose `forward` is an instance attribute, or that hooktrace.trace()
// instruments, are covered too; and Dynamo, imported after the run starts,
// takes this object for the unpatched `nn.Module.__call__` and keeps inlining
// `forward` in compiled regions (torch/_dynamo/utils.py
// `unpatched_nn_module_call`). Spans include the module's forward hooks.
//
// Per call: a lookup of the instance in an open-addressing table keyed by its
// address (GIL-protected: only code holding the GIL calls modules, inserts
// and removals happen under it too) and Session::record() for enter and exit.
// No lock, no allocation, no Python object, no thread-local state of its own:
// the rare path, which needs the calls open on its thread to name a module,
// finds them in the Python frames of `_wrapped_call_impl` (no depth limit, and
// nothing kept per call). Measured 60-90 ns per call on 1000 x Identity, about
// 30 ns more than trace()'s instance wrapper, which also spares the bound
// method of `forward` (benchmarks/RESULTS.md). The first call of an instance takes the
// rare path into `resolve(module)`, which names it, calls `register(m, slot)`
// for it (and its whole subtree) and returns its slot (-1: do not record it,
// ask again next time). An entry is removed by `forget(address)` from the
// module's weakref callback, which runs before its memory can be reused.
#pragma once

#include <Python.h>

namespace hooktrace {

// Readies the GlobalCall type and adds it to `module`. Returns -1 with a
// Python error set on failure.
int add_global_forward_type(PyObject* module);

}  // namespace hooktrace
