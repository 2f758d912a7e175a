#include "module_call.h"

#include <c10/core/GradMode.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "event.h"
#include "gpu_time.h"
#include "numerics.h"
#include "shapes.h"
#include "profiler_emit.h"
#include "session.h"

namespace py = pybind11;

namespace hooktrace {
namespace {

// The process scope's slot of a module it has not named yet.
constexpr uint32_t kUnresolved = UINT32_MAX;
// Not recorded (resolve() said so, or no process scope is recording).
constexpr uint32_t kNoSlot = UINT32_MAX - 1;

struct Entry {
  const void* key = nullptr;
  Session* model = nullptr;  // the model-scope session recording this module, if any
  PyObject* model_owner = nullptr;  // its Python Session (borrowed: `owners` holds it)
  uint32_t model_slot = 0;
  uint32_t global_slot = kUnresolved;
};

// --- module address -> entry ----------------------------------------------------

// Open addressing with linear probing, load factor <= 1/2, backward-shift
// deletion (no tombstones), so a lookup is a multiply, a shift and usually one
// compare. Touched only with the GIL held. Entry pointers are valid until the
// next insert or erase.
class ModuleTable {
 public:
  ModuleTable() : entries_(kInitial) {}

  Entry* find(const void* key) {
    for (size_t i = index(key);; i = (i + 1) & mask()) {
      Entry& e = entries_[i];
      if (e.key == key) return &e;
      if (!e.key) return nullptr;
    }
  }

  Entry& upsert(const void* key) {
    if (2 * (count_ + 1) > entries_.size()) grow();
    for (size_t i = index(key);; i = (i + 1) & mask()) {
      Entry& e = entries_[i];
      if (e.key == key) return e;
      if (!e.key) {
        e = Entry{};
        e.key = key;
        ++count_;
        return e;
      }
    }
  }

  void erase(const void* key) {
    size_t i = index(key);
    while (entries_[i].key != key) {
      if (!entries_[i].key) return;
      i = (i + 1) & mask();
    }
    // Shift later members of the probe run back into the hole.
    for (size_t j = (i + 1) & mask(); entries_[j].key; j = (j + 1) & mask()) {
      const size_t home = index(entries_[j].key);
      // Move j to i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (!stays) {
        entries_[i] = entries_[j];
        i = j;
      }
    }
    entries_[i] = Entry{};
    --count_;
  }

  // Applies `f` to every entry; erases those for which it returns true.
  template <typename F>
  void update_all(F f) {
    std::vector<const void*> gone;
    for (Entry& e : entries_)
      if (e.key && f(e)) gone.push_back(e.key);
    for (const void* key : gone) erase(key);
  }

  size_t size() const { return count_; }

 private:
  static constexpr size_t kInitial = 1024;

  size_t mask() const { return entries_.size() - 1; }
  size_t index(const void* key) const {
    // Fibonacci hashing: objects are 16-byte aligned, the multiply spreads the rest.
    const uint64_t h = (reinterpret_cast<uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(h >> 20) & mask();
  }
  void grow() {
    std::vector<Entry> old(entries_.size() * 2);
    old.swap(entries_);
    count_ = 0;
    for (const Entry& e : old)
      if (e.key) upsert(e.key) = e;
  }

  std::vector<Entry> entries_;
  size_t count_ = 0;
};

// Set on a thread while it runs the Python rare path, so a module called from
// there is not resolved recursively. Read on the rare path only.
thread_local bool tls_resolving = false;

// --- the type -------------------------------------------------------------------

struct ModuleCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* wrapped;   // the original nn.Module.__call__
  Session* global;     // the process scope's session, or null
  PyObject* global_owner;  // its Python Session: keeps `global` alive
  PyObject* resolve;   // the process scope's resolve(module) -> slot or -1
  PyObject* owners;    // dict: id(session) -> model-scope Python Session in the table
  ModuleTable* table;
  PyObject* weakrefs;
};

// The rare path: the first call of an instance while the process scope
// records. Returns its slot, kNoSlot not to record it, or kNoSlot with an
// exception set only for a BaseException that must propagate
// (KeyboardInterrupt); any other error in hooktrace's own code is reported as
// unraisable and the call goes on unrecorded.
C10_NOINLINE uint32_t resolve_slot(ModuleCall* g, PyObject* module) {
  if (tls_resolving || !g->resolve) return kNoSlot;
  tls_resolving = true;
  PyObject* resolve = g->resolve;
  Py_INCREF(resolve);  // the process scope may end inside it
  PyObject* r = PyObject_CallOneArg(resolve, module);
  tls_resolving = false;
  long slot = -1;
  if (r) {
    slot = PyLong_AsLong(r);
    Py_DECREF(r);
  }
  if (PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_Exception)) PyErr_WriteUnraisable(resolve);
    Py_DECREF(resolve);
    return kNoSlot;  // (a BaseException stays set: the caller propagates it)
  }
  Py_DECREF(resolve);
  return slot < 0 || slot >= static_cast<long>(kNoSlot) ? kNoSlot : static_cast<uint32_t>(slot);
}

