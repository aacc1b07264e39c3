// The OpenAI target: any OpenAI-compatible server (tireless-serve's HTTP API, llama.cpp's
// llama-server, vLLM, ...) at [target] base_url, driven with streamed chat completions from one
// kj event loop in this thread (kj-http's client, a connection per request in flight). Time to
// first token and the total are measured here, at the client; tokens come from the final
// usage chunk (or are counted from the stream when a server sends none). Each scenario tenant
// key is sent as the key [target.keys] maps it to (default: itself).
#include <fmt/format.h>
#include <kj/async-io.h>
#include <kj/compat/http.h>

#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "target.hpp"
#include "wall_clock_session.hpp"
#include "workload.hpp"

namespace tireless::load {

namespace {

using json = nlohmann::json;

// An HTTP error's outcome (the shape of server/openai_api.cpp's errors; other servers' bodies
// are read as far as they match).
outcome refusal_of(unsigned status, const std::string& body, const kj::HttpHeaders& headers,
                   kj::HttpHeaderId retry_after_ms, kj::HttpHeaderId retry_token) {
  const json doc = json::parse(body, nullptr, false);
  const json err = doc.is_object() && doc.contains("error") && doc["error"].is_object() ? doc["error"] : json::object();
  std::string code = err.contains("code") && err["code"].is_string() ? err["code"].get<std::string>() : "";
  std::string message = err.contains("message") && err["message"].is_string() ? err["message"].get<std::string>()
                                                                               : body.substr(0, 300);
  int64_t retry = -1;
  KJ_IF_MAYBE (v, headers.get(retry_after_ms)) {
    retry = std::atoll(v->cStr());
  }
  if (status >= 500 && status != 503) return failed_outcome(0, fmt::format("HTTP {}: {}", status, message));
  if (status == 401) code = std::string(reason::unauthenticated);
  if (code == "context_length_exceeded" || status == 413) code = std::string(reason::prompt_too_long);
  if (status == 429 && code != reason::quota_exceeded) code = std::string(reason::overloaded);
  if (status == 503) code = std::string(reason::shutting_down);
  if (code.empty()) code = std::string(reason::invalid);
  outcome o = rejected_outcome(0, code, fmt::format("HTTP {}: {}", status, message), retry);
  KJ_IF_MAYBE (v, headers.get(retry_token)) {  // tireless's reservation for the retry
    o.retry_token = std::strtoull(v->cStr(), nullptr, 10);
  }
  return o;
}

class openai_session final : public wall_clock_session, public kj::TaskSet::ErrorHandler {
 public:
  openai_session(kj::AsyncIoContext& io, const scenario& s)
      : wall_clock_session(io), s_(s), http_(std::make_unique<http>(io, *this)) {
    url_ = s_.base_url;
    while (!url_.empty() && url_.back() == '/') url_.pop_back();
  }
  // What is in flight is cancelled, its connection closed, which cancels it at the server.
  ~openai_session() override {
    http_.reset();
    io_.waitScope.poll();
  }

