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

// Expert parallelism at fleet scale: the device is one of `degree` that hold a mixture of
// experts' routed experts between them. Every MoE layer of a step sends each token's hidden
// state to the other devices holding its experts (dispatch) and gathers their outputs
// (combine) over a network; the step waits for the busiest device (the all-to-all
// synchronizes the group). `cost` is the step with the experts evenly loaded and the exchange
// hidden behind compute (two micro-batches) -- how a deployment measured at its operating
// point runs; degree <= 1 leaves it as it is.
struct expert_parallel {
  int32_t degree = 0;              // devices sharing the routed experts
  int32_t moe_layers = 0;
  double remote_copies = 0;        // other devices a token's state goes to, per MoE layer
  int32_t hidden = 0;              // elements of a token's state
  double dispatch_bytes = 1.0;     // per element sent out (FP8)
  double combine_bytes = 2.0;      // per element coming back (BF16)
  double link_bytes_per_s = 0;     // per device, each way
  double link_latency_s = 0;       // per dispatch and per combine
  bool overlap = true;             // two micro-batches: one's exchange runs during the other's compute
  double expert_share = 0;         // share of cost's per-token terms that is routed-expert work

  bool on() const { return degree > 1; }
};

// The expert-parallel group's state while a step runs.
struct expert_condition {
  int32_t down = 0;        // devices of the group down: their experts served by the others' replicas
  double imbalance = 1.0;  // max over mean routed tokens per device
};

// A condition over a span of time, in seconds since the backend started: a device lost (its
// experts' load falls on the rest), a hot expert (imbalance) until the rebalancer moves it.
struct expert_event {
  double at_s = 0;
  double for_s = 0;        // 0: to the end
  int32_t down = 0;
  double imbalance = 1.0;
  double stall_s = 0;      // once, on the first step at or after at_s: failure detection and the step's re-run
};

struct sim_profile {
  std::string name;
  step_cost cost;
  expert_parallel ep;
  kv_geometry kv;
  backend_limits limits;
  int32_t n_vocab = 0;
  // Sampled tokens are drawn from [first_sampled_token, end_sampled_token): ordinary text
  // pieces of the model's vocabulary, never a control or stop token.
  token_id first_sampled_token = 0;
  token_id end_sampled_token = 0;
};

// The group's condition at t: the devices down of every event in force (at most all but one),
// the largest imbalance among them.
expert_condition condition_at(const std::vector<expert_event>& events, int32_t degree, double t);

// A step's seconds under expert parallelism: cost's, with the routed-expert work scaled by the
// busiest device's load (imbalance x degree / live devices), and the exchange's time (bytes into
// the busiest device over the link, plus latency) overlapped with compute or added to it.
double step_seconds(const sim_profile& p, const step_shape& s, const expert_condition& c = {});
// The exchange alone (dispatch and combine of every MoE layer), for reports and tests.
double exchange_seconds(const sim_profile& p, const step_shape& s, const expert_condition& c = {});

// Throws std::invalid_argument naming the field when a number is negative, not finite, or
// out of range (empty KV pool, non-positive limits, a sampling range outside the vocabulary).
void validate(const sim_profile& p);

// The built-in profiles: "cpu-smollm2" and "h200-k2". Throws std::invalid_argument listing the
// known names when `name` is not one of them.
sim_profile named_profile(std::string_view name);
std::vector<std::string> profile_names();

}  // namespace tireless::sim