// One side of a span in one session. `on` is whether it emitted a profiler
// range at enter, so exit closes exactly what enter opened.
inline bool span_enter(Session* s, uint32_t slot, uint8_t flags) {
  s->record(slot, kEnter, flags);
  // Rare (emit_profiler=True): tested after the record, so the common path costs
  // one predictable branch here.
  if (C10_LIKELY(!s->emits()) || !s->active()) return false;
  emit_enter(s->emit_name(slot));
  return true;
}

inline void span_exit(Session* s, uint32_t slot, uint8_t flags, bool on) {
  s->record(slot, kExit, flags);
  if (C10_UNLIKELY(on)) emit_exit();
}

// Interned names, made once by add_module_call_type.
PyObject* s_training = nullptr;
PyObject* s_wrapped_call_impl = nullptr;
PyObject* s_compiled_call_impl = nullptr;
PyObject* s_call_impl = nullptr;

// An ENTER's flags: an eval/inference call (grad mode off, or `module.training`
// False) is told apart from a training one. `training` is read from the instance
// dict (nn.Module.__setattr__ has made it a real dict by then): no allocation.
inline uint8_t enter_flags(PyObject* module) {
  uint8_t flags = c10::GradMode::is_enabled() ? 0 : kFlagNoGrad;
  PyObject** dict = _PyObject_GetDictPtr(module);
  if (C10_LIKELY(dict && *dict)) {
    PyObject* training = PyDict_GetItemWithError(*dict, s_training);  // borrowed
    if (training == Py_False)
      flags |= kFlagEvalMode;
    else if (C10_UNLIKELY(!training && PyErr_Occurred()))
      PyErr_Clear();
  }
  return flags;
}

// The module's call, as `wrapped` (nn.Module._wrapped_call_impl) makes it:
//
//   if self._compiled_call_impl is not None:
//       return self._compiled_call_impl(*args, **kwargs)
//   return self._call_impl(*args, **kwargs)
//
// done here instead of in a Python frame of its own when the module's class
// would run exactly `wrapped` (a class or a patch that changes
// _wrapped_call_impl gets it called as is) and `_compiled_call_impl` is None;
// `_call_impl` is called as a method, without a bound method object. This
// saves the frame the recording would otherwise add to (see RESULTS.md); the
// hooks, forward and tracing checks stay torch's own (_call_impl).
inline PyObject* call_module(ModuleCall* g, PyObject* const* args, size_t nargsf,
                             PyObject* kwnames) {
  PyObject* module = args[0];
  if (C10_LIKELY(_PyType_Lookup(Py_TYPE(module), s_wrapped_call_impl) == g->wrapped)) {
    PyObject* compiled = PyObject_GetAttr(module, s_compiled_call_impl);
    if (C10_LIKELY(compiled == Py_None)) {
      Py_DECREF(compiled);
      return PyObject_VectorcallMethod(s_call_impl, args, nargsf, kwnames);
    }
    if (compiled) {
      Py_DECREF(compiled);
    } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();  // not set up by nn.Module.__init__: the original decides
    } else {
      return nullptr;  // anything else (a KeyboardInterrupt) propagates
    }
  }
  return PyObject_Vectorcall(g->wrapped, args, nargsf, kwnames);
}

