#include "scheduler/router.hpp"

#include <algorithm>
#include <tuple>

namespace tireless {

namespace {

bool better(const replica_view& a, const replica_view& b) {
  return std::tie(a.predicted_ttft_s, a.queued, a.kv_utilization) < std::tie(b.predicted_ttft_s, b.queued, b.kv_utilization);
}

}  // namespace

std::optional<int32_t> router::pick(std::span<const replica_view> replicas, uint64_t prefix_hash, double prefix_saving_s) {
  std::optional<int32_t> best, best_refusing;
  for (int32_t i = 0; i < static_cast<int32_t>(replicas.size()); ++i) {
    const replica_view& r = replicas[static_cast<size_t>(i)];
    if (!r.up) continue;
    auto& slot = r.would_refuse ? best_refusing : best;
    if (!slot || better(r, replicas[static_cast<size_t>(*slot)])) slot = i;
  }
  if (!best) return best_refusing;
  if (prefix_hash != 0) {
    auto it = home_.find(prefix_hash);
    if (it != home_.end()) {
      const int32_t home = it->second.first;
      if (home >= 0 && home < static_cast<int32_t>(replicas.size())) {
        const replica_view& h = replicas[static_cast<size_t>(home)];
        if (h.up && !h.would_refuse &&
            h.predicted_ttft_s <= replicas[static_cast<size_t>(*best)].predicted_ttft_s + prefix_saving_s) {
          ++hits_;
          return home;
        }
      }
    }
  }
  return best;
}

void router::served(uint64_t prefix_hash, int32_t replica) {
  if (prefix_hash == 0 || o_.affinity_entries == 0) return;
  auto it = home_.find(prefix_hash);
  if (it != home_.end()) {
    lru_.erase(it->second.second);
    home_.erase(it);
  }
  lru_.push_front(prefix_hash);
  home_.emplace(prefix_hash, std::make_pair(replica, lru_.begin()));
  while (home_.size() > o_.affinity_entries) {
    home_.erase(lru_.back());
    lru_.pop_back();
  }
}

void router::forget(int32_t replica) {
  for (auto it = home_.begin(); it != home_.end();) {
    if (it->second.first == replica) {
      lru_.erase(it->second.second);
      it = home_.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t router::prefix_hash(std::span<const int32_t> prompt) const {
  if (o_.affinity_prefix_tokens <= 0 || prompt.empty()) return 0;
  const size_t n = std::min(prompt.size(), static_cast<size_t>(o_.affinity_prefix_tokens));
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    for (int b = 0; b < 4; ++b) {
      h ^= static_cast<uint64_t>((static_cast<uint32_t>(prompt[i]) >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  }
  return h == 0 ? 1 : h;
}

}  // namespace tireless
