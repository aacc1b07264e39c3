#include "server/request_decoder.hpp"

#include <cmath>

#include <fmt/format.h>

#include "model/unicode.hpp"

namespace tireless {

bool valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const utf8_step s = utf8_decode(text, pos);
    if (s.kind != utf8_step::valid) return false;
    pos += s.length;
  }
  return true;
}

namespace {

std::string text_problem(capnp::Text::Reader t, std::string_view what) {
  const std::string_view v(t.cStr(), t.size());
  if (!valid_utf8(v)) return fmt::format("{} is not valid UTF-8", what);
  if (v.find('\0') != std::string_view::npos) return fmt::format("{} contains a NUL byte", what);
  return {};
}

}  // namespace

std::variant<decoded_request, std::string> decode_request(rpc::GenerateRequest::Reader r,
                                                          const decode_limits& limits) {
  decoded_request out;
  request& q = out.req;
  q.api_key = r.getApiKey();
  const std::string model = r.getModel();
  if (!model.empty() && model != limits.model_name) {
    return fmt::format("unknown model '{}'; this server serves '{}'", model, limits.model_name);
  }
  auto input = r.getInput();
  switch (input.which()) {
    case rpc::GenerateRequest::Input::MESSAGES: {
      const auto messages = input.getMessages();
      if (messages.size() == 0) return std::string("messages is empty: send at least one message");
      for (unsigned i = 0; i < messages.size(); ++i) {
        const auto m = messages[i];
        for (auto [text, what] : {std::pair{m.getRole(), "role"}, std::pair{m.getContent(), "content"}}) {
          if (auto p = text_problem(text, fmt::format("messages[{}].{}", i, what)); !p.empty()) return p;
        }
        const std::string role = m.getRole();
        if (role != "system" && role != "user" && role != "assistant") {
          return fmt::format("messages[{}].role is '{}'; use system, user or assistant", i, role);
        }
        q.messages.push_back({role, m.getContent()});
      }
      break;
    }
    case rpc::GenerateRequest::Input::TEXT: {
      if (auto p = text_problem(input.getText(), "text"); !p.empty()) return p;
      q.prompt = input.getText();
      if (q.prompt.empty()) return std::string("text is empty");
      break;
    }
    case rpc::GenerateRequest::Input::TOKENS: {
      for (int32_t t : input.getTokens()) q.prompt_tokens.push_back(t);
      if (q.prompt_tokens.empty()) return std::string("tokens is empty");
      break;
    }
    default:
      return std::string("input is of a kind this server does not know; send messages, text or tokens");
  }
  const auto s = r.getSampling();
  q.sampling = {s.getTemperature(), s.getTopK(), s.getTopP(), s.getSeed()};
  if (!std::isfinite(q.sampling.temperature) || q.sampling.temperature < 0 || q.sampling.temperature > 100) {
    return fmt::format("sampling.temperature is {}; use a number from 0 (greedy) to 100", q.sampling.temperature);
  }
  if (!(q.sampling.top_p > 0 && q.sampling.top_p <= 1)) {
    return fmt::format("sampling.topP is {}; use a number in (0, 1]", q.sampling.top_p);
  }
  if (q.sampling.top_k < 0) return fmt::format("sampling.topK is {}; use 0 (all) or more", q.sampling.top_k);
  const int32_t max_tokens = r.getMaxTokens();
  if (max_tokens == 0 || max_tokens < -1) {
    return fmt::format("maxTokens is {}; use at least 1, or leave it unset for the server's default", max_tokens);
  }
  q.max_tokens = max_tokens == -1 ? 0 : max_tokens;
  const auto stops = r.getStop();
  if (stops.size() > limits.max_stop_sequences) {
    return fmt::format("{} stop sequences; at most {} are allowed", stops.size(), limits.max_stop_sequences);
  }
  for (unsigned i = 0; i < stops.size(); ++i) {
    if (auto p = text_problem(stops[i], fmt::format("stop[{}]", i)); !p.empty()) return p;
    if (stops[i].size() == 0 || stops[i].size() > limits.max_stop_bytes) {
      return fmt::format("stop[{}] has {} bytes; use 1 to {}", i, stops[i].size(), limits.max_stop_bytes);
    }
    q.stop.emplace_back(stops[i].cStr());
  }
  const int64_t timeout = r.getTimeoutMs();
  if (timeout < 0) return fmt::format("timeoutMs is {}; use 0 (the server's default) or more", timeout);
  q.timeout = timeout == 0 ? limits.default_timeout
                           : std::min(std::chrono::milliseconds(timeout), limits.default_timeout);
  q.token_window = limits.stream_window;
  q.manual_ack = true;
  out.client_request_id = r.getClientRequestId();
  if (auto p = text_problem(r.getClientRequestId(), "clientRequestId"); !p.empty()) return p;
  return out;
}

}  // namespace tireless