// module_call with shapes, numerics and/or device time on in one of the sessions (x: extras;
// a null session records nothing). Out of line: the common path stays as it was.
C10_NOINLINE PyObject* call_with_extras(ModuleCall* g, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames, uint8_t model_x, uint8_t global_x,
                           Session* model, uint32_t model_slot, bool model_on,
                           Session* global, uint32_t global_slot, bool global_on) {
  // a paused session (between schedule windows) records nothing: measure nothing
  if (model && !model->active()) model_x = 0;
  if (global && !global->active()) global_x = 0;
  const bool shapes = (model_x | global_x) & Session::kExtraShapes;
  const uint32_t in_sig = shapes ? input_signature(args, nargsf, kwnames) : kShapeUnknown;
  Session* model_num = model_x & Session::kExtraNumerics ? model : nullptr;
  Session* global_num = global_x & Session::kExtraNumerics ? global : nullptr;
  if (model_num || global_num)
    numerics_enter(args, nargsf, kwnames, model_num, model_slot, global_num, global_slot);
  // device time (gpu_time.h): the marks hug the call, numerics' kernels stay outside
  const bool model_gpu = model_x & Session::kExtraGpu;
  const bool global_gpu = global_x & Session::kExtraGpu;
  if (model_gpu) gpu_enter(model, model_slot);
  if (global_gpu) gpu_enter(global, global_slot);
  PyObject* result = call_module(g, args, nargsf, kwnames);
  if (global_gpu) gpu_exit(global, global_slot);
  if (model_gpu) gpu_exit(model, model_slot);
  const uint8_t flags = result ? 0 : kFlagError;
  if (global) span_exit(global, global_slot, flags, global_on);
  if (model) span_exit(model, model_slot, flags, model_on);
  if (result) {
    if (shapes) {
      const uint32_t out_sig = output_signature(result);
      if (model_x & Session::kExtraShapes)
        model->record_shapes(model_slot, in_sig, out_sig);
      if (global_x & Session::kExtraShapes)
        global->record_shapes(global_slot, in_sig, out_sig);
    }
    if (model_num || global_num)
      numerics_exit(result, model_num, model_slot, global_num, global_slot);
  }
  return result;
}

PyObject* module_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  if (C10_UNLIKELY(PyVectorcall_NARGS(nargsf) < 1))
    return PyObject_Vectorcall(g->wrapped, args, nargsf, kwnames);
  PyObject* module = args[0];
  // Copied out: the call below may insert into the table and move its entries.
  Session* model = nullptr;
  PyObject* model_owner = nullptr;
  uint32_t model_slot = 0;
  uint32_t global_slot = kUnresolved;
  if (const Entry* e = g->table->find(module)) {
    model = e->model;
    model_owner = e->model_owner;
    model_slot = e->model_slot;
    global_slot = e->global_slot;
  }
  Session* global = g->global;
  if (!global) {
    global_slot = kNoSlot;
  } else if (C10_UNLIKELY(global_slot == kUnresolved)) {
    global_slot = global->active() ? resolve_slot(g, module) : kNoSlot;
    if (C10_UNLIKELY(global_slot == kNoSlot && PyErr_Occurred())) return nullptr;
    if (global != g->global) global_slot = kNoSlot;  // resolve ended the process scope
  }
  PyObject* global_owner = global_slot != kNoSlot ? g->global_owner : nullptr;
  if (!model && !global_owner) return call_module(g, args, nargsf, kwnames);
  // Both sessions stay alive until the exit is recorded, even if their scopes end
  // inside the call (a stopped session records nothing): one reference each,
  // no allocation.
  Py_XINCREF(model_owner);
  Py_XINCREF(global_owner);
  const uint8_t flags_in = enter_flags(module);
  const bool model_on = model && span_enter(model, model_slot, flags_in);
  const bool global_on = global_owner && span_enter(global, global_slot, flags_in);
  // shapes / numerics (shapes.h, numerics.h): one load per session when off
  const uint8_t model_x = model ? model->extras() : 0;
  const uint8_t global_x = global_owner ? global->extras() : 0;
  if (C10_LIKELY(!(model_x | global_x))) {
    PyObject* result = call_module(g, args, nargsf, kwnames);
    const uint8_t flags = result ? 0 : kFlagError;
    if (global_owner) span_exit(global, global_slot, flags, global_on);
    if (model) span_exit(model, model_slot, flags, model_on);
    Py_XDECREF(global_owner);
    Py_XDECREF(model_owner);
    return result;
  }
  PyObject* result =
      call_with_extras(g, args, nargsf, kwnames, model_x, global_x, model, model_slot, model_on,
                       global_owner ? global : nullptr, global_slot, global_on);
  Py_XDECREF(global_owner);
  Py_XDECREF(model_owner);
  return result;
}

