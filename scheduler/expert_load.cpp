#include "scheduler/expert_load.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace tireless {

std::vector<int32_t> round_robin_placement(int32_t n_expert, int32_t shards) {
  if (n_expert < 0 || shards < 1) throw std::invalid_argument("round_robin_placement: needs experts >= 0 and shards >= 1");
  std::vector<int32_t> shard_of(static_cast<size_t>(n_expert));
  for (int32_t e = 0; e < n_expert; ++e) shard_of[static_cast<size_t>(e)] = e % shards;
  return shard_of;
}

namespace {

// max / mean of `v` (1 when it is empty or all zero).
double max_over_mean(const std::vector<int64_t>& v) {
  const int64_t total = std::accumulate(v.begin(), v.end(), int64_t{0});
  if (v.empty() || total == 0) return 1.0;
  return static_cast<double>(*std::max_element(v.begin(), v.end())) * static_cast<double>(v.size()) /
         static_cast<double>(total);
}

}  // namespace

expert_load_summary summarize_expert_load(std::span<const int64_t> counts, int32_t n_expert,
                                          std::span<const int32_t> shard_of) {
  if (n_expert < 1 || counts.size() % static_cast<size_t>(n_expert) != 0 || shard_of.size() != static_cast<size_t>(n_expert)) {
    throw std::invalid_argument("summarize_expert_load: counts must be whole layers of n_expert, one shard per expert");
  }
  const int32_t shards = shard_of.empty() ? 0 : *std::max_element(shard_of.begin(), shard_of.end()) + 1;
  expert_load_summary s;
  s.per_expert.assign(static_cast<size_t>(n_expert), 0);
  s.per_shard.assign(static_cast<size_t>(shards), 0);
  double expert_sum = 0, shard_sum = 0;
  int layers = 0;
  std::vector<int64_t> layer_shard(static_cast<size_t>(shards));
  for (size_t from = 0; from < counts.size(); from += static_cast<size_t>(n_expert)) {
    const std::vector<int64_t> layer(counts.begin() + static_cast<ptrdiff_t>(from),
                                     counts.begin() + static_cast<ptrdiff_t>(from) + n_expert);
    std::fill(layer_shard.begin(), layer_shard.end(), 0);
    for (int32_t e = 0; e < n_expert; ++e) {
      const int64_t n = layer[static_cast<size_t>(e)];
      s.per_expert[static_cast<size_t>(e)] += n;
      s.per_shard[static_cast<size_t>(shard_of[static_cast<size_t>(e)])] += n;
      layer_shard[static_cast<size_t>(shard_of[static_cast<size_t>(e)])] += n;
      s.routed += n;
    }
    if (std::accumulate(layer.begin(), layer.end(), int64_t{0}) == 0) continue;
    ++layers;
    const double ei = max_over_mean(layer), si = max_over_mean(layer_shard);
    expert_sum += ei;
    shard_sum += si;
    s.expert_imbalance_worst = layers == 1 ? ei : std::max(s.expert_imbalance_worst, ei);
    s.shard_imbalance_worst = layers == 1 ? si : std::max(s.shard_imbalance_worst, si);
  }
  if (layers > 0) {
    s.expert_imbalance = expert_sum / layers;
    s.shard_imbalance = shard_sum / layers;
  }
  return s;
}

}  // namespace tireless
