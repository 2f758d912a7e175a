// Emitting module ranges into torch.profiler (issue #4): with
// trace(model, emit_profiler=True) every module call also opens a
// RecordFunction of RecordScope::USER_SCOPE named after the module, so the
// names appear in the profiler's own trace, TensorBoard, HTA and, on CUDA, as
// GPU user annotations.
//
// A module call's enter and exit are two separate calls from Python, so the
// RecordFunction cannot live on the C++ stack: each thread keeps a stack of
// preallocated slots (allocated once, on the thread's first emit) and
// constructs the RecordFunction in place. When no profiler runs,
// getStepCallbacksUnlessEmpty() says so and nothing is constructed.
#pragma once

namespace hooktrace {

// `name` must outlive the call (the session owns it).
void emit_enter(const char* name);
void emit_exit();

}  // namespace hooktrace