PyObject* module_call_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  PyObject* wrapped;
  static const char* kwlist[] = {"wrapped", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", const_cast<char**>(kwlist), &wrapped))
    return nullptr;
  if (!PyCallable_Check(wrapped)) {
    PyErr_Format(PyExc_TypeError, "expected a callable, got %R", wrapped);
    return nullptr;
  }
  PyObject* owners = PyDict_New();
  if (!owners) return nullptr;
  auto* self = reinterpret_cast<ModuleCall*>(type->tp_alloc(type, 0));
  if (!self) {
    Py_DECREF(owners);
    return nullptr;
  }
  self->vectorcall = module_call;
  self->table = new ModuleTable();
  Py_INCREF(wrapped);
  self->wrapped = wrapped;
  self->owners = owners;
  return reinterpret_cast<PyObject*>(self);
}

int module_call_clear(PyObject* self) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  Py_CLEAR(g->resolve);  // the resolver refers back to this object: a cycle
  return 0;
}

void module_call_dealloc(PyObject* self) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  PyObject_GC_UnTrack(self);
  if (g->weakrefs) PyObject_ClearWeakRefs(self);
  module_call_clear(self);
  delete g->table;  // before the sessions its entries point to can go
  g->table = nullptr;
  g->global = nullptr;
  Py_CLEAR(g->global_owner);
  Py_CLEAR(g->owners);
  Py_CLEAR(g->wrapped);
  Py_TYPE(self)->tp_free(self);
}

int module_call_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  Py_VISIT(g->wrapped);
  Py_VISIT(g->global_owner);
  Py_VISIT(g->resolve);
  Py_VISIT(g->owners);
  return 0;
}

// A descriptor like a function's: `nn.Module.__call__` is this object itself,
// `m.__call__` a bound method of it (only when asked for; calls do not bind).
PyObject* module_call_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

Session* as_session(PyObject* obj) {
  try {
    return py::cast<Session*>(py::handle(obj));
  } catch (const py::cast_error&) {
    PyErr_Format(PyExc_TypeError, "expected a hooktrace._C.Session, got %R", obj);
    return nullptr;
  }
}

bool parse_slot(unsigned long slot) {
  if (slot >= kNoSlot) {
    PyErr_SetString(PyExc_OverflowError, "slot out of range");
    return false;
  }
  return true;
}

// --- the scopes' controls (rare path, GIL held) ----------------------------------

