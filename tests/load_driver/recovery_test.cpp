#include <gtest/gtest.h>

#include "report.hpp"

namespace tireless::load {
namespace {

TEST(last_drop_s, a_spike_drops_once_and_recovery_counts_from_there) {
  const rate_profile spike{{{0, 0.3}, {100, 0.3}, {110, 4}, {150, 4}, {160, 0.3}, {300, 0.3}}};
  const double drop = last_drop_s(spike, 1, 50, 300);
  EXPECT_GT(drop, 150);
  EXPECT_LT(drop, 160) << "where 4x falling to 0.3x crosses 1x";
  EXPECT_EQ(last_drop_s(spike, 0.2, 50, 300), -1) << "0.8x at its peak: never over the capacity";
  EXPECT_EQ(last_drop_s(spike, 1, 200, 300), -1) << "the drop came before the measured part";
}

TEST(last_drop_s, a_load_that_swings_recovers_after_its_last_swing) {
  const rate_profile swings{{{0, 0.2}, {10, 5}, {20, 0.2}, {30, 5}, {40, 0.2}, {50, 5}, {60, 0.2}, {200, 0.2}}};
  const double drop = last_drop_s(swings, 1, 0, 200);
  EXPECT_GT(drop, 50);
  EXPECT_LT(drop, 60);
  EXPECT_EQ(last_drop_s(swings, 1, 0, 55), -1) << "still over the capacity where the measured part ends";
}

TEST(last_drop_s, a_ramp_that_ends_at_the_capacity_has_no_drop) {
  const rate_profile ramp{{{0, 0.5}, {100, 4}, {200, 0.5}, {300, 0.5}}};
  EXPECT_EQ(last_drop_s(ramp, 2, 0, 300), -1) << "2 x 0.5 is the capacity itself: nothing to recover to";
  EXPECT_GT(last_drop_s(ramp, 1, 0, 300), 100);
}

}  // namespace
}  // namespace tireless::load
