#include "model/sampler.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace tireless {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from (seed, draw).
double uniform(uint64_t seed, uint64_t draw) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ (draw * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

token_id argmax(std::span<const float> logits) {
  token_id best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<token_id>(i);
  }
  return best;
}

// Tokens whose probability is below e^-30 of the best one's cannot change a draw in double
// precision in any realistic way; dropping them keeps the sort short.
constexpr float negligible_log_ratio = 30.0f;

// Calls f(token, count) once per distinct token of `tokens` (ids outside [0, n) skipped).
template <class F>
void for_each_count(std::span<const token_id> tokens, size_t n, std::vector<token_id>& sorted, F f) {
  sorted.assign(tokens.begin(), tokens.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    if (sorted[i] >= 0 && static_cast<size_t>(sorted[i]) < n) f(sorted[i], static_cast<int32_t>(j - i));
    i = j;
  }
}

// The logits after the penalties, in scratch.penalized.
std::span<const float> penalize(std::span<const float> logits, const sampling_params& p, sampler_scratch& scratch,
                                std::span<const token_id> history, int32_t prompt_len) {
  auto& l = scratch.penalized;
  l.assign(logits.begin(), logits.end());
  if (p.repetition_penalty != 1.0f) {
    for_each_count(history, l.size(), scratch.sorted, [&](token_id t, int32_t) {
      l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    });
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    const size_t from = std::min(history.size(), static_cast<size_t>(std::max(prompt_len, 0)));
    for_each_count(history.subspan(from), l.size(), scratch.sorted, [&](token_id t, int32_t count) {
      l[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
    });
  }
  return l;
}

}  // namespace

token_id sample(std::span<const float> logits, const sampling_params& p, uint64_t draw,
                sampler_scratch& scratch, std::span<const token_id> history, int32_t prompt_len) {
  assert(!logits.empty());
  if (p.penalized() && !history.empty()) logits = penalize(logits, p, scratch, history, prompt_len);
  if (p.temperature <= 0.0f || p.top_k == 1) return argmax(logits);
  const float max_logit = logits[argmax(logits)];
  auto& c = scratch.candidates;
  c.clear();
  const float floor = max_logit - negligible_log_ratio * p.temperature;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= floor) c.emplace_back(logits[i], static_cast<token_id>(i));
  }
  auto more_likely = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) {
    std::nth_element(c.begin(), c.begin() + p.top_k, c.end(), more_likely);
    c.resize(static_cast<size_t>(p.top_k));
  }
  std::sort(c.begin(), c.end(), more_likely);
  double total = 0.0;
  for (auto& [v, id] : c) {
    v = static_cast<float>(std::exp(static_cast<double>(v - max_logit) / p.temperature));
    total += v;
  }
  size_t keep = c.size();
  if (p.min_p > 0.0f) {  // c[0] is the most likely, with weight 1
    while (keep > 1 && c[keep - 1].first < p.min_p) --keep;
  }
  if (p.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += c[i].first / total;
      if (cumulative >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += c[i].first;
  const double target = uniform(p.seed, draw) * kept;
  double cumulative = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += c[i].first;
    if (target < cumulative) return c[i].second;
  }
  return c[keep - 1].second;
}

token_logprob logprob_of(std::span<const float> logits, token_id chosen, int32_t top, sampler_scratch& scratch) {
  assert(!logits.empty() && chosen >= 0 && static_cast<size_t>(chosen) < logits.size());
  const float max_logit = logits[argmax(logits)];
  double total = 0.0;
  for (float v : logits) total += std::exp(static_cast<double>(v - max_logit));
  const double log_total = static_cast<double>(max_logit) + std::log(total);
  token_logprob out;
  out.token = chosen;
  out.logprob = static_cast<float>(logits[chosen] - log_total);
  const size_t n = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (n == 0) return out;
  auto& c = scratch.top;
  c.clear();
  for (size_t i = 0; i < logits.size(); ++i) c.emplace_back(logits[i], static_cast<token_id>(i));
  std::partial_sort(c.begin(), c.begin() + static_cast<ptrdiff_t>(n), c.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  out.top.reserve(n);
  for (size_t i = 0; i < n; ++i) out.top.emplace_back(c[i].second, static_cast<float>(c[i].first - log_total));
  return out;
}

}  // namespace tireless
