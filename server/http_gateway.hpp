#pragma once
// The OpenAI-compatible HTTP API over an embedded runtime (kj-http, on the same event loop as
// the Cap'n Proto service):
//   POST /v1/chat/completions, POST /v1/completions   (stream or not; SSE with data: [DONE])
//   GET /v1/models, GET /health (alive), GET /ready (accepting)
// Authorization: Bearer KEY names the tenant as an RPC api key does. Errors have OpenAI's shape
// and status (server/openai_api.hpp); 429 and 503 carry Retry-After (seconds, rounded up) and
// retry-after-ms. Degradations are listed in the x-tireless-degradations header and the body
// (the final stream chunk when streaming).
//
// A stream is flow-controlled as an RPC sink is: the runtime sends at most the stream window
// ahead of what the socket took, so a slow reader pauses its sequence. A client that goes away
// (its connection closes) cancels its request.

#include <kj/async-io.h>
#include <kj/compat/http.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "server/decode_limits.hpp"
#include "server/kj_bridge.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

class http_gateway {
 public:
  // keep_alive: how long a connection may sit idle between two requests before it is closed
  // (server.http_keep_alive_ms).
  http_gateway(runtime& rt, kj_bridge& bridge, kj::Timer& timer, service_info info, decode_limits limits,
               std::chrono::milliseconds keep_alive);
  ~http_gateway();

  // Serves connections on `port` until the promise is dropped. At most max_connections are
  // open at once (server.max_connections, counted apart from the RPC listener's): a connection
  // beyond them is answered 503 with Retry-After and closed. A connection idle between requests
  // is closed after keep_alive, one whose headers trickle after 15 s.
  kj::Promise<void> listen(kj::ConnectionReceiver& port);
  void limit_connections(int32_t max_connections) { max_connections_ = max_connections; }
  int32_t open_connections() const { return open_connections_; }
  int64_t refused_connections() const { return refused_connections_; }
  // Shutting down: /ready says 503, new generations are refused (503, shutting_down).
  void stop_accepting() { accepting_ = false; }
  // Generations whose response has not ended yet.
  size_t unfinished() const { return live_; }
  // Called with each generation's API key and outcome as it ends (the metrics).
  void observe_outcomes_with(std::function<void(const std::string&, const outcome&)> f) { observe_ = std::move(f); }
  // Extra routes served on this listener (GET only), such as /metrics: path -> body producer.
  using page = std::function<kj::Promise<std::pair<std::string, std::string>>()>;  // {content type, body}
  void add_page(std::string path, page p);

  struct generation;

 private:
  class connection_service;
  kj::Promise<void> handle(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                           kj::AsyncInputStream& body, kj::HttpService::Response& response,
                           class watched_stream& connection);
  kj::Promise<void> generate(int endpoint, std::string body, std::string api_key, uint64_t retry_token,
                             kj::HttpService::Response& response, class watched_stream& connection);
  kj::Promise<void> respond_json(kj::HttpService::Response& response, unsigned status, std::string body,
                                 const struct api_error* error = nullptr, const struct outcome* done = nullptr);
  kj::Promise<void> stream(std::shared_ptr<generation> g, kj::HttpService::Response& response);
  void refuse_connection(kj::Own<kj::AsyncIoStream> connection);

  runtime& rt_;
  kj_bridge& bridge_;
  kj::Timer& timer_;
  service_info info_;
  decode_limits limits_;
  size_t max_body_bytes_;
  bool accepting_ = true;
  size_t live_ = 0;
  int32_t max_connections_ = 256, open_connections_ = 0;
  int64_t refused_connections_ = 0;
  int64_t started_at_ = 0;  // unix seconds, for /v1/models
  std::mt19937_64 seeds_;
  std::vector<std::pair<std::string, page>> pages_;
  std::function<void(const std::string&, const outcome&)> observe_;
  kj::Own<kj::HttpHeaderTable> table_;
  struct header_ids;
  std::unique_ptr<header_ids> ids_;
  kj::Own<kj::HttpServer> server_;
  kj::TaskSet connections_;  // each open connection's HTTP loop; destroyed before server_
};

}  // namespace tireless
