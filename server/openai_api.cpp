#include "server/openai_api.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "actors/request_checks.hpp"

namespace tireless {

using json = nlohmann::json;

namespace {

std::string_view type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

api_error invalid(std::string param, std::string message) {
  api_error e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

api_error wrong_type(const std::string& param, const json& v, std::string_view wanted) {
  return invalid(param, fmt::format("'{}' is {}; it must be {}", param, type_name(v), wanted));
}

// Reads the body's fields one by one; the first problem ends the reading.
class body_reader {
 public:
  explicit body_reader(const json& body) : body_(body) {}

  std::optional<api_error> problem;

  // The field, or null when it is absent or null (OpenAI treats null as "not given").
  const json* field(const char* name) const {
    auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  bool ok() const { return !problem; }

  void number(const char* name, float& out, double lo, double hi, bool lo_open = false) {
    const json* v = field(name);
    if (!v || problem) return;
    if (!v->is_number()) return fail(wrong_type(name, *v, "a number"));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      return fail(invalid(name, fmt::format("'{}' is {}; use a number in {}{}, {}]", name, x, lo_open ? "(" : "[", lo, hi)));
    }
    out = static_cast<float>(x);
  }

  void integer(const char* name, int64_t& out, int64_t lo, int64_t hi) {
    const json* v = field(name);
    if (!v || problem) return;
    if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>())) {
      return fail(wrong_type(name, *v, "an integer"));
    }
    const double x = v->get<double>();
    if (x < static_cast<double>(lo) || x > static_cast<double>(hi)) {
      return fail(invalid(name, fmt::format("'{}' is {}; use an integer from {} to {}", name, x, lo, hi)));
    }
    out = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  }

  void boolean(const char* name, bool& out) {
    const json* v = field(name);
    if (!v || problem) return;
    if (!v->is_boolean()) return fail(wrong_type(name, *v, "true or false"));
    out = v->get<bool>();
  }

  void string(const char* name, std::string& out) {
    const json* v = field(name);
    if (!v || problem) return;
    if (!v->is_string()) return fail(wrong_type(name, *v, "a string"));
    out = v->get<std::string>();
  }

  void fail(api_error e) {
    if (!problem) problem = std::move(e);
  }

 private:
  const json& body_;
};

bool has_nul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
std::optional<api_error> content_of(const json& v, const std::string& param, std::string& out) {
  if (v.is_string()) {
    out = v.get<std::string>();
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      const json& part = v[i];
      const std::string where = fmt::format("{}[{}]", param, i);
      if (!part.is_object()) return wrong_type(where, part, "an object {\"type\": \"text\", \"text\": ...}");
      auto type = part.find("type");
      auto text = part.find("text");
      if (type == part.end() || !type->is_string() || *type != "text") {
        return invalid(where + ".type", fmt::format("{} is not a text part; this model reads text only "
                                                    "(type \"text\")", where));
      }
      if (text == part.end() || !text->is_string()) return invalid(where + ".text", where + ".text must be a string");
      out += text->get<std::string>();
    }
  } else {
    return wrong_type(param, v, "a string or a list of text parts");
  }
  if (has_nul(out)) return invalid(param, param + " contains a NUL character");
  return std::nullopt;
}

std::optional<api_error> read_messages(const json* v, request& q) {
  if (!v) return invalid("messages", "'messages' is missing: send a list of {\"role\", \"content\"} messages");
  if (!v->is_array()) return wrong_type("messages", *v, "a list of messages");
  if (v->empty()) return invalid("messages", "'messages' is empty: send at least one message");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return wrong_type(where, m, "an object with role and content");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return invalid(where + ".role", where + ".role must be a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant") {
      return invalid(where + ".role", fmt::format("{}.role is '{}'; use system, developer, user or assistant "
                                                  "(tools are not supported)", where, role->get<std::string>()));
    }
    auto content = m.find("content");
    std::string text;
    if (content == m.end() || content->is_null()) {
      if (r != "assistant") return invalid(where + ".content", where + ".content is missing");
    } else if (auto p = content_of(*content, where + ".content", text)) {
      return p;
    }
    q.messages.push_back({std::move(r), std::move(text)});
  }
  return std::nullopt;
}

std::optional<api_error> read_prompt(const json* v, request& q) {
  if (!v) return invalid("prompt", "'prompt' is missing: send the text to continue");
  if (v->is_string()) {
    q.prompt = v->get<std::string>();
  } else if (v->is_array() && v->size() == 1 && (*v)[0].is_string()) {
    q.prompt = (*v)[0].get<std::string>();
  } else if (v->is_array() && !v->empty() && std::all_of(v->begin(), v->end(), [](const json& t) {
               return t.is_number_integer();
             })) {
    for (const json& t : *v) {
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return invalid("prompt", fmt::format("token id {} is out of range", id));
      }
      q.prompt_tokens.push_back(static_cast<int32_t>(id));
    }
    return std::nullopt;
  } else if (v->is_array() && v->size() > 1) {
    return invalid("prompt", "'prompt' has several prompts; send one per request (n = 1)");
  } else {
    return wrong_type("prompt", *v, "a string or a list of token ids");
  }
  if (q.prompt.empty()) return invalid("prompt", "'prompt' is empty");
  if (has_nul(q.prompt)) return invalid("prompt", "'prompt' contains a NUL character");
  return std::nullopt;
}

