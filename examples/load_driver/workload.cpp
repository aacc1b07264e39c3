#include "workload.hpp"

#include <algorithm>
#include <array>
#include <cmath>

namespace tireless::load {

namespace {

// Token ids below SmolLM2's vocabulary and clear of every profile's control tokens.
constexpr int32_t first_id = 1000, end_id = 30000;

int32_t draw(const length_dist& d, std::mt19937_64& rng) {
  switch (d.shape) {
    case length_dist::kind::fixed: return d.min;
    case length_dist::kind::uniform: return std::uniform_int_distribution<int32_t>(d.min, d.max)(rng);
    case length_dist::kind::lognormal: {
      std::lognormal_distribution<double> ln(std::log(d.median), d.sigma);
      for (int i = 0; i < 64; ++i) {
        const double v = std::round(ln(rng));
        if (v >= d.min && v <= d.max) return static_cast<int32_t>(v);
      }
      return static_cast<int32_t>(std::lround(d.median));
    }
  }
  return d.min;
}

std::vector<double> shares(const scenario& s) {
  std::vector<double> w;
  for (const request_class& c : s.mix) w.push_back(c.share);
  return w;
}

}  // namespace

request_source::request_source(const scenario& s, uint64_t seed) : s_(s), rng_(seed) {
  if (!s.mix.empty()) {
    const auto w = shares(s);
    pick_ = std::discrete_distribution<int32_t>(w.begin(), w.end());
  }
}

planned_request request_source::next() {
  planned_request r;
  r.content_seed = rng_();
  if (!s_.trace.empty()) {
    const trace_row& row = s_.trace[trace_next_++ % s_.trace.size()];
    r.tier = row.tier;
    r.tenant_key = &row.tenant_key;
    r.prompt_tokens = row.prompt_tokens;
    r.max_tokens = row.output_tokens;
    return r;
  }
  r.cls = pick_(rng_);
  const request_class& c = s_.mix[static_cast<size_t>(r.cls)];
  r.tier = c.tier;
  r.tenant_key = &c.tenant_key;
  r.system_tokens = c.system_prompt_tokens;
  r.prompt_tokens = c.system_prompt_tokens + draw(c.prompt, rng_);
  r.max_tokens = draw(c.output, rng_);
  r.timeout_ms = c.timeout_ms;
  return r;
}

std::vector<planned_request> plan_open_loop(const scenario& s, double rate_rps, double horizon_s, uint64_t seed) {
  std::vector<planned_request> plan;
  request_source source(s, seed);
  if (s.arrivals == arrival_kind::poisson) {
    // A Poisson process whose rate follows the profile and each class's bursts, by thinning:
    // candidates at the peak rate, each kept with the ratio of its class's rate then to it.
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
    double burst_peak = 1.0;
    for (const request_class& c : s.mix) burst_peak = std::max(burst_peak, c.burst_peak());
    const double peak = s.profile.peak() * burst_peak;
    const bool thin = !s.profile.points.empty() || burst_peak > 1.0;
    std::exponential_distribution<double> gap(rate_rps * peak);
    std::uniform_real_distribution<double> keep(0, 1);
    for (double t = gap(rng); t < horizon_s; t += gap(rng)) {
      planned_request r = source.next();
      const double f = s.profile.at(t) * s.mix[static_cast<size_t>(r.cls)].burst_at(t);
      if (thin && keep(rng) * peak >= f) continue;
      r.arrival_s = t;
      plan.push_back(r);
    }
    return plan;
  }
  // The trace's own mean rate over its span; its times are scaled to rate_rps.
  const double first = s.trace.front().arrival_s;
  const double span = std::max(s.trace.back().arrival_s - first, 1e-3);
  const double own_rate = static_cast<double>(s.trace.size()) / span;
  const double scale = own_rate / rate_rps;
  for (double offset = 0;; offset += span * scale + 1.0 / rate_rps) {
    for (const trace_row& row : s.trace) {
      planned_request r = source.next();
      r.arrival_s = offset + (row.arrival_s - first) * scale;
      if (r.arrival_s >= horizon_s) return plan;
      plan.push_back(r);
    }
  }
}

std::vector<int32_t> prompt_token_ids(const planned_request& r) {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(r.prompt_tokens));
  std::mt19937_64 shared(0x5eed0000ull + static_cast<uint64_t>(r.cls + 1));
  std::mt19937_64 own(r.content_seed);
  std::uniform_int_distribution<int32_t> id(first_id, end_id - 1);
  for (int32_t i = 0; i < r.prompt_tokens; ++i) ids.push_back(id(i < r.system_tokens ? shared : own));
  return ids;
}

std::string filler_text(int32_t tokens, uint64_t seed) {
  // Each is one token, with its leading space, for GPT-2-style BPE vocabularies such as SmolLM2's.
  static constexpr std::array<const char*, 48> words = {
      " the",   " of",    " and",   " to",    " in",    " is",    " that",  " for",   " it",    " was",
      " on",    " with",  " he",    " as",    " you",   " at",    " be",    " this",  " have",  " from",
      " or",    " one",   " had",   " by",    " word",  " but",   " not",   " what",  " all",   " were",
      " we",    " when",  " your",  " can",   " said",  " there", " use",   " an",    " each",  " which",
      " she",   " do",    " how",   " their", " if",    " will",  " up",    " other"};
  std::mt19937_64 rng(seed);
  std::string text;
  text.reserve(static_cast<size_t>(tokens) * 6);
  for (int32_t n = 0, i = 0; n < tokens; ++i) {
    text += words[rng() % words.size()];
    ++n;
    if (i % 16 == 15 && n < tokens) {
      text += '.';
      ++n;
    }
  }
  return text;
}

std::pair<double, double> mean_lengths(const scenario& s) {
  double prompt = 0, output = 0;
  if (!s.trace.empty()) {
    for (const trace_row& r : s.trace) {
      prompt += r.prompt_tokens;
      output += r.output_tokens;
    }
    return {prompt / s.trace.size(), output / s.trace.size()};
  }
  for (const request_class& c : s.mix) {
    prompt += c.share * (c.system_prompt_tokens + c.prompt.mean());
    output += c.share * c.output.mean();
  }
  return {prompt, output};
}

}  // namespace tireless::load
