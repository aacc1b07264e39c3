#include "server/http_gateway.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <sys/socket.h>

#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include <kj/debug.h>

#include "server/openai_api.hpp"
#include "server/watched_stream.hpp"

namespace tireless {

namespace {

class log_connection_errors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override { spdlog::debug("http connection ended: {}", e.getDescription().cStr()); }
};
log_connection_errors connection_errors;

}  // namespace

struct http_gateway::header_ids {
  explicit header_ids(kj::HttpHeaderTable::Builder& b)
      : authorization(b.add("Authorization")),
        retry_after(b.add("Retry-After")),
        retry_after_ms(b.add("retry-after-ms")),
        degradations(b.add("x-tireless-degradations")),
        request_id(b.add("x-request-id")),
        cache_control(b.add("Cache-Control")),
        should_retry(b.add("x-should-retry")),
        retry_token(b.add("x-tireless-retry-token")) {}
  kj::HttpHeaderId authorization, retry_after, retry_after_ms, degradations, request_id, cache_control, should_retry,
      retry_token;
};

// One generation, touched only on the loop's thread: the runtime's callbacks post to it.
struct http_gateway::generation {
  uint64_t id = 0;
  openai_call call;
  response_id rid;
  std::string pending_text;
  int32_t pending_tokens = 0;
  std::vector<token_logprob> pending_logprobs;  // of tokens whose text has not gone out yet
  int64_t text_offset = 0;                      // bytes of the tokens whose logprobs went out
  std::optional<outcome> final;
  kj::Own<kj::PromiseFulfiller<void>> waiting;  // the handler waits for news

  // The pending logprobs went out in a chunk: completions' text offsets move past them.
  void take_logprobs() {
    for (const token_logprob& l : pending_logprobs) {
      text_offset += rid.token_bytes ? static_cast<int64_t>(rid.token_bytes(l.token).size()) : 0;
    }
    pending_logprobs.clear();
  }

  void notify() {
    if (waiting) {
      waiting->fulfill();
      waiting = nullptr;
    }
  }
  // Resolves once there are tokens or an outcome to hand on.
  kj::Promise<void> news() {
    if (pending_tokens > 0 || !pending_text.empty() || final) return kj::READY_NOW;
    auto pf = kj::newPromiseAndFulfiller<void>();
    waiting = kj::mv(pf.fulfiller);
    return kj::mv(pf.promise);
  }
};

namespace {

// Held by a generation's handler: when the handler is dropped (the client went away, the
// server stopped) before its outcome, the request is cancelled; the gateway counts it until then.
class generation_guard {
 public:
  generation_guard(runtime& rt, std::shared_ptr<http_gateway::generation> g, size_t& live)
      : rt_(rt), g_(std::move(g)), live_(live) {
    ++live_;
  }
  ~generation_guard() {
    if (!g_->final) rt_.cancel(g_->id);
    --live_;
  }

 private:
  runtime& rt_;
  std::shared_ptr<http_gateway::generation> g_;
  size_t& live_;
};

std::string sse(std::string_view data) { return fmt::format("data: {}\n\n", data); }

std::string api_key_of(const kj::HttpHeaders& headers, kj::HttpHeaderId authorization) {
  KJ_IF_MAYBE (value, headers.get(authorization)) {
    std::string v(value->cStr(), value->size());
    if (v.size() > 7 && (v.compare(0, 7, "Bearer ") == 0 || v.compare(0, 7, "bearer ") == 0)) return v.substr(7);
    return v;
  }
  return {};
}

kj::StringPtr status_text(unsigned status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
  }
}

constexpr size_t socket_send_buffer_bytes = 32 * 1024;  // Linux doubles it for its bookkeeping

constexpr int chat_endpoint = static_cast<int>(openai_endpoint::chat_completions);
constexpr int completions_endpoint = static_cast<int>(openai_endpoint::completions);

}  // namespace

// Each connection's requests reach the gateway with the connection, so a handler can watch
// for its client going away.
class http_gateway::connection_service final : public kj::HttpService {
 public:
  connection_service(http_gateway& gw, watched_stream& connection) : gw_(gw), connection_(connection) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                            kj::AsyncInputStream& body, Response& response) override {
    return gw_.handle(method, url, headers, body, response, connection_);
  }

 private:
  http_gateway& gw_;
  watched_stream& connection_;
};