std::optional<api_error> read_stop(const json* v, const decode_limits& limits, request& q) {
  if (!v) return std::nullopt;
  std::vector<const json*> items;
  if (v->is_string()) {
    items.push_back(v);
  } else if (v->is_array()) {
    for (const json& s : *v) items.push_back(&s);
  } else {
    return wrong_type("stop", *v, "a string or a list of strings");
  }
  if (items.size() > limits.max_stop_sequences) {
    return invalid("stop", fmt::format("{} stop sequences; at most {} are allowed", items.size(), limits.max_stop_sequences));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i]->is_string()) return wrong_type(fmt::format("stop[{}]", i), *items[i], "a string");
    std::string s = items[i]->get<std::string>();
    if (s.empty() || s.size() > limits.max_stop_bytes || has_nul(s)) {
      return invalid("stop", fmt::format("stop[{}] has {} bytes; use 1 to {}, without NUL", i, s.size(), limits.max_stop_bytes));
    }
    q.stop.push_back(std::move(s));
  }
  return std::nullopt;
}

std::optional<api_error> read_sampling(body_reader& b, openai_endpoint endpoint, uint64_t seed, sampling_options& s) {
  s.temperature = 1.0f;  // OpenAI's default
  b.number("temperature", s.temperature, 0, 2);
  b.number("top_p", s.top_p, 0, 1, true);
  int64_t top_k = 0;
  b.integer("top_k", top_k, -1, std::numeric_limits<int32_t>::max());  // -1: all (vLLM's)
  s.top_k = static_cast<int32_t>(std::max<int64_t>(top_k, 0));
  b.number("min_p", s.min_p, 0, 1);
  b.number("presence_penalty", s.presence_penalty, -2, 2);
  b.number("frequency_penalty", s.frequency_penalty, -2, 2);
  b.number("repetition_penalty", s.repetition_penalty, 0, 10, true);
  int64_t given_seed = -1;
  b.integer("seed", given_seed, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  s.seed = b.field("seed") ? static_cast<uint64_t>(given_seed) : seed;
  int64_t n = 1;
  b.integer("n", n, 1, 1000);
  if (b.ok() && n != 1) b.fail(invalid("n", fmt::format("'n' is {}; this server returns one choice per request (n = 1)", n)));
  // logprobs: a boolean for chat (top_logprobs says how many alternatives), a count of
  // alternatives for completions.
  if (endpoint == openai_endpoint::chat_completions) {
    bool wanted = false;
    int64_t top = -1;
    b.boolean("logprobs", wanted);
    b.integer("top_logprobs", top, 0, max_top_logprobs);
    if (b.ok() && top >= 0 && !wanted) {
      b.fail(invalid("top_logprobs", "top_logprobs needs \"logprobs\": true; set it, or leave top_logprobs unset"));
    }
    s.logprobs = wanted ? static_cast<int32_t>(std::max<int64_t>(top, 0)) : -1;
  } else {
    int64_t top = -1;
    b.integer("logprobs", top, 0, max_top_logprobs);
    s.logprobs = static_cast<int32_t>(top);
  }
  if (const json* echo = b.field("echo"); echo && b.ok() && echo->is_boolean() && echo->get<bool>()) {
    b.fail(invalid("echo", "echo is not supported; leave it unset"));
  }
  return b.problem;
}

}  // namespace

