#include "scheduler/expert_load.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tireless