  void submit(const planned_request& r, outcome_fn done) override {
    std::string key = r.tenant_key ? *r.tenant_key : "";
    if (auto it = s_.target_keys.find(key); it != s_.target_keys.end()) key = it->second;
    json messages = json::array();
    const bool system = r.system_tokens > 0;
    if (system) {
      messages.push_back({{"role", "system"},
                          {"content", filler_text(r.system_tokens, 0x5eed0000ull + static_cast<uint64_t>(r.cls + 1))}});
    }
    const int32_t own = std::max(1, r.prompt_tokens - r.system_tokens - (system ? 20 : 30));
    messages.push_back({{"role", "user"},
                        {"content", "Write a long, detailed story that uses these words:" + filler_text(own, r.content_seed)}});
    json body = {{"model", s_.config.model.name}, {"messages", messages}, {"max_tokens", r.max_tokens},
                 {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"temperature", 0}};
    auto state = std::make_shared<call>();
    state->body = body.dump();
    state->started = now();
    state->done = std::move(done);
    kj::HttpHeaders headers(*http_->table);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
    if (!key.empty()) headers.set(http_->authorization, kj::str("Bearer ", key.c_str()));
    if (r.retry_token != 0) headers.set(http_->retry_token, kj::str(r.retry_token));
    auto req = http_->client->request(kj::HttpMethod::POST, kj::str(url_.c_str(), "/v1/chat/completions"), headers,
                                static_cast<uint64_t>(state->body.size()));
    auto sent = req.body->write(state->body.data(), state->body.size()).attach(kj::mv(req.body));
    kj::Promise<void> work =
        sent.then([response = kj::mv(req.response)]() mutable { return kj::mv(response); })
            .then([this, state](kj::HttpClient::Response&& response) { return read(state, kj::mv(response)); })
            .catch_([this, state](kj::Exception&& e) {
              finish(state, failed_outcome(0, fmt::format("HTTP request failed: {}", e.getDescription().cStr())));
            });
    // The request's deadline, kept by the client as the articles' clients keep theirs (the
    // server may not know it): when it passes, the request is dropped (its connection closed,
    // which cancels it at a server that notices) and counted as cancelled by its deadline.
    const int64_t timeout_ms = r.timeout_ms > 0 ? r.timeout_ms : s_.config.session.request_timeout.count();
    if (timeout_ms > 0) {
      work = work.exclusiveJoin(io_.provider->getTimer().afterDelay(timeout_ms * kj::MILLISECONDS).then([this, state] {
        outcome o;
        o.kind = outcome_kind::cancelled;
        o.reason = reason::deadline;
        o.message = "the client's deadline passed before the answer ended";
        finish(state, timed(*state, std::move(o)));
      }));
    }
    http_->tasks.add(kj::mv(work));
  }

  std::optional<target_probe> probe() override { return std::nullopt; }
  std::string broken() override { return {}; }

 private:
  struct call {
    std::string body;
    double started = 0, first_token = -1, last_token = -1, longest_pause = 0;
    std::string pending;  // bytes of the stream not yet split into events
    int32_t chunks = 0, prompt_tokens = 0, completion_tokens = -1;
    std::vector<std::string> degradations;
    std::string finish_reason, error;
    kj::byte buffer[4096];
    outcome_fn done;
  };

  void finish(const std::shared_ptr<call>& c, outcome o) {
    if (c->done) std::exchange(c->done, nullptr)(o);
  }

  kj::Promise<void> read(std::shared_ptr<call> c, kj::HttpClient::Response&& response) {
    if (response.statusCode != 200) {
      auto headers = kj::heap<kj::HttpHeaders>(response.headers->clone());
      const unsigned status = response.statusCode;
      return response.body->readAllText().attach(kj::mv(response.body)).then(
          [this, c, status, headers = kj::mv(headers)](kj::String text) {
            finish(c, refusal_of(status, std::string(text.cStr()), *headers, http_->retry_after_ms, http_->retry_token));
          });
    }
    auto body = kj::mv(response.body);
    auto& stream = *body;
    return pump(c, stream).attach(kj::mv(body));
  }

