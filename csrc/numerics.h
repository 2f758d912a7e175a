// Numeric health per module call (issue #19): trace(model, numerics=True).
//
// Forward: after a recorded call returns (its EXIT recorded), the floating-point
// tensors of its output (nested tuples, lists, dicts, dataclasses: depth <= 4; deeper
// containers are counted, kNumNotWalked) are reduced where they live: abs-max
// (aminmax) and the 2-norm, one kernel each (the 2-norm redone in float64 when float32
// overflows); only when one of them is not finite, the count of non-finite values
// (isfinite().sum()). A tensor that cannot be reduced (nested, a subclass without
// those ops) is counted (kNumFailed); no C++ exception or Python error leaves here. One kNumerics event follows the EXIT on
// the same thread.
//
// Backward: the gradient with respect to the module's *inputs* (not its output):
// the call registers a tensor hook on each input tensor that requires grad (grad
// mode on; a leaf tensor, such as a parameter given to a submodule, gets one hook per
// session instead, removed by forget_numerics); when every hook has fired, the gradients' statistics are one
// kNumerics event with kNumBackward, on the engine thread. Why the inputs: a module
// whose backward produces a NaN (a custom autograd Function) shows it in the
// gradient of its own inputs; the gradient of its output is still finite. A tensor
// that is the input of a module and of its parent gives both the same gradient at
// the same moment; the reader (hooktrace/analysis/numerics.py) names the innermost.
//
// The kNumerics event (event.h): t, seq = absmax (float32 bits, low half) | rms
// (float32 bits, high half), id = the module's slot, rf_tid = non-finite values
// (saturating), flags = kNumBackward | kNumSkipped (no floating tensor: integer or
// boolean outputs, nothing requiring grad) | kNumFailed (a reduction raised: a
// tensor subclass or fake tensor that cannot be reduced; stats are zero) |
// kNumNotWalked (containers deeper than the walk goes).
//
// Cost: this path is taken only by sessions with numerics on (module_call.cpp tests
// one byte); it allocates (tensors, hooks) and, on CPU, reads three scalars per
// tensor (no sync to wait for there). Off the CPU the reductions are deferred (below):
// no host sync per module call, one per step.
// When the first non-finite value of a session is seen, the session's callback (set
// from Python) is called once, with the GIL.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <utility>

namespace hooktrace {

class Session;

// Flags of a kNumerics event.
enum NumericsFlags : uint8_t {
  kNumBackward = 1,
  kNumSkipped = 2,
  kNumFailed = 4,
  kNumDeferred = 8,  // the statistics follow in a kNumericsValue event (rf_tid = its id)
  kNumNotWalked = 16,  // the output holds containers deeper than the walk goes
};

// Deferred statistics (a tensor off the CPU, or every tensor after
// set_numerics_deferred(true)): the call's reductions are queued where its tensors
// live, with no host sync: one fused kernel per tensor when a launcher is registered
// (set_numerics_fused, below), else five ATen ops (abs-max, the tensor scaled by it,
// that copy's 2-norm and count of non-zeros: numerics.cpp, reduce_deferred); its kNumerics event
// carries kNumDeferred, seq 0 and rf_tid = an id unique in the session.
// flush_numerics() reads every queued tensor of the session at once (one sync per
// step: the recorder calls it at each step mark and before it stops) and records a
// kNumericsValue event per call: id = that id, seq / rf_tid / flags as a kNumerics
// event's. Returns the calls flushed. GIL held.
size_t flush_numerics(Session* s);
// Process-wide: take the deferred path on CPU too (tests the GPU path on CPU).
void set_numerics_deferred(bool on);
// Process-wide: the fused deferred path (hooktrace/record/fused_numerics.py). With a
// launcher registered, a deferred float32/bfloat16/float16 CUDA tensor (CPU too when
// `cpu`) is reduced by launcher(x, buffer, row): one kernel, one pass, folding its
// finite abs-max, sum of squares, NaN and inf counts into `row` of a float64 [rows, 4]
// buffer handed out here (zeroed once per 1024 rows, read at the flush with one copy
// per buffer); x is the tensor itself when its elements fill one dense range of
// memory, else a copy (reshape). The launcher is called with the GIL (taken where the
// caller, an autograd thread, does not hold it); the first exception it raises
// unregisters it and is kept (numerics_fused_state); that tensor and every later one
// take the ATen path. None unregisters. GIL held.
void set_numerics_fused(PyObject* launcher, bool cpu);
// (a launcher is registered, the first failure's message or "") GIL held.
std::pair<bool, std::string> numerics_fused_state();
// Drops the session's queue and removes the hooks it left on leaf tensors (the
// recorder, after its last flush).
void forget_numerics(const Session* s);
// Leaf tensors holding a numerics hook, all sessions (tests).
size_t numerics_leaf_hooks();

// The session's callback for its first non-finite value: called once, with the GIL,
// as callback(slot, backward: bool); exceptions it raises are reported as
// unraisable. None clears it (the recorder does at its end). GIL held.
void set_nonfinite_callback(Session* s, PyObject* callback);

// After a recorded call returned `result`: one forward kNumerics event into each
// given session (null: none). GIL held.
void numerics_exit(PyObject* result, Session* a, uint32_t slot_a, Session* b, uint32_t slot_b);

// At a recorded call's start: hooks on its input tensors for the backward event.
// `args`/`nargsf`/`kwnames` as the vectorcall received them (args[0] is the
// module). GIL held.
void numerics_enter(PyObject* const* args, size_t nargsf, PyObject* kwnames, Session* a,
                    uint32_t slot_a, Session* b, uint32_t slot_b);

}  // namespace hooktrace
