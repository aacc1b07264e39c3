#include "ideal.hpp"

#include <gtest/gtest.h>

namespace tireless::load {
namespace {

TEST(ideal_on_time, alone_each_prompt_that_fits_its_target_is_on_time) {
  const std::vector<bool> on = ideal_on_time({{0.0, 0.3}, {1.0, 0.6}, {2.0, 0.49}}, 0.5);
  EXPECT_EQ(on, (std::vector<bool>{true, false, true})) << "0.6 s of prefill never fits 0.5 s";
}

TEST(ideal_on_time, in_a_burst_the_longest_is_left_out_so_that_the_others_are_on_time) {
  // Four at once, 0.2 + 0.15 + 0.15 + 0.1 s: together 0.6 s past 0.5 s; without the longest
  // the other three end at 0.4 s.
  EXPECT_EQ(ideal_on_time({{0.0, 0.2}, {0.0, 0.15}, {0.01, 0.15}, {0.02, 0.1}}, 0.5),
            (std::vector<bool>{false, true, true, true}));
  // Spread out, all fit: the engine is idle between them.
  EXPECT_EQ(ideal_on_time({{0.0, 0.2}, {0.3, 0.15}, {0.5, 0.15}, {0.7, 0.1}}, 0.5),
            (std::vector<bool>{true, true, true, true}));
}

TEST(ideal_on_time, arrival_order_is_not_the_input_order_and_unknown_work_is_always_on_time) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ideal_on_time({{0.02, 0.1}, {0.0, 0.2}, {5.0, nan}, {0.01, 0.15}, {0.0, 0.15}}, 0.5),
            (std::vector<bool>{true, false, true, true, true}));
}

TEST(ideal_on_time, a_stall_of_the_engine_holds_back_what_arrived_before_it) {
  // A 1 s stall from 0.1 s: the prompt arriving at 0 with 0.2 s of work ends at 1.2 s, late;
  // one arriving after the stall is not held back.
  EXPECT_EQ(ideal_on_time({{0.0, 0.2}, {1.2, 0.2}, {0.05, 0.01}}, 0.5, {{0.1, 1.1}}),
            (std::vector<bool>{false, true, true}));
}

}  // namespace
}  // namespace tireless::load
