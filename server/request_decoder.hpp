#pragma once
// A client's GenerateRequest checked and turned into a runtime request. Everything that can
// be checked without the model is checked here (the session checks lengths against the
// context); what is wrong becomes a message for a rejected(invalid) outcome.

#include <chrono>
#include <string>
#include <variant>

#include "actors/request_checks.hpp"
#include "server/decode_limits.hpp"
#include "protocol/tireless.capnp.h"
#include "tireless/runtime.hpp"

namespace tireless {

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
