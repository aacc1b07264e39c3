#include "scheduler/kv_plan.hpp"

#include <gtest/gtest.h>

#include <numeric>

namespace tireless {
namespace {

// A pool of 8 blocks of 4 positions, no prefix cache unless asked.
block_manager pool(bool prefix_caching = false, int32_t watermark = 0) {
  return block_manager({.n_blocks = 8, .block_size = 4, .prefix_caching = prefix_caching,
                        .watermark_blocks = watermark});
}

kv_entry admit(seq_id seq, int32_t prompt_tokens, int32_t positions, token_id first = 0) {
  kv_entry e;
  e.seq = seq;
  e.admit = true;
  e.prompt.resize(static_cast<size_t>(prompt_tokens));
  std::iota(e.prompt.begin(), e.prompt.end(), first);
  e.positions = positions;
  return e;
}

kv_entry grow(seq_id seq, int32_t positions, bool preemptable = true) {
  kv_entry e;
  e.seq = seq;
  e.positions = positions;
  e.write_from = positions - 1;
  e.preemptable = preemptable;
  return e;
}

TEST(kv_plan, grants_in_order_and_defers_an_admission_that_does_not_fit_holding_nothing) {
  block_manager b = pool();
  const kv_reply r = plan_kv(b, {{admit(1, 16, 16), admit(2, 16, 16), admit(3, 4, 4)}, {}, {}});
  ASSERT_EQ(r.grants.size(), 3u);
  EXPECT_TRUE(r.grants[0].granted);
  EXPECT_TRUE(r.grants[1].granted);
  EXPECT_FALSE(r.grants[2].granted);
  EXPECT_FALSE(b.has(3));
  EXPECT_EQ(r.grants[0].table.size(), 4u);
  EXPECT_TRUE(r.preempted.empty());
  EXPECT_EQ(r.stats.free, 0);
  b.check_invariants();
}

TEST(kv_plan, a_running_entry_that_must_grow_takes_blocks_from_the_last_preemptable_one_after_it) {
  block_manager b = pool();
  plan_kv(b, {{admit(1, 12, 12), admit(2, 8, 8), admit(3, 12, 12)}, {}, {}});  // 3 + 2 + 3 blocks
  const kv_reply r = plan_kv(b, {{grow(1, 13), grow(2, 9), grow(3, 13)}, {}, {}});
  EXPECT_TRUE(r.grants[0].granted);
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0], 3u);  // kept last, preempted first
  EXPECT_FALSE(b.has(3));
  EXPECT_TRUE(r.grants[1].granted);
  b.check_invariants();
}

TEST(kv_plan, a_protected_entry_is_preempted_only_when_no_preemptable_one_is_left) {
  block_manager b = pool();
  plan_kv(b, {{admit(1, 16, 16), admit(2, 8, 8), admit(3, 8, 8)}, {}, {}});
  const kv_reply r = plan_kv(b, {{grow(1, 17), grow(2, 9, /*preemptable=*/true), grow(3, 9, /*preemptable=*/false)}, {}, {}});
  ASSERT_FALSE(r.preempted.empty());
  EXPECT_EQ(r.preempted[0], 2u);  // before 3, which used its preemptions
  EXPECT_TRUE(b.has(3));
  b.check_invariants();
}

TEST(kv_plan, a_released_sequences_committed_prefix_serves_the_next_admission_of_the_same_request) {
  block_manager b = pool(/*prefix_caching=*/true);
  kv_reply r = plan_kv(b, {{admit(1, 16, 16)}, {}, {}});
  ASSERT_TRUE(r.grants[0].granted);
  std::vector<token_id> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 0);
  // 1's prompt was computed (the commit rides the next request), then 1 ends; 2 starts with
  // the same prompt in the request that releases 1: its first 12 tokens (three full blocks;
  // the last token is always computed) come from the cache.
  plan_kv(b, {{}, {}, {{1, tokens, 16}}});
  r = plan_kv(b, {{admit(2, 16, 16)}, {1}, {}});
  ASSERT_TRUE(r.grants[0].granted);
  EXPECT_EQ(r.grants[0].cached_tokens, 12);
  EXPECT_FALSE(b.has(1));
  b.check_invariants();
}

TEST(kv_plan, writing_into_a_shared_block_asks_for_a_copy_first) {
  block_manager b = pool(/*prefix_caching=*/true);
  std::vector<token_id> tokens(6);
  std::iota(tokens.begin(), tokens.end(), 0);
  plan_kv(b, {{admit(1, 6, 6)}, {}, {}});
  plan_kv(b, {{}, {}, {{1, tokens, 6}}});
  // 2 shares 1's first full block (4 tokens) and writes from position 4: no copy. Writing
  // from position 2 (write_from below the cached prefix) needs its own copy of block 0.
  kv_entry e = admit(2, 6, 6);
  kv_reply r = plan_kv(b, {{e}, {}, {}});
  ASSERT_TRUE(r.grants[0].granted);
  EXPECT_EQ(r.grants[0].cached_tokens, 4);
  EXPECT_TRUE(r.copies.empty());
  kv_entry w = grow(2, 6);
  w.write_from = 2;
  r = plan_kv(b, {{w}, {}, {}});
  ASSERT_TRUE(r.grants[0].granted);
  ASSERT_EQ(r.copies.size(), 1u);
  EXPECT_NE(r.copies[0].first, r.copies[0].second);
  b.check_invariants();
}

}  // namespace
}  // namespace tireless
