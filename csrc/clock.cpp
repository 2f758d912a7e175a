#include "clock.h"

namespace hooktrace {

ClockCapture::ClockCapture()
    : converter_(std::make_unique<c10::ApproximateClockToUnixTimeConverter>()),
      ticks0_(now_ticks()) {}

ClockConversion ClockCapture::current() const {
  auto to_unix = converter_->makeConverter();
  // The converter is linear: (double)(t - t0_approx) * scale + t0. Sampling it
  // 2^40 ticks apart (minutes of wall time) recovers the slope to well under
  // 1 ns over hours of trace.
  constexpr uint64_t kSpan = uint64_t(1) << 40;
  ClockConversion c;
  c.ticks0 = ticks0_;
  c.unix_ns0 = to_unix(static_cast<c10::approx_time_t>(ticks0_));
  const int64_t far = to_unix(static_cast<c10::approx_time_t>(ticks0_ + kSpan));
  c.ns_per_tick = static_cast<double>(far - c.unix_ns0) / static_cast<double>(kSpan);
  return c;
}

}  // namespace hooktrace
