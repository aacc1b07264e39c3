#include "scheduler/step_time_model.hpp"

#include <gtest/gtest.h>

#include <random>

namespace tireless {
namespace {

TEST(step_time_model, fits_a_linear_machine) {
  step_time_model m;
  std::mt19937 rng(3);
  for (int i = 0; i < 400; ++i) {
    const step_shape_counts s{static_cast<double>(rng() % 512), static_cast<double>(rng() % 64),
                              static_cast<double>(rng() % 100000)};
    m.observe(s, 0.004 + 0.0001 * s.prefill_tokens + 0.0005 * s.decode_seqs + 0.002 * s.decode_context / 1000);
  }
  EXPECT_NEAR(m.predict({256, 32, 50000}), 0.004 + 0.0256 + 0.016 + 0.1, 1e-6);
}

TEST(step_time_model, a_lone_stall_is_left_out_of_the_fit_and_a_lasting_change_is_not) {
  step_time_model m;
  std::mt19937 rng(5);
  auto shape = [&] {
    return step_shape_counts{static_cast<double>(rng() % 512), static_cast<double>(rng() % 64), 0};
  };
  auto cost = [](const step_shape_counts& s) { return 0.004 + 0.0001 * s.prefill_tokens + 0.0005 * s.decode_seqs; };
  for (int i = 0; i < 400; ++i) {
    const auto s = shape();
    m.observe(s, cost(s));
  }
  // One 5-second step (a stall): not fitted, the predictions stay.
  EXPECT_FALSE(m.observe({100, 10, 0}, 5.0));
  for (int i = 0; i < 20; ++i) {
    const auto s = shape();
    EXPECT_TRUE(m.observe(s, cost(s)));
  }
  EXPECT_NEAR(m.predict({256, 32, 0}), cost({256, 32, 0}), 1e-6);
  // A machine five times slower from now on: its first slow step looks like a stall, the
  // second and those after are fitted.
  std::vector<bool> taken;
  for (int i = 0; i < 1500; ++i) {
    const auto s = shape();
    taken.push_back(m.observe(s, 5 * cost(s)));
  }
  EXPECT_FALSE(taken[0]);
  EXPECT_TRUE(taken[1]) << "the step after a stall-like one is fitted when it is slow too";
  EXPECT_NEAR(m.predict({256, 32, 0}), 5 * cost({256, 32, 0}), 0.05 * 5 * cost({256, 32, 0}));
}

TEST(step_residuals, report_one_until_enough_steps_then_the_quantile_of_the_error) {
  step_residuals r(100, 10);
  for (int i = 0; i < 9; ++i) r.add(0.1, 0.2);
  EXPECT_EQ(r.quantile(0.95), 1.0) << "nine steps are not enough to judge the model";
  step_residuals even(100, 10);
  for (int i = 1; i <= 100; ++i) even.add(0.1, 0.1 * (0.5 + i / 100.0));  // ratios 0.51 .. 1.50
  EXPECT_NEAR(even.quantile(0.95), 1.45, 0.011);
  EXPECT_NEAR(even.quantile(0.5), 1.0, 0.011);
  // A window: the old errors leave it (a host that slowed and recovered).
  for (int i = 0; i < 100; ++i) even.add(0.1, 0.1);
  EXPECT_NEAR(even.quantile(0.95), 1.0, 1e-9);
  even.add(0, 5);  // no prediction: ignored
  EXPECT_NEAR(even.quantile(0.95), 1.0, 1e-9);
}

}  // namespace
}  // namespace tireless
