// Clock conversion for a recording session.
//
// Events store raw c10::getApproximateTime() ticks (rdtsc on x86: ~7 ns, versus
// ~20 ns for clock_gettime). torch.profiler converts the same ticks to Unix ns
// with c10::ApproximateClockToUnixTimeConverter measured around its session; we
// do the same around ours so module spans land on the profiler's timeline
// (a prototype aligned within ~100 ns, see issue #2).
#pragma once

#include <c10/util/ApproximateClock.h>

#include <cstdint>
#include <memory>

namespace hooktrace {

// unix_ns = unix_ns0 + round((ticks - ticks0) * ns_per_tick)
struct ClockConversion {
  uint64_t ticks0 = 0;
  int64_t unix_ns0 = 0;
  double ns_per_tick = 1.0;
};

// Measures clock pairs at construction (session start) and again in current()
// (session stop, or a live snapshot); the linear map between them is exact at
// both ends.
class ClockCapture {
 public:
  ClockCapture();
  ClockConversion current() const;

 private:
  std::unique_ptr<c10::ApproximateClockToUnixTimeConverter> converter_;
  uint64_t ticks0_;
};

inline uint64_t now_ticks() {
  return static_cast<uint64_t>(c10::getApproximateTime());
}

}  // namespace hooktrace
