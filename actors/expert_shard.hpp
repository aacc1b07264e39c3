#pragma once
// Expert shards: actors that each own a subset of a mixture-of-experts model's experts and
// answer, for one layer at a time, the routed tokens' expert outputs. remote_experts is the
// attention shard's side: the expert_ffn the CPU backend calls, which dispatches to the
// shards, gathers their outputs and combines them in slot order (so the result equals the
// single-process forward pass bit for bit). It restarts a shard that fails.

#include <caf/fwd.hpp>

#include <memory>
#include <vector>

#include "gpu/cpu/expert_ffn.hpp"

namespace tireless {

class model;

class remote_experts final : public cpu::expert_ffn {
 public:
  // Spawns `shards` expert shards over the model's experts (expert e on shard e % shards).
  remote_experts(caf::actor_system& sys, std::shared_ptr<const model> m, int shards, int64_t max_tokens);
  ~remote_experts() override;

  void run(const cpu::routed_tokens& tokens, float* out, int64_t ld_out) override;

  int restarts() const { return restarts_; }
  void crash_shard_for_test(int shard);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  int restarts_ = 0;
};

}  // namespace tireless
