// The tensors of a call's arguments or result, in order (issue #19: shapes and
// numerics read them natively). Nested tuples and lists, dict values (transformers'
// ModelOutput is an OrderedDict) and dataclass fields are flattened depth-first up
// to kMaxWalkDepth; anything else is not a tensor and is passed over. No Python
// object is created: the dataclass test is a type-dict lookup of an interned name.
#pragma once

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

namespace hooktrace {

constexpr int kMaxWalkDepth = 4;

// Interned "__dataclass_fields__" (set once by init_tensor_walk, GIL held).
extern PyObject* g_dataclass_fields;
void init_tensor_walk();

// Calls f(const at::Tensor&) for each tensor in `obj`; stops early when f returns
// false. Returns false when it stopped early. GIL held; never sets an error.
template <typename F>
bool walk_tensors(PyObject* obj, int depth, F& f) {
  if (THPVariable_Check(obj)) return f(THPVariable_Unpack(obj));
  if (depth >= kMaxWalkDepth || obj == Py_None) return true;
  if (PyTuple_Check(obj) || PyList_Check(obj)) {
    // (a list may change under a tensor's __torch_function__: index, don't iterate)
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(obj); ++i)
      if (!walk_tensors(PySequence_Fast_GET_ITEM(obj, i), depth + 1, f)) return false;
  } else if (PyDict_Check(obj)) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value))
      if (!walk_tensors(value, depth + 1, f)) return false;
  } else if (g_dataclass_fields && _PyType_Lookup(Py_TYPE(obj), g_dataclass_fields)) {
    PyObject** dict = _PyObject_GetDictPtr(obj);
    if (dict && *dict) {
      Py_ssize_t pos = 0;
      PyObject *key, *value;
      while (PyDict_Next(*dict, &pos, &key, &value))
        if (!walk_tensors(value, depth + 1, f)) return false;
    }
  }
  return true;
}

// The tensors among a vectorcall's arguments after `self` (args[0]): positional,
// then keyword values.
template <typename F>
void walk_call_args(PyObject* const* args, size_t nargsf, PyObject* kwnames, F& f) {
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  for (Py_ssize_t i = 1; i < n; ++i)
    if (!walk_tensors(args[i], 1, f)) return;
}

}  // namespace hooktrace
