#pragma once
// The Inference interface of protocol/tireless.capnp over an embedded runtime. Runs on the
// kj event loop's thread; the runtime's callbacks reach it through a kj_bridge, so neither
// side ever blocks the other.

#include <kj/async.h>

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

struct service_info {
  std::string model_name;
  std::string description;
  int32_t context_length = 0;
  int32_t vocab_size = 0;
};

// Fills a Common.Outcome from the runtime's outcome.
void fill_outcome(proto::Outcome::Builder b, const outcome& o);

class inference_service final : public rpc::Inference::Server {
 public:
  inference_service(runtime& rt, kj_bridge& bridge, const runtime_config& config, service_info info,
                    decode_limits limits);
  ~inference_service();

  // Shutting down: new generations are refused (rejected, shutting_down).
  void stop_accepting() { accepting_ = false; }
  // Generations whose outcome has not reached their client yet.
  size_t unfinished() const;

 protected:
  kj::Promise<void> generate(GenerateContext context) override;
  kj::Promise<void> models(ModelsContext context) override;
  kj::Promise<void> health(HealthContext context) override;
  kj::Promise<void> stats(StatsContext context) override;

 public:
  struct generation_state;
  struct tenant_counters {
    int64_t completed = 0, rejected = 0, cancelled = 0, failed = 0, prompt_tokens = 0, completion_tokens = 0;
  };

 private:
  void finished(const std::string& tenant, const outcome& o);

  runtime& rt_;
  kj_bridge& bridge_;
  const runtime_config& config_;
  service_info info_;
  decode_limits limits_;
  bool accepting_ = true;
  kj::TaskSet tasks_;
  std::map<std::string, std::string> tenant_of_key_;
  std::map<std::string, tenant_counters> counters_;
  std::shared_ptr<std::map<uint64_t, std::shared_ptr<generation_state>>> live_;
  uint64_t next_local_id_ = UINT64_MAX;  // ids of requests refused here, never given to the runtime
  std::thread::id loop_thread_;           // the kj loop's (the service is made on it)
  bool in_submit_ = false;
  std::optional<outcome> refused_now_;
};

}  // namespace tireless
