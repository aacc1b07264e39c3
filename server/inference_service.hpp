#pragma once
// The Inference interface of protocol/tireless.capnp over an embedded runtime. Runs on the
// kj event loop's thread; the runtime's callbacks reach it through a kj_bridge, so neither
// side ever blocks the other. One inference_service serves every connection; each connection
// reaches it through its own connection_service (connection_manager.hpp), which tells it what
// that connection is doing.

#include <kj/async.h>
#include <kj/time.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "config/runtime_config.hpp"
#include "protocol/tireless.capnp.h"
#include "server/kj_bridge.hpp"
#include "server/request_decoder.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

// What one client connection is doing, as its calls tell it (loop thread only).
struct connection_activity {
  int32_t live = 0;         // its generations whose outcome has not reached it yet
  kj::TimePoint last_call = kj::origin<kj::TimePoint>();  // its latest call (or its connecting)
  int64_t calls = 0;
};

using generate_context = capnp::CallContext<rpc::Inference::GenerateParams, rpc::Inference::GenerateResults>;
using models_context = capnp::CallContext<rpc::Inference::ModelsParams, rpc::Inference::ModelsResults>;
using health_context = capnp::CallContext<rpc::Inference::HealthParams, rpc::Inference::HealthResults>;
using stats_context = capnp::CallContext<rpc::Inference::StatsParams, rpc::Inference::StatsResults>;

class inference_service {
 public:
  inference_service(runtime& rt, kj_bridge& bridge, const runtime_config& config, service_info info,
                    decode_limits limits);
  ~inference_service();

  // Shutting down: new generations are refused (rejected, shutting_down).
  void stop_accepting() { accepting_ = false; }
  bool accepting() const { return accepting_; }
  // Generations whose outcome has not reached their client yet (each holds its TokenSink).
  size_t unfinished() const;
  // Where health() learns how many connections are open.
  void count_connections_with(std::function<int32_t()> f) { connections_ = std::move(f); }
  // Called with each generation's API key and outcome as it ends (the metrics).
  void observe_outcomes_with(std::function<void(const std::string&, const outcome&)> f) { observe_ = std::move(f); }

  // The methods of Inference, for a call that arrived on a connection doing `conn`.
  kj::Promise<void> generate(generate_context context, const std::shared_ptr<connection_activity>& conn);
  kj::Promise<void> models(models_context context);
  kj::Promise<void> health(health_context context);
  kj::Promise<void> stats(stats_context context);

  struct generation_state;
  struct tenant_counters {
    int64_t completed = 0, rejected = 0, cancelled = 0, failed = 0, prompt_tokens = 0, completion_tokens = 0;
  };

 private:
  void finished(const std::string& tenant, const outcome& o);
  // Ends `s` with `o` (loop thread): its outcome goes to the client, then it lets go of the sink.
  void deliver(const std::shared_ptr<generation_state>& s, const outcome& o);
  // Holds `s` until its outcome has reached the client.
  void keep(const std::shared_ptr<generation_state>& s, std::weak_ptr<connection_activity> conn);

  runtime& rt_;
  kj_bridge& bridge_;
  service_info info_;
  decode_limits limits_;
  bool accepting_ = true;
  kj::TaskSet tasks_;
  std::map<std::string, std::string> tenant_of_key_;
  std::map<std::string, tenant_counters> counters_;
  tenant_counters all_;   // every outcome, whoever's
  int64_t received_ = 0;  // generate() calls
  std::map<uint64_t, std::shared_ptr<generation_state>> live_;
  uint64_t next_local_id_ = UINT64_MAX;  // ids of requests refused here, never given to the runtime
  std::thread::id loop_thread_;           // the kj loop's (the service is made on it)
  bool in_submit_ = false;
  std::optional<outcome> refused_now_;
  std::function<int32_t()> connections_;
  std::function<void(const std::string&, const outcome&)> observe_;
};

}  // namespace tireless
