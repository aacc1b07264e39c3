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

// Where every layer's experts live, replicas included: holders(layer, e) lists the shards
// that hold expert e of that layer, its home first. An expert's key is layer * n_expert + e.
class expert_placement {
 public:
  expert_placement() = default;
  // Expert e of every layer on shard e % shards (its home), no replicas.
  static expert_placement round_robin(int32_t layers, int32_t n_expert, int32_t shards);
  // holders[key] for every key, each non-empty (throws std::invalid_argument otherwise).
  static expert_placement from_holders(int32_t layers, int32_t n_expert, int32_t shards,
                                       std::vector<std::vector<int32_t>> holders);

  int32_t layers() const { return layers_; }
  int32_t n_expert() const { return n_expert_; }
  int32_t shards() const { return shards_; }
  const std::vector<int32_t>& holders(int32_t layer, int32_t e) const { return holders_[key(layer, e)]; }
  bool holds(int32_t shard, int32_t layer, int32_t e) const;
  int32_t key(int32_t layer, int32_t e) const { return layer * n_expert_ + e; }
  std::vector<int32_t> keys_of(int32_t shard) const;  // what a shard must hold, ascending
  int32_t replicas() const;                           // holders beyond the homes, all keys
  // Adds `shard` as a holder of (layer, e), after the ones it has (no-op if it holds it).
  void add(int32_t shard, int32_t layer, int32_t e);
  // Takes a shard out (fenced): its experts keep their other holders; the ones it alone held
  // move to the live shard that holds the fewest keys. Returns the keys that moved.
  std::vector<int32_t> fence(int32_t shard, std::span<const char> live);

 private:
  int32_t layers_ = 0, n_expert_ = 0, shards_ = 0;
  std::vector<std::vector<int32_t>> holders_;  // [key]
};

// Sends each (token, expert) pair of one layer to a live shard that holds its expert: the
// holder with the fewest pairs so far (`load`, per shard, carried across calls so a step's
// layers and the steps after even out; ties go to the earlier holder). Returns the shard of
// each pair, or -1 where no live shard holds the expert.
std::vector<int32_t> assign_pairs(const expert_placement& p, int32_t layer, std::span<const int32_t> experts,
                                  std::span<const char> live, std::span<int64_t> load);

// The EPLB idea: replicate the hottest experts onto the least-loaded shards. counts is
// [layer][expert] as backend::expert_tokens() gives it; each shard takes up to
// replicas_per_shard extra experts per layer. Per layer, it repeatedly takes the busiest
// shard's expert with the most tokens per holder and gives it a replica on the least-loaded
// shard that does not hold it yet, while that lowers the layer's busiest shard.
expert_placement rebalance(const expert_placement& base, std::span<const int64_t> counts, int32_t replicas_per_shard);

// Per layer, max over mean of tokens per shard if each expert's tokens split evenly over its
// holders (what assign_pairs approaches), averaged over layers that routed anything.
double expected_shard_imbalance(const expert_placement& p, std::span<const int64_t> counts);

}  // namespace tireless
