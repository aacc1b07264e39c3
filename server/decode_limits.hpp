#pragma once
// What every transport's request decoder checks a client's request against (Cap'n Proto's
// request_decoder, the OpenAI-style HTTP gateway's openai_api), and what the server says of
// its model: filled once by tireless-serve from its config and runtime.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace tireless {

struct decode_limits {
  std::string model_name;
  // The most bytes of prompt text (runtime::max_prompt_bytes; 0: no limit here). A longer text
  // is refused (prompt_too_long) before it is checked or copied.
  size_t max_prompt_bytes = 0;
  int32_t max_prompt_tokens = 0;  // for the refusal's message
  std::chrono::milliseconds default_timeout{300'000};  // when the client gives none; also the most
  int32_t stream_window = 64;                          // tokens sent ahead of what the client took
  size_t max_stop_sequences = 16;
  size_t max_stop_bytes = 256;
};

struct service_info {
  std::string model_name;
  std::string description;
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  // A token's bytes (its tokenizer piece), for logprobs over HTTP; empty without a tokenizer.
  std::function<std::string(int32_t)> token_bytes;
};

}  // namespace tireless
