#include "global_forward.h"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "event.h"
#include "session.h"

namespace py = pybind11;

namespace hooktrace {
namespace {

// --- module address -> slot ---------------------------------------------------

// Open addressing with linear probing, load factor <= 1/2, backward-shift
// deletion (no tombstones), so a lookup is a multiply, a shift and usually one
// compare. Touched only with the GIL held.
class SlotTable {
 public:
  SlotTable() : entries_(kInitial) {}

  bool find(const void* key, uint32_t* slot) const {
    for (size_t i = index(key);; i = (i + 1) & mask()) {
      const Entry& e = entries_[i];
      if (e.key == key) {
        *slot = e.slot;
        return true;
      }
      if (!e.key) return false;
    }
  }

  void insert(const void* key, uint32_t slot) {
    if (2 * (count_ + 1) > entries_.size()) grow();
    for (size_t i = index(key);; i = (i + 1) & mask()) {
      Entry& e = entries_[i];
      if (e.key == key) {
        e.slot = slot;
        return;
      }
      if (!e.key) {
        e = {key, slot};
        ++count_;
        return;
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
    entries_[i] = {};
    --count_;
  }

  size_t size() const { return count_; }

 private:
  struct Entry {
    const void* key = nullptr;
    uint32_t slot = 0;
  };
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
      if (e.key) insert(e.key, e.slot);
  }

  std::vector<Entry> entries_;
  size_t count_ = 0;
};

// Set on a thread while it runs the Python rare path, so a module called from
// there is not resolved recursively. Read on the rare path only.
thread_local bool tls_resolving = false;

// --- the type -------------------------------------------------------------------

struct GlobalCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Session* session;
  PyObject* owner;    // the Python Session: keeps `session` alive
  PyObject* wrapped;  // the original nn.Module.__call__
  PyObject* resolve;  // resolve(module) -> slot or -1
  SlotTable* table;
  PyObject* weakrefs;
};

constexpr uint32_t kNoSlot = UINT32_MAX;

// The rare path: the first call of an instance. Returns its slot, kNoSlot not
// to record it, or kNoSlot with an exception set only for a BaseException that
// must propagate (KeyboardInterrupt); any other error in hooktrace's own code is
// reported as unraisable and the call goes on unrecorded.
C10_NOINLINE uint32_t resolve_slot(GlobalCall* g, PyObject* module) {
  if (tls_resolving) return kNoSlot;
  tls_resolving = true;
  PyObject* r = PyObject_CallOneArg(g->resolve, module);
  tls_resolving = false;
  long slot = -1;
  if (r) {
    slot = PyLong_AsLong(r);
    Py_DECREF(r);
  }
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return kNoSlot;  // propagate
    PyErr_WriteUnraisable(g->resolve);
    return kNoSlot;
  }
  return slot < 0 || slot >= static_cast<long>(kNoSlot) ? kNoSlot : static_cast<uint32_t>(slot);
}

PyObject* global_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* g = reinterpret_cast<GlobalCall*>(self);
  if (C10_UNLIKELY(PyVectorcall_NARGS(nargsf) < 1 || !g->session->active()))
    return PyObject_Vectorcall(g->wrapped, args, nargsf, kwnames);
  PyObject* module = args[0];
  uint32_t slot;
  if (C10_UNLIKELY(!g->table->find(module, &slot))) {
    slot = resolve_slot(g, module);
    if (slot == kNoSlot) {
      if (PyErr_Occurred()) return nullptr;
      return PyObject_Vectorcall(g->wrapped, args, nargsf, kwnames);
    }
  }
  g->session->record(slot, kEnter, 0);
  PyObject* result = PyObject_Vectorcall(g->wrapped, args, nargsf, kwnames);
  g->session->record(slot, kExit, result ? 0 : kFlagError);
  return result;
}

PyObject* global_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  PyObject *session_obj, *wrapped, *resolve;
  static const char* kwlist[] = {"session", "wrapped", "resolve", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO", const_cast<char**>(kwlist), &session_obj,
                                   &wrapped, &resolve))
    return nullptr;
  Session* session;
  try {
    session = py::cast<Session*>(py::handle(session_obj));
  } catch (const py::cast_error&) {
    PyErr_Format(PyExc_TypeError, "session must be a hooktrace._C.Session, got %R", session_obj);
    return nullptr;
  }
  for (PyObject* f : {wrapped, resolve}) {
    if (!PyCallable_Check(f)) {
      PyErr_Format(PyExc_TypeError, "expected a callable, got %R", f);
      return nullptr;
    }
  }
  auto* self = reinterpret_cast<GlobalCall*>(type->tp_alloc(type, 0));
  if (!self) return nullptr;
  self->vectorcall = global_call;
  self->session = session;
  self->table = new SlotTable();
  Py_INCREF(session_obj);
  self->owner = session_obj;
  Py_INCREF(wrapped);
  self->wrapped = wrapped;
  Py_INCREF(resolve);
  self->resolve = resolve;
  return reinterpret_cast<PyObject*>(self);
}