std::variant<openai_call, api_error> parse_openai_request(std::string_view body, openai_endpoint endpoint,
                                                          const decode_limits& limits, uint64_t seed) {
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return invalid("", "the body is not valid JSON (UTF-8); send a JSON object");
  }
  if (!doc.is_object()) return invalid("", fmt::format("the body is {}; send a JSON object", type_name(doc)));
  openai_call call;
  call.endpoint = endpoint;
  request& q = call.req;
  body_reader b(doc);

  b.string("model", call.model);
  if (!b.ok()) return *b.problem;
  if (!call.model.empty() && call.model != limits.model_name) {
    api_error e = invalid("model", fmt::format("The model '{}' does not exist; this server serves '{}' "
                                               "(GET /v1/models)", call.model, limits.model_name));
    e.status = 404;
    e.code = "model_not_found";
    return e;
  }
  if (call.model.empty()) call.model = limits.model_name;

  std::optional<api_error> problem = endpoint == openai_endpoint::chat_completions
                                         ? read_messages(b.field("messages"), q)
                                         : read_prompt(b.field("prompt"), q);
  if (problem) return *problem;
  if (limits.max_prompt_bytes > 0 && prompt_text_bytes(q) > limits.max_prompt_bytes) {
    const request_problem p = prompt_bytes_problem(prompt_text_bytes(q), limits.max_prompt_bytes, limits.max_prompt_tokens);
    api_error e = invalid(endpoint == openai_endpoint::chat_completions ? "messages" : "prompt", p.message);
    e.code = "context_length_exceeded";
    return e;
  }

  int64_t max_tokens = 0;
  b.integer("max_tokens", max_tokens, 1, std::numeric_limits<int32_t>::max());
  b.integer("max_completion_tokens", max_tokens, 1, std::numeric_limits<int32_t>::max());
  q.max_tokens = static_cast<int32_t>(max_tokens);
  if (auto p = read_sampling(b, endpoint, seed, q.sampling)) return *p;
  if (auto p = read_stop(b.field("stop"), limits, q)) return *p;
  b.boolean("stream", call.stream);
  if (const json* so = b.field("stream_options"); so && b.ok()) {
    if (!so->is_object()) return wrong_type("stream_options", *so, "an object");
    if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return wrong_type("stream_options.include_usage", *iu, "true or false");
      call.include_usage = iu->get<bool>();
    }
  }
  std::string user;
  b.string("user", user);
  if (!b.ok()) return *b.problem;
  if (const json* t = b.field("retry_token")) {
    std::string digits = t->is_string() ? t->get<std::string>() : t->is_number_unsigned() ? std::to_string(t->get<uint64_t>()) : "";
    uint64_t token = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), token);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
      return invalid("retry_token", "'retry_token' must be the decimal string a 429 response gave");
    }
    q.retry_token = token;
  }

  q.timeout = limits.default_timeout;
  q.token_window = limits.stream_window;
  q.manual_ack = true;
  return call;
}

api_error body_too_large(size_t limit_bytes, const decode_limits& limits) {
  api_error e;
  e.status = 413;
  e.code = "context_length_exceeded";
  e.message = fmt::format("the request body is over {} bytes; this server takes prompts of at most {} tokens. "
                          "Split the text into smaller requests", limit_bytes, limits.max_prompt_tokens);
  return e;
}

