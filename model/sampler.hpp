#pragma once
// Choosing the next token from logits: greedy, or temperature with top-k, top-p and min-p;
// either after the repetition, presence and frequency penalties over the tokens so far.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/tokenizer.hpp"
#include "tireless/outcome.hpp"

namespace tireless {

struct sampling_params {
  float temperature = 0.0f;  // 0: greedy (the highest logit, lowest id on ties)
  int32_t top_k = 0;         // keep the k most likely tokens; 0: all
  float top_p = 1.0f;        // keep the smallest set whose probability reaches top_p; in (0, 1]
  uint64_t seed = 0;
  float min_p = 0.0f;        // drop tokens less likely than min_p x the most likely one's; [0, 1]
  // OpenAI's penalties, over the generated tokens: logit -= presence (a token generated at
  // least once) + frequency x its count. [-2, 2]
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  // The CTRL paper's (vLLM's, llama.cpp's), over the prompt and generated tokens: a positive
  // logit is divided by it, a negative one multiplied; 1: off. > 0.
  float repetition_penalty = 1.0f;
  int32_t logprobs = -1;  // -1: none; n >= 0: the chosen token's log-probability and the top n's

  bool penalized() const { return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f; }
};

// Reusable work space, so sampling allocates nothing once warmed up.
struct sampler_scratch {
  std::vector<std::pair<float, token_id>> candidates;
  std::vector<float> penalized;  // [n_vocab] the logits after the penalties
  std::vector<token_id> sorted;  // the history, sorted: runs of one token
  std::vector<std::pair<float, token_id>> top;  // logprobs: the most likely tokens
};

// The token for draw number `draw` (the position the token will take). The random number
// comes from (seed, draw) alone, so the same seed gives the same text, and a sequence
// recomputed after preemption draws the same tokens again.
// history: every token before the draw, prompt first (its first prompt_len); the penalties
// read it, and it is unused when p.penalized() is false.
token_id sample(std::span<const float> logits, const sampling_params& p, uint64_t draw,
                sampler_scratch& scratch, std::span<const token_id> history = {}, int32_t prompt_len = 0);

// `chosen`'s log-probability under softmax(logits) (the raw distribution: what the model says,
// before temperature, penalties and filters) and the `top` most likely tokens' (ties: lower id).
token_logprob logprob_of(std::span<const float> logits, token_id chosen, int32_t top, sampler_scratch& scratch);

}  // namespace tireless
