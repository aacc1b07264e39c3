#pragma once
// The checks of a request that need no actor: its sampling parameters, its token ids and its
// length against the context. The session runs them once it has the prompt's tokens; the
// intake runs them before refusing a request for load, so that a bad request hears what is
// wrong with it rather than "retry later". No CAF here.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/sampler.hpp"
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

// The longest prompt a request may have, in tokens.
inline int32_t prompt_token_limit(const request_limits& lim) {
  const int32_t context_limit = lim.max_context - 1;
  return lim.max_prompt_tokens > 0 ? std::min(lim.max_prompt_tokens, context_limit) : context_limit;
}

// The most bytes of text a prompt may have: more cannot fit in prompt_token_limit tokens of
// at most max_token_bytes bytes each. A cheap bound, checked before any tokenizing.
inline size_t prompt_byte_limit(const request_limits& lim, size_t max_token_bytes) {
  return static_cast<size_t>(std::max(prompt_token_limit(lim), 0)) * max_token_bytes;
}

// The bytes of text a request carries (its raw prompt, or its messages' contents).
size_t prompt_text_bytes(const request& r);

// A prompt_too_long problem for `bytes` bytes of text over the limit of `limit_bytes`.
inline request_problem prompt_bytes_problem(size_t bytes, size_t limit_bytes, int32_t limit_tokens) {
  return {"prompt_too_long",
          fmt::format("the prompt has {} bytes of text; at most {} bytes ({} tokens) are accepted. Split it into "
                      "smaller requests", bytes, limit_bytes, limit_tokens)};
}

// The sampler's parameters of a request's sampling options (the same fields).
sampling_params sampling_params_of(const sampling_options& s);

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

// Tokenizes `r`'s prompt into `out`; returns what is wrong with it (nothing when nothing is).
// `lm` null: token ids are the only form taken. A text over prompt_byte_limit is refused
// untokenized, and tokenizing stops just past prompt_token_limit (prompt_too_long): the work
// per request is bounded by the limits, not by what a client sends. Message contents (and raw text, unless
// the request asks for parse_special) are tokenized as plain text.
std::optional<request_problem> prepare_prompt(const request& r, const model* lm, const request_limits& lim,
                                              prepared_prompt& out);

// What is wrong with `r`, whose prompt has `prompt_tokens` tokens; nothing when it may go on.
// `lm` null: a backend without a tokenizer (token ids only).
std::optional<request_problem> check_request(const request& r, const model* lm, int32_t prompt_tokens,
                                             const request_limits& lim);

}  // namespace tireless
