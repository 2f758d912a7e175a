#include "kernel_marks.h"

#include "gpu_time.h"
#include "session_set.h"

namespace hooktrace {
namespace {

SessionSet g_sessions;

// The site: a Python int below 2**32 (the wrapper code only ever passes those;
// anything else is ignored rather than raising inside compiled code).
inline bool site_of(PyObject* arg, uint32_t* site) {
  if (!PyLong_CheckExact(arg)) return false;
  const unsigned long v = PyLong_AsUnsignedLong(arg);
  if (v == static_cast<unsigned long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (v > 0xFFFFFFFFul) return false;
  *site = static_cast<uint32_t>(v);
  return true;
}

PyObject* kernel_begin(PyObject*, PyObject* arg) {
  uint32_t site;
  if (site_of(arg, &site))
    g_sessions.for_each([&](Session* s) {
      s->record_kernel(kKernelBegin, site);
      if (C10_UNLIKELY(s->gpu())) gpu_kernel(s, site, false);  // device time (gpu_time.h)
    });
  Py_RETURN_NONE;
}

PyObject* kernel_end(PyObject*, PyObject* arg) {
  uint32_t site;
  if (site_of(arg, &site))
    g_sessions.for_each([&](Session* s) {
      if (C10_UNLIKELY(s->gpu())) gpu_kernel(s, site, true);
      s->record_kernel(kKernelEnd, site);
    });
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"kernel_begin", kernel_begin, METH_O, "Kernel mark: site's kernel starts (hot path)."},
    {"kernel_end", kernel_end, METH_O, "Kernel mark: site's kernel ended (hot path)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void add_kernel_session(const std::shared_ptr<Session>& s) { g_sessions.add(s, "kernels"); }

void remove_kernel_session(const Session* s) { g_sessions.remove(s); }

int add_kernel_mark_functions(PyObject* module) {
  for (PyMethodDef* def = g_methods; def->ml_name; ++def) {
    PyObject* fn = PyCFunction_NewEx(def, nullptr, nullptr);
    if (!fn || PyModule_AddObject(module, def->ml_name, fn) < 0) {
      Py_XDECREF(fn);
      return -1;
    }
  }
  return 0;
}

}  // namespace hooktrace
