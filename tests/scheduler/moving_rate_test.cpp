#include "scheduler/moving_rate.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace tireless {
namespace {

constexpr int64_t second = 1'000'000'000;

// Events at a steady rate from the observer's start: the reading is that rate once
// min_observed_s passed, where a plain moving average reads a fraction of it for several windows.
TEST(moving_rate, reads_a_steady_rate_from_the_start_of_observing_it) {
  moving_rate r(10.0);
  const int64_t start = 100 * second;
  for (int i = 1; i <= 300; ++i) {  // 100 units a second, an event every 10 ms, for 3 s
    const int64_t now = start + i * second / 100;
    r.add(1.0, now);
    if (i % 100 == 0 && i >= 200) EXPECT_NEAR(r.at(now, start), 100.0, 10.0) << "after " << i / 100 << " s";
  }
  // Long after, still the rate; then it decays once events stop.
  for (int i = 301; i <= 6000; ++i) r.add(1.0, start + i * second / 100);
  EXPECT_NEAR(r.at(start + 60 * second, start), 100.0, 3.0);
  EXPECT_LT(r.at(start + 90 * second, start), 100.0 * 0.06);
}

TEST(moving_rate, a_single_early_event_is_read_over_at_least_the_least_observed_time) {
  moving_rate r(10.0);
  r.add(50.0, 0);
  // 5 a second in the average, over 2 s of a 10-s window: about 50 over those 2 s.
  EXPECT_NEAR(r.at(0, 0), 5.0 / (1.0 - std::exp(-moving_rate::min_observed_s / 10.0)), 1e-9);
  EXPECT_EQ(moving_rate(10.0).at(5 * second, 0), 0.0) << "nothing arrived: nothing";
}

}  // namespace
}  // namespace tireless
