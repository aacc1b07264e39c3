#pragma once
// Choosing the next token from logits: greedy, or temperature with top-k and top-p.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/tokenizer.hpp"

namespace tireless {

struct sampling_params {
  float temperature = 0.0f;  // 0: greedy (the highest logit, lowest id on ties)
  int32_t top_k = 0;         // keep the k most likely tokens; 0: all
  float top_p = 1.0f;        // keep the smallest set whose probability reaches top_p; in (0, 1]
  uint64_t seed = 0;
};

// Reusable work space, so sampling allocates nothing once warmed up.
struct sampler_scratch {
  std::vector<std::pair<float, token_id>> candidates;
};

// The token for draw number `draw` (the position the token will take). The random number
// comes from (seed, draw) alone, so the same seed gives the same text, and a sequence
// recomputed after preemption draws the same tokens again.
token_id sample(std::span<const float> logits, const sampling_params& p, uint64_t draw,
                sampler_scratch& scratch);

}  // namespace tireless
