// Kernel marks (issue #18): the calls that hooktrace writes around each kernel
// call in the Python wrapper of code torch.compile generated while a trace was
// active (hooktrace/record/kernels.py writes them):
//
//     _ht_kb(17)                                  # kKernelBegin, site 17
//     extern_kernels.addmm(primals_2, buf0, ...)  # the kernel, unchanged
//     _ht_ke(17)                                  # kKernelEnd, site 17
//
// Each is a METH_O builtin: no argument parsing, no Python object created; it
// records one event into every session registered here (a Session::record_kernel
// per session). With none registered (compiled under a trace, run untraced) a
// mark is the call and one relaxed load per slot. The site table (kernel name,
// the module whose ops it runs, phase) lives in Python and goes into the trace's
// info; the reader attributes each kernel's time to that module.
#pragma once

#include <Python.h>

#include <memory>

#include "session.h"

namespace hooktrace {

void add_kernel_session(const std::shared_ptr<Session>& s);
void remove_kernel_session(const Session* s);

// Adds kernel_begin / kernel_end to the extension module; -1 with a Python
// error set on failure.
int add_kernel_mark_functions(PyObject* module);

}  // namespace hooktrace
