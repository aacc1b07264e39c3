// libFuzzer target: any byte string, read as a Cap'n Proto message holding a GenerateRequest
// (as the RPC layer hands one to the service), either fails to read with a kj::Exception or
// decodes to a request or to a message saying what is wrong; never anything else (another
// exception is a finding too). A request that decodes carries the wire's values, within the
// limits it was decoded with; a refusal is invalid, or prompt_too_long for a text over the
// byte bound. Requests that decode then go through the runtime's request checks.

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <variant>

#include "protocol/tireless.capnp.h"
#include "actors/request_checks.hpp"
#include "fuzz_limits.hpp"
#include "server/request_decoder.hpp"

namespace {

using namespace tireless;

// The wire's text as the decoded request should hold it (NUL bytes are refused, so a text
// that decodes holds every byte).
std::string bytes(capnp::Text::Reader t) { return std::string(t.begin(), t.size()); }

size_t prompt_bytes(rpc::GenerateRequest::Reader r) {
  const auto input = r.getInput();
  if (input.isText()) return input.getText().size();
  size_t n = 0;
  if (input.isMessages()) {
    for (const auto m : input.getMessages()) n += m.getContent().size();
  }
  return n;
}

// A request that decodes carries the wire's values, within the limits.
void check_accepted(rpc::GenerateRequest::Reader r, const request& q, const decode_limits& l) {
  const auto input = r.getInput();
  const int inputs = !q.messages.empty() + !q.prompt.empty() + !q.prompt_tokens.empty();
  if (inputs != 1) __builtin_trap();
  if (prompt_bytes(r) > l.max_prompt_bytes) __builtin_trap();
  if (input.isMessages()) {
    const auto m = input.getMessages();
    if (q.messages.size() != m.size()) __builtin_trap();
    for (unsigned i = 0; i < m.size(); ++i) {
      if (q.messages[i].role != bytes(m[i].getRole()) || q.messages[i].content != bytes(m[i].getContent())) __builtin_trap();
      if (q.messages[i].role != "system" && q.messages[i].role != "user" && q.messages[i].role != "assistant") __builtin_trap();
      if (!valid_utf8(q.messages[i].content)) __builtin_trap();
    }
  }
  if (input.isText() && (q.prompt != bytes(input.getText()) || !valid_utf8(q.prompt))) __builtin_trap();
  if (input.isTokens() && q.prompt_tokens.size() != input.getTokens().size()) __builtin_trap();
  if (q.max_tokens < 0) __builtin_trap();
  const auto stops = r.getStop();
  if (q.stop.size() != stops.size() || q.stop.size() > l.max_stop_sequences) __builtin_trap();
  for (unsigned i = 0; i < stops.size(); ++i) {
    const std::string& s = q.stop[i];
    if (s != bytes(stops[i]) || s.size() > l.max_stop_bytes || !valid_utf8(s)) __builtin_trap();
    if (s.empty()) __builtin_trap();
  }
  if (q.timeout <= std::chrono::milliseconds(0) || q.timeout > l.default_timeout) __builtin_trap();
  if (!std::isfinite(q.sampling.temperature) || !(q.sampling.top_p > 0 && q.sampling.top_p <= 1)) __builtin_trap();
  if (q.sampling.top_k < 0 || q.token_window != l.stream_window) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const decode_limits limits = fuzz_limits();
  // Word-aligned copy, the tail zero-padded to a whole word.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>((size + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  std::memset(words.begin(), 0, words.size() * sizeof(capnp::word));
  if (size > 0) std::memcpy(words.begin(), data, size);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 64 * 1024;  // inputs are small; keep each run fast
  options.nestingLimit = 32;
  try {
    capnp::FlatArrayMessageReader message(words, options);
    const auto request = message.getRoot<rpc::GenerateRequest>();
    auto decoded = decode_request(request, limits);
    if (auto* ok = std::get_if<decoded_request>(&decoded)) {
      check_accepted(request, ok->req, limits);
      // The runtime's checks of a request (a backend without a tokenizer: token ids only).
      const request_limits rl{4096, 2048, 256};
      const auto problem = check_request(ok->req, nullptr, static_cast<int32_t>(ok->req.prompt_tokens.size()), rl);
      if (problem && problem->message.empty()) __builtin_trap();
      prepared_prompt prepared;
      const auto prep = prepare_prompt(ok->req, nullptr, rl, prepared);
      if (ok->req.prompt_tokens.empty() != prep.has_value()) __builtin_trap();  // text needs a tokenizer
    } else {
      const request_problem& p = std::get<request_problem>(decoded);
      if (p.message.empty()) __builtin_trap();  // a refusal must say what is wrong
      const std::string_view reason = p.reason;
      if (reason == "prompt_too_long" ? prompt_bytes(request) <= limits.max_prompt_bytes : reason != "invalid")
        __builtin_trap();
    }
  } catch (const kj::Exception&) {
    // malformed message: the RPC layer turns this into an error for the caller
  }
  return 0;
}
