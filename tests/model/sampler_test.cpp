#include "model/sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

namespace tireless {
namespace {

sampling_params with_temperature(float t, uint64_t seed = 7) {
  sampling_params p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

// How often each token comes up in draws 0 .. n-1.
std::vector<int> histogram(const std::vector<float>& logits, const sampling_params& p, int n) {
  sampler_scratch scratch;
  std::vector<int> counts(logits.size());
  for (int d = 0; d < n; ++d) ++counts.at(sample(logits, p, static_cast<uint64_t>(d), scratch));
  return counts;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& x : p) x /= total;
  return p;
}

// Pearson's statistic of counts against probabilities; tokens with probability 0 must not
// come up at all.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs) {
  int n = 0;
  for (int c : counts) n += c;
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double expected = n * probs[i];
    chi += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi;
}

// Chi-square quantiles at 0.999 (a fixed seed makes the draws, and so the test, deterministic).
constexpr double chi_999_1dof = 10.83, chi_999_2dof = 13.82, chi_999_4dof = 18.47;

TEST(sampler, greedy_picks_the_highest_logit) {
  sampler_scratch scratch;
  const std::vector<float> logits = {0.5f, -1.0f, 3.25f, 3.0f, -7.0f};
  EXPECT_EQ(sample(logits, sampling_params{}, 0, scratch), 2);
  EXPECT_EQ(sample(logits, sampling_params{}, 123, scratch), 2);
}

TEST(sampler, greedy_takes_the_lowest_id_on_ties) {
  sampler_scratch scratch;
  EXPECT_EQ(sample(std::vector<float>{1.0f, 4.0f, 2.0f, 4.0f, 4.0f}, sampling_params{}, 0, scratch), 1);
  EXPECT_EQ(sample(std::vector<float>{-2.0f, -2.0f}, sampling_params{}, 5, scratch), 0);
}

TEST(sampler, top_k_of_one_is_greedy_at_any_temperature) {
  sampler_scratch scratch;
  sampling_params p = with_temperature(5.0f);
  p.top_k = 1;
  const std::vector<float> logits = {0.0f, 0.1f, 0.2f, 0.2f, 0.1f};
  for (uint64_t d = 0; d < 100; ++d) EXPECT_EQ(sample(logits, p, d, scratch), 2);
}

TEST(sampler, temperature_sampling_follows_the_softmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  for (float t : {1.0f, 0.5f, 2.0f}) {
    const std::vector<int> counts = histogram(logits, with_temperature(t), 20000);
    EXPECT_LT(chi_square(counts, softmax(logits, t)), chi_999_4dof) << "temperature " << t;
  }
}

TEST(sampler, top_k_draws_only_from_the_k_best_in_their_proportions) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.0f, 2.5f, 2.0f, -1.0f};
  sampling_params p = with_temperature(1.0f);
  p.top_k = 3;
  const std::vector<int> counts = histogram(logits, p, 20000);
  std::vector<float> kept = logits;
  for (int i : {0, 2, 5}) kept[i] = -INFINITY;
  EXPECT_LT(chi_square(counts, softmax(kept, 1.0)), chi_999_2dof);
}

TEST(sampler, top_k_larger_than_the_vocabulary_keeps_everything) {
  const std::vector<float> logits = {0.0f, 1.0f};
  sampling_params p = with_temperature(1.0f);
  p.top_k = 50;
  EXPECT_LT(chi_square(histogram(logits, p, 20000), softmax(logits, 1.0)), chi_999_1dof);
}

TEST(sampler, top_p_keeps_the_smallest_set_reaching_p) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (in shuffled order): 0.5 < p = 0.7 <= 0.8, so the two
  // best stay; p = 0.9 keeps the three best.
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  sampling_params p = with_temperature(1.0f);
  p.top_p = 0.7f;
  EXPECT_LT(chi_square(histogram(logits, p, 20000), {0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8}), chi_999_1dof);
  p.top_p = 0.9f;
  EXPECT_LT(chi_square(histogram(logits, p, 20000), {0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95}),
            chi_999_2dof);
  p.top_p = 0.4f;  // the best alone already reaches it
  const std::vector<int> counts = histogram(logits, p, 1000);
  EXPECT_EQ(counts[1], 1000);
}

