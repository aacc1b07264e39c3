// A step request through its Cap'n Proto form (actors/wire.hpp), as the shard receives it:
// block tables and penalized sequences' token histories rebuilt from deltas.

#include <gtest/gtest.h>

#include <vector>

#include "actors/wire.hpp"

namespace tireless {
namespace {

// Sends `batch` and applies it to the shard's storage, as the shard does.
void send(const step_batch& batch, step_storage& shard, const std::vector<seq_id>& forget = {}) {
  auto m = to_wire(1, batch, {}, forget);
  unpack(m.get(), shard);
}

TEST(step_wire, a_penalized_sequence_reaches_the_shard_with_its_whole_history_even_after_a_prefix_cache_hit) {
  // Positions 0..7 came from the prefix cache: the shard never computed them.
  const std::vector<token_id> tokens = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  const std::vector<int32_t> table = {4, 5, 6};
  sequence_step st;
  st.seq_id = 3;
  st.start_pos = 8;
  st.tokens = std::span<const token_id>(tokens).subspan(8, 3);
  st.block_table = table;
  st.sample = true;
  st.sampling.repetition_penalty = 1.2f;
  st.history = std::span<const token_id>(tokens).first(11);
  st.prompt_len = 11;
  st.history_from = 0;
  step_storage shard;
  send({{st}}, shard);
  ASSERT_EQ(shard.batch.seqs.size(), 1u);
  const sequence_step& got = shard.batch.seqs[0];
  EXPECT_EQ(std::vector<token_id>(got.history.begin(), got.history.end()),
            std::vector<token_id>(tokens.begin(), tokens.begin() + 11));
  EXPECT_EQ(got.prompt_len, 11);
  EXPECT_FLOAT_EQ(got.sampling.repetition_penalty, 1.2f);

  // The next decode step sends only its token.
  st.start_pos = 11;
  st.tokens = std::span<const token_id>(tokens).subspan(11, 1);
  st.history = tokens;
  st.history_from = 11;
  auto m = to_wire(2, {{st}}, {});
  EXPECT_EQ(m.get().getSeqs()[0].getHistory().size(), 0u);
  unpack(m.get(), shard);
  EXPECT_EQ(std::vector<token_id>(shard.batch.seqs[0].history.begin(), shard.batch.seqs[0].history.end()), tokens);
  send({{st}}, shard);  // a re-run after a crash: the same history
  EXPECT_EQ(shard.batch.seqs[0].history.size(), tokens.size());

  // A delta past what the shard holds is refused, not guessed.
  step_storage fresh;
  EXPECT_THROW(send({{st}}, fresh), std::runtime_error);

  send({}, shard, {3});
  EXPECT_TRUE(shard.histories.empty());
  EXPECT_TRUE(shard.tables.empty());
}

TEST(step_wire, an_unpenalized_sequence_carries_no_history) {
  const std::vector<token_id> tokens = {1, 2, 3};
  const std::vector<int32_t> table = {0};
  sequence_step st;
  st.seq_id = 1;
  st.tokens = tokens;
  st.block_table = table;
  st.sample = true;
  step_storage shard;
  send({{st}}, shard);
  EXPECT_TRUE(shard.batch.seqs[0].history.empty());
  EXPECT_TRUE(shard.histories.empty());
}

}  // namespace
}  // namespace tireless
