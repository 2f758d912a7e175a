// The tensors of a call's arguments or result, in order (issue #19: shapes and
// numerics read them natively). Nested tuples and lists, dict values (transformers'
// ModelOutput is an OrderedDict) and dataclass fields are flattened depth-first up
// to kMaxWalkDepth (deeper containers are counted as not walked); anything else is
// not a tensor and is passed over. No Python object is created: the dataclass test is
// a type-dict lookup of an interned name.
#pragma once

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

namespace hooktrace {

constexpr int kMaxWalkDepth = 4;

// Interned "__dataclass_fields__" (set once by init_tensor_walk, GIL held).
extern PyObject* g_dataclass_fields;
void init_tensor_walk();

// Calls f(const at::Tensor&) for each tensor in `obj`; stops early when f returns
// false. Returns false when it stopped early. A container (tuple, list, dict,
// dataclass) deeper than kMaxWalkDepth is not walked: counted in *not_walked when
// given. A dataclass with slots=True (no __dict__) is read by its fields' names.
// GIL held; never sets an error.
template <typename F>
bool walk_tensors(PyObject* obj, int depth, F& f, uint32_t* not_walked = nullptr) {
  if (THPVariable_Check(obj)) return f(THPVariable_Unpack(obj));
  if (obj == Py_None) return true;
  const bool sequence = PyTuple_Check(obj) || PyList_Check(obj);
  const bool dict = !sequence && PyDict_Check(obj);
  PyObject* fields = sequence || dict || !g_dataclass_fields
                         ? nullptr
                         : _PyType_Lookup(Py_TYPE(obj), g_dataclass_fields);  // (borrowed)
  if (!sequence && !dict && !fields) return true;
  if (depth >= kMaxWalkDepth) {
    if (not_walked) ++*not_walked;
    return true;
  }
  if (sequence) {
    // (a list may change under a tensor's __torch_function__: index, don't iterate)
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(obj); ++i)
      if (!walk_tensors(PySequence_Fast_GET_ITEM(obj, i), depth + 1, f, not_walked)) return false;
  } else if (dict) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value))
      if (!walk_tensors(value, depth + 1, f, not_walked)) return false;
  } else {
    PyObject** inst_dict = _PyObject_GetDictPtr(obj);
    if (inst_dict && *inst_dict) {
      Py_ssize_t pos = 0;
      PyObject *key, *value;
      while (PyDict_Next(*inst_dict, &pos, &key, &value))
        if (!walk_tensors(value, depth + 1, f, not_walked)) return false;
    } else if (!inst_dict && PyDict_Check(fields)) {
      // slots=True: each field's slot, by name (a slot is a member descriptor: no
      // Python code runs); an unset one is passed over
      Py_ssize_t pos = 0;
      PyObject *key, *field;
      while (PyDict_Next(fields, &pos, &key, &field)) {
        PyObject* value = PyObject_GetAttr(obj, key);
        if (!value) {
          PyErr_Clear();
          continue;
        }
        const bool go_on = walk_tensors(value, depth + 1, f, not_walked);
        Py_DECREF(value);
        if (!go_on) return false;
      }
    }
  }
  return true;
}

// The tensors among a vectorcall's arguments after `self` (args[0]): positional,
// then keyword values.
template <typename F>
void walk_call_args(PyObject* const* args, size_t nargsf, PyObject* kwnames, F& f,
                    uint32_t* not_walked = nullptr) {
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  for (Py_ssize_t i = 1; i < n; ++i)
    if (!walk_tensors(args[i], 1, f, not_walked)) return;
}

}  // namespace hooktrace