PyObject* mc_set_global(PyObject* self, PyObject* args) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  PyObject *session_obj, *resolve;
  if (!PyArg_ParseTuple(args, "OO", &session_obj, &resolve)) return nullptr;
  Session* s = as_session(session_obj);
  if (!s) return nullptr;
  if (!PyCallable_Check(resolve)) {
    PyErr_Format(PyExc_TypeError, "resolve must be callable, got %R", resolve);
    return nullptr;
  }
  if (g->global) {
    PyErr_SetString(PyExc_RuntimeError, "a process scope is already recording");
    return nullptr;
  }
  Py_INCREF(session_obj);
  Py_INCREF(resolve);
  g->global_owner = session_obj;
  g->resolve = resolve;
  g->global = s;
  Py_RETURN_NONE;
}

PyObject* mc_clear_global(PyObject* self, PyObject*) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  g->global = nullptr;
  g->table->update_all([](Entry& e) {
    e.global_slot = kUnresolved;
    return e.model == nullptr;
  });
  Py_CLEAR(g->resolve);
  Py_CLEAR(g->global_owner);
  Py_RETURN_NONE;
}

// register(module, slot): the process scope names `module` with `slot`.
PyObject* mc_register(PyObject* self, PyObject* args) {
  PyObject* module;
  unsigned long slot;
  if (!PyArg_ParseTuple(args, "Ok", &module, &slot) || !parse_slot(slot)) return nullptr;
  reinterpret_cast<ModuleCall*>(self)->table->upsert(module).global_slot =
      static_cast<uint32_t>(slot);
  Py_RETURN_NONE;
}

// register_model(module, session, slot): a model scope records `module` into
// `session` under `slot`; the session is kept alive until release(session).
PyObject* mc_register_model(PyObject* self, PyObject* args) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  PyObject *module, *session_obj;
  unsigned long slot;
  if (!PyArg_ParseTuple(args, "OOk", &module, &session_obj, &slot) || !parse_slot(slot))
    return nullptr;
  Session* s = as_session(session_obj);
  if (!s) return nullptr;
  PyObject* key = PyLong_FromVoidPtr(s);
  if (!key) return nullptr;
  const int err = PyDict_SetItem(g->owners, key, session_obj);
  Py_DECREF(key);
  if (err < 0) return nullptr;
  Entry& e = g->table->upsert(module);
  e.model = s;
  e.model_owner = session_obj;
  e.model_slot = static_cast<uint32_t>(slot);
  Py_RETURN_NONE;
}

// release(session): the model scope recording into `session` ends.
PyObject* mc_release(PyObject* self, PyObject* session_obj) {
  auto* g = reinterpret_cast<ModuleCall*>(self);
  Session* s = as_session(session_obj);
  if (!s) return nullptr;
  g->table->update_all([s](Entry& e) {
    if (e.model != s) return false;
    e.model = nullptr;
    e.model_owner = nullptr;
    return e.global_slot == kUnresolved;
  });
  PyObject* key = PyLong_FromVoidPtr(s);
  if (!key) return nullptr;
  if (PyDict_DelItem(g->owners, key) < 0) {
    if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
      Py_DECREF(key);
      return nullptr;
    }
    PyErr_Clear();
  }
  Py_DECREF(key);
  Py_RETURN_NONE;
}

// skip(module): the process scope knows `module` and does not record it (a
// torch.compile() wrapper whose module's own call is the span).
PyObject* mc_skip(PyObject* self, PyObject* module) {
  reinterpret_cast<ModuleCall*>(self)->table->upsert(module).global_slot = kNoSlot;
  Py_RETURN_NONE;
}

PyObject* mc_forget(PyObject* self, PyObject* address) {
  void* key = PyLong_AsVoidPtr(address);
  if (!key && PyErr_Occurred()) return nullptr;
  reinterpret_cast<ModuleCall*>(self)->table->erase(key);
  Py_RETURN_NONE;
}

PyObject* mc_lookup(PyObject* self, PyObject* module) {
  const Entry* e = reinterpret_cast<ModuleCall*>(self)->table->find(module);
  if (!e || e->global_slot >= kNoSlot) return PyLong_FromLong(-1);
  return PyLong_FromUnsignedLong(e->global_slot);
}

PyObject* mc_size(PyObject* self, void*) {
  return PyLong_FromSize_t(reinterpret_cast<ModuleCall*>(self)->table->size());
}

