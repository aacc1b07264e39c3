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

std::variant<decoded_request, request_problem> decode_request(rpc::GenerateRequest::Reader r,
                                                              const decode_limits& limits) {
  auto invalid = [](std::string message) { return request_problem{"invalid", std::move(message)}; };
  auto too_long = [&](size_t bytes) {
    return prompt_bytes_problem(bytes, limits.max_prompt_bytes, limits.max_prompt_tokens);
  };
  const bool bounded = limits.max_prompt_bytes > 0;
  decoded_request out;
  request& q = out.req;
  q.api_key = r.getApiKey();
  const std::string model = r.getModel();
  if (!model.empty() && model != limits.model_name) {
    return invalid(fmt::format("unknown model '{}'; this server serves '{}'", model, limits.model_name));
  }
  auto input = r.getInput();
  switch (input.which()) {
    case rpc::GenerateRequest::Input::MESSAGES: {
      const auto messages = input.getMessages();
      if (messages.size() == 0) return invalid("messages is empty: send at least one message");
      // Each text is read once: the sizes first (nothing is checked or copied over the limit).
      std::vector<std::pair<capnp::Text::Reader, capnp::Text::Reader>> texts;
      texts.reserve(messages.size());
      size_t bytes = 0;
      for (const auto m : messages) {
        texts.emplace_back(m.getRole(), m.getContent());
        bytes += texts.back().second.size();
      }
      if (bounded && bytes > limits.max_prompt_bytes) return too_long(bytes);
      for (unsigned i = 0; i < texts.size(); ++i) {
        const auto [role, content] = texts[i];
        for (auto [text, what] : {std::pair{role, "role"}, std::pair{content, "content"}}) {
          if (auto p = text_problem(text, fmt::format("messages[{}].{}", i, what)); !p.empty()) return invalid(p);
        }
        const std::string_view role_text(role.cStr(), role.size());
        if (role_text != "system" && role_text != "user" && role_text != "assistant") {
          return invalid(fmt::format("messages[{}].role is '{}'; use system, user or assistant", i, role_text));
        }
        q.messages.push_back({std::string(role_text), std::string(content.cStr(), content.size())});
      }
      break;
    }
    case rpc::GenerateRequest::Input::TEXT: {
      const auto text = input.getText();  // read once
      if (bounded && text.size() > limits.max_prompt_bytes) return too_long(text.size());
      if (auto p = text_problem(text, "text"); !p.empty()) return invalid(p);
      q.prompt.assign(text.cStr(), text.size());
      if (q.prompt.empty()) return invalid("text is empty");
      q.parse_special = r.getParseSpecialTokens();
      break;
    }
    case rpc::GenerateRequest::Input::TOKENS: {
      const auto tokens = input.getTokens();
      q.prompt_tokens.reserve(tokens.size());
      for (int32_t t : tokens) q.prompt_tokens.push_back(t);
      if (q.prompt_tokens.empty()) return invalid("tokens is empty");
      break;
    }
    default:
      return invalid("input is of a kind this server does not know; send messages, text or tokens");
  }
  if (r.getParseSpecialTokens() && input.which() != rpc::GenerateRequest::Input::TEXT) {
    return invalid("parseSpecialTokens applies to text input only; chat message contents are always plain text");
  }
  const auto s = r.getSampling();
  q.sampling.temperature = s.getTemperature();
  q.sampling.top_k = s.getTopK();
  q.sampling.top_p = s.getTopP();
  q.sampling.seed = s.getSeed();
  q.sampling.min_p = s.getMinP();
  q.sampling.presence_penalty = s.getPresencePenalty();
  q.sampling.frequency_penalty = s.getFrequencyPenalty();
  q.sampling.repetition_penalty = s.getRepetitionPenalty();
  q.sampling.logprobs = s.getLogprobs();
  if (!std::isfinite(q.sampling.temperature) || q.sampling.temperature < 0 || q.sampling.temperature > 100) {
    return invalid(fmt::format("sampling.temperature is {}; use a number from 0 (greedy) to 100", q.sampling.temperature));
  }
  if (!(q.sampling.top_p > 0 && q.sampling.top_p <= 1)) {
    return invalid(fmt::format("sampling.topP is {}; use a number in (0, 1]", q.sampling.top_p));
  }
  if (q.sampling.top_k < 0) return invalid(fmt::format("sampling.topK is {}; use 0 (all) or more", q.sampling.top_k));
  if (!(q.sampling.min_p >= 0 && q.sampling.min_p <= 1)) {
    return invalid(fmt::format("sampling.minP is {}; use a number in [0, 1]", q.sampling.min_p));
  }
  for (auto [v, name] : {std::pair{q.sampling.presence_penalty, "presencePenalty"},
                         std::pair{q.sampling.frequency_penalty, "frequencyPenalty"}}) {
    if (!(v >= -2 && v <= 2)) return invalid(fmt::format("sampling.{} is {}; use a number in [-2, 2]", name, v));
  }
  if (!(q.sampling.repetition_penalty > 0 && q.sampling.repetition_penalty <= 10)) {
    return invalid(fmt::format("sampling.repetitionPenalty is {}; use a number in (0, 10] (1: off)",
                               q.sampling.repetition_penalty));
  }
  if (q.sampling.logprobs < -1 || q.sampling.logprobs > max_top_logprobs) {
    return invalid(fmt::format("sampling.logprobs is {}; use -1 (none) or 0 to {} (the most likely tokens to list "
                               "beside each token's own)", q.sampling.logprobs, max_top_logprobs));
  }
  const int32_t max_tokens = r.getMaxTokens();
  if (max_tokens == 0 || max_tokens < -1) {
    return invalid(fmt::format("maxTokens is {}; use at least 1, or leave it unset for the server's default", max_tokens));
  }
  q.max_tokens = max_tokens == -1 ? 0 : max_tokens;
  const auto stops = r.getStop();
  if (stops.size() > limits.max_stop_sequences) {
    return invalid(fmt::format("{} stop sequences; at most {} are allowed", stops.size(), limits.max_stop_sequences));
  }
  for (unsigned i = 0; i < stops.size(); ++i) {
    const auto stop = stops[i];  // read once
    if (auto p = text_problem(stop, fmt::format("stop[{}]", i)); !p.empty()) return invalid(p);
    if (stop.size() == 0 || stop.size() > limits.max_stop_bytes) {
      return invalid(fmt::format("stop[{}] has {} bytes; use 1 to {}", i, stop.size(), limits.max_stop_bytes));
    }
    q.stop.emplace_back(stop.cStr(), stop.size());
  }
  const int64_t timeout = r.getTimeoutMs();
  if (timeout < 0) return invalid(fmt::format("timeoutMs is {}; use 0 (the server's default) or more", timeout));
  q.timeout = timeout == 0 ? limits.default_timeout
                           : std::min(std::chrono::milliseconds(timeout), limits.default_timeout);
  q.retry_token = r.getRetryToken();
  q.token_window = limits.stream_window;
  q.manual_ack = true;
  const auto id = r.getClientRequestId();  // read once
  if (auto p = text_problem(id, "clientRequestId"); !p.empty()) return invalid(p);
  out.client_request_id.assign(id.cStr(), id.size());
  return out;
}

}  // namespace tireless
