// A fixed set of sessions that process-wide callbacks record into: the
// backward callback (backward.h) and the kernel marks of compiled code
// (kernel_marks.h). Readers (the callbacks, on any thread) take no lock: they
// load each slot and record into the sessions they find. remove() waits until
// no reader can still be using the removed session.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "session.h"

namespace hooktrace {

class SessionSet {
 public:
  // At most this many sessions at once; more is an error.
  static constexpr int kMaxSessions = 8;

  // Adds `s` (kept alive until removed). Returns whether the set was empty
  // before. Throws std::runtime_error when full; `what` names the set then.
  bool add(const std::shared_ptr<Session>& s, const char* what);
  // Removes `s`; returns whether the set is empty now. Returns once no reader
  // can still touch `s` (or after 1 s, in which case the session is kept alive
  // forever rather than risk a use after free).
  bool remove(const Session* s);

  // Calls f(Session*) for each session in the set. Lock-free.
  template <class F>
  void for_each(F&& f) {
    inflight_.fetch_add(1, std::memory_order_acq_rel);
    for (auto& slot : slots_)
      if (Session* s = slot.load(std::memory_order_acquire)) f(s);
    inflight_.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  std::array<std::atomic<Session*>, kMaxSessions> slots_{};
  std::atomic<uint32_t> inflight_{0};  // readers inside for_each
  std::mutex mutex_;                   // guards owned_ and slot writes
  std::vector<std::shared_ptr<Session>> owned_;
};

}  // namespace hooktrace