http_gateway::http_gateway(runtime& rt, kj_bridge& bridge, kj::Timer& timer, service_info info, decode_limits limits,
                           std::chrono::milliseconds keep_alive)
    : rt_(rt),
      bridge_(bridge),
      timer_(timer),
      info_(std::move(info)),
      limits_(std::move(limits)),
      // JSON escapes may take several bytes per byte of text: the body may be larger than the
      // prompt limit; parse_openai_request then checks the text itself.
      max_body_bytes_(limits_.max_prompt_bytes > 0 ? 4 * limits_.max_prompt_bytes + (size_t{1} << 20)
                                                   : size_t{64} << 20),
      started_at_(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count()),
      seeds_(std::random_device{}()),
      connections_(connection_errors) {
  kj::HttpHeaderTable::Builder builder;
  ids_ = std::make_unique<header_ids>(builder);
  table_ = builder.build();
  kj::HttpServerSettings settings;
  settings.pipelineTimeout = keep_alive.count() * kj::MILLISECONDS;
  // Every connection comes from accept_loop, wrapped.
  server_ = kj::heap<kj::HttpServer>(
      timer, *table_,
      [this](kj::AsyncIoStream& connection) -> kj::Own<kj::HttpService> {
        return kj::heap<connection_service>(*this, static_cast<watched_stream&>(connection));
      },
      settings);
}

http_gateway::~http_gateway() = default;

kj::Promise<void> http_gateway::listen(kj::ConnectionReceiver& port) {
  return port.accept().then(
      [this, &port](kj::Own<kj::AsyncIoStream> connection) {
    // A fixed, small send buffer (no autotuning to megabytes): a reader that stops reading
    // stops its stream within the window plus these bytes, and costs the kernel no more.
    int bytes = static_cast<int>(socket_send_buffer_bytes);
    connection->setsockopt(SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    if (open_connections_ >= max_connections_) {
      refuse_connection(kj::mv(connection));
      return listen(port);
    }
    ++open_connections_;
    connections_.add(server_->listenHttp(kj::heap<watched_stream>(kj::mv(connection)))
                         .attach(kj::defer([this] { --open_connections_; })));
    return listen(port);
  },
      [this, &port](kj::Exception&& e) -> kj::Promise<void> {
        // Out of file descriptors, a connection reset before it was accepted: keep listening.
        spdlog::warn("http accept failed ({}); retrying", e.getDescription().cStr());
        return timer_.afterDelay(100 * kj::MILLISECONDS).then([this, &port] { return listen(port); });
      });
}

// A connection over the limit: one 503 in OpenAI's error shape, with the hint to come back,
// then closed (what the client sent is not read).
void http_gateway::refuse_connection(kj::Own<kj::AsyncIoStream> connection) {
  ++refused_connections_;
  api_error e;
  e.status = 503;
  e.type = "server_error";
  e.code = "too_many_connections";
  e.message = fmt::format("this server has {} HTTP connections open, its limit (server.max_connections); retry "
                          "in a second, or reuse a connection", max_connections_);
  e.retry_after_ms = 1000;
  const std::string body = error_body(e);
  auto text = kj::heapString(fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; "
                                         "charset=utf-8\r\nRetry-After: 1\r\nretry-after-ms: 1000\r\n"
                                         "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                                         body.size(), body));
  auto& stream = *connection;
  auto written = stream.write(text.begin(), text.size()).then([&stream] { stream.shutdownWrite(); });
  connections_.add(written.exclusiveJoin(timer_.afterDelay(2 * kj::SECONDS)).attach(kj::mv(connection), kj::mv(text)));
}

void http_gateway::add_page(std::string path, page p) { pages_.emplace_back(std::move(path), std::move(p)); }

kj::Promise<void> http_gateway::respond_json(kj::HttpService::Response& response, unsigned status, std::string body,
                                             const api_error* error, const outcome* done) {
  kj::HttpHeaders headers(*table_);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json; charset=utf-8");
  if (error && error->retry_after_ms >= 0) {
    headers.set(ids_->retry_after, kj::str((error->retry_after_ms + 999) / 1000));
    headers.set(ids_->retry_after_ms, kj::str(error->retry_after_ms));
  }
  if (error && error->retry_token != 0) headers.set(ids_->retry_token, kj::str(error->retry_token));
  // Retrying cannot help a request that is wrong, or a 429 without a time to come back (a quota
  // it can never fit): the openai package reads this header before its own rules.
  if (error && error->status < 500 && (error->status != 429 || error->retry_after_ms < 0)) {
    headers.set(ids_->should_retry, "false");
  }
  if (done) {
    headers.set(ids_->request_id, kj::str(done->request_id));
    if (!done->degradations.empty()) headers.set(ids_->degradations, kj::str(degradations_header(done->degradations).c_str()));
  }
  auto out = response.send(status, status_text(status), headers, static_cast<uint64_t>(body.size()));
  auto text = kj::heapString(body.data(), body.size());
  auto write = out->write(text.begin(), text.size());
  return write.attach(kj::mv(out), kj::mv(text));
}

kj::Promise<void> http_gateway::handle(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                                       kj::AsyncInputStream& body, kj::HttpService::Response& response,
                                       watched_stream& connection) {
  std::string path(url.cStr(), url.size());
  if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  auto error = [&](unsigned status, std::string type, std::string message) {
    api_error e;
    e.status = static_cast<int>(status);
    e.type = std::move(type);
    e.message = std::move(message);
    return respond_json(response, status, error_body(e), &e);
  };

  const bool post = method == kj::HttpMethod::POST;
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    if (!post) return error(405, "invalid_request_error", fmt::format("use POST for {}", path));
    const int endpoint = path == "/v1/chat/completions" ? chat_endpoint : completions_endpoint;
    std::string key = api_key_of(headers, ids_->authorization);
    uint64_t token = 0;
    KJ_IF_MAYBE (t, headers.get(ids_->retry_token)) {
      std::from_chars(t->begin(), t->end(), token);  // a malformed one is no token
    }
    return body.readAllText(max_body_bytes_)
        .then(
            [this, endpoint, key = std::move(key), token, &response, &connection](kj::String text) mutable {
              return generate(endpoint, std::string(text.cStr(), text.size()), std::move(key), token, response,
                              connection);
            },
            [this, &response](kj::Exception&& e) -> kj::Promise<void> {
              if (e.getType() == kj::Exception::Type::DISCONNECTED) return kj::mv(e);
              const api_error too_large = body_too_large(max_body_bytes_, limits_);
              return respond_json(response, 413, error_body(too_large), &too_large);
            });
  }
  if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
    return error(post ? 404 : 405, "invalid_request_error", fmt::format("no {} route for {}", kj::str(method).cStr(), path));
  }
  if (path == "/v1/models") return respond_json(response, 200, models_body(info_.model_name, started_at_, info_.context_length));
  if (path == "/health" || path == "/ready") {
    const bool ready_check = path == "/ready";
    return runtime_stats_promise(rt_).then([this, ready_check, &response](runtime_stats s) {
      const bool alive = s.backend_problem.empty();
      const bool ok = ready_check ? alive && accepting_ : alive;
      std::string status = !alive ? "backend lost: " + s.backend_problem : ok ? "ok" : "shutting down";
      nlohmann::json j = {{"status", status}, {"accepting", accepting_}, {"running", s.running},
                          {"queued", s.queued_in_admission + s.waiting_in_engine}};
      return respond_json(response, ok ? 200 : 503, j.dump());
    });
  }
  for (auto& [p, producer] : pages_) {
    if (path != p) continue;
    return producer().then([this, &response](std::pair<std::string, std::string> page) {
      kj::HttpHeaders h(*table_);
      h.set(kj::HttpHeaderId::CONTENT_TYPE, kj::str(page.first.c_str()));
      auto out = response.send(200, "OK", h, static_cast<uint64_t>(page.second.size()));
      auto text = kj::heapString(page.second.data(), page.second.size());
      auto write = out->write(text.begin(), text.size());
      return write.attach(kj::mv(out), kj::mv(text));
    });
  }
  return error(404, "invalid_request_error",
               fmt::format("no route {}; this server serves /v1/chat/completions, /v1/completions, /v1/models, "
                           "/health and /ready", path));
}

