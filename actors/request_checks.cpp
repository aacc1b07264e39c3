#include "actors/request_checks.hpp"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "model/model.hpp"

namespace tireless {

size_t prompt_text_bytes(const request& r) {
  size_t n = r.prompt.size();
  for (const message& m : r.messages) n += m.content.size();
  return n;
}

std::optional<request_problem> prepare_prompt(const request& r, const model* lm, const request_limits& lim,
                                              prepared_prompt& out) {
  auto invalid = [](std::string message) { return request_problem{"invalid", std::move(message)}; };
  const int forms = !r.messages.empty() + !r.prompt.empty() + !r.prompt_tokens.empty();
  if (forms != 1) return invalid("give exactly one of messages, prompt or prompt_tokens");
  if (!r.prompt_tokens.empty()) {  // checked by check_request
    out.ids.assign(r.prompt_tokens.begin(), r.prompt_tokens.end());
    return std::nullopt;
  }
  if (!lm) return invalid("this backend has no tokenizer: send the prompt as token ids");
  const int32_t limit_tokens = prompt_token_limit(lim);
  const size_t limit_bytes = prompt_byte_limit(lim, lm->tok().max_token_bytes());
  if (const size_t bytes = prompt_text_bytes(r); bytes > limit_bytes) {
    return prompt_bytes_problem(bytes, limit_bytes, limit_tokens);
  }
  // Tokenizing stops just past the limit: a prompt that long is refused, however long it is.
  const size_t limit = static_cast<size_t>(std::max(limit_tokens, 0));
  bool whole = true;
  if (!r.messages.empty()) {
    std::vector<chat_message> chat;
    for (const message& m : r.messages) {
      if (m.role != "system" && m.role != "user" && m.role != "assistant")
        return invalid(fmt::format("message role '{}' is not one of system, user, assistant", m.role));
      chat.push_back({m.role, m.content});
    }
    whole = lm->chat().encode(chat, true, lm->tok(), out.ids, limit);
    out.stop_tokens = lm->chat().stop_tokens();
  } else {
    whole = lm->tok().encode_into(out.ids, r.prompt, r.parse_special, limit);
    if (auto eos = lm->tok().eos()) out.stop_tokens = {*eos};
  }
  if (!whole) {
    return request_problem{"prompt_too_long",
                           fmt::format("the prompt has more than {} tokens; at most {} are accepted. Split it into "
                                       "smaller requests", limit_tokens, limit_tokens)};
  }
  if (out.ids.empty()) return invalid("the prompt is empty");
  return std::nullopt;
}

sampling_params sampling_params_of(const sampling_options& s) {
  sampling_params p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.seed = s.seed;
  p.min_p = s.min_p;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.repetition_penalty = s.repetition_penalty;
  p.logprobs = s.logprobs;
  return p;
}

std::optional<request_problem> check_request(const request& r, const model* lm, int32_t prompt_tokens,
                                             const request_limits& lim) {
  auto invalid = [](std::string message) { return request_problem{"invalid", std::move(message)}; };
  const int32_t vocab = lm ? lm->config().n_vocab : INT32_MAX;
  for (int32_t t : r.prompt_tokens) {
    if (t < 0 || t >= vocab) return invalid(fmt::format("prompt token {} is outside the vocabulary (0..{})", t, vocab - 1));
  }
  if (r.max_tokens < 0) return invalid("max_tokens must be positive");
  if (!(r.sampling.temperature >= 0.0f && r.sampling.temperature <= 100.0f))
    return invalid("temperature must be a number in [0, 100]");
  if (!(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f)) return invalid("top_p must be in (0, 1]");
  if (r.sampling.top_k < 0) return invalid("top_k must be 0 or positive");
  if (!(r.sampling.min_p >= 0.0f && r.sampling.min_p <= 1.0f)) return invalid("min_p must be in [0, 1]");
  if (!(r.sampling.presence_penalty >= -2.0f && r.sampling.presence_penalty <= 2.0f))
    return invalid("presence_penalty must be in [-2, 2]");
  if (!(r.sampling.frequency_penalty >= -2.0f && r.sampling.frequency_penalty <= 2.0f))
    return invalid("frequency_penalty must be in [-2, 2]");
  if (!(r.sampling.repetition_penalty > 0.0f && r.sampling.repetition_penalty <= 10.0f))
    return invalid("repetition_penalty must be in (0, 10]; 1 is off");
  if (r.sampling.logprobs < -1 || r.sampling.logprobs > max_top_logprobs)
    return invalid(fmt::format("logprobs must be -1 (none) or the number of most likely tokens to list, 0 to {}",
                               max_top_logprobs));
  if (!lm && !r.stop.empty()) return invalid("stop sequences need a tokenizer; this backend has none");
  const int32_t limit = prompt_token_limit(lim);
  if (prompt_tokens > limit) {
    return request_problem{"prompt_too_long",
                           fmt::format("the prompt has {} tokens; at most {} are accepted. Split it into smaller "
                                       "requests", prompt_tokens, limit)};
  }
  const int32_t max_tokens = effective_max_tokens(r, lim);
  if (int64_t{prompt_tokens} + max_tokens > lim.max_context) {
    return invalid(fmt::format("prompt ({} tokens) plus max_tokens ({}) exceeds the context of {} tokens; lower "
                               "max_tokens", prompt_tokens, max_tokens, lim.max_context));
  }
  return std::nullopt;
}

}  // namespace tireless
