#pragma once
// The one terminal outcome of a request, as the embedded API, the server and the load driver
// see it. protocol/outcome_wire.hpp is its one conversion to and from Cap'n Proto.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tireless {

// The names of outcome.reason, defined once: the wire tables (protocol/reason_names.hpp) and
// the cores that end requests use these.
namespace reason {
inline constexpr std::string_view stop_token = "stop_token", stop_string = "stop_string",
                                  max_tokens = "max_tokens", context_full = "context_full";
inline constexpr std::string_view overloaded = "overloaded", quota_exceeded = "quota_exceeded",
                                  unauthenticated = "unauthenticated", invalid = "invalid",
                                  prompt_too_long = "prompt_too_long", shutting_down = "shutting_down";
inline constexpr std::string_view client = "client", deadline = "deadline", shutdown = "shutdown";
inline constexpr std::string_view error = "error";
}  // namespace reason

enum class outcome_kind { completed, rejected, cancelled, failed };

// A generated token's log-probability under the model's raw distribution (before temperature,
// penalties and the top-k/top-p/min-p filters, as vLLM reports them by default) and the most
// likely tokens' at its position, most likely first. Asked for with sampling logprobs >= 0.
struct token_logprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct outcome {
  uint64_t request_id = 0;
  outcome_kind kind = outcome_kind::failed;
  std::string reason;        // completed: stop_token, stop_string, max_tokens, context_full;
                             // rejected: overloaded, quota_exceeded, unauthenticated, invalid,
                             // prompt_too_long, shutting_down; cancelled: client, deadline, shutdown;
                             // failed: error
  std::string message;       // for people: what happened and what to do
  int64_t retry_after_ms = -1;  // rejected: wait at least this long before retrying; -1: don't
  uint64_t retry_token = 0;     // rejected for load: send it with the retry (request::retry_token)
  std::vector<std::string> degradations;  // everything done to the request because of load
  int32_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0, preemptions = 0;
  double queued_ms = 0, time_to_first_token_ms = -1, total_ms = 0;
  double longest_pause_ms = 0;  // the longest wait between two of its tokens (0: fewer than two)
  std::string text;             // everything generated (after stop handling)
  std::vector<int32_t> tokens;  // every generated token id
  std::vector<token_logprob> logprobs;  // one per token when asked for (sampling logprobs >= 0)
};

// The outcomes the runtime makes itself.
inline outcome rejected_outcome(uint64_t id, std::string_view why, std::string message, int64_t retry_after_ms) {
  outcome o;
  o.request_id = id;
  o.kind = outcome_kind::rejected;
  o.reason = why;
  o.message = std::move(message);
  o.retry_after_ms = retry_after_ms;
  return o;
}
inline outcome failed_outcome(uint64_t id, std::string message) {
  outcome o;
  o.request_id = id;
  o.kind = outcome_kind::failed;
  o.reason = reason::error;
  o.message = std::move(message);
  return o;
}

}  // namespace tireless
