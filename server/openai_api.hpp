#pragma once
// The OpenAI-style HTTP API's bodies, without any HTTP: a request body checked and turned into
// a runtime request, and outcomes and tokens turned into the response bodies and stream chunks
// the official clients read. Everything here is a pure function of its inputs (the fuzz target
// and unit tests call it directly); server/http_service.cpp does the HTTP.
//
// Choices (where OpenAI's API and the servers users compare with differ):
// - Defaults are OpenAI's: temperature 1, top_p 1; a request without a seed gets a random one.
// - Unknown fields are ignored, as OpenAI does; a known field of the wrong type or out of
//   range is refused (400, naming the field).
// - n must be 1.
// - logprobs (chat: logprobs + top_logprobs; completions: logprobs = the count, up to 20) are
//   the model's raw log-probabilities, before temperature, penalties and filters (vLLM's
//   default). A token's text is its tokenizer piece as bytes (chat also lists "bytes"); a
//   piece that is part of a character is sent with U+FFFD in "token". Completions' top_logprobs
//   always hold the chosen token too, as vLLM's do.
// - "developer" messages are system messages; message content is a string or a list of text
//   parts. Roles and parts other than these are refused.
// - prompt (completions): a string, a list of one string, or a list of token ids.
// - A 429's body has retry_after_ms and retry_token (a decimal string); a retry that sends the
//   token back (body field "retry_token", or the x-tireless-retry-token header) after that
//   wait holds the room reserved for it.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/decode_limits.hpp"
#include "tireless/outcome.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

enum class openai_endpoint { chat_completions, completions };

// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct api_error {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;   // "" is sent as null
  std::string param;  // the field at fault; "" is sent as null
  std::string message;
  int64_t retry_after_ms = -1;  // 429 and 503: the Retry-After and retry-after-ms headers
  uint64_t retry_token = 0;     // refused for load: sent back with the retry, it holds a reservation
};

struct openai_call {
  openai_endpoint endpoint = openai_endpoint::chat_completions;
  request req;
  std::string model;  // as the response names it
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// `seed` is the request's seed when it names none. `api_key` comes from the Authorization
// header, not the body.
std::variant<openai_call, api_error> parse_openai_request(std::string_view body, openai_endpoint endpoint,
                                                          const decode_limits& limits, uint64_t seed);

// A body over the size the server reads (413), with the hint to split.
api_error body_too_large(size_t limit_bytes, const decode_limits& limits);

// The error for an outcome that is not a completion (rejected, cancelled, failed).
api_error error_of(const outcome& o);
std::string error_body(const api_error& e);

// "stop" or "length" (max_tokens or the context reached).
std::string_view finish_reason_of(const outcome& o);

// A token's bytes (its tokenizer piece), for logprobs. Without one, tokens are named
// "token_id:N" (vLLM's form).
using token_bytes_fn = std::function<std::string(int32_t)>;

// The identity of one response, the same on each of its stream chunks, and its form.
struct response_id {
  openai_endpoint endpoint = openai_endpoint::chat_completions;
  std::string id;  // chatcmpl-... or cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
  int32_t logprobs = -1;  // the request's sampling logprobs: -1, none in the choices
  token_bytes_fn token_bytes;
};

response_id make_response_id(const openai_call& call, uint64_t request_id, int64_t created,
                             token_bytes_fn token_bytes = {});

// The whole response of a completed request (not streamed).
std::string completion_body(const response_id& r, const outcome& o);

// Stream chunks (each is one SSE event's data).
std::string first_chunk(const response_id& r);  // chat: the assistant role, no text yet
// logprobs: of the tokens this chunk's text comes from (and any before whose text was held
// back); text_offset: the bytes of the tokens before them (completions' text_offset).
std::string text_chunk(const response_id& r, std::string_view text, std::span<const token_logprob> logprobs = {},
                       int64_t text_offset = 0);
// The last choice chunk: finish_reason and the degradations (a field of the chunk), and the
// logprobs of tokens whose text never came (a stop string's).
std::string final_chunk(const response_id& r, const outcome& o, std::span<const token_logprob> logprobs = {},
                        int64_t text_offset = 0);
std::string usage_chunk(const response_id& r, const outcome& o);  // choices [] and usage

std::string models_body(const std::string& model_name, int64_t created, int32_t context_length);

// What load did to a request, for the x-tireless-degradations header: printable ASCII, "; "
// between items.
std::string degradations_header(const std::vector<std::string>& degradations);

}  // namespace tireless
