#include "gpu/sim/sim_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <stdexcept>

namespace tireless::sim {
namespace {

using ::testing::HasSubstr;

// A small profile with round numbers: blocks of 4 tokens, 16 blocks, 8 tokens and 3
// sequences per step, 32 positions, 100 tokens of which 10..99 may be sampled.
sim_profile tiny() {
  sim_profile p;
  p.name = "tiny";
  p.cost.c0 = 1e-3;
  p.cost.c_prefill = 1e-4;
  p.cost.c_decode = 1e-2;
  p.cost.c_context = 1e-6;
  p.kv = {4, 16, 4096};
  p.limits = {8, 3, 32};
  p.n_vocab = 100;
  p.first_sampled_token = 10;
  p.end_sampled_token = 100;
  return p;
}

struct sim_backend_step : ::testing::Test {
  sim_backend b{tiny()};
  std::vector<token_id> prompt{1, 2, 3, 4, 5};
  std::vector<token_id> one{7};
  std::vector<int32_t> table{0, 1, 2, 3, 4, 5, 6, 7};
  step_result r;

  sequence_step seq(uint64_t id, std::span<const token_id> tokens, int32_t start) const {
    sequence_step s;
    s.seq_id = id;
    s.tokens = tokens;
    s.start_pos = start;
    s.block_table = table;
    s.sample = true;
    return s;
  }
  std::string error_of(const step_batch& batch) {
    try {
      b.execute(batch, r);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  }
};

TEST_F(sim_backend_step, reports_the_profile_geometry_and_limits) {
  EXPECT_EQ(b.kv().block_size, 4);
  EXPECT_EQ(b.kv().n_blocks, 16);
  EXPECT_EQ(b.kv().bytes_per_block, 4096);
  EXPECT_EQ(b.limits().max_step_tokens, 8);
  EXPECT_EQ(b.limits().max_step_seqs, 3);
  EXPECT_EQ(b.limits().max_context, 32);
  EXPECT_EQ(b.n_vocab(), 100);
  EXPECT_THAT(b.describe(), HasSubstr("tiny"));
}

TEST_F(sim_backend_step, a_step_takes_the_modelled_time_and_advances_the_virtual_clock) {
  step_batch batch;
  batch.seqs = {seq(1, prompt, 0), seq(2, one, 9)};
  b.execute(batch, r);
  // c0 + 5 prefill tokens + one decode + (1+2+3+4+5) prefill and 10 decode positions.
  const double step = 1e-3 + 5e-4 + 1e-2 + 25e-6;
  EXPECT_DOUBLE_EQ(b.last_step_seconds(), step);
  EXPECT_EQ(b.last_step_shape().prefill_context, 15);
  b.execute(batch, r);
  EXPECT_DOUBLE_EQ(b.virtual_seconds(), 2 * step);
  b.execute(step_batch{}, r);
  EXPECT_EQ(b.last_step_seconds(), 0.0);
  EXPECT_TRUE(r.next.empty());
  EXPECT_DOUBLE_EQ(b.virtual_seconds(), 2 * step);
}

TEST_F(sim_backend_step, samples_only_where_asked_from_the_sampled_range) {
  step_batch batch;
  batch.seqs = {seq(1, prompt, 0), seq(2, one, 9), seq(3, one, 4)};
  batch.seqs[1].sample = false;
  b.execute(batch, r);
  ASSERT_EQ(r.next.size(), 3u);
  EXPECT_EQ(r.next[1], -1);
  for (size_t i : {0u, 2u}) {
    EXPECT_GE(r.next[i], 10);
    EXPECT_LT(r.next[i], 100);
  }
  EXPECT_TRUE(r.logits.empty());
}

TEST_F(sim_backend_step, tokens_depend_only_on_sequence_position_and_seed) {
  step_batch batch;
  batch.seqs = {seq(1, prompt, 0), seq(2, one, 9)};
  b.execute(batch, r);
  const std::vector<token_id> first = r.next;
  sim_backend other(tiny());
  step_result again;
  other.execute(batch, again);
  EXPECT_EQ(again.next, first);
  // The position the token takes, not how the chunk got there.
  EXPECT_EQ(first[0], b.token_for(1, 5, 0));
  EXPECT_EQ(first[1], b.token_for(2, 10, 0));

  // Over many draws, the sequence, the position and the seed each change the token.
  int differ_seq = 0, differ_pos = 0, differ_seed = 0;
  for (int64_t pos = 0; pos < 200; ++pos) {
    differ_seq += b.token_for(1, pos, 0) != b.token_for(2, pos, 0);
    differ_pos += b.token_for(1, pos, 0) != b.token_for(1, pos + 1, 0);
    differ_seed += b.token_for(1, pos, 0) != b.token_for(1, pos, 1);
  }
  EXPECT_GT(differ_seq, 150);
  EXPECT_GT(differ_pos, 150);
  EXPECT_GT(differ_seed, 150);
}

TEST_F(sim_backend_step, logits_point_at_the_sampled_token) {
  step_batch batch;
  batch.seqs = {seq(1, prompt, 0), seq(2, one, 9)};
  batch.seqs[0].want_logits = true;
  batch.seqs[1].want_logits = true;
  batch.seqs[1].sample = false;
  b.execute(batch, r);
  ASSERT_EQ(r.logits.size(), 200u);
  const auto best = [&](size_t row) {
    return static_cast<token_id>(std::max_element(r.logits.begin() + row * 100, r.logits.begin() + (row + 1) * 100) -
                                 (r.logits.begin() + row * 100));
  };
  EXPECT_EQ(best(0), r.next[0]);
  EXPECT_EQ(best(1), b.token_for(2, 10, 0));
  EXPECT_FLOAT_EQ(std::accumulate(r.logits.begin(), r.logits.end(), 0.0f), 2.0f);
}

TEST_F(sim_backend_step, rejects_batches_past_the_limits_as_the_cpu_backend_does) {
  std::vector<token_id> nine(9, 1), bad_token{100};
  step_batch batch;
  batch.seqs = {seq(1, one, 0), seq(2, one, 0), seq(3, one, 0), seq(4, one, 0)};
  EXPECT_EQ(error_of(batch), "step has 4 sequences, the limit is 3");
  batch.seqs = {seq(1, nine, 0)};
  EXPECT_EQ(error_of(batch), "step has 9 tokens, the limit is 8");
  batch.seqs = {seq(1, one, 32)};
  EXPECT_EQ(error_of(batch), "sequence 1: positions 32..32 are outside 0..31");
  batch.seqs = {seq(1, one, -1)};
  EXPECT_EQ(error_of(batch), "sequence 1: positions -1..-1 are outside 0..31");
  batch.seqs = {seq(1, std::span<const token_id>{}, 0)};
  EXPECT_THAT(error_of(batch), HasSubstr("are outside 0..31"));
  batch.seqs = {seq(1, prompt, 28)};
  batch.seqs[0].block_table = std::span<const int32_t>(table).first(7);
  EXPECT_EQ(error_of(batch), "sequence 1: positions 28..32 are outside 0..31");
  batch.seqs = {seq(1, prompt, 27)};
  batch.seqs[0].block_table = std::span<const int32_t>(table).first(7);
  EXPECT_EQ(error_of(batch), "sequence 1: 8 blocks needed, block table has 7");
  const std::vector<int32_t> outside{0, 16};
  batch.seqs = {seq(1, prompt, 0)};
  batch.seqs[0].block_table = outside;
  EXPECT_EQ(error_of(batch), "sequence 1: block 16 is outside the pool");
  batch.seqs = {seq(1, bad_token, 0)};
  EXPECT_EQ(error_of(batch), "sequence 1: token 100 is outside the vocabulary");
  // A rejected step takes no time.
  EXPECT_EQ(b.virtual_seconds(), 0.0);
}

TEST_F(sim_backend_step, copy_blocks_only_checks_the_ids) {
  const std::pair<int32_t, int32_t> ok[] = {{0, 15}, {3, 4}};
  EXPECT_NO_THROW(b.copy_blocks(ok));
  const std::pair<int32_t, int32_t> bad[] = {{0, 1}, {2, 16}};
  try {
    b.copy_blocks(bad);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "copy of block 2 to 16: outside the pool");
  }
}

TEST(sim_backend, refuses_an_invalid_profile) {
  sim_profile p = tiny();
  p.limits.max_context = 0;
  EXPECT_THROW(sim_backend{p}, std::invalid_argument);
  EXPECT_THROW(make_sim_backend(p), std::invalid_argument);
}

TEST(sim_backend, works_through_the_backend_interface) {
  std::unique_ptr<backend> b = make_sim_backend(named_profile("cpu-smollm2"));
  const std::vector<token_id> tokens{1, 2, 3};
  const std::vector<int32_t> table{0};
  step_batch batch;
  batch.seqs.push_back({42, tokens, 0, table, true, {}, false});
  step_result r;
  b->execute(batch, r);
  auto& sim = dynamic_cast<sim_backend&>(*b);
  EXPECT_GT(sim.last_step_seconds(), 0.0);
  EXPECT_GE(r.next[0], 17);  // never one of SmolLM2's control tokens
}

// Real time only ever waits at least the modelled duration: a lower bound, whatever the
// machine's speed.
TEST(sim_backend, expert_events_apply_within_their_span_and_stall_once) {
  sim_backend b{named_profile("h200-k2")};
  b.set_expert_events({{.at_s = 10, .for_s = 20, .down = 2, .stall_s = 1.5}, {.at_s = 15, .for_s = 0, .imbalance = 1.6}});
  std::vector<token_id> one{300};
  std::vector<int32_t> table{0};
  step_batch batch;
  sequence_step s;
  s.seq_id = 1;
  s.tokens = one;
  s.start_pos = 0;
  s.block_table = table;
  batch.seqs.push_back(s);
  step_result r;
  const auto at = [&](double t) {
    b.set_time(t);
    b.execute(batch, r);
    return b.last_step_seconds();
  };
  const double even = at(5);
  EXPECT_EQ(b.condition().down, 0);
  const double stalled = at(10);
  const double down = at(11);
  EXPECT_EQ(b.condition().down, 2);
  EXPECT_GT(down, even);
  EXPECT_NEAR(stalled - down, 1.5, 1e-9);  // the stall comes once
  EXPECT_GT(at(16), down);                  // and a hot expert on top
  EXPECT_DOUBLE_EQ(b.condition().imbalance, 1.6);
  at(31);
  EXPECT_EQ(b.condition().down, 0);         // the devices are back; the hot expert stays
  EXPECT_DOUBLE_EQ(b.condition().imbalance, 1.6);
}

TEST(sim_backend, refuses_expert_events_its_group_cannot_have) {
  sim_backend k2{named_profile("h200-k2")};
  EXPECT_THAT([&] { k2.set_expert_events({{.at_s = 1, .down = 96}}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("at least one device must stay up")));
  sim_backend cpu{named_profile("cpu-smollm2")};
  EXPECT_THAT([&] { cpu.set_expert_events({{.at_s = 1, .down = 1}}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("no expert-parallel group")));
}

TEST(sim_backend, real_time_sleeps_for_the_step) {
  sim_profile p = tiny();
  p.cost.c0 = 0.02;
  sim_backend b(p);
  const std::vector<token_id> one{7};
  const std::vector<int32_t> table{0};
  step_batch batch;
  batch.seqs.push_back({1, one, 0, table, true, {}, false});
  step_result r;
  b.set_real_time(true);
  const auto t0 = std::chrono::steady_clock::now();
  b.execute(batch, r);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, b.last_step_seconds());
}

// An hour of K2 serving, 64 sequences in decode and a 64-token prefill chunk per step (about
// 100k steps of 36 ms), replayed without waiting. Prints the speed; asserts only the virtual
// time covered, never the machine's speed.
TEST(sim_backend, replays_an_hour_of_steps_without_waiting) {
  sim_backend b(named_profile("h200-k2"));
  constexpr int n_decode = 64;
  constexpr int context = 2000;
  const std::vector<token_id> one{1000};
  const std::vector<token_id> chunk(64, 1000);
  std::vector<int32_t> table((context + 128 + 63) / 64);
  std::iota(table.begin(), table.end(), 0);
  step_batch batch;
  for (int i = 0; i < n_decode; ++i) batch.seqs.push_back({static_cast<uint64_t>(i), one, context, table, true, {}, false});
  batch.seqs.push_back({999, chunk, context, table, true, {}, false});
  step_result r;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t steps = 0;
  while (b.virtual_seconds() < 3600.0) {
    for (int i = 0; i < n_decode; ++i) batch.seqs[i].start_pos = context + static_cast<int32_t>(steps % 64);
    b.execute(batch, r);
    ++steps;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("replayed %.0f virtual seconds in %lld steps of %.1f ms in %.3f s of wall time (%.0fx)\n",
              b.virtual_seconds(), static_cast<long long>(steps), 1e3 * b.last_step_seconds(), wall,
              b.virtual_seconds() / wall);
  EXPECT_GE(b.virtual_seconds(), 3600.0);
  EXPECT_GT(steps, 50'000);
}

}  // namespace
}  // namespace tireless::sim
