#include "profiler_emit.h"

#include <ATen/record_function.h>

#include <memory>
#include <new>
#include <string_view>

namespace hooktrace {
namespace {

struct Slot {
  alignas(at::RecordFunction) unsigned char storage[sizeof(at::RecordFunction)];
  bool live = false;
  at::RecordFunction* rf() { return std::launder(reinterpret_cast<at::RecordFunction*>(storage)); }
};

// Module nesting deeper than this is still recorded by hooktrace; only the
// profiler ranges beyond it are skipped.
constexpr int kMaxDepth = 512;

struct EmitStack {
  std::unique_ptr<Slot[]> slots;
  int depth = 0;  // may exceed kMaxDepth; those levels hold no slot
  ~EmitStack() {
    // A thread ending inside a module call: end what is still open.
    if (!slots) return;
    for (int d = std::min(depth, kMaxDepth) - 1; d >= 0; --d)
      if (slots[d].live) slots[d].rf()->~RecordFunction();
  }
};
thread_local EmitStack tls_emit;

}  // namespace

void emit_enter(const char* name) {
  EmitStack& st = tls_emit;
  const int d = st.depth++;
  if (d >= kMaxDepth) return;
  if (C10_UNLIKELY(!st.slots)) st.slots = std::make_unique<Slot[]>(kMaxDepth);
  Slot& slot = st.slots[d];
  slot.live = false;
  auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  if (C10_LIKELY(!callbacks)) return;
  auto* rf = new (slot.storage) at::RecordFunction(std::move(*callbacks));
  // a const char*: torch 2.5's before() takes it (not std::string_view), today's as a
  // std::string_view; neither copies the name
  rf->before(name, c10::ArrayRef<const c10::IValue>{});
  slot.live = true;
}

void emit_exit() {
  EmitStack& st = tls_emit;
  if (st.depth == 0) return;  // an exit without its enter (emitting began mid-call)
  const int d = --st.depth;
  if (d >= kMaxDepth || !st.slots) return;
  Slot& slot = st.slots[d];
  if (slot.live) {
    slot.rf()->~RecordFunction();  // runs the end callbacks
    slot.live = false;
  }
}

}  // namespace hooktrace
