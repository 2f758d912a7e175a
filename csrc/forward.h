// Forward recording: compiled callables that record module enter/exit into a
// Session. Both are CPython types with vectorcall, because a pybind11
// __call__ costs ~1 us more per hook pair (issue #2).
//
//   ForwardPreHook(session, slot)   register_forward_pre_hook: records kEnter
//   ForwardHook(session, slot)      register_forward_hook(always_call=True):
//                                   records kExit (kFlagError when forward
//                                   raised: output is None while an
//                                   exception is being handled). Both keep a
//                                   per-thread stack of open calls, so a call
//                                   whose exit a KeyboardInterrupt skipped
//                                   (nn.Module runs always_call hooks only for
//                                   an Exception) is closed as an error before
//                                   the next call: Session::hook_enter.
//   ForwardWrapper(session, slot, f)  replaces an instance's `forward`: records
//                                   kEnter, calls f, records kExit. Keeps the
//                                   module on nn.Module's hook-free fast path,
//                                   which is why it is the default. Transparent:
//                                   __wrapped__, __name__, __qualname__,
//                                   __doc__, __module__ and other attributes of
//                                   f are forwarded; pickles/deep-copies as f.
#pragma once

#include <Python.h>

namespace hooktrace {

// Readies the three types and adds them to `module`. Returns -1 with a Python
// error set on failure.
int add_forward_types(PyObject* module);

}  // namespace hooktrace
