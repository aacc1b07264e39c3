#pragma once
// A rate (units a second) of events, as an exponential moving average over a window, read
// unbiased from the start: an average that begins at zero reads (1 - e^(-t/window)) of the true
// rate after t seconds, so a server started under a sudden load took its first windows for a
// light one (cpu-smollm2 at 3x: half the free requests admitted in the first 10 s were refused
// later, after waiting 16 s). The reading is divided by that share of the time observed,
// counted from `since` (when the observer began to look), at least min_observed_s of it.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tireless {

class moving_rate {
 public:
  explicit moving_rate(double window_s) : window_s_(window_s) {}

  void add(double amount, int64_t now_ns) {
    rate_ = decayed(now_ns) + amount / window_s_;
    at_ns_ = now_ns;
  }
  // The rate at now_ns, for an observer looking since since_ns.
  double at(int64_t now_ns, int64_t since_ns) const {
    const double observed = std::max(static_cast<double>(now_ns - since_ns) * 1e-9, min_observed_s);
    return decayed(now_ns) / (1.0 - std::exp(-observed / window_s_));
  }

  static constexpr double min_observed_s = 2.0;

 private:
  double decayed(int64_t now_ns) const {
    const double dt = std::max<double>(0, static_cast<double>(now_ns - at_ns_) * 1e-9);
    return rate_ * std::exp(-dt / window_s_);
  }
  double window_s_;
  double rate_ = 0;
  int64_t at_ns_ = 0;
};

}  // namespace tireless
