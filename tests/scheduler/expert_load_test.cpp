#include "scheduler/expert_load.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

namespace tireless {
namespace {

TEST(expert_load, round_robin_puts_expert_e_on_shard_e_mod_shards) {
  EXPECT_EQ(round_robin_placement(5, 2), (std::vector<int32_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(round_robin_placement(3, 8), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_THROW(round_robin_placement(4, 0), std::invalid_argument);
}

TEST(expert_load, imbalance_is_max_over_mean_per_layer_for_experts_and_for_shards) {
  // Two layers of four experts on two shards (0, 2 on shard 0; 1, 3 on shard 1).
  const std::vector<int64_t> counts = {6, 2, 0, 0,   // layer 0: experts 6/2 = 3x the mean; shards 6/2 -> 1.5
                                       2, 2, 2, 2};  // layer 1: even
  const expert_load_summary s = summarize_expert_load(counts, 4, round_robin_placement(4, 2));
  EXPECT_EQ(s.routed, 16);
  EXPECT_DOUBLE_EQ(s.expert_imbalance_worst, 3.0);
  EXPECT_DOUBLE_EQ(s.expert_imbalance, 2.0);
  EXPECT_DOUBLE_EQ(s.shard_imbalance_worst, 1.5);
  EXPECT_DOUBLE_EQ(s.shard_imbalance, 1.25);
  EXPECT_EQ(s.per_expert, (std::vector<int64_t>{8, 4, 2, 2}));
  EXPECT_EQ(s.per_shard, (std::vector<int64_t>{10, 6}));
}

TEST(expert_load, layers_that_routed_nothing_do_not_count_and_bad_shapes_are_refused) {
  const std::vector<int64_t> counts = {0, 0, 3, 1};
  const expert_load_summary s = summarize_expert_load(counts, 2, round_robin_placement(2, 2));
  EXPECT_DOUBLE_EQ(s.expert_imbalance, 1.5);
  EXPECT_DOUBLE_EQ(summarize_expert_load(std::vector<int64_t>{0, 0}, 2, round_robin_placement(2, 1)).shard_imbalance, 1.0);
  EXPECT_THROW(summarize_expert_load(std::vector<int64_t>{1, 2, 3}, 2, round_robin_placement(2, 1)), std::invalid_argument);
  EXPECT_THROW(summarize_expert_load(counts, 2, round_robin_placement(3, 1)), std::invalid_argument);
}

TEST(expert_placement, round_robin_homes_and_replicas_per_layer) {
  expert_placement p = expert_placement::round_robin(2, 4, 2);
  EXPECT_EQ(p.holders(1, 3), (std::vector<int32_t>{1}));
  EXPECT_EQ(p.keys_of(0), (std::vector<int32_t>{0, 2, 4, 6}));
  p.add(0, 1, 3);
  p.add(0, 1, 3);  // already held: no-op
  EXPECT_EQ(p.holders(1, 3), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(p.replicas(), 1);
  EXPECT_FALSE(p.holds(0, 0, 3));  // layer 0's expert 3 is still on shard 1 alone
  EXPECT_THROW(p.add(2, 0, 0), std::out_of_range);
}

TEST(expert_placement, a_pair_goes_to_its_least_loaded_live_holder) {
  expert_placement p = expert_placement::round_robin(1, 4, 2);
  p.add(1, 0, 0);  // expert 0 on shards 0 and 1
  const std::vector<char> live = {1, 1};
  std::vector<int64_t> load = {0, 0};
  const std::vector<int32_t> experts = {0, 0, 0, 2, 0};
  // 0 -> shard 0 (tie: home first); 0 -> 1; 0 -> 0; expert 2 lives on 0 alone; 0 -> 1
  EXPECT_EQ(assign_pairs(p, 0, experts, live, load), (std::vector<int32_t>{0, 1, 0, 0, 1}));
  EXPECT_EQ(load, (std::vector<int64_t>{3, 2}));
  const std::vector<char> one_down = {0, 1};
  std::vector<int64_t> fresh = {0, 0};
  // shard 0 down: expert 0 goes to its replica; expert 2 has no live holder
  EXPECT_EQ(assign_pairs(p, 0, std::vector<int32_t>{0, 2}, one_down, fresh), (std::vector<int32_t>{1, -1}));
}

TEST(expert_placement, fencing_moves_only_what_no_live_shard_still_holds) {
  expert_placement p = expert_placement::round_robin(1, 6, 3);  // shard 2 holds experts 2 and 5
  p.add(0, 0, 5);                                                  // 5 has a replica on shard 0
  const std::vector<char> live = {1, 1, 0};
  const std::vector<int32_t> moved = p.fence(2, live);
  EXPECT_EQ(moved, (std::vector<int32_t>{2}));  // expert 2 moved; 5 keeps its replica
  EXPECT_EQ(p.holders(0, 5), (std::vector<int32_t>{0}));
  EXPECT_EQ(p.holders(0, 2), (std::vector<int32_t>{1}));  // shard 1 held fewer keys than shard 0
  EXPECT_TRUE(p.keys_of(2).empty());
  EXPECT_THROW(p.fence(1, std::vector<char>{0, 1, 0}), std::runtime_error);  // nobody left
}

TEST(expert_placement, rebalancing_a_zipf_skew_brings_shards_within_a_quarter_of_the_mean) {
  // Two layers of 8 experts with Zipf(1) shares (hot expert 0 in layer 0, 7 in layer 1), 4 shards.
  std::vector<int64_t> counts;
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 8; ++e) counts.push_back(static_cast<int64_t>(10'000.0 / ((l == 0 ? e : 7 - e) + 1)));
  }
  const expert_placement base = expert_placement::round_robin(2, 8, 4);
  const double before = expected_shard_imbalance(base, counts);
  EXPECT_GT(before, 1.5);
  const expert_placement none = rebalance(base, counts, 0);
  EXPECT_EQ(none.replicas(), 0);
  const expert_placement p = rebalance(base, counts, 2);
  const double after = expected_shard_imbalance(p, counts);
  EXPECT_LE(after, 1.25) << "before " << before;
  EXPECT_GT(p.replicas(), 0);
  EXPECT_LE(p.replicas(), 2 * 4 * 2);
  EXPECT_GT(p.holders(0, 0).size(), 1u);  // the hot expert of each layer got replicas
  EXPECT_GT(p.holders(1, 7).size(), 1u);
  // routing actual pairs by least-loaded replica realizes it
  std::vector<int64_t> load(4, 0);
  const std::vector<char> live(4, 1);
  std::vector<int32_t> experts;
  for (int e = 0; e < 8; ++e) experts.insert(experts.end(), static_cast<size_t>(counts[e] / 100), e);
  assign_pairs(p, 0, experts, live, load);
  const double total = static_cast<double>(experts.size());
  EXPECT_LE(static_cast<double>(*std::max_element(load.begin(), load.end())) * 4 / total, 1.25);
  EXPECT_THROW(rebalance(base, std::vector<int64_t>(3, 1), 1), std::invalid_argument);
}

}  // namespace
}  // namespace tireless