api_error error_of(const outcome& o) {
  api_error e;
  e.message = o.message.empty() ? o.reason : o.message;
  e.code = o.reason;
  e.retry_after_ms = o.retry_after_ms;
  e.retry_token = o.retry_token;
  switch (o.kind) {
    case outcome_kind::rejected:
      if (o.reason == reason::unauthenticated) {
        e.status = 401;
        e.code = "invalid_api_key";
      } else if (o.reason == reason::prompt_too_long) {
        e.status = 400;
        e.code = "context_length_exceeded";
      } else if (o.reason == reason::overloaded || o.reason == reason::quota_exceeded) {
        e.status = 429;
        e.type = "rate_limit_error";
      } else if (o.reason == reason::shutting_down) {
        e.status = 503;
        e.type = "server_error";
      }
      break;
    case outcome_kind::cancelled:
      e.status = o.reason == reason::deadline ? 504 : 503;
      e.type = o.reason == reason::deadline ? "timeout" : "server_error";
      break;
    case outcome_kind::failed:
    case outcome_kind::completed:  // not an error; a caller's bug
      e.status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

std::string error_body(const api_error& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  if (e.retry_after_ms >= 0) err["retry_after_ms"] = e.retry_after_ms;
  if (e.retry_token != 0) err["retry_token"] = std::to_string(e.retry_token);
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string_view finish_reason_of(const outcome& o) {
  return o.reason == reason::max_tokens || o.reason == reason::context_full ? "length" : "stop";
}

response_id make_response_id(const openai_call& call, uint64_t request_id, int64_t created, token_bytes_fn token_bytes) {
  response_id r;
  r.endpoint = call.endpoint;
  r.id = fmt::format("{}-{:016x}", call.endpoint == openai_endpoint::chat_completions ? "chatcmpl" : "cmpl", request_id);
  r.created = created;
  r.model = call.model;
  r.logprobs = call.req.sampling.logprobs;
  r.token_bytes = std::move(token_bytes);
  return r;
}

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json envelope(const response_id& r, bool chunk) {
  const bool chat = r.endpoint == openai_endpoint::chat_completions;
  return json{{"id", r.id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", r.created},
              {"model", r.model}};
}

json usage_of(const outcome& o) {
  return json{{"prompt_tokens", o.prompt_tokens},
              {"completion_tokens", o.completion_tokens},
              {"total_tokens", o.prompt_tokens + o.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", o.cached_prompt_tokens}}}};
}

std::string bytes_of(const response_id& r, int32_t token) {
  return r.token_bytes ? r.token_bytes(token) : fmt::format("token_id:{}", token);
}

json logprob_entry(const response_id& r, int32_t token, float logprob) {
  const std::string b = bytes_of(r, token);
  json bytes = json::array();
  for (unsigned char c : b) bytes.push_back(static_cast<int>(c));
  return json{{"token", b}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

// The logprobs of a choice: chat's {"content": [...]} or completions' parallel lists (their
// text_offset counts from `text_offset`, the bytes of the tokens before these).
json logprobs_json(const response_id& r, std::span<const token_logprob> lps, int64_t text_offset) {
  if (r.endpoint == openai_endpoint::chat_completions) {
    json content = json::array();
    for (const token_logprob& l : lps) {
      json e = logprob_entry(r, l.token, l.logprob);
      json top = json::array();
      for (const auto& [t, lp] : l.top) top.push_back(logprob_entry(r, t, lp));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const token_logprob& l : lps) {
    const std::string b = bytes_of(r, l.token);
    tokens.push_back(b);
    token_logprobs.push_back(l.logprob);
    json alternatives = json::object();  // the chosen token always, as vLLM does
    alternatives[b] = l.logprob;
    for (const auto& [t, lp] : l.top) alternatives[bytes_of(r, t)] = lp;
    top.push_back(std::move(alternatives));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(b.size());
  }
  return json{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top)}, {"text_offset", std::move(offsets)}};
}

// The choice of a chunk or response: a chat delta/message or a completion's text.
json choice(const response_id& r, std::string_view text, bool chunk, const outcome* finished,
            std::span<const token_logprob> lps = {}, int64_t text_offset = 0) {
  json c = {{"index", 0}};
  if (r.endpoint == openai_endpoint::chat_completions) {
    if (chunk) {
      c["delta"] = text.empty() ? json::object() : json{{"content", text}};
    } else {
      c["message"] = {{"role", "assistant"}, {"content", text}};
    }
  } else {
    c["text"] = text;
  }
  const bool with_logprobs = r.logprobs >= 0 && (!chunk || !lps.empty());
  c["logprobs"] = with_logprobs ? logprobs_json(r, lps, text_offset) : json(nullptr);
  c["finish_reason"] = finished ? json(finish_reason_of(*finished)) : json(nullptr);
  return c;
}

// What tireless adds to a response: the degradations, never silent.
void add_tireless_fields(json& j, const outcome& o) {
  j["degradations"] = o.degradations;
  j["tireless"] = {{"request_id", o.request_id},
                   {"queued_ms", o.queued_ms},
                   {"time_to_first_token_ms", o.time_to_first_token_ms},
                   {"total_ms", o.total_ms},
                   {"longest_pause_ms", o.longest_pause_ms},
                   {"reason", o.reason}};
}

}  // namespace

std::string completion_body(const response_id& r, const outcome& o) {
  json j = envelope(r, false);
  j["choices"] = json::array({choice(r, o.text, false, &o, o.logprobs)});
  j["usage"] = usage_of(o);
  add_tireless_fields(j, o);
  return dump(j);
}

std::string first_chunk(const response_id& r) {
  json j = envelope(r, true);
  json c = choice(r, "", true, nullptr);
  if (r.endpoint == openai_endpoint::chat_completions) c["delta"] = {{"role", "assistant"}, {"content", ""}};
  j["choices"] = json::array({c});
  return dump(j);
}

std::string text_chunk(const response_id& r, std::string_view text, std::span<const token_logprob> logprobs,
                       int64_t text_offset) {
  json j = envelope(r, true);
  j["choices"] = json::array({choice(r, text, true, nullptr, logprobs, text_offset)});
  return dump(j);
}

std::string final_chunk(const response_id& r, const outcome& o, std::span<const token_logprob> logprobs,
                        int64_t text_offset) {
  json j = envelope(r, true);
  j["choices"] = json::array({choice(r, "", true, &o, logprobs, text_offset)});
  add_tireless_fields(j, o);
  return dump(j);
}

std::string usage_chunk(const response_id& r, const outcome& o) {
  json j = envelope(r, true);
  j["choices"] = json::array();
  j["usage"] = usage_of(o);
  return dump(j);
}

std::string models_body(const std::string& model_name, int64_t created, int32_t context_length) {
  json m = {{"id", model_name}, {"object", "model"}, {"created", created}, {"owned_by", "tireless"}};
  if (context_length > 0) m["max_model_len"] = context_length;
  return dump(json{{"object", "list"}, {"data", json::array({m})}});
}

std::string degradations_header(const std::vector<std::string>& degradations) {
  std::string out;
  for (const std::string& d : degradations) {
    if (!out.empty()) out += "; ";
    for (char c : d) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out;
}

}  // namespace tireless