kj::Promise<void> http_gateway::generate(int endpoint, std::string body, std::string api_key, uint64_t retry_token,
                                         kj::HttpService::Response& response, watched_stream& connection) {
  auto parsed = parse_openai_request(body, static_cast<openai_endpoint>(endpoint), limits_, seeds_());
  if (auto* e = std::get_if<api_error>(&parsed)) {
    spdlog::debug("http: refused a bad request: {}", e->message);
    return respond_json(response, static_cast<unsigned>(e->status), error_body(*e), e);
  }
  if (!accepting_) {
    outcome o = rejected_outcome(0, reason::shutting_down, "the server is shutting down; retry on another replica", 1000);
    const api_error e = error_of(o);
    return respond_json(response, 503, error_body(e), &e);
  }
  auto g = std::make_shared<generation>();
  g->call = std::move(std::get<openai_call>(parsed));
  request req = std::move(g->call.req);
  req.api_key = api_key;
  if (req.retry_token == 0) req.retry_token = retry_token;
  const bool streamed = g->call.stream;
  if (!streamed) {  // the text comes with the outcome: no window to hold the sequence back
    req.token_window = 0;
    req.manual_ack = false;
  }
  std::weak_ptr<generation> weak = g;
  // Both callbacks run on runtime threads (or inside submit): they only post to the loop.
  g->id = rt_.submit(
      std::move(req),
      [this, weak, streamed](const token_event& e) {
        if (!streamed) return;
        bridge_.post([weak, e] {
          auto g = weak.lock();
          if (!g || g->final) return;
          g->pending_text += e.text;
          g->pending_tokens += static_cast<int32_t>(e.tokens.size());
          g->pending_logprobs.insert(g->pending_logprobs.end(), e.logprobs.begin(), e.logprobs.end());
          if (!e.tokens.empty() || !e.text.empty()) g->notify();
        });
      },
      [this, weak, api_key](const outcome& o) {
        if (observe_) observe_(api_key, o);  // thread-safe: the metrics
        bridge_.post([weak, o] {
          if (auto g = weak.lock(); g && !g->final) {
            g->final = o;
            g->notify();
          }
        });
      });
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  g->rid = make_response_id(g->call, g->id, now, info_.token_bytes);

  kj::Promise<void> work = nullptr;
  if (streamed) {
    work = stream(g, response);
  } else {
    work = g->news().then([this, g, &response]() -> kj::Promise<void> {
      const outcome& o = *g->final;
      if (o.kind == outcome_kind::completed) return respond_json(response, 200, completion_body(g->rid, o), nullptr, &o);
      const api_error e = error_of(o);
      return respond_json(response, static_cast<unsigned>(e.status), error_body(e), &e, &o);
    });
  }
  // A client that goes away while its request waits or runs cancels it (the guard).
  auto gone = connection.closed().then([]() -> kj::Promise<void> {
    return KJ_EXCEPTION(DISCONNECTED, "the client went away");
  });
  return work.exclusiveJoin(kj::mv(gone)).attach(kj::heap<generation_guard>(rt_, g, live_));
}