int global_clear(PyObject* self) {
  auto* g = reinterpret_cast<GlobalCall*>(self);
  Py_CLEAR(g->resolve);  // the resolver refers back to this object: a cycle
  return 0;
}

void global_dealloc(PyObject* self) {
  auto* g = reinterpret_cast<GlobalCall*>(self);
  PyObject_GC_UnTrack(self);
  if (g->weakrefs) PyObject_ClearWeakRefs(self);
  global_clear(self);
  Py_CLEAR(g->wrapped);
  Py_CLEAR(g->owner);
  delete g->table;
  Py_TYPE(self)->tp_free(self);
}

int global_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* g = reinterpret_cast<GlobalCall*>(self);
  Py_VISIT(g->wrapped);
  Py_VISIT(g->owner);
  Py_VISIT(g->resolve);
  return 0;
}

// A descriptor like a function's: `nn.Module.__call__` is this object itself,
// `m.__call__` a bound method of it (only when asked for; calls do not bind).
PyObject* global_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

// --- methods for the rare path ------------------------------------------------

PyObject* global_register(PyObject* self, PyObject* args) {
  PyObject* module;
  unsigned long slot;
  if (!PyArg_ParseTuple(args, "Ok", &module, &slot)) return nullptr;
  if (slot >= kNoSlot) {
    PyErr_SetString(PyExc_OverflowError, "slot out of range");
    return nullptr;
  }
  reinterpret_cast<GlobalCall*>(self)->table->insert(module, static_cast<uint32_t>(slot));
  Py_RETURN_NONE;
}

PyObject* global_forget(PyObject* self, PyObject* address) {
  void* key = PyLong_AsVoidPtr(address);
  if (!key && PyErr_Occurred()) return nullptr;
  reinterpret_cast<GlobalCall*>(self)->table->erase(key);
  Py_RETURN_NONE;
}

PyObject* global_lookup(PyObject* self, PyObject* module) {
  uint32_t slot;
  if (!reinterpret_cast<GlobalCall*>(self)->table->find(module, &slot)) return PyLong_FromLong(-1);
  return PyLong_FromUnsignedLong(slot);
}

PyObject* global_size(PyObject* self, void*) {
  return PyLong_FromSize_t(reinterpret_cast<GlobalCall*>(self)->table->size());
}

PyObject* global_wrapped(PyObject* self, void*) {
  PyObject* w = reinterpret_cast<GlobalCall*>(self)->wrapped;
  Py_INCREF(w);
  return w;
}

PyObject* forward_attr(PyObject* self, void* name) {
  return PyObject_GetAttrString(reinterpret_cast<GlobalCall*>(self)->wrapped,
                                static_cast<const char*>(name));
}

PyObject* global_repr(PyObject* self) {
  return PyUnicode_FromFormat("<hooktrace global recording of %R>",
                              reinterpret_cast<GlobalCall*>(self)->wrapped);
}

PyMethodDef global_methods[] = {
    {"register", global_register, METH_VARARGS,
     "register(module, slot): record the module's calls under `slot`."},
    {"forget", global_forget, METH_O, "forget(address): the module at `address` is gone."},
    {"lookup", global_lookup, METH_O, "lookup(module) -> its slot, or -1."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef global_getset[] = {
    {"__wrapped__", global_wrapped, nullptr, nullptr, nullptr},
    {"__name__", forward_attr, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", forward_attr, nullptr, nullptr, const_cast<char*>("__qualname__")},
    {"__doc__", forward_attr, nullptr, nullptr, const_cast<char*>("__doc__")},
    {"__module__", forward_attr, nullptr, nullptr, const_cast<char*>("__module__")},
    {"size", global_size, nullptr, "modules in the table", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject make_global_type() {
  PyTypeObject t = {PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "hooktrace._C.GlobalCall";
  t.tp_doc = "GlobalCall(session, wrapped, resolve): nn.Module.__call__ recording every module.";
  t.tp_basicsize = sizeof(GlobalCall);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
               Py_TPFLAGS_METHOD_DESCRIPTOR;
  t.tp_vectorcall_offset = offsetof(GlobalCall, vectorcall);
  t.tp_weaklistoffset = offsetof(GlobalCall, weakrefs);
  t.tp_call = PyVectorcall_Call;
  t.tp_new = global_new;
  t.tp_dealloc = global_dealloc;
  t.tp_traverse = global_traverse;
  t.tp_clear = global_clear;
  t.tp_descr_get = global_descr_get;
  t.tp_repr = global_repr;
  t.tp_methods = global_methods;
  t.tp_getset = global_getset;
  return t;
}

PyTypeObject GlobalCallType = make_global_type();

}  // namespace

int add_global_forward_type(PyObject* module) {
  if (PyType_Ready(&GlobalCallType) < 0) return -1;
  Py_INCREF(&GlobalCallType);
  if (PyModule_AddObject(module, "GlobalCall", reinterpret_cast<PyObject*>(&GlobalCallType)) < 0) {
    Py_DECREF(&GlobalCallType);
    return -1;
  }
  return 0;
}

}  // namespace hooktrace
