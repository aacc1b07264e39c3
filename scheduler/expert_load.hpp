#pragma once
// How evenly a mixture of experts' tokens fall on its experts and on the shards that hold
// them: the measure the rebalancer (issue 13) works against. Pure functions of the counts a
// backend keeps (backend::expert_tokens()).

#include <cstdint>
#include <span>
#include <vector>

namespace tireless {

// Where each expert lives: shard_of[e] for expert e. The default spread puts expert e on
// shard e % shards, as the in-process expert shards do.
std::vector<int32_t> round_robin_placement(int32_t n_expert, int32_t shards);

struct expert_load_summary {
  int64_t routed = 0;                 // token-expert pairs counted, all layers
  // Per layer, max over mean of tokens per expert and per shard, averaged over the layers
  // that routed anything, and the worst layer's; 1 is perfectly even.
  double expert_imbalance = 1, expert_imbalance_worst = 1;
  double shard_imbalance = 1, shard_imbalance_worst = 1;
  std::vector<int64_t> per_expert;    // summed over layers
  std::vector<int64_t> per_shard;     // summed over layers
};

// counts: [layer][expert] flattened, as backend::expert_tokens() returns them.
expert_load_summary summarize_expert_load(std::span<const int64_t> counts, int32_t n_expert,
                                          std::span<const int32_t> shard_of);

}  // namespace tireless
