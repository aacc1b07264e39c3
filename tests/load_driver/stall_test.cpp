#include <gtest/gtest.h>

#include "report.hpp"

namespace tireless::load {
namespace {

TEST(stall_after_ms, a_tier_may_pause_a_stream_for_its_first_token_target_or_three_tpots_and_one_tpot_more) {
  EXPECT_DOUBLE_EQ(stall_after_ms(500, 50), 550) << "premium: the first-token target is the longer";
  EXPECT_DOUBLE_EQ(stall_after_ms(100, 200), 800) << "three TPOTs are the longer";
  EXPECT_DOUBLE_EQ(stall_after_ms(0, 0), 0) << "no targets: no bound";
}

request_record finished(double arrival_s, double took_s) {
  request_record r;
  r.plan.arrival_s = arrival_s;
  r.submitted_s = 1000 + arrival_s;  // the target's clock need not be the run's
  r.outcome_s = r.submitted_s + took_s;
  r.kind = outcome_kind::completed;
  return r;
}

TEST(in_injected_stall, only_a_request_in_flight_when_a_fault_stalls_the_engine_is_excused) {
  scenario s;
  fault_settings::expert_group_event stall;
  stall.at_s = 100;
  stall.stall_ms = 5000;
  s.expert_group.push_back(stall);
  fault_settings::expert_group_event imbalance;  // no stall: nothing excused
  imbalance.at_s = 300;
  imbalance.imbalance = 1.8;
  s.expert_group.push_back(imbalance);
  EXPECT_TRUE(in_injected_stall(finished(98, 4), s)) << "in flight when the stall began";
  EXPECT_TRUE(in_injected_stall(finished(103, 4), s)) << "arrived during the stall";
  EXPECT_FALSE(in_injected_stall(finished(90, 5), s)) << "done before it";
  EXPECT_FALSE(in_injected_stall(finished(106, 3), s)) << "arrived after it";
  EXPECT_FALSE(in_injected_stall(finished(299, 5), s)) << "a fault without a stall";
  s.config.faults.shard_slow_per_step = 0.001;
  EXPECT_TRUE(in_injected_stall(finished(90, 5), s)) << "shards slow down at random: any time";
}

}  // namespace
}  // namespace tireless::load