PyObject* mc_wrapped(PyObject* self, void*) {
  PyObject* w = reinterpret_cast<ModuleCall*>(self)->wrapped;
  Py_INCREF(w);
  return w;
}

PyObject* forward_attr(PyObject* self, void* name) {
  return PyObject_GetAttrString(reinterpret_cast<ModuleCall*>(self)->wrapped,
                                static_cast<const char*>(name));
}

PyObject* mc_repr(PyObject* self) {
  return PyUnicode_FromFormat("<hooktrace recording of %R>",
                              reinterpret_cast<ModuleCall*>(self)->wrapped);
}

PyMethodDef mc_methods[] = {
    {"set_global", mc_set_global, METH_VARARGS,
     "set_global(session, resolve): the process scope records into `session`."},
    {"clear_global", mc_clear_global, METH_NOARGS, "clear_global(): the process scope ends."},
    {"register", mc_register, METH_VARARGS,
     "register(module, slot): the process scope records the module's calls under `slot`."},
    {"register_model", mc_register_model, METH_VARARGS,
     "register_model(module, session, slot): a model scope records the module's calls."},
    {"release", mc_release, METH_O, "release(session): the model scope of `session` ends."},
    {"skip", mc_skip, METH_O, "skip(module): the process scope does not record the module."},
    {"forget", mc_forget, METH_O, "forget(address): the module at `address` is gone."},
    {"lookup", mc_lookup, METH_O, "lookup(module) -> its process-scope slot, or -1."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef mc_getset[] = {
    {"__wrapped__", mc_wrapped, nullptr, nullptr, nullptr},
    {"__code__", forward_attr, nullptr, nullptr, const_cast<char*>("__code__")},
    {"__name__", forward_attr, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", forward_attr, nullptr, nullptr, const_cast<char*>("__qualname__")},
    {"__doc__", forward_attr, nullptr, nullptr, const_cast<char*>("__doc__")},
    {"__module__", forward_attr, nullptr, nullptr, const_cast<char*>("__module__")},
    {"size", mc_size, nullptr, "modules in the table", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject make_module_call_type() {
  PyTypeObject t = {PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "hooktrace._C.ModuleCall";
  t.tp_doc = "ModuleCall(wrapped): nn.Module.__call__ recording the calls of registered modules.";
  t.tp_basicsize = sizeof(ModuleCall);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
               Py_TPFLAGS_METHOD_DESCRIPTOR;
  t.tp_vectorcall_offset = offsetof(ModuleCall, vectorcall);
  t.tp_weaklistoffset = offsetof(ModuleCall, weakrefs);
  t.tp_call = PyVectorcall_Call;
  t.tp_new = module_call_new;
  t.tp_dealloc = module_call_dealloc;
  t.tp_traverse = module_call_traverse;
  t.tp_clear = module_call_clear;
  t.tp_descr_get = module_call_descr_get;
  t.tp_repr = mc_repr;
  t.tp_methods = mc_methods;
  t.tp_getset = mc_getset;
  return t;
}

PyTypeObject ModuleCallType = make_module_call_type();

}  // namespace

int add_module_call_type(PyObject* module) {
  s_training = PyUnicode_InternFromString("training");
  s_wrapped_call_impl = PyUnicode_InternFromString("_wrapped_call_impl");
  s_compiled_call_impl = PyUnicode_InternFromString("_compiled_call_impl");
  s_call_impl = PyUnicode_InternFromString("_call_impl");
  if (!s_training || !s_wrapped_call_impl || !s_compiled_call_impl || !s_call_impl) return -1;
  if (PyType_Ready(&ModuleCallType) < 0) return -1;
  Py_INCREF(&ModuleCallType);
  if (PyModule_AddObject(module, "ModuleCall", reinterpret_cast<PyObject*>(&ModuleCallType)) < 0) {
    Py_DECREF(&ModuleCallType);
    return -1;
  }
  return 0;
}

}  // namespace hooktrace
