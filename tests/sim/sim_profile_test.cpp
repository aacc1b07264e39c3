#include "gpu/sim/sim_profile.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace tireless::sim {
namespace {

using ::testing::HasSubstr;

sequence_step chunk(uint64_t seq, std::span<const token_id> tokens, int32_t start) {
  sequence_step s;
  s.seq_id = seq;
  s.tokens = tokens;
  s.start_pos = start;
  return s;
}

TEST(step_shape, counts_prefill_tokens_decode_sequences_and_attended_positions) {
  const std::vector<token_id> three{5, 6, 7}, one{9};
  step_batch b;
  b.seqs.push_back(chunk(1, three, 0));   // positions 0..2 attend 1 + 2 + 3
  b.seqs.push_back(chunk(2, three, 10));  // positions 10..12 attend 11 + 12 + 13
  b.seqs.push_back(chunk(3, one, 99));    // position 99 attends 100
  b.seqs.push_back(chunk(4, one, 0));     // position 0 attends 1
  const step_shape s = shape_of(b);
  EXPECT_EQ(s.prefill_tokens, 6);
  EXPECT_EQ(s.decode_seqs, 2);
  EXPECT_EQ(s.prefill_context, 6 + 36);
  EXPECT_EQ(s.decode_context, 101);
}

TEST(step_cost, adds_each_term) {
  step_cost c;
  c.c0 = 1.0;
  c.c_prefill = 0.1;
  c.c_decode = 0.01;
  c.c_context = 0.001;
  const step_shape s{.prefill_tokens = 3, .decode_seqs = 2, .decode_context = 40, .prefill_context = 6};
  // Without c_prefill_ctx every attended position costs c_context.
  EXPECT_DOUBLE_EQ(c.seconds(s), 1.0 + 0.3 + 0.02 + 0.001 * 46);
  c.c_prefill_ctx = 0.0001;
  EXPECT_DOUBLE_EQ(c.seconds(s), 1.0 + 0.3 + 0.02 + 0.001 * 40 + 0.0001 * 6);
}

TEST(step_cost, an_empty_step_costs_nothing) {
  step_cost c;
  c.c0 = 1.0;
  EXPECT_EQ(c.seconds(step_shape{}), 0.0);
}

TEST(named_profile, knows_its_profiles_and_they_are_valid) {
  for (const std::string& name : profile_names()) {
    const sim_profile p = named_profile(name);
    EXPECT_EQ(p.name, name);
    EXPECT_NO_THROW(validate(p)) << name;
    if (name == "zero") {
      EXPECT_EQ(p.cost.c0 + p.cost.c_prefill + p.cost.c_decode + p.cost.c_context, 0.0);
    } else {
      EXPECT_GT(p.cost.c0 + p.cost.c_prefill + p.cost.c_decode, 0.0) << name;
    }
  }
}

TEST(named_profile, an_unknown_name_lists_the_known_ones) {
  try {
    named_profile("tpu-llama");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("tpu-llama"));
    EXPECT_THAT(e.what(), HasSubstr("cpu-smollm2"));
    EXPECT_THAT(e.what(), HasSubstr("h200-k2"));
  }
}

