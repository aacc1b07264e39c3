#pragma once
// The requests of a run: when each arrives and what it asks for, drawn from the scenario's mix
// (or taken from its trace) with a seeded generator, so that every policy sees the same
// requests at the same times.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "scenario.hpp"

namespace tireless::load {

struct planned_request {
  double arrival_s = 0;  // since the run's start
  int32_t cls = -1;      // index into the mix; -1 for a trace row
  int32_t tier = 0;      // index into the config's tiers
  const std::string* tenant_key = nullptr;  // points into the scenario
  int32_t prompt_tokens = 0, max_tokens = 0, system_tokens = 0;
  int64_t timeout_ms = 0;
  uint64_t content_seed = 0;
  uint64_t retry_token = 0;  // a client's retry: the token of the refusal it follows (0: none)
};

// Draws requests from the mix, or cycles through the trace, one after another.
class request_source {
 public:
  request_source(const scenario& s, uint64_t seed);
  planned_request next();  // arrival_s left 0

 private:
  const scenario& s_;
  std::mt19937_64 rng_;
  std::discrete_distribution<int32_t> pick_;
  size_t trace_next_ = 0;
};

// Arrivals over [0, horizon_s) at rate_rps on average: a Poisson process over the mix, or the
// trace with its times scaled so that its mean rate is rate_rps (repeated to fill the horizon).
std::vector<planned_request> plan_open_loop(const scenario& s, double rate_rps, double horizon_s, uint64_t seed);

// Prompt token ids for the sim backend: the class's shared system prefix, then the request's own.
std::vector<int32_t> prompt_token_ids(const planned_request& r);

// Text for a real model of about `tokens` tokens (common one-token English words).
std::string filler_text(int32_t tokens, uint64_t seed);

// The mean prompt and output tokens of the mix (or the trace), for descriptions.
std::pair<double, double> mean_lengths(const scenario& s);

}  // namespace tireless::load