TEST(sampler, top_k_and_top_p_combine) {
  // top_k = 3 keeps 0.5, 0.3, 0.15 (renormalized: 0.526, 0.316, 0.158); top_p = 0.8 then
  // needs the two best (0.526 < 0.8 <= 0.842).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  sampling_params p = with_temperature(1.0f);
  p.top_k = 3;
  p.top_p = 0.8f;
  EXPECT_LT(chi_square(histogram(logits, p, 20000), {0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8}), chi_999_1dof);
}

TEST(sampler, the_same_seed_and_draw_give_the_same_token) {
  std::vector<float> logits(1000, 0.0f);  // uniform: every draw is informative
  sampler_scratch a, b;
  const sampling_params p = with_temperature(1.0f, 42);
  for (uint64_t d = 0; d < 200; ++d) {
    const token_id first = sample(logits, p, d, a);
    sample(logits, with_temperature(1.0f, 99), d + 1, a);  // scratch left dirty in between
    EXPECT_EQ(sample(logits, p, d, a), first) << "draw " << d;
    EXPECT_EQ(sample(logits, p, d, b), first) << "draw " << d;
  }
}

TEST(sampler, different_seeds_give_different_tokens) {
  std::vector<float> logits(1000, 0.0f);
  sampler_scratch scratch;
  for (uint64_t seed : {0ull, 1ull, 2ull, 12345ull}) {
    int same = 0;
    for (uint64_t d = 0; d < 200; ++d) {
      same += sample(logits, with_temperature(1.0f, seed), d, scratch) ==
              sample(logits, with_temperature(1.0f, seed + 1), d, scratch);
    }
    EXPECT_LT(same, 5) << "seeds " << seed << " and " << seed + 1;  // about 0.2 expected
  }
}

TEST(sampler, the_draw_index_changes_the_token) {
  std::vector<float> logits(1000, 0.0f);
  sampler_scratch scratch;
  std::set<token_id> seen;
  for (uint64_t d = 0; d < 200; ++d) seen.insert(sample(logits, with_temperature(1.0f), d, scratch));
  EXPECT_GT(seen.size(), 150u);  // about 182 distinct expected from 200 uniform draws of 1000
}

TEST(sampler, a_sequence_recomputed_after_preemption_draws_the_same_tokens) {
  // Draw d is the position the token takes. A preempted sequence that recomputes from
  // position 20 draws with indices 20, 21, ... again, in a fresh scratch.
  const std::vector<float> logits = {0.3f, 0.1f, 0.0f, 0.2f, 0.4f, 0.1f, 0.0f, 0.2f};
  sampling_params p = with_temperature(0.8f, 2024);
  p.top_k = 6;
  p.top_p = 0.95f;
  sampler_scratch first_run;
  std::vector<token_id> tokens;
  for (uint64_t pos = 0; pos < 60; ++pos) tokens.push_back(sample(logits, p, pos, first_run));
  sampler_scratch second_run;
  for (uint64_t pos = 20; pos < 60; ++pos) EXPECT_EQ(sample(logits, p, pos, second_run), tokens[pos]);
  EXPECT_GT(std::set<token_id>(tokens.begin(), tokens.end()).size(), 3u);
}

TEST(sampler, repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens) {
  sampler_scratch scratch;
  sampling_params p;  // greedy
  p.repetition_penalty = 2.0f;
  // Token 0 (3.0) seen: 1.5 < token 1's 2.0. Token 2 (-1.0) seen: -2.0.
  const std::vector<float> logits = {3.0f, 2.0f, -1.0f, -1.5f};
  EXPECT_EQ(sample(logits, sampling_params{}, 0, scratch), 0);
  const std::vector<token_id> history = {0, 0, 2};
  EXPECT_EQ(sample(logits, p, 0, scratch, history, 3), 1);  // prompt tokens count too
  const std::vector<float> negative = {-3.0f, -2.5f, -1.0f, -1.5f};
  EXPECT_EQ(sample(negative, p, 0, scratch, std::vector<token_id>{2}, 1), 3);  // -2.0 < -1.5
}

