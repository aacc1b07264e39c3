#include <gtest/gtest.h>

#include "scheduler/admission_control.hpp"
#include "tests/scheduler/admission_test_support.hpp"

// Where the batch's seats, not the prefill, hold a request back: returns promised before it,
// late refusals, and a fresh engine whose seats free a whole batch at a time.

namespace tireless {
namespace {

using namespace admission_test;

// A batch with no seat free: 8 running of 8, one finishing a second. Short prompts cost
// almost no prefill, so what holds a request back is the seats.
engine_load full_batch() {
  engine_load l = busy_engine(0);
  l.max_step_seqs = 8;
  tier_load running;
  running.priority = 1000;
  running.running = running.decodes = 8;
  l.tiers = {running};
  l.finished_per_second = 1;
  return l;
}

TEST(admission_control, where_seats_are_the_bottleneck_each_return_promised_before_counts_as_a_request_ahead) {
  const tier_settings free_tier = tier("free", 1, 500ms, true, {{0.85, degrade_action::shed, 0}});
  admission_control c(admission_policy::tireless, {}, {free_tier}, {tenant("a", "free")});
  c.observe(full_batch());
  std::vector<int64_t> hints;
  for (uint64_t id = 1; id <= 4; ++id) {
    const admission_decision d = arrive(c, id, "a", "free", 0, 20, 100);
    ASSERT_FALSE(d.admitted);
    hints.push_back(d.retry_after_ms);
  }
  // Prompts of 20 tokens alone would spread them 20 ms apart: they would all come back together.
  for (size_t k = 1; k < hints.size(); ++k) EXPECT_GE(hints[k] - hints[k - 1], 900) << "hint " << k;
}

TEST(admission_control, a_request_the_engine_refuses_late_is_told_when_by_the_forecast_and_its_return_is_reserved) {
  const tier_settings free_tier = tier("free", 1, 500ms, true, {{0.85, degrade_action::shed, 0}});
  admission_control c(admission_policy::tireless, {}, {free_tier}, {tenant("a", "free")});
  c.observe(busy_engine(0));
  ASSERT_TRUE(arrive(c, 1, "a", "free", 0, 20, 100).admitted);
  ASSERT_TRUE(arrive(c, 2, "a", "free", 0, 20, 100).admitted);
  while (c.next()) {
  }
  // Released; the engine fills up and then refuses both unstarted.
  c.observe(full_batch());
  const int64_t now = 10 * second;
  const std::optional<retry_promise> one = c.retry_after_late_start(1, now);
  const std::optional<retry_promise> two = c.retry_after_late_start(2, now);
  ASSERT_TRUE(one && two);
  EXPECT_GT(one->retry_after_ms, 100);
  EXPECT_GE(two->retry_after_ms - one->retry_after_ms, 900) << "the first one's return is ahead of the second";
  ASSERT_NE(one->retry_token, 0u);
  EXPECT_FALSE(c.retry_after_late_start(99, now).has_value()) << "not held here: nothing to say";
  // Back at its time with its token, the client is not shed again although the batch is full.
  EXPECT_FALSE(arrive(c, 3, "a", "free", now + one->retry_after_ms * 1'000'000, 20, 100).admitted);
  arrival back{4, "a", "free", 20, 100, now + one->retry_after_ms * 1'000'000};
  back.retry_token = one->retry_token;
  EXPECT_TRUE(c.arrive(back).admitted);
}


// A fresh engine: its step model known (the prior), 8 seats, nothing reported running and no
// completion measured yet. A full batch's decode step takes 10 + 8 x 5 ms = 50 ms, so a
// request of 100 tokens holds its seat ~5 s.
engine_load fresh_engine() {
  engine_load l;
  l.step_model = {0.010, 0.001, 0.005, 0.0};
  l.step_observations = 100;
  l.max_step_tokens = 512;
  l.max_step_seqs = 8;
  return l;
}

TEST(admission_control, a_flood_on_a_fresh_engine_is_refused_at_arrival_once_its_seats_are_taken) {
  const tier_settings free_tier = tier("free", 1, 2000ms, true, {{0.85, degrade_action::shed, 0}});
  admission_control c(admission_policy::tireless, {}, {free_tier}, {tenant("a", "free")});
  engine_credits credits;
  credits.load = fresh_engine();
  c.observe(credits);
  // A first batch is admitted, released to the engine, received there and ends: its seats are
  // free again.
  for (uint64_t id = 101; id <= 108; ++id) ASSERT_TRUE(arrive(c, id, "a", "free", 0, 20, 100).admitted) << id;
  while (c.next()) {
  }
  for (uint64_t id = 101; id <= 108; ++id) c.finished(id, 120, 0);
  credits.received_by_priority[1] = 8;
  c.observe(credits);
  // The next batch is admitted and released to the engine, which has not received it yet.
  for (uint64_t id = 1; id <= 8; ++id) {
    ASSERT_TRUE(arrive(c, id, "a", "free", 0, 20, 100).admitted) << id << ": the requests that ended still count";
  }
  while (c.next()) {
  }
  // The ninth would wait for a seat, ~5 s, against 2 s: refused now, not after waiting.
  std::vector<int64_t> hints;
  for (uint64_t id = 9; id <= 24; ++id) {
    const admission_decision d = arrive(c, id, "a", "free", 0, 20, 100);
    ASSERT_FALSE(d.admitted) << id;
    EXPECT_GE(d.retry_after_ms, 2500) << id;
    hints.push_back(d.retry_after_ms);
  }
  // Their returns are reserved: the second batch of them is told a whole batch's time later.
  EXPECT_GE(hints[8] - hints[0], 4000);
}

// A higher tier that keeps a few requests in the batch takes its seats back as each batch
// frees: a lower tier's flood gets only the rest of every batch.
TEST(admission_control, on_a_fresh_engine_a_higher_tiers_requests_keep_their_seats_in_every_batch) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 60s, false),
                                            tier("free", 1, 2000ms, true, {{0.85, degrade_action::shed, 0}})};
  admission_control c(admission_policy::tireless, {}, tiers, {tenant("g", "gold"), tenant("a", "free")});
  engine_credits credits;
  credits.load = fresh_engine();
  c.observe(credits);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(arrive(c, id, "g", "gold", 0, 20, 100).admitted);
  for (uint64_t id = 4; id <= 8; ++id) ASSERT_TRUE(arrive(c, id, "a", "free", 0, 20, 100).admitted) << id;
  std::vector<int64_t> hints;
  for (uint64_t id = 9; id <= 19; ++id) {
    const admission_decision d = arrive(c, id, "a", "free", 0, 20, 100);
    ASSERT_FALSE(d.admitted) << id;
    hints.push_back(d.retry_after_ms);
  }
  // Five free seats a batch (8 less gold's 3): the sixth return waits a batch more than the first.
  EXPECT_LT(hints[4] - hints[0], 1000);
  EXPECT_GE(hints[5] - hints[0], 4000);
}

}  // namespace
}  // namespace tireless
