// MoE experts spread over expert shard actors give exactly the single-process forward pass.
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "actors/expert_shard.hpp"
#include "gpu/cpu/cpu_backend.hpp"
#include "model/model.hpp"
#include "scheduler/expert_load.hpp"

namespace tireless {
namespace {

std::string tiny_moe() { return std::string(std::getenv("TIRELESS_TEST_DATA")) + "/tiny-moe.gguf"; }

// Logits after each of `tokens`, feeding prefill chunks of 5 then decoding.
std::vector<float> run(backend& b, const std::vector<token_id>& tokens) {
  std::vector<int32_t> blocks(b.kv().n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  step_batch batch;
  batch.seqs.resize(1);
  auto& s = batch.seqs[0];
  s.block_table = blocks;
  s.want_logits = true;
  step_result result;
  std::vector<float> all;
  for (size_t p = 0; p < tokens.size();) {
    const size_t n = p < 10 ? 5 : 1;
    s.tokens = std::span<const token_id>(tokens.data() + p, n);
    s.start_pos = static_cast<int32_t>(p);
    b.execute(batch, result);
    all.insert(all.end(), result.logits.begin(), result.logits.end());
    p += n;
  }
  return all;
}

// run() feeds 2 chunks of 5, then one token per step.
size_t run_calls(size_t tokens) { return 2 + (tokens - 10); }

class expert_shards : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("TIRELESS_TEST_DATA") || !std::filesystem::exists(tiny_moe())) GTEST_SKIP() << "no tiny-moe.gguf";
    lm_ = model::load(tiny_moe());
    ASSERT_TRUE(lm_->config().is_moe());
    for (int i = 0; i < 24; ++i) tokens_.push_back(17 + (i * 37) % 250);
    opt_.threads = 1;
    opt_.max_context = 64;
    opt_.max_step_tokens = 16;
  }
  std::shared_ptr<const model> lm_;
  std::vector<token_id> tokens_;
  cpu::cpu_backend_options opt_;
};

TEST_F(expert_shards, two_and_three_shards_give_the_single_process_logits_bit_for_bit_and_see_only_their_tokens) {
  auto local = cpu::make_cpu_backend(lm_, opt_);
  const std::vector<float> want = run(*local, tokens_);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (int shards : {2, 3}) {
    auto experts = make_actor_expert_exchange(sys, lm_, shards, opt_.max_step_tokens, {});
    cpu::cpu_backend_options o = opt_;
    o.experts = experts.get();
    auto sharded = cpu::make_cpu_backend(lm_, o);
    const std::vector<float> got = run(*sharded, tokens_);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << shards << " shards";
    // every (token, expert) pair went to exactly one shard: the pairs add up to tokens x k x layers
    const expert_exchange_stats st = experts->stats();
    int64_t pairs = 0;
    for (int64_t n : st.per_shard_pairs) pairs += n;
    EXPECT_EQ(pairs, static_cast<int64_t>(tokens_.size()) * lm_->config().n_expert_used * lm_->config().n_layer);
    EXPECT_EQ(st.calls, static_cast<int64_t>(run_calls(tokens_.size())) * lm_->config().n_layer);
    EXPECT_GT(st.bytes_out, 0);
  }
}

TEST_F(expert_shards, a_crashed_expert_shard_is_replaced_and_the_step_gives_the_same_result) {
  auto local = cpu::make_cpu_backend(lm_, opt_);
  const std::vector<float> want = run(*local, tokens_);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  const model_config& c = lm_->config();
  auto transport = std::make_unique<actor_expert_transport>(sys, lm_, 2, opt_.max_step_tokens * c.n_expert_used);
  actor_expert_transport& shards = *transport;
  expert_exchange experts(lm_, std::move(transport), expert_placement::round_robin(c.n_layer, c.n_expert, 2), {});
  cpu::cpu_backend_options o = opt_;
  o.experts = &experts;
  auto sharded = cpu::make_cpu_backend(lm_, o);
  shards.crash_shard_for_test(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<float> got = run(*sharded, tokens_);
  EXPECT_EQ(experts.stats().failures, 1);
  EXPECT_EQ(experts.stats().revivals, 1);
  EXPECT_EQ(experts.stats().live, 2);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

}  // namespace
}  // namespace tireless
