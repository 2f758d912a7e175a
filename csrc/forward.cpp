#include "forward.h"

#include <pybind11/pybind11.h>

#include <memory>

#include "event.h"
#include "profiler_emit.h"
#include "session.h"

namespace py = pybind11;

namespace hooktrace {
namespace {

// Fields shared by the three types. `owner` is the Python Session object,
// held strongly so `session` outlives every callable that records into it.
struct Recorder {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Session* session;
  PyObject* owner;
  uint32_t slot;
};

struct Wrapper {
  Recorder base;
  PyObject* wrapped;
  PyObject* weakrefs;  // the Trace refers to its wrappers weakly: models are held weakly
};

// --- construction -----------------------------------------------------------

int init_recorder(Recorder* self, PyObject* session_obj, unsigned long slot) {
  try {
    self->session = py::cast<Session*>(py::handle(session_obj));
  } catch (const py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "expected a hooktrace._C.Session");
    return -1;
  }
  if (slot > UINT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "slot out of range");
    return -1;
  }
  Py_INCREF(session_obj);
  self->owner = session_obj;
  self->slot = static_cast<uint32_t>(slot);
  return 0;
}

// --- hooks ------------------------------------------------------------------

// The hooks keep a per-thread stack of open calls (Session::hook_enter), so calls
// whose exit hook a KeyboardInterrupt skipped are closed as errors and later
// calls nest right. The return values say how many were closed that way.
size_t pre_hook_record(Recorder* r) {
  return r->session->hook_enter(r->slot,
                                reinterpret_cast<uintptr_t>(__builtin_frame_address(0)));
}

PyObject* pre_hook_call(PyObject* self, PyObject* const*, size_t, PyObject*) {
  pre_hook_record(reinterpret_cast<Recorder*>(self));
  Py_RETURN_NONE;
}

size_t post_hook_record(Recorder* r, PyObject* const* args, size_t nargsf) {
  uint8_t flags = 0;
  // nn.Module runs always_call hooks from its `except` block with output None.
  if (PyVectorcall_NARGS(nargsf) >= 3 && args[2] == Py_None) {
    PyObject* handled = PyErr_GetHandledException();
    if (handled) {
      flags = kFlagError;
      Py_DECREF(handled);
    }
  }
  return r->session->hook_exit(r->slot, flags);
}

PyObject* post_hook_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject*) {
  post_hook_record(reinterpret_cast<Recorder*>(self), args, nargsf);
  Py_RETURN_NONE;
}

// The same, also opening/closing a profiler range (profiler_emit.h); chosen at
// construction so sessions without emission pay nothing for it.
PyObject* pre_hook_call_emit(PyObject* self, PyObject* const*, size_t, PyObject*) {
  auto* r = reinterpret_cast<Recorder*>(self);
  const bool on = r->session->active();
  for (size_t closed = pre_hook_record(r); on && closed > 0; --closed) emit_exit();
  if (on) emit_enter(r->session->emit_name(r->slot));
  Py_RETURN_NONE;
}

PyObject* post_hook_call_emit(PyObject* self, PyObject* const* args, size_t nargsf, PyObject*) {
  auto* r = reinterpret_cast<Recorder*>(self);
  const bool on = r->session->active();
  for (size_t closed = post_hook_record(r, args, nargsf) + 1; on && closed > 0; --closed)
    emit_exit();
  Py_RETURN_NONE;
}

PyObject* hook_new(PyTypeObject* type, PyObject* args, PyObject* kwds, vectorcallfunc call) {
  PyObject* session_obj;
  unsigned long slot;
  static const char* kwlist[] = {"session", "slot", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "Ok", const_cast<char**>(kwlist), &session_obj,
                                   &slot))
    return nullptr;
  auto* self = reinterpret_cast<Recorder*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->vectorcall = call;
  if (init_recorder(self, session_obj, slot) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
  if (self->session->emits())
    self->vectorcall = call == pre_hook_call ? pre_hook_call_emit : post_hook_call_emit;
  return reinterpret_cast<PyObject*>(self);
}

PyObject* pre_hook_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  return hook_new(type, args, kwds, pre_hook_call);
}

PyObject* post_hook_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  return hook_new(type, args, kwds, post_hook_call);
}

void recorder_dealloc(PyObject* self) {
  auto* r = reinterpret_cast<Recorder*>(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(r->owner);
  Py_TYPE(self)->tp_free(self);
}

int recorder_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<Recorder*>(self)->owner);
  return 0;
}

