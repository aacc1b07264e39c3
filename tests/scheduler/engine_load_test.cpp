#include "scheduler/engine_load.hpp"

#include <gtest/gtest.h>

namespace tireless {
namespace {

// Steps of 5 ms + 0.1 ms a prompt token + 0.3 ms a decode, a 50 ms budget; premium (priority
// 2) has nothing running, free (priority 1) 100 decodes at a token per 200 ms.
engine_load h200_like() {
  engine_load l;
  l.step_model = {0.005, 0.0001, 0.0003, 0.0};
  l.step_observations = 100;
  l.max_step_tokens = 8192;
  l.max_step_seqs = 256;
  l.step_seconds = 0.050;
  tier_load premium;
  premium.priority = 2;
  premium.tpot_seconds = 0.050;
  tier_load free;
  free.priority = 1;
  free.running = free.decodes = 100;
  free.tpot_seconds = 0.200;
  l.tiers = {premium, free};
  l.finished_per_second = 10;
  return l;
}

TEST(engine_load, nothing_measured_forecasts_nothing) {
  engine_load l = h200_like();
  l.step_observations = 0;
  EXPECT_EQ(forecast_first_token(l, {.priority = 2, .prompt_tokens = 2000}).seconds, 0.0);
}

TEST(engine_load, a_lower_tiers_decodes_cost_a_tier_that_is_never_shed_only_their_share_at_their_tpot) {
  // Yielding: the free decodes need 100 x 0.3 ms per 200 ms, 15% of the time; a step has
  // 42.5 ms for 5 ms + prefill: 375 tokens. 2000 tokens: 5 steps of 50 ms and 125 tokens more.
  const first_token_forecast own =
      forecast_first_token(h200_like(), {.priority = 2, .prompt_tokens = 2000, .lower_tiers_yield = true});
  EXPECT_NEAR(own.seconds, 5 * 0.050 + (0.005 + 125 * 0.0001) / 0.85, 1e-9);
  EXPECT_NEAR(own.seconds_per_token, 0.050 / 375, 1e-12);
  // Were the free decodes not there: 45 ms of a step for prefill, 450 tokens.
  EXPECT_NEAR(own.seconds_per_token_alone, 0.050 / 450, 1e-12);
  // Charged to every step: 30 ms of decodes leave 150 tokens a step; 13 steps and 50 tokens.
  const first_token_forecast all = forecast_first_token(h200_like(), {.priority = 2, .prompt_tokens = 2000});
  EXPECT_NEAR(all.seconds, 13 * 0.050 + (0.005 + 0.030 + 50 * 0.0001), 1e-9);
  // The free tier's own request sees its decodes either way.
  EXPECT_NEAR(forecast_first_token(h200_like(), {.priority = 1, .prompt_tokens = 2000, .lower_tiers_yield = true}).seconds,
              all.seconds, 1e-9);
}

TEST(engine_load, decodes_that_fill_the_step_leave_the_least_prefill_a_step) {
  engine_load l = h200_like();
  l.tiers[0].running = l.tiers[0].decodes = 200;  // 60 ms of premium decodes: past the budget
  const first_token_forecast f = forecast_first_token(l, {.priority = 2, .prompt_tokens = 160, .lower_tiers_yield = true});
  // min_step_prefill_tokens (16) a step, each step as long as its work: 10 steps.
  const double step = (0.005 + 0.060 + 16 * 0.0001) / 0.85;
  EXPECT_NEAR(f.seconds, 10 * step, 1e-9);
}

TEST(engine_load, those_waiting_ahead_join_the_decodes_and_a_full_batch_waits_for_completions) {
  engine_load l = h200_like();
  l.max_step_seqs = 100;  // the free decodes fill the batch
  // Own view: the batch has room for premium (the engine places higher tiers first).
  const double own = forecast_first_token(l, {.priority = 2, .prompt_tokens = 100, .lower_tiers_yield = true}).seconds;
  // Full view: 100 running + 1 - 100 = 1 request to finish first, at 10 a second; and the 100
  // decodes in every step.
  const double all = forecast_first_token(l, {.priority = 2, .prompt_tokens = 100}).seconds;
  EXPECT_NEAR(all, 0.005 + 0.030 + 100 * 0.0001 + 0.1, 1e-9);
  EXPECT_LT(own, 0.03);
  // Requests waiting ahead join the decodes (half of them over the wait).
  const double behind_ten =
      forecast_first_token(l, {.priority = 2, .prompt_tokens = 100, .requests = 10, .lower_tiers_yield = true}).seconds;
  EXPECT_NEAR(behind_ten - own, 5 * 0.0003 / 0.85, 1e-9);
}

TEST(engine_load, without_a_time_budget_a_step_is_max_step_tokens) {
  engine_load l = h200_like();
  l.step_seconds = 0;
  l.max_step_tokens = 1000;
  // Every decode in every step (no budget to yield within): 900 prompt tokens a step.
  const first_token_forecast f = forecast_first_token(l, {.priority = 2, .prompt_tokens = 2000, .lower_tiers_yield = true});
  const double step = 0.005 + 100 * 0.0003 + 900 * 0.0001;
  EXPECT_NEAR(f.seconds, 2 * step + 0.005 + 0.030 + 200 * 0.0001, 1e-9);
}

TEST(engine_load, running_and_waiting_sum_the_tiers) {
  engine_load l = h200_like();
  l.tiers[0].waiting = 3;
  l.tiers[0].running = 2;
  EXPECT_EQ(l.running(), 102);
  EXPECT_EQ(l.waiting(), 3);
}

TEST(engine_load, steps_take_what_the_model_says_times_its_observed_error) {
  engine_load l = h200_like();
  const double model = forecast_first_token(l, {.priority = 2, .prompt_tokens = 2000, .lower_tiers_yield = true}).seconds;
  l.step_residual = 0.8;  // steps packed to 50 ms take 40
  EXPECT_NEAR(forecast_first_token(l, {.priority = 2, .prompt_tokens = 2000, .lower_tiers_yield = true}).seconds, 0.8 * model,
              1e-12);
}

}  // namespace
}  // namespace tireless
