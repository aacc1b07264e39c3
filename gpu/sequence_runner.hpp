#pragma once
// The bare generation loop over a backend, without the runtime: a fixed set of sequences,
// KV blocks handed out contiguously, prompts prefilled in chunks, then every unfinished
// sequence decoded one token per step. For tools, benchmarks and tests; serving goes through
// the engine.

#include <functional>
#include <vector>

#include "gpu/backend.hpp"

namespace tireless {

struct generation_request {
  std::vector<token_id> prompt;
  sampling_params sampling;
  int32_t max_tokens = 16;
  std::vector<token_id> stop_tokens;
  bool keep_logits = false;  // keep the logits of every generated position
};

struct generation_output {
  std::vector<token_id> tokens;         // generated, stop token included when one ended it
  bool stopped = false;                 // ended by a stop token or by the callback
  std::vector<std::vector<float>> logits;  // with keep_logits: one row per generated token
};

struct runner_stats {
  int64_t prefill_tokens = 0, decode_tokens = 0, steps = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

class sequence_runner {
 public:
  explicit sequence_runner(backend& b) : backend_(b) {}

  // Called for every generated token; returning false ends that sequence (a stop string).
  using token_callback = std::function<bool(size_t request, token_id token)>;

  // Throws std::invalid_argument when the requests do not fit the backend's limits or pool.
  std::vector<generation_output> run(const std::vector<generation_request>& requests,
                                     const token_callback& on_token = {});
  const runner_stats& stats() const { return stats_; }

 private:
  backend& backend_;
  runner_stats stats_;
};

}  // namespace tireless
