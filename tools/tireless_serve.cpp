// tireless-serve: serves a model to Cap'n Proto RPC clients (protocol/tireless.capnp) and, with
// server.http_listen, to OpenAI-style HTTP clients (server/http_gateway.hpp).
//
//   tireless-serve [--config config/tireless.toml] [--listen 127.0.0.1:7433 | --port N]
//                  [--http-listen 127.0.0.1:8000 | --http-port N]
//                  [--metrics-listen 127.0.0.1:9433 | --metrics-port N] ...
//
// Prints "listening on HOST:PORT" on stdout once it accepts connections, then "http listening
// on HOST:PORT" when HTTP is on and "metrics listening on HOST:PORT" when Prometheus metrics
// have their own listener (server.metrics_listen; they are also at /metrics on the HTTP one). SIGTERM or SIGINT: stops accepting (HTTP /ready says 503 and
// new requests are refused with 503), lets running requests finish for
// server.shutdown_grace_ms, cancels the rest (each client gets its outcome) and exits 0.
#include <CLI/CLI.hpp>
#include <prometheus/exposer.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "model/model.hpp"
#include "server/connection_manager.hpp"
#include "server/http_gateway.hpp"
#include "server/server_metrics.hpp"
#include "server/inference_service.hpp"
#include "tireless/runtime.hpp"

namespace {

using namespace tireless;

// The largest message a client may send (Cap'n Proto's default traversal limit): a request
// under it always gets an outcome, however bad it is.
constexpr size_t transport_limit_bytes = size_t{64} << 20;

struct cli_overrides {
  std::string listen, http_listen, metrics_listen, log_level, model, backend, sim_profile;
  int port = -1, http_port = -1, metrics_port = -1;
  int threads = -1;
};

std::pair<std::string, unsigned> split_host_port(const std::string& listen) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("server.listen '" + listen + "' is not HOST:PORT");
  return {listen.substr(0, colon), static_cast<unsigned>(std::stoul(listen.substr(colon + 1)))};
}