// A deep copy or pickle of a module traced with hooks carries an inert hook
// (copies are not traced); see hooktrace.recording._inert_hook.
PyObject* hook_reduce(PyObject*, PyObject*) {
  PyObject* mod = PyImport_ImportModule("hooktrace.recording");
  if (!mod) return nullptr;
  PyObject* fn = PyObject_GetAttrString(mod, "_inert_hook");
  Py_DECREF(mod);
  if (!fn) return nullptr;
  return Py_BuildValue("(N())", fn);
}

PyObject* hook_slot(PyObject* self, void*) {
  return PyLong_FromUnsignedLong(reinterpret_cast<Recorder*>(self)->slot);
}

PyMethodDef hook_methods[] = {
    {"__reduce__", hook_reduce, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef hook_getset[] = {
    {"slot", hook_slot, nullptr, "module slot in the session", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// The slots every recording type shares; callers add their own on top.
PyTypeObject recorder_type(const char* name, const char* doc, Py_ssize_t size, newfunc tp_new,
                           destructor dealloc, traverseproc traverse) {
  PyTypeObject t = {PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = name;
  t.tp_doc = doc;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_vectorcall_offset = offsetof(Recorder, vectorcall);
  t.tp_call = PyVectorcall_Call;
  t.tp_new = tp_new;
  t.tp_dealloc = dealloc;
  t.tp_traverse = traverse;
  return t;
}

PyTypeObject make_hook_type(const char* name, const char* doc, newfunc tp_new) {
  PyTypeObject t = recorder_type(name, doc, sizeof(Recorder), tp_new, recorder_dealloc,
                                 recorder_traverse);
  t.tp_methods = hook_methods;
  t.tp_getset = hook_getset;
  return t;
}

PyTypeObject PreHookType = make_hook_type(
    "hooktrace._C.ForwardPreHook",
    "ForwardPreHook(session, slot): forward pre-hook recording a module enter.", pre_hook_new);
PyTypeObject PostHookType = make_hook_type(
    "hooktrace._C.ForwardHook",
    "ForwardHook(session, slot): forward hook (always_call=True) recording a module exit.",
    post_hook_new);

// --- wrapper ----------------------------------------------------------------

PyObject* wrapper_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* w = reinterpret_cast<Wrapper*>(self);
  Session* s = w->base.session;
  const uint32_t slot = w->base.slot;
  s->record(slot, kEnter, 0);
  PyObject* result = PyObject_Vectorcall(w->wrapped, args, nargsf, kwnames);
  s->record(slot, kExit, result ? 0 : kFlagError);
  return result;
}

PyObject* wrapper_call_emit(PyObject* self, PyObject* const* args, size_t nargsf,
                            PyObject* kwnames) {
  auto* w = reinterpret_cast<Wrapper*>(self);
  Session* s = w->base.session;
  const uint32_t slot = w->base.slot;
  const bool on = s->active();
  if (on) emit_enter(s->emit_name(slot));
  s->record(slot, kEnter, 0);
  PyObject* result = PyObject_Vectorcall(w->wrapped, args, nargsf, kwnames);
  s->record(slot, kExit, result ? 0 : kFlagError);
  if (on) emit_exit();
  return result;
}

PyObject* wrapper_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  PyObject* session_obj;
  unsigned long slot;
  PyObject* wrapped;
  static const char* kwlist[] = {"session", "slot", "wrapped", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OkO", const_cast<char**>(kwlist), &session_obj,
                                   &slot, &wrapped))
    return nullptr;
  if (!PyCallable_Check(wrapped)) {
    PyErr_Format(PyExc_TypeError, "wrapped must be callable, got %R", wrapped);
    return nullptr;
  }
  auto* self = reinterpret_cast<Wrapper*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->base.vectorcall = wrapper_call;
  if (init_recorder(&self->base, session_obj, slot) < 0) {
    Py_DECREF(self);
    return nullptr;
  }
  Py_INCREF(wrapped);
  self->wrapped = wrapped;
  if (self->base.session->emits()) self->base.vectorcall = wrapper_call_emit;
  return reinterpret_cast<PyObject*>(self);
}

int wrapper_clear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<Wrapper*>(self)->wrapped);
  return 0;
}

void wrapper_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  if (reinterpret_cast<Wrapper*>(self)->weakrefs) PyObject_ClearWeakRefs(self);
  wrapper_clear(self);
  Py_CLEAR(reinterpret_cast<Recorder*>(self)->owner);
  Py_TYPE(self)->tp_free(self);
}

int wrapper_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<Wrapper*>(self)->wrapped);
  Py_VISIT(reinterpret_cast<Recorder*>(self)->owner);
  return 0;
}

