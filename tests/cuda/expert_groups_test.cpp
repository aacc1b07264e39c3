// The expert group over the GPUs of one process (gpu/cuda/expert_groups.hpp), on the host:
// which rank holds which experts, the exchange's rows and offsets, the fallbacks and refusals.
#include "gpu/cuda/expert_groups.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

namespace tireless::cuda {
namespace {

using ::testing::HasSubstr;

expert_group_request moe(std::vector<int32_t> devices, int32_t present, int32_t n_expert = 8) {
  expert_group_request r;
  r.devices = std::move(devices);
  r.devices_present = present;
  r.nccl_built = true;
  r.n_expert = n_expert;
  r.n_expert_used = 2;
  r.max_step_tokens = 512;
  r.hidden = 576;
  return r;
}

TEST(expert_groups, ranks_hold_contiguous_balanced_ranges_in_the_order_given) {
  const expert_group_plan p = plan_expert_groups(moe({3, 1, 2}, 4, 8));
  EXPECT_EQ(p.devices, (std::vector<int32_t>{3, 1, 2}));
  EXPECT_EQ(p.first_expert, (std::vector<int32_t>{0, 3, 6, 8}));  // 8 = 3 + 3 + 2
  EXPECT_TRUE(p.exchanges());
  EXPECT_EQ(p.rank_of(0), 0);
  EXPECT_EQ(p.rank_of(2), 0);
  EXPECT_EQ(p.rank_of(3), 1);
  EXPECT_EQ(p.rank_of(7), 2);
  EXPECT_THROW(p.rank_of(8), std::out_of_range);
  EXPECT_EQ(p.max_pairs, 1024);
  EXPECT_EQ(p.buffer_bytes(), 1024 * 576 * 4);
  EXPECT_TRUE(p.fallback.empty());
}

TEST(expert_groups, one_device_or_none_named_is_one_rank_without_exchange) {
  for (const auto& devices : {std::vector<int32_t>{}, std::vector<int32_t>{1}}) {
    const expert_group_plan p = plan_expert_groups(moe(devices, 2));
    EXPECT_EQ(p.ranks(), 1);
    EXPECT_FALSE(p.exchanges());
    EXPECT_EQ(p.first_expert, (std::vector<int32_t>{0, 8}));
    EXPECT_EQ(p.devices[0], devices.empty() ? 0 : 1);
  }
  expert_group_request dense = moe({}, 1, 0);
  EXPECT_EQ(plan_expert_groups(dense).first_expert, (std::vector<int32_t>{0, 0}));
}

TEST(expert_groups, without_nccl_several_devices_fall_back_to_the_first_and_say_so) {
  expert_group_request r = moe({2, 0}, 4);
  r.nccl_built = false;
  const expert_group_plan p = plan_expert_groups(r);
  EXPECT_EQ(p.devices, std::vector<int32_t>{2});
  EXPECT_FALSE(p.exchanges());
  EXPECT_THAT(p.fallback, HasSubstr("no NCCL"));
  EXPECT_THAT(p.fallback, HasSubstr("device 2"));
}

TEST(expert_groups, impossible_groups_are_refused_with_what_to_change) {
  const auto message = [](const expert_group_request& r) {
    try {
      plan_expert_groups(r);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message(moe({0, 5}, 2)), HasSubstr("device 5 does not exist here (2 CUDA devices: ids 0..1)"));
  EXPECT_THAT(message(moe({0, 0}, 2)), HasSubstr("device 0 is listed twice"));
  EXPECT_THAT(message(moe({0, 1}, 2, 0)), HasSubstr("dense model"));
  EXPECT_THAT(message(moe({0, 1, 2}, 3, 2)), HasSubstr("3 devices for 2 experts"));
  EXPECT_THAT(message(moe({0}, 0)), HasSubstr("device 0 does not exist here (0 CUDA devices"));
}

TEST(expert_groups, dispatch_sends_each_rank_its_slice_and_combine_brings_it_back) {
  const expert_group_plan p = plan_expert_groups(moe({0, 1, 2}, 3, 8));  // experts 0-2, 3-5, 6-7
  // Pairs sorted by expert: counts 2 0 1 | 4 0 3 | 1 5 -> offsets.
  const std::vector<int32_t> counts{2, 0, 1, 4, 0, 3, 1, 5};
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const exchange_counts d = dispatch_counts(p, offsets);
  EXPECT_EQ(d.send[0], (std::vector<int64_t>{0, 7, 6}));  // rank 0 keeps its 3 in place
  EXPECT_EQ(d.send_at[0][1], 3);                          // rank 1's slice starts after rank 0's
  EXPECT_EQ(d.send_at[0][2], 10);
  EXPECT_EQ(d.recv[1], (std::vector<int64_t>{7, 0, 0}));
  EXPECT_EQ(d.recv_at[1][0], 0);
  EXPECT_EQ(d.recv[2], (std::vector<int64_t>{6, 0, 0}));
  EXPECT_EQ(d.send[1], (std::vector<int64_t>{0, 0, 0}));  // attention on rank 0 only
  EXPECT_EQ(d.rows_in(1), 7);
  const exchange_counts c = transpose(d);
  EXPECT_EQ(c.send[1][0], 7);
  EXPECT_EQ(c.send_at[1][0], 0);
  EXPECT_EQ(c.recv[0], (std::vector<int64_t>{0, 7, 6}));
  EXPECT_EQ(c.recv_at[0][1], 3);  // back into rank 0's pair order
  EXPECT_EQ(c.recv_at[0][2], 10);
  // Every row sent is received, for any split.
  for (size_t a = 0; a < 3; ++a) {
    for (size_t b = 0; b < 3; ++b) EXPECT_EQ(d.send[a][b], d.recv[b][a]);
  }
  EXPECT_THROW(dispatch_counts(p, std::vector<int32_t>(5, 0)), std::invalid_argument);
}

}  // namespace
}  // namespace tireless::cuda
