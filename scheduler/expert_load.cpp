#include "scheduler/expert_load.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

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

namespace tireless {

expert_placement expert_placement::round_robin(int32_t layers, int32_t n_expert, int32_t shards) {
  if (layers < 1 || n_expert < 1 || shards < 1) {
    throw std::invalid_argument("expert_placement: needs layers, experts and shards >= 1");
  }
  expert_placement p;
  p.layers_ = layers;
  p.n_expert_ = n_expert;
  p.shards_ = shards;
  p.holders_.resize(static_cast<size_t>(layers) * n_expert);
  for (int32_t l = 0; l < layers; ++l) {
    for (int32_t e = 0; e < n_expert; ++e) p.holders_[p.key(l, e)] = {e % shards};
  }
  return p;
}

expert_placement expert_placement::from_holders(int32_t layers, int32_t n_expert, int32_t shards,
                                                std::vector<std::vector<int32_t>> holders) {
  expert_placement p = round_robin(layers, n_expert, shards);
  if (holders.size() != p.holders_.size()) throw std::invalid_argument("expert_placement: one holder list per key");
  for (size_t k = 0; k < holders.size(); ++k) {
    if (holders[k].empty()) {
      throw std::invalid_argument("expert " + std::to_string(k % n_expert) + " of layer " + std::to_string(k / n_expert) +
                                  " is held by no shard");
    }
    for (int32_t s : holders[k]) {
      if (s < 0 || s >= shards) throw std::invalid_argument("expert_placement: holder out of range");
    }
  }
  p.holders_ = std::move(holders);
  return p;
}

bool expert_placement::holds(int32_t shard, int32_t layer, int32_t e) const {
  const auto& h = holders(layer, e);
  return std::find(h.begin(), h.end(), shard) != h.end();
}

std::vector<int32_t> expert_placement::keys_of(int32_t shard) const {
  std::vector<int32_t> keys;
  for (size_t k = 0; k < holders_.size(); ++k) {
    if (std::find(holders_[k].begin(), holders_[k].end(), shard) != holders_[k].end()) keys.push_back(static_cast<int32_t>(k));
  }
  return keys;
}

int32_t expert_placement::replicas() const {
  int32_t n = 0;
  for (const auto& h : holders_) n += static_cast<int32_t>(h.size()) - 1;
  return n;
}

void expert_placement::add(int32_t shard, int32_t layer, int32_t e) {
  if (shard < 0 || shard >= shards_) throw std::out_of_range("expert_placement::add: no such shard");
  if (!holds(shard, layer, e)) holders_[key(layer, e)].push_back(shard);
}

std::vector<int32_t> expert_placement::fence(int32_t shard, std::span<const char> live) {
  std::vector<int64_t> held(static_cast<size_t>(shards_), 0);
  for (const auto& h : holders_) {
    for (int32_t s : h) ++held[static_cast<size_t>(s)];
  }
  std::vector<int32_t> moved;
  for (size_t k = 0; k < holders_.size(); ++k) {
    auto& h = holders_[k];
    const auto it = std::find(h.begin(), h.end(), shard);
    if (it == h.end()) continue;
    h.erase(it);
    bool covered = false;
    for (int32_t s : h) covered = covered || live[static_cast<size_t>(s)];
    if (covered) continue;
    int32_t best = -1;
    for (int32_t s = 0; s < shards_; ++s) {
      if (s == shard || !live[static_cast<size_t>(s)]) continue;
      if (best < 0 || held[static_cast<size_t>(s)] < held[static_cast<size_t>(best)]) best = s;
    }
    if (best < 0) throw std::runtime_error("no live expert shard is left to take over shard " + std::to_string(shard) + "'s experts");
    h.push_back(best);
    ++held[static_cast<size_t>(best)];
    moved.push_back(static_cast<int32_t>(k));
  }
  return moved;
}

std::vector<int32_t> assign_pairs(const expert_placement& p, int32_t layer, std::span<const int32_t> experts,
                                  std::span<const char> live, std::span<int64_t> load) {
  std::vector<int32_t> shard(experts.size(), -1);
  for (size_t i = 0; i < experts.size(); ++i) {
    int32_t best = -1;
    for (int32_t s : p.holders(layer, experts[i])) {
      if (!live[static_cast<size_t>(s)]) continue;
      if (best < 0 || load[static_cast<size_t>(s)] < load[static_cast<size_t>(best)]) best = s;
    }
    shard[i] = best;
    if (best >= 0) ++load[static_cast<size_t>(best)];
  }
  return shard;
}

namespace {

// One layer's expected tokens per shard when each expert's tokens split evenly over its holders.
std::vector<double> expected_layer_load(const expert_placement& p, int32_t layer, std::span<const int64_t> counts) {
  std::vector<double> load(static_cast<size_t>(p.shards()), 0.0);
  for (int32_t e = 0; e < p.n_expert(); ++e) {
    const auto& h = p.holders(layer, e);
    const double share = static_cast<double>(counts[static_cast<size_t>(p.key(layer, e))]) / static_cast<double>(h.size());
    for (int32_t s : h) load[static_cast<size_t>(s)] += share;
  }
  return load;
}

void check_counts(const expert_placement& p, std::span<const int64_t> counts) {
  if (counts.size() != static_cast<size_t>(p.layers()) * p.n_expert()) {
    throw std::invalid_argument("expert counts must be [layer][expert] of the placement's model");
  }
}

}  // namespace

expert_placement rebalance(const expert_placement& base, std::span<const int64_t> counts, int32_t replicas_per_shard) {
  check_counts(base, counts);
  expert_placement p = base;
  for (int32_t l = 0; l < p.layers(); ++l) {
    std::vector<int32_t> added(static_cast<size_t>(p.shards()), 0);
    for (;;) {
      const std::vector<double> load = expected_layer_load(p, l, counts);
      const auto busiest_at = std::max_element(load.begin(), load.end());
      const double busiest = *busiest_at;
      const auto b = static_cast<int32_t>(busiest_at - load.begin());
      // the busiest shard's expert with the most tokens per holder that another shard can take
      int32_t hot = -1, to = -1;
      double hot_share = 0;
      for (int32_t e = 0; e < p.n_expert(); ++e) {
        if (!p.holds(b, l, e)) continue;
        const double share = static_cast<double>(counts[static_cast<size_t>(p.key(l, e))]) /
                             static_cast<double>(p.holders(l, e).size());
        if (share <= hot_share) continue;
        int32_t best = -1;
        for (int32_t s = 0; s < p.shards(); ++s) {
          if (added[static_cast<size_t>(s)] >= replicas_per_shard || p.holds(s, l, e)) continue;
          if (best < 0 || load[static_cast<size_t>(s)] < load[static_cast<size_t>(best)]) best = s;
        }
        if (best < 0) continue;
        hot = e, to = best, hot_share = share;
      }
      if (hot < 0) break;
      expert_placement next = p;
      next.add(to, l, hot);
      const std::vector<double> after = expected_layer_load(next, l, counts);
      if (*std::max_element(after.begin(), after.end()) >= busiest) break;  // no longer helps
      p = std::move(next);
      ++added[static_cast<size_t>(to)];
    }
  }
  return p;
}

double expected_shard_imbalance(const expert_placement& p, std::span<const int64_t> counts) {
  check_counts(p, counts);
  double sum = 0;
  int layers = 0;
  for (int32_t l = 0; l < p.layers(); ++l) {
    const std::vector<double> load = expected_layer_load(p, l, counts);
    const double total = std::accumulate(load.begin(), load.end(), 0.0);
    if (total <= 0) continue;
    sum += *std::max_element(load.begin(), load.end()) * static_cast<double>(load.size()) / total;
    ++layers;
  }
  return layers > 0 ? sum / layers : 1.0;
}

}  // namespace tireless
