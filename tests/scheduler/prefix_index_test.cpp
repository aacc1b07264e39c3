#include "scheduler/prefix_index.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace tireless {
namespace {

// n distinct tokens from `first` on.
std::vector<token_id> tokens(int32_t n, token_id first = 1000) {
  std::vector<token_id> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<token_id> joined(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(prefix_index, a_shared_system_prompt_is_expected_cached_in_whole_blocks) {
  prefix_index index(16, 1000);
  const std::vector<token_id> system = tokens(100);  // 6 full blocks and 4 tokens
  EXPECT_EQ(index.cached_tokens(joined(system, tokens(30, 1))), 0);
  index.record(joined(system, tokens(30, 1)));
  EXPECT_EQ(index.cached_tokens(joined(system, tokens(50, 5000))), 96);
  EXPECT_EQ(index.cached_tokens(tokens(40, 7000)), 0);  // another prefix
  // A block is keyed by all that precedes it: the same tokens after a different first block
  // are not a match.
  std::vector<token_id> shifted = system;
  shifted[0] = 1;
  EXPECT_EQ(index.cached_tokens(shifted), 0);
}

TEST(prefix_index, the_last_prompt_token_is_never_expected_cached) {
  prefix_index index(16, 1000);
  index.record(tokens(64));
  EXPECT_EQ(index.cached_tokens(tokens(64)), 48);  // the engine computes the last token
  EXPECT_EQ(index.cached_tokens(tokens(65)), 64);
  EXPECT_EQ(index.cached_tokens(tokens(1)), 0);
}

TEST(prefix_index, forgets_the_least_recently_sent_blocks_beyond_its_capacity) {
  prefix_index index(16, 8);
  const std::vector<token_id> a = tokens(64, 1000), b = tokens(64, 5000);  // 4 blocks each
  index.record(a);
  index.record(b);
  EXPECT_EQ(index.size(), 8);
  index.record(a);  // a is the most recent again
  index.record(tokens(32, 9000));  // 2 more: b's first two go
  EXPECT_EQ(index.size(), 8);
  EXPECT_EQ(index.cached_tokens(joined(a, {1})), 64);
  EXPECT_EQ(index.cached_tokens(joined(b, {1})), 0);  // its first block is gone, so is the chain
}

TEST(prefix_index, expects_what_the_block_manager_reuses_while_nothing_was_evicted) {
  block_manager m({.n_blocks = 64, .block_size = 16, .prefix_caching = true, .watermark_blocks = 0});
  prefix_index index(16, 64);
  const std::vector<token_id> system = tokens(200);
  const std::vector<std::vector<token_id>> prompts = {joined(system, tokens(20, 1)), joined(system, tokens(37, 3000)),
                                                      tokens(50, 8000), joined(tokens(50, 8000), tokens(9, 1)),
                                                      joined(system, tokens(3, 4000))};
  seq_id id = 1;
  for (const std::vector<token_id>& p : prompts) {
    const int32_t expected = index.cached_tokens(p);
    const auto n = static_cast<int32_t>(p.size());
    auto cached = m.admit(id, p, n);
    ASSERT_TRUE(cached.has_value());
    EXPECT_EQ(*cached, expected) << "prompt " << id;
    m.commit(id, p, n);
    index.record(p);
    m.release(id++);
  }
}

TEST(prefix_index, without_a_capacity_it_expects_nothing) {
  prefix_index index;
  index.record(tokens(64));
  EXPECT_EQ(index.cached_tokens(tokens(80)), 0);
  EXPECT_EQ(index.size(), 0);
}

}  // namespace
}  // namespace tireless
