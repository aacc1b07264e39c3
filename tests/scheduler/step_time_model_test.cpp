#include "scheduler/step_time_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// The engine packs each step to its budget with the fit itself, so every step it measures
// lasts about the budget: along that line prefill and fixed cost trade off. Plain forgetting
// let the fit drift there until prefill cost nothing (c1 <= 0) and the engine packed a whole
// token budget into one step. With a prefill cost the fit does not model (attention over a
// long context) and 2% noise, as the sim's steps have.
TEST(step_time_model, packed_to_its_own_budget_the_fit_keeps_a_prefill_cost) {
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    step_time_model m;
    m.seed({0.004, 1.4e-4, 3e-4, 2e-5}, 8);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double budget = 0.045;
    double least = 1.0;
    for (int i = 0; i < 20000; ++i) {
      const auto& k = m.coefficients();
      ASSERT_GT(k[1], 0) << "seed " << seed << ", step " << i << ": prefill reads as free";
      least = std::min(least, k[1]);
      const double decodes = 40 + std::floor(unit(rng) * 50);
      const double context = decodes * (1200 + 600 * unit(rng));
      const double left = budget - std::max(k[0], 0.0) - decodes * std::max(k[2], 0.0) -
                          context / 1000 * std::max(k[3], 0.0);
      const step_shape_counts s{std::clamp(left / k[1], 16.0, 8192.0), decodes, context};
      const double modeled = 0.004 + 1.4e-4 * s.prefill_tokens + 3e-4 * decodes + 1e-5 * context / 1000;
      const double attention = 5e-9 * s.prefill_tokens * (500 + 2500 * unit(rng));
      m.observe(s, (modeled + attention) * (0.98 + 0.04 * unit(rng)));
    }
    EXPECT_GT(least, 1.4e-4 / 4) << "seed " << seed << ": the prefill cost drifted far below the machine's";
    // A shape off the budget's line: a long prompt's chunk.
    const double chunk = 0.004 + 2000 * (1.4e-4 + 5e-9 * 1750) + 60 * 3e-4 + 0.9e-3;
    EXPECT_NEAR(m.predict({2000, 60, 90000}), chunk, 0.25 * chunk) << "seed " << seed;
  }
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
