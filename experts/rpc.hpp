#pragma once
// Expert shards in other processes: the ExpertShard interface served over Cap'n Proto RPC
// (tireless-shard), and the transport the attention shard's expert_exchange calls them with.

#include <capnp/capability.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "experts/exchange.hpp"
#include "protocol/runtime.capnp.h"

namespace tireless {

class expert_service;

// The server side: one per tireless-shard process.
kj::Own<proto::ExpertShard::Server> make_expert_shard_server(std::shared_ptr<expert_service> service);

// The client side: a thread of its own runs a kj event loop with one connection per shard
// address ("host:port", "unix:/path"); exchange() blocks the caller until every reply (or
// error) is in. A broken connection fails that shard's call; revive() reconnects.
class rpc_transport final : public expert_transport {
 public:
  // Connects to every address, waiting up to connect_wait for each (a shard still loading its
  // model is not yet listening). call_timeout bounds one call. Throws if a shard cannot be reached.
  rpc_transport(std::vector<std::string> addresses, std::chrono::milliseconds connect_wait,
                std::chrono::milliseconds call_timeout);
  ~rpc_transport() override;

  int32_t shards() const override;
  std::unique_ptr<in_flight> send(const std::vector<const owned<proto::ExpertRequest>*>& requests) override;
  bool sends_without_waiting() const override { return true; }
  std::vector<reply> exchange(const std::vector<const owned<proto::ExpertRequest>*>& requests) override;
  bool revive(int32_t shard, std::chrono::milliseconds wait) override;
  void hold(int32_t shard, const std::vector<int32_t>& keys) override;

  struct shard_info {
    std::string model;
    int32_t layers = 0, experts = 0, width = 0;
    std::vector<int32_t> held;  // keys
    int64_t pid = 0;
  };
  shard_info info(int32_t shard);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// The placement a set of shards already holds, from their info (experts they hold in every
// layer): each key's holders, in shard order. Throws if some expert is held nowhere or the
// shards disagree on the model.
expert_placement placement_of(const std::vector<rpc_transport::shard_info>& shards);

// Connects to the shards (waiting up to `wait` for each), checks they serve `m`, and returns
// the exchange over them with the placement they hold.
std::unique_ptr<expert_exchange> make_rpc_expert_exchange(std::shared_ptr<const model> m,
                                                          const std::vector<std::string>& addresses,
                                                          std::chrono::milliseconds wait, expert_exchange_options o);

}  // namespace tireless
