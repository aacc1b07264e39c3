#pragma once
// The checks of a request that need no actor: its sampling parameters, its token ids and its
// length against the context. The session runs them once it has the prompt's tokens; the
// intake runs them before refusing a request for load, so that a bad request hears what is
// wrong with it rather than "retry later". No CAF here.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

class model;

struct request_limits {
  int32_t max_context = 0;
  int32_t max_prompt_tokens = 0;  // 0: the context's
  int32_t default_max_tokens = 256;
};

struct request_problem {
  const char* reason = "invalid";  // or "prompt_too_long"
  std::string message;
};

// The max_tokens a request runs with.
inline int32_t effective_max_tokens(const request& r, const request_limits& lim) {
  return r.max_tokens > 0 ? r.max_tokens : lim.default_max_tokens;
}

// A request's prompt as the engine takes it: token ids (the chat template applied), and the
// tokens that end its generation (the template's end of turn, or the end of text).
struct prepared_prompt {
  std::vector<token_id> ids;
  std::vector<token_id> stop_tokens;
};

// Tokenizes `r`'s prompt into `out`; returns what is wrong with it (empty when nothing is).
// `lm` null: token ids are the only form taken.
std::string prepare_prompt(const request& r, const model* lm, prepared_prompt& out);

// What is wrong with `r`, whose prompt has `prompt_tokens` tokens; nothing when it may go on.
// `lm` null: a backend without a tokenizer (token ids only).
std::optional<request_problem> check_request(const request& r, const model* lm, int32_t prompt_tokens,
                                             const request_limits& lim);

}  // namespace tireless