  kj::Promise<void> pump(std::shared_ptr<call> c, kj::AsyncInputStream& stream) {
    return stream.tryRead(c->buffer, 1, sizeof(c->buffer)).then([this, c, &stream](size_t n) -> kj::Promise<void> {
      if (n == 0) {
        end(c);
        return kj::READY_NOW;
      }
      c->pending.append(reinterpret_cast<const char*>(c->buffer), n);
      for (size_t at; (at = c->pending.find("\n\n")) != std::string::npos;) {
        const std::string event = c->pending.substr(0, at);
        c->pending.erase(0, at + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        const std::string data = event.substr(6);
        if (data == "[DONE]") {
          end(c);
          return kj::READY_NOW;
        }
        take(*c, json::parse(data, nullptr, false));
      }
      return pump(c, stream);
    });
  }

  void take(call& c, const json& chunk) {
    if (!chunk.is_object()) return;
    if (chunk.contains("error")) {
      c.error = chunk["error"].is_object() ? chunk["error"].value("message", "error") : "error";
      return;
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      c.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
      c.completion_tokens = chunk["usage"].value("completion_tokens", -1);
    }
    if (chunk.contains("degradations") && chunk["degradations"].is_array()) {
      for (const json& d : chunk["degradations"]) {
        if (d.is_string()) c.degradations.push_back(d.get<std::string>());
      }
    }
    if (!chunk.contains("choices") || !chunk["choices"].is_array()) return;
    for (const json& choice : chunk["choices"]) {
      const json delta = choice.value("delta", json::object());
      if (delta.is_object() && delta.contains("content") && delta["content"].is_string() &&
          !delta["content"].get<std::string>().empty()) {
        const double t = now();
        if (c.first_token < 0) c.first_token = t;
        if (c.last_token >= 0) c.longest_pause = std::max(c.longest_pause, t - c.last_token);
        c.last_token = t;
        ++c.chunks;
      }
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        c.finish_reason = choice["finish_reason"].get<std::string>();
      }
    }
  }

  void end(const std::shared_ptr<call>& c) {
    if (!c->error.empty() || c->finish_reason.empty()) {
      finish(c, failed_outcome(0, c->error.empty() ? "the stream ended without a finish_reason" : c->error));
      return;
    }
    outcome o;
    o.kind = outcome_kind::completed;
    o.reason = c->finish_reason == "length" ? reason::max_tokens : reason::stop_token;
    o.prompt_tokens = c->prompt_tokens;
    o.completion_tokens = c->completion_tokens >= 0 ? c->completion_tokens : c->chunks;
    o.degradations = c->degradations;
    finish(c, timed(*c, std::move(o)));
  }

  // The times the client saw: to the first text, the whole, the longest wait between two
  // chunks of text (a server's chunk may hold several tokens).
  outcome timed(const call& c, outcome o) {
    o.time_to_first_token_ms = c.first_token < 0 ? -1 : (c.first_token - c.started) * 1000;
    o.total_ms = (now() - c.started) * 1000;
    o.longest_pause_ms = c.longest_pause * 1000;
    return o;
  }

  void taskFailed(kj::Exception&& e) override { (void)e; }

  struct http {
    http(kj::AsyncIoContext& io, kj::TaskSet::ErrorHandler& errors) : tasks(errors) {
      kj::HttpHeaderTable::Builder b;
      authorization = b.add("Authorization");
      retry_after_ms = b.add("retry-after-ms");
      retry_token = b.add("x-tireless-retry-token");
      table = b.build();
      client = kj::newHttpClient(io.provider->getTimer(), *table, io.provider->getNetwork(), nullptr);
    }
    kj::HttpHeaderId authorization, retry_after_ms, retry_token;
    kj::Own<kj::HttpHeaderTable> table;
    kj::Own<kj::HttpClient> client;
    kj::TaskSet tasks;  // destroyed first: the requests in flight, before their client
  };

  const scenario& s_;
  std::unique_ptr<http> http_;
  std::string url_;
};

class openai_target final : public target {
 public:
  explicit openai_target(const scenario& s) : s_(s), io_(std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo())) {}
  std::unique_ptr<target_session> open(admission_policy, bool, const std::string&) override {
    return std::make_unique<openai_session>(*io_, s_);
  }
  bool virtual_time() const override { return false; }
  bool switches_policy() const override { return false; }
  std::string describe() const override { return fmt::format("the OpenAI-compatible server at {}", s_.base_url); }

 private:
  const scenario& s_;
  std::unique_ptr<kj::AsyncIoContext> io_;
};

}  // namespace

std::unique_ptr<target> make_openai_target(const scenario& s) { return std::make_unique<openai_target>(s); }

}  // namespace tireless::load
