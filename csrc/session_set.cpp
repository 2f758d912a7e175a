#include "session_set.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace hooktrace {

bool SessionSet::add(const std::shared_ptr<Session>& s, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool was_empty = true;
  for (auto& slot : slots_) was_empty = was_empty && slot.load() == nullptr;
  for (auto& slot : slots_) {
    Session* expected = nullptr;
    if (slot.compare_exchange_strong(expected, s.get())) {
      owned_.push_back(s);
      return was_empty;
    }
  }
  throw std::runtime_error(std::string("hooktrace: at most ") + std::to_string(kMaxSessions) +
                           " traces can record " + what + " at once");
}

bool SessionSet::remove(const Session* s) {
  std::shared_ptr<Session> release;
  bool empty = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& slot : slots_) {
      if (slot.load() == s) slot.store(nullptr);
      empty = empty && slot.load() == nullptr;
    }
    for (auto it = owned_.begin(); it != owned_.end(); ++it) {
      if (it->get() == s) {
        release = std::move(*it);
        owned_.erase(it);
        break;
      }
    }
  }
  // A reader that loaded `s` before the store above may still be writing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (inflight_.load(std::memory_order_acquire) != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      new std::shared_ptr<Session>(std::move(release));  // never freed, by design
      break;
    }
    std::this_thread::yield();
  }
  return empty;
}

}  // namespace hooktrace