// Headers go out with the first token (or an error status, if the request ends before one);
// then one SSE event per batch of tokens, each written before the runtime may send more.
kj::Promise<void> http_gateway::stream(std::shared_ptr<generation> g, kj::HttpService::Response& response) {
  struct sse_state {
    kj::Own<kj::AsyncOutputStream> out;
    std::string buffer;
  };
  auto st = std::make_shared<sse_state>();
  auto step = std::make_shared<std::function<kj::Promise<void>()>>();
  *step = [this, g, st, step_weak = std::weak_ptr<std::function<kj::Promise<void>()>>(step), &response]() {
    return g->news().then([this, g, st, step_weak, &response]() -> kj::Promise<void> {
      if (!st->out) {
        if (g->final && g->pending_tokens == 0 && g->final->kind != outcome_kind::completed) {
          const api_error e = error_of(*g->final);
          return respond_json(response, static_cast<unsigned>(e.status), error_body(e), &e, &*g->final);
        }
        kj::HttpHeaders h(*table_);
        h.set(kj::HttpHeaderId::CONTENT_TYPE, "text/event-stream; charset=utf-8");
        h.set(ids_->cache_control, "no-cache");
        h.set(ids_->request_id, kj::str(g->id));
        st->out = response.send(200, "OK", h);
        if (g->rid.endpoint == openai_endpoint::chat_completions) st->buffer += sse(first_chunk(g->rid));
      }
      int32_t taken = 0;
      bool last = false;
      if (g->pending_tokens > 0 || !g->pending_text.empty()) {
        if (!g->pending_text.empty()) {
          st->buffer += sse(text_chunk(g->rid, g->pending_text, g->pending_logprobs, g->text_offset));
          g->take_logprobs();
        }
        taken = g->pending_tokens;
        g->pending_text.clear();
        g->pending_tokens = 0;
      } else {
        const outcome& o = *g->final;
        if (o.kind == outcome_kind::completed) {
          st->buffer += sse(final_chunk(g->rid, o, g->pending_logprobs, g->text_offset));
          g->take_logprobs();
          if (g->call.include_usage) st->buffer += sse(usage_chunk(g->rid, o));
        } else {
          st->buffer += sse(error_body(error_of(o)));  // the openai package raises it
        }
        st->buffer += "data: [DONE]\n\n";
        last = true;
      }
      if (st->buffer.empty()) {  // tokens without text yet (half a character, a possible stop string)
        if (taken > 0 && !g->final) rt_.acknowledge(g->id, taken);  // or the window would close for good
        return (*step_weak.lock())();
      }
      auto written = st->out->write(st->buffer.data(), st->buffer.size());
      return written.then([this, g, st, step_weak, taken, last]() -> kj::Promise<void> {
        st->buffer.clear();
        if (taken > 0 && !g->final) rt_.acknowledge(g->id, taken);
        if (last) {
          st->out = nullptr;  // ends the chunked body
          return kj::READY_NOW;
        }
        return (*step_weak.lock())();
      });
    });
  };
  return (*step)().attach(kj::mv(step));
}

}  // namespace tireless
