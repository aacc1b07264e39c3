#pragma once
// A client's GenerateRequest checked and turned into a runtime request. Everything that can
// be checked without the model is checked here (the session checks lengths against the
// context); what is wrong becomes a message for a rejected(invalid) outcome.

#include <chrono>
#include <string>
#include <variant>

#include "actors/request_checks.hpp"
#include "protocol/tireless.capnp.h"
#include "tireless/runtime.hpp"

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

struct decoded_request {
  request req;
  std::string client_request_id;
};

// The request, or what is wrong with it. Reads every text of `r` once (each read counts
// against the message's traversal limit, so a large text read twice would fail to read).
// Throws kj::Exception when the message itself cannot be read.
std::variant<decoded_request, request_problem> decode_request(rpc::GenerateRequest::Reader r,
                                                              const decode_limits& limits);

bool valid_utf8(std::string_view text);

}  // namespace tireless
