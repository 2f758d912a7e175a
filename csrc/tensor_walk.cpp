#include "tensor_walk.h"

namespace hooktrace {

PyObject* g_dataclass_fields = nullptr;

void init_tensor_walk() {
  if (!g_dataclass_fields) g_dataclass_fields = PyUnicode_InternFromString("__dataclass_fields__");
}

}  // namespace hooktrace