TEST(sampler, presence_and_frequency_penalties_count_generated_tokens_only) {
  sampler_scratch scratch;
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  const std::vector<token_id> history = {0, 0, 0, 1, 0};  // prompt {0, 0, 0}; generated {1, 0}
  sampling_params presence;
  presence.presence_penalty = 1.0f;  // 0: 2.0, 1: 1.5
  EXPECT_EQ(sample(logits, presence, 0, scratch, history, 3), 0);
  sampling_params frequency;
  frequency.frequency_penalty = 0.6f;  // each generated once: 0: 3.0 - 0.6 = 2.4, 1: 2.5 - 0.6 = 1.9
  EXPECT_EQ(sample(logits, frequency, 0, scratch, history, 3), 0);
  const std::vector<token_id> repeated = {1, 0, 0, 0};  // prompt {1}; generated 0 three times
  EXPECT_EQ(sample(logits, frequency, 0, scratch, repeated, 1), 1);  // 3.0 - 1.8 = 1.2 < 2.5
  // The whole history as prompt: nothing generated, nothing penalized.
  EXPECT_EQ(sample(logits, frequency, 0, scratch, repeated, 4), 0);
}

TEST(sampler, min_p_drops_tokens_less_likely_than_its_share_of_the_best) {
  // At temperature 1, token 2 has e^-3 (5%) of token 0's probability, token 1 e^-0.5 (61%).
  const std::vector<float> logits = {0.0f, -0.5f, -3.0f};
  sampling_params p = with_temperature(1.0f);
  p.min_p = 0.1f;
  const std::vector<int> counts = histogram(logits, p, 4000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_GT(counts[1], 1000);
  p.min_p = 0.01f;
  EXPECT_GT(histogram(logits, p, 4000)[2], 0);
}

TEST(sampler, penalties_are_ignored_without_a_history_and_need_one_with) {
  sampler_scratch scratch;
  sampling_params p;
  p.repetition_penalty = 5.0f;
  EXPECT_FALSE(sampling_params{}.penalized());
  EXPECT_TRUE(p.penalized());
  const std::vector<float> logits = {1.0f, 0.5f};
  EXPECT_EQ(sample(logits, p, 0, scratch), 0);
  EXPECT_EQ(sample(logits, p, 0, scratch, std::vector<token_id>{0}, 1), 1);
  EXPECT_EQ(sample(logits, p, 0, scratch, std::vector<token_id>{7, -1}, 1), 0);  // ids outside the vocabulary
}

TEST(sampler, logprobs_are_the_raw_log_softmax_with_the_most_likely_tokens_first) {
  sampler_scratch scratch;
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  const std::vector<double> p = softmax(logits, 1.0);
  const token_logprob l = logprob_of(logits, 4, 3, scratch);
  EXPECT_EQ(l.token, 4);
  EXPECT_NEAR(l.logprob, std::log(p[4]), 1e-5);
  ASSERT_EQ(l.top.size(), 3u);
  EXPECT_EQ(l.top[0].first, 1);  // ties: the lower id first
  EXPECT_EQ(l.top[1].first, 3);
  EXPECT_EQ(l.top[2].first, 0);
  for (const auto& [t, lp] : l.top) EXPECT_NEAR(lp, std::log(p[static_cast<size_t>(t)]), 1e-5);
  EXPECT_TRUE(logprob_of(logits, 0, 0, scratch).top.empty());
  EXPECT_EQ(logprob_of(logits, 0, 20, scratch).top.size(), logits.size());  // at most the vocabulary
  // Huge logits do not overflow: log-softmax is shift-invariant.
  const std::vector<float> big = {1000.0f, 999.0f};
  EXPECT_NEAR(logprob_of(big, 1, 0, scratch).logprob, std::log(1.0 / (1.0 + std::exp(1.0))), 1e-5);
}

}  // namespace
}  // namespace tireless
