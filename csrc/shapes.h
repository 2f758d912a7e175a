// Shapes on every forward span (issue #19): trace(model, shapes=True).
//
// A recorded call's tensor inputs (positional and keyword arguments after the
// module) and tensor outputs, each flattened in order (tensor_walk.h), are two
// *signatures*: the dtype and sizes of each tensor, e.g. "float32[2,16,64];int64[2,16]"
// ("" for none). A signature is interned once per process into a table of strings
// (shape_signatures(); the trace stores it as info["shape_signatures"]) and an event
// carries its index:
//
//   kShapes (event.h), after the call's EXIT on the same thread:
//     id = module slot, seq = input signature | output signature << 32,
//     rf_tid = 0, flags = 0.  kShapeUnknown (UINT32_MAX): the table is full.
//
// Cost (the hot path with shapes on): a walk of the arguments and the result, a
// 64-bit hash of (dtype, rank, sizes) per tensor, and a lookup in a thread-local
// cache of hash -> index: no lock, no allocation, no Python object. Only a
// signature the thread has not seen builds its string and takes the table's mutex.
// Two different signatures with the same 64-bit hash would share an index (odds
// ~n^2 / 2^65 for n signatures): accepted. A signature keeps its first
// kMaxShapeTensors tensors and counts the rest ("...+N").
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hooktrace {

class Session;

constexpr uint32_t kShapeUnknown = UINT32_MAX;
constexpr int kMaxShapeTensors = 32;
constexpr size_t kMaxShapeSignatures = 1 << 20;

// The signature index of the tensors in a call's arguments (after `self`). GIL held.
uint32_t input_signature(PyObject* const* args, size_t nargsf, PyObject* kwnames);
// The signature index of the tensors in a call's result. GIL held.
uint32_t output_signature(PyObject* result);

// Signatures [first, count) of the process's table, in index order.
std::vector<std::string> shape_signatures(size_t first);

}  // namespace hooktrace
