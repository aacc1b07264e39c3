#pragma once
// What runs a model step: the interface between the engine and a device. No device types
// here; a step is a plain value that could cross a process boundary unchanged.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

namespace tireless {

// One sequence's share of a step: a chunk of prompt (prefill) or one generated token
// (decode), appended at positions start_pos .. start_pos + tokens.size() - 1.
struct sequence_step {
  uint64_t seq_id = 0;
  std::span<const token_id> tokens;
  int32_t start_pos = 0;
  // Physical KV block of each logical block; covers positions [0, start_pos + tokens.size()).
  std::span<const int32_t> block_table;
  bool sample = false;          // choose the next token after the chunk's last position
  sampling_params sampling;
  bool want_logits = false;     // also return the last position's logits
  // Between actors and processes only: the step's receiver already has block_table[0,
  // table_from) from earlier steps, so a step request carries the rest (backends ignore it).
  int32_t table_from = 0;
  // For the sampler's penalties (sampling.penalized() only; empty otherwise): the tokens at
  // positions [0, start_pos + tokens.size()), the prompt's first prompt_len of them. Between
  // actors, the receiver already has history[0, history_from) from earlier steps.
  std::span<const token_id> history{};
  int32_t prompt_len = 0;
  int32_t history_from = 0;
};

struct step_batch {
  std::vector<sequence_step> seqs;
  int64_t n_tokens() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += static_cast<int64_t>(s.tokens.size());
    return n;
  }
};

struct step_result {
  std::vector<token_id> next;   // per sequence: the sampled token, or -1
  std::vector<float> logits;    // [sequences with want_logits][n_vocab], in batch order
  // Empty when no sequence asked (sampling.logprobs < 0 for all); else one per sequence,
  // filled for those that sampled and asked.
  std::vector<token_logprob> logprobs;
};

struct kv_geometry {
  int32_t block_size = 16;  // tokens per block
  int32_t n_blocks = 0;     // blocks in the pool
  int64_t bytes_per_block = 0;
};

struct backend_limits {
  int32_t max_step_tokens = 0;  // tokens per step, summed over sequences
  int32_t max_step_seqs = 0;    // sequences per step
  int32_t max_context = 0;      // positions per sequence
};

// What a step of the backend roughly costs before anything was measured, in seconds:
// c0 + per prefill token + per decode sequence + per thousand positions decode tokens attend.
struct step_cost_prior {
  double c0 = 0, per_prefill_token = 0, per_decode_seq = 0, per_thousand_context = 0;
};

class backend {
 public:
  virtual ~backend() = default;
  virtual std::string describe() const = 0;
  virtual kv_geometry kv() const = 0;
  virtual backend_limits limits() const = 0;
  virtual int32_t n_vocab() const = 0;

  // Runs one step. Every sequence's block table must hold the blocks its positions need;
  // the step writes the new tokens' keys and values into them.
  virtual void execute(const step_batch& batch, step_result& result) = 0;

  // A starting point for the engine's step-time model (refined by measurement).
  virtual step_cost_prior cost_prior() const = 0;

  // Copies whole KV blocks (copy-on-write of a shared prefix block), src → dst pairs.
  virtual void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) = 0;

  // Mixture-of-experts models: the token-expert pairs routed to each expert since the backend
  // was made, [layer][expert] flattened (scheduler/expert_load.hpp reads them); empty for
  // dense models and backends that do not count.
  virtual std::vector<int64_t> expert_tokens() const { return {}; }
};

}  // namespace tireless