// Dunder attributes of the wrapped callable that are forwarded; other dunders
// resolve on the wrapper itself so copy/pickle protocols stay ours.
bool forwarded_dunder(const char* name) {
  static const char* const names[] = {
      "__self__",     "__func__",    "__code__",    "__defaults__", "__kwdefaults__",
      "__globals__",  "__closure__", "__dict__",    "__annotations__", "__signature__",
      "__text_signature__", "__type_params__", nullptr};
  for (const char* const* n = names; *n; ++n)
    if (strcmp(*n, name) == 0) return true;
  return false;
}

PyObject* wrapper_getattro(PyObject* self, PyObject* name) {
  PyObject* r = PyObject_GenericGetAttr(self, name);
  if (r || !PyErr_ExceptionMatches(PyExc_AttributeError)) return r;
  const char* s = PyUnicode_AsUTF8(name);
  if (!s) return nullptr;
  const size_t n = strlen(s);
  const bool dunder = n > 4 && s[0] == '_' && s[1] == '_' && s[n - 1] == '_' && s[n - 2] == '_';
  if (dunder && !forwarded_dunder(s)) return nullptr;
  PyErr_Clear();
  return PyObject_GetAttr(reinterpret_cast<Wrapper*>(self)->wrapped, name);
}

PyObject* forward_attr(PyObject* self, void* name) {
  return PyObject_GetAttrString(reinterpret_cast<Wrapper*>(self)->wrapped,
                                static_cast<const char*>(name));
}

PyObject* wrapper_wrapped(PyObject* self, void*) {
  PyObject* w = reinterpret_cast<Wrapper*>(self)->wrapped;
  Py_INCREF(w);
  return w;
}

// Pickles and (deep-)copies as the wrapped callable, using only builtins, so a
// model saved while traced loads without hooktrace and is not traced:
// operator.getitem((wrapped,), 0).
PyObject* wrapper_reduce(PyObject* self, PyObject*) {
  PyObject* op = PyImport_ImportModule("operator");
  if (!op) return nullptr;
  PyObject* getitem = PyObject_GetAttrString(op, "getitem");
  Py_DECREF(op);
  if (!getitem) return nullptr;
  return Py_BuildValue("(N((O)i))", getitem, reinterpret_cast<Wrapper*>(self)->wrapped, 0);
}

PyObject* wrapper_reduce_ex(PyObject* self, PyObject*) { return wrapper_reduce(self, nullptr); }

PyObject* wrapper_repr(PyObject* self) {
  return PyUnicode_FromFormat("<hooktrace wrapper of %R>", reinterpret_cast<Wrapper*>(self)->wrapped);
}

PyMethodDef wrapper_methods[] = {
    {"__reduce__", wrapper_reduce, METH_NOARGS, nullptr},
    {"__reduce_ex__", wrapper_reduce_ex, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef wrapper_getset[] = {
    {"__wrapped__", wrapper_wrapped, nullptr, nullptr, nullptr},
    {"__name__", forward_attr, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", forward_attr, nullptr, nullptr, const_cast<char*>("__qualname__")},
    {"__doc__", forward_attr, nullptr, nullptr, const_cast<char*>("__doc__")},
    {"__module__", forward_attr, nullptr, nullptr, const_cast<char*>("__module__")},
    {"slot", hook_slot, nullptr, "module slot in the session", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject make_wrapper_type() {
  PyTypeObject t = recorder_type(
      "hooktrace._C.ForwardWrapper",
      "ForwardWrapper(session, slot, wrapped): transparent recording forward.", sizeof(Wrapper),
      wrapper_new, wrapper_dealloc, wrapper_traverse);
  t.tp_weaklistoffset = offsetof(Wrapper, weakrefs);
  t.tp_clear = wrapper_clear;
  t.tp_getattro = wrapper_getattro;
  t.tp_repr = wrapper_repr;
  t.tp_methods = wrapper_methods;
  t.tp_getset = wrapper_getset;
  return t;
}

PyTypeObject WrapperType = make_wrapper_type();

}  // namespace

int add_forward_types(PyObject* module) {
  for (PyTypeObject* t : {&PreHookType, &PostHookType, &WrapperType}) {
    if (PyType_Ready(t) < 0) return -1;
    const char* short_name = strrchr(t->tp_name, '.') + 1;
    Py_INCREF(t);
    if (PyModule_AddObject(module, short_name, reinterpret_cast<PyObject*>(t)) < 0) {
      Py_DECREF(t);
      return -1;
    }
  }
  return 0;
}

}  // namespace hooktrace