// Applies the command line on top of the file; the result is validated again as a whole.
runtime_config configure(const std::string& path, const cli_overrides& o) {
  runtime_config c = load_config(path);
  if (!o.listen.empty()) c.server.listen = o.listen;
  if (o.port >= 0) c.server.listen = split_host_port(c.server.listen).first + ":" + std::to_string(o.port);
  if (!o.http_listen.empty()) c.server.http_listen = o.http_listen;
  if (o.http_port >= 0) {
    const std::string& base = c.server.http_listen.empty() ? c.server.listen : c.server.http_listen;
    c.server.http_listen = split_host_port(base).first + ":" + std::to_string(o.http_port);
  }
  if (!o.metrics_listen.empty()) c.server.metrics_listen = o.metrics_listen;
  if (o.metrics_port >= 0) {
    const std::string& base = c.server.metrics_listen.empty() ? c.server.listen : c.server.metrics_listen;
    c.server.metrics_listen = split_host_port(base).first + ":" + std::to_string(o.metrics_port);
  }
  if (!o.model.empty()) c.model.path = o.model;
  if (!o.backend.empty()) {
    if (o.backend == "cpu") c.backend.kind = backend_kind::cpu;
    else if (o.backend == "sim") c.backend.kind = backend_kind::sim;
    else if (o.backend == "cuda") c.backend.kind = backend_kind::cuda;
    else if (o.backend == "auto") c.backend.kind = backend_kind::automatic;
    else throw std::runtime_error("--backend " + o.backend + ": use cpu, sim, cuda or auto");
  }
  if (!o.sim_profile.empty()) c.backend.sim_profile = o.sim_profile;
  if (o.threads >= 0) c.backend.threads = o.threads;
  if (!o.log_level.empty()) {
    const auto level = spdlog::level::from_str(o.log_level);
    if (level == spdlog::level::off && o.log_level != "off")
      throw std::runtime_error("--log-level " + o.log_level + ": use trace, debug, info, warn, error or off");
    c.server.log_level = static_cast<log_level>(level);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Serve a model to Cap'n Proto RPC and OpenAI-style HTTP clients"};
  std::string config_path = "config/tireless.toml";
  cli_overrides o;
  app.add_option("-c,--config", config_path, "TOML configuration")->capture_default_str();
  app.add_option("--listen", o.listen, "HOST:PORT (overrides server.listen)");
  app.add_option("--port", o.port, "port on the configured host; 0 picks a free one")->check(CLI::Range(0, 65535));
  app.add_option("--http-listen", o.http_listen, "HOST:PORT of the OpenAI-style HTTP API (overrides server.http_listen)");
  app.add_option("--http-port", o.http_port, "HTTP on this port of the HTTP (or RPC) host; 0 picks a free one")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics-listen", o.metrics_listen, "HOST:PORT of Prometheus /metrics (overrides server.metrics_listen)");
  app.add_option("--metrics-port", o.metrics_port, "metrics on this port of the metrics (or RPC) host; 0 picks a free one")
      ->check(CLI::Range(0, 65535));
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error, off");
  app.add_option("--model", o.model, "GGUF model file (overrides model.path)");
  app.add_option("--backend", o.backend, "cpu, sim, cuda or auto (overrides backend.kind)");
  app.add_option("--sim-profile", o.sim_profile, "sim cost model (overrides backend.sim_profile)");
  app.add_option("--threads", o.threads, "CPU threads (overrides backend.threads)");
  bool check_only = false;
  app.add_flag("--check-config", check_only, "validate the configuration, print its warnings, and exit (0: valid)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("tireless"));  // stdout carries "listening on"

  // Before any thread exists, so every later thread inherits the blocked signals.
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  std::signal(SIGPIPE, SIG_IGN);

  runtime_config config;
  std::unique_ptr<runtime> rt;
  try {
    config = configure(config_path, o);
    spdlog::set_level(static_cast<spdlog::level::level_enum>(config.server.log_level));
    for (const auto& w : config.warnings) spdlog::warn("{}", w);
    if (check_only) {
      std::printf("%s: valid\n", config_path.c_str());
      return 0;
    }
    rt = runtime::start(config);
  } catch (const std::exception& e) {
    std::cerr << "tireless-serve: " << e.what() << "\n";
    return 1;
  }
  spdlog::info("serving {}", rt->describe());

  auto io = kj::setupAsyncIo();
  kj_bridge bridge;
  auto pump = bridge.pump().eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::error("bridge failed: {}", e.getDescription().cStr());
  });
  service_info info;
  info.model_name = config.model.name;
  info.description = rt->describe();
  decode_limits limits;
  limits.model_name = config.model.name;
  limits.default_timeout = config.session.request_timeout;
  limits.stream_window = config.session.stream_buffer_tokens;
  if (config.backend.kind != backend_kind::sim) {
    // The model is open inside the runtime; its facts for models() come from the file again.
    std::shared_ptr<const model> m = model::load(config.model.path);
    info.context_length = m->config().n_ctx_train;
    info.vocab_size = m->config().n_vocab;
    info.token_bytes = [m](int32_t t) { return std::string(m->tok().token_bytes(t)); };
  }
  limits.max_prompt_bytes = rt->max_prompt().text_bytes;
  limits.max_prompt_tokens = rt->max_prompt().tokens;
  server_metrics metrics(config, config.kv.block_size);
  auto observe = [&metrics](const std::string& key, const outcome& o) { metrics.observe(key, o); };
  inference_service service(*rt, bridge, config, info, limits);
  service.observe_outcomes_with(observe);
  connection_limits cl;
  cl.max_connections = config.server.max_connections;
  cl.max_per_peer = config.server.max_connections_per_peer;
  cl.idle_timeout = config.server.idle_timeout.count() * kj::MILLISECONDS;
  cl.handshake_timeout = config.server.handshake_timeout.count() * kj::MILLISECONDS;
  cl.reader.traversalLimitInWords = transport_limit_bytes / sizeof(capnp::word);
  auto connections = kj::heap<connection_manager>(io.provider->getTimer(), service, cl);

  kj::Own<kj::ConnectionReceiver> listener;
  try {
    auto [host, port] = split_host_port(config.server.listen);
    auto address = io.provider->getNetwork().parseAddress(host, port).wait(io.waitScope);
    listener = address->listen();
    std::printf("listening on %s:%u\n", host.c_str(), listener->getPort());
    std::fflush(stdout);
    spdlog::info("listening on {}:{}", host, listener->getPort());
  } catch (const kj::Exception& e) {
    std::cerr << "tireless-serve: cannot listen on " << config.server.listen << ": " << e.getDescription().cStr() << "\n";
    return 1;
  }
  auto accepting = connections->listen(*listener).eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::error("accept failed: {}", e.getDescription().cStr());
  });

  kj::Own<http_gateway> http;
  kj::Own<kj::ConnectionReceiver> http_listener;
  kj::Promise<void> http_accepting = kj::READY_NOW;
  if (!config.server.http_listen.empty()) {
    http = kj::heap<http_gateway>(*rt, bridge, io.provider->getTimer(), info, limits, config.server.http_keep_alive);
    http->observe_outcomes_with(observe);
    http->limit_connections(config.server.max_connections);
    http->add_page("/metrics", [&rt, &metrics] {
      return runtime_stats_promise(*rt).then([&metrics](runtime_stats s) {
        metrics.update(s);
        return std::pair<std::string, std::string>("text/plain; version=0.0.4; charset=utf-8", metrics.text());
      });
    });
    try {
      auto [host, port] = split_host_port(config.server.http_listen);
      http_listener = io.provider->getNetwork().parseAddress(host, port).wait(io.waitScope)->listen();
      std::printf("http listening on %s:%u\n", host.c_str(), http_listener->getPort());
      std::fflush(stdout);
      spdlog::info("http listening on {}:{}", host, http_listener->getPort());
    } catch (const kj::Exception& e) {
      std::cerr << "tireless-serve: cannot listen on " << config.server.http_listen << ": "
                << e.getDescription().cStr() << "\n";
      return 1;
    }
    http_accepting = http->listen(*http_listener).eagerlyEvaluate([](kj::Exception&& e) {
      spdlog::error("http accept failed: {}", e.getDescription().cStr());
    });
  }

  // Prometheus metrics on their own listener: prometheus-cpp's exposer (its own threads) asks
  // the runtime for its state at each scrape.
  std::unique_ptr<prometheus::Exposer> exposer;
  auto scraped = std::make_shared<scraped_metrics>(*rt, metrics);
  if (!config.server.metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(config.server.metrics_listen);
      exposer->RegisterCollectable(scraped);
      const auto host = split_host_port(config.server.metrics_listen).first;
      const auto ports = exposer->GetListeningPorts();
      std::printf("metrics listening on %s:%d\n", host.c_str(), ports.empty() ? 0 : ports.front());
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::cerr << "tireless-serve: cannot serve metrics on " << config.server.metrics_listen << ": " << e.what() << "\n";
      return 1;
    }
  }

  io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT)).wait(io.waitScope);
  spdlog::info("stopping: no new requests; {} ms for running ones", config.server.shutdown_grace.count());
  accepting = kj::READY_NOW;  // stop accepting connections
  listener = nullptr;
  service.stop_accepting();
  if (http) http->stop_accepting();  // still answers: /ready says 503 while running requests finish
  auto stopped = kj::newPromiseAndCrossThreadFulfiller<void>();
  kj::CrossThreadPromiseFulfiller<void>* fulfiller = stopped.fulfiller.get();
  std::thread stopper([&rt, &config, fulfiller] {
    rt->shutdown(config.server.shutdown_grace);  // every request gets its outcome
    fulfiller->fulfill();
  });
  stopped.promise.wait(io.waitScope);
  stopper.join();
  // Deliver the outcomes that are still on their way to clients, for a moment at most.
  auto unfinished = [&] { return service.unfinished() + (http ? http->unfinished() : 0); };
  for (int i = 0; i < 200 && unfinished() > 0; ++i) {
    io.provider->getTimer().afterDelay(10 * kj::MILLISECONDS).wait(io.waitScope);
  }
  if (unfinished() > 0) spdlog::warn("{} outcomes did not reach their clients in time", unfinished());
  connections = nullptr;  // closes every connection
  http_accepting = kj::READY_NOW;
  http_listener = nullptr;
  http = nullptr;
  exposer = nullptr;
  spdlog::info("stopped");
  return 0;
}
