#pragma once
// What the sim backend pretends to be: a cost model of one step's duration, and the KV
// geometry, vocabulary and step limits of the device and model it stands in for. Named
// profiles are built in (named_profile); any other comes from config as explicit numbers.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/backend.hpp"

namespace tireless::sim {

// The quantities a step's cost depends on. A sequence with one new token is a decode; a
// longer chunk is prefill (the cost follows the shape of the work, not where it came from).
struct step_shape {
  int64_t prefill_tokens = 0;   // tokens in chunks of two or more
  int64_t decode_seqs = 0;      // sequences with exactly one new token
  int64_t decode_context = 0;   // Σ over decode tokens of the positions they attend (pos + 1)
  int64_t prefill_context = 0;  // Σ over prefill tokens of the positions they attend (pos + 1)
};

step_shape shape_of(const step_batch& batch);

// seconds = c0 + c_prefill·prefill_tokens + c_decode·decode_seqs
//         + c_context·decode_context + c_prefill_ctx·prefill_context
// An empty step costs nothing.
struct step_cost {
  double c0 = 0.0;         // per step
  double c_prefill = 0.0;  // per prefill token
  double c_decode = 0.0;   // per decode sequence (its token, LM head and sampling)
  double c_context = 0.0;  // per position attended by a decode token
  // Per position attended by a prefill token; unset: c_context. Set it where prefill
  // attention reuses each key for many queries and so costs far less per position than a
  // decode token's (a GPU, where decode attention is bound by reading the KV cache).
  std::optional<double> c_prefill_ctx;

  double seconds(const step_shape& s) const;
};

struct sim_profile {
  std::string name;
  step_cost cost;
  kv_geometry kv;
  backend_limits limits;
  int32_t n_vocab = 0;
  // Sampled tokens are drawn from [first_sampled_token, end_sampled_token): ordinary text
  // pieces of the model's vocabulary, never a control or stop token.
  token_id first_sampled_token = 0;
  token_id end_sampled_token = 0;
};

// Throws std::invalid_argument naming the field when a number is negative, not finite, or
// out of range (empty KV pool, non-positive limits, a sampling range outside the vocabulary).
void validate(const sim_profile& p);

// The built-in profiles: "cpu-smollm2" and "h200-k2". Throws std::invalid_argument listing the
// known names when `name` is not one of them.
sim_profile named_profile(std::string_view name);
std::vector<std::string> profile_names();

}  // namespace tireless::sim