// The derivation in sim_profile.cpp must give back the figures it started from.
TEST(h200_k2, reproduces_the_published_per_gpu_throughput) {
  const sim_profile p = named_profile("h200-k2");
  // Prefill: steps of 8192 tokens of 2000-token prompts at ≈7k tokens/s per GPU.
  const step_shape prefill{.prefill_tokens = 8192, .prefill_context = 8192 * 1000 + 8192 / 2};
  EXPECT_NEAR(8192 / p.cost.seconds(prefill), 7000.0, 70.0);
  // Decode: 480 sequences at 2000 + 50.5 positions on average at ≈3k tokens/s per GPU.
  const step_shape decode{.decode_seqs = 480, .decode_context = 480 * 2050 + 240};
  EXPECT_NEAR(480 / p.cost.seconds(decode), 3000.0, 30.0);
  // MLA's KV estimate, ≈70 KB per token.
  EXPECT_EQ(p.kv.bytes_per_block, p.kv.block_size * 70'272);
  EXPECT_EQ(p.kv.n_blocks, static_cast<int32_t>(100e9 / p.kv.bytes_per_block));
  EXPECT_EQ(p.limits.max_step_tokens, 8192);
  EXPECT_EQ(p.limits.max_step_seqs, 512);
}

// With its expert-parallel group evenly loaded, the exchange hides behind compute at both
// operating points: the published throughput holds with the network in the model.
TEST(h200_k2, the_expert_exchange_hides_behind_compute_at_the_operating_points) {
  const sim_profile p = named_profile("h200-k2");
  ASSERT_TRUE(p.ep.on());
  const step_shape prefill{.prefill_tokens = 8192, .prefill_context = 8192 * 1000 + 8192 / 2};
  const step_shape decode{.decode_seqs = 480, .decode_context = 480 * 2050 + 240};
  for (const step_shape& s : {prefill, decode}) {
    EXPECT_LT(exchange_seconds(p, s), p.cost.seconds(s));
    EXPECT_DOUBLE_EQ(step_seconds(p, s), p.cost.seconds(s));
  }
  EXPECT_NEAR(8192 / step_seconds(p, prefill), 7000.0, 70.0);
  EXPECT_NEAR(480 / step_seconds(p, decode), 3000.0, 30.0);
  // decode: 480 tokens × 5.5 remote copies × 7168 × (1 + 2) bytes × 60 layers over 50 GB/s, plus 120 × 20 µs
  EXPECT_NEAR(exchange_seconds(p, decode), 480 * 5.5 * 7168 * 3 * 60 / 50e9 + 120 * 20e-6, 1e-9);
}

TEST(h200_k2, a_hot_expert_or_a_device_down_slows_every_step_of_the_group) {
  sim_profile p = named_profile("h200-k2");
  const step_shape decode{.decode_seqs = 480, .decode_context = 480 * 2050 + 240};
  const double even = step_seconds(p, decode);
  // a device down: its experts' load spreads over the other 95 (replicas)
  const double down = step_seconds(p, decode, {.down = 1});
  EXPECT_NEAR(down - even, p.ep.expert_share * p.cost.c_decode * 480 * (96.0 / 95 - 1), 1e-9);
  // a hot expert: the busiest device takes 1.8x the mean, in compute and on its link
  const double hot = step_seconds(p, decode, {.imbalance = 1.8});
  EXPECT_NEAR(hot - even, p.ep.expert_share * p.cost.c_decode * 480 * 0.8, 1e-9);
  // prefill, level with its link, becomes bound by it under the same hot expert
  const step_shape prefill{.prefill_tokens = 8192, .prefill_context = 8192 * 1000 + 8192 / 2};
  EXPECT_DOUBLE_EQ(step_seconds(p, prefill, {.imbalance = 1.8}), exchange_seconds(p, prefill, {.imbalance = 1.8}));
  // without overlap the exchange adds to every step; a slower link makes it longer
  p.ep.overlap = false;
  EXPECT_DOUBLE_EQ(step_seconds(p, decode), p.cost.seconds(decode) + exchange_seconds(p, decode));
  const double fast = exchange_seconds(p, decode);
  p.ep.link_bytes_per_s /= 4;
  EXPECT_GT(exchange_seconds(p, decode), 3.9 * (fast - 120 * 20e-6));
  // no group: the cost model alone
  p.ep.degree = 0;
  EXPECT_DOUBLE_EQ(step_seconds(p, decode, {.down = 3, .imbalance = 2}), p.cost.seconds(decode));
  EXPECT_EQ(exchange_seconds(p, decode), 0.0);
}

TEST(validate, names_a_bad_expert_parallel_field) {
  sim_profile p = named_profile("h200-k2");
  p.ep.remote_copies = 200;
  EXPECT_THAT([&] { validate(p); }, ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("remote_copies")));
  p = named_profile("h200-k2");
  p.ep.link_bytes_per_s = 0;
  EXPECT_THAT([&] { validate(p); }, ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("link_bytes_per_s")));
  p = named_profile("h200-k2");
  p.ep.expert_share = 1.5;
  EXPECT_THAT([&] { validate(p); }, ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("expert_share")));
}

TEST(h200_k2, decode_attention_costs_more_per_position_than_prefill_attention) {
  const sim_profile p = named_profile("h200-k2");
  ASSERT_TRUE(p.cost.c_prefill_ctx.has_value());
  EXPECT_GT(p.cost.c_context, 2.0 * *p.cost.c_prefill_ctx);
}

TEST(validate, names_the_bad_field) {
  auto expect_rejected = [](sim_profile p, const char* field) {
    try {
      validate(p);
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(field));
      EXPECT_THAT(e.what(), HasSubstr(p.name));
    }
  };
  const sim_profile good = named_profile("cpu-smollm2");
  sim_profile p = good;
  p.cost.c_decode = -1e-3;
  expect_rejected(p, "c_decode");
  p = good;
  p.cost.c_prefill_ctx = std::nan("");
  expect_rejected(p, "c_prefill_ctx");
  p = good;
  p.kv.n_blocks = 0;
  expect_rejected(p, "n_blocks");
  p = good;
  p.limits.max_step_seqs = 0;
  expect_rejected(p, "max_step_seqs");
  p = good;
  p.end_sampled_token = p.n_vocab + 1;
  expect_rejected(p, "sampled tokens");
  p = good;
  p.first_sampled_token = p.end_sampled_token;
  expect_rejected(p, "sampled tokens");
}

}  // namespace
}  // namespace tireless::sim
