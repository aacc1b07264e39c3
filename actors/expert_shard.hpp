#pragma once
// Expert shards as actors in this process: each owns some of a mixture-of-experts model's
// experts and answers ExpertRequests with the same service a tireless-shard process runs
// (experts/expert_service.hpp). The transport is what experts/exchange.hpp dispatches over;
// reviving a shard spawns a fresh actor (the supervisor's job) with its experts.

#include <caf/fwd.hpp>

#include <memory>
#include <vector>

#include "experts/exchange.hpp"

namespace tireless {

class model;

class actor_expert_transport final : public expert_transport {
 public:
  // `shards` actors, expert e of every layer on shard e % shards.
  actor_expert_transport(caf::actor_system& sys, std::shared_ptr<const model> m, int shards, int64_t max_pairs);
  ~actor_expert_transport() override;

  int32_t shards() const override;
  std::vector<reply> exchange(const std::vector<const owned<proto::ExpertRequest>*>& requests) override;
  bool revive(int32_t shard, std::chrono::milliseconds wait) override;
  void hold(int32_t shard, const std::vector<int32_t>& keys) override;

  void crash_shard_for_test(int shard);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// The exchange over in-process shard actors, as the runtime wires it for backend.expert_shards.
std::unique_ptr<expert_exchange> make_actor_expert_exchange(caf::actor_system& sys, std::shared_ptr<const model> m,
                                                            int shards, int64_t max_tokens, expert_exchange_options o);

}  // namespace tireless
