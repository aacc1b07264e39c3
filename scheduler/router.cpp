#include "scheduler/router.hpp"

#include <algorithm>
#include <tuple>

namespace tireless {

namespace {

bool earlier(const replica_view& a, const replica_view& b) {
  return std::tie(a.predicted_ttft_s, a.outstanding, a.queued) < std::tie(b.predicted_ttft_s, b.outstanding, b.queued);
}

bool less_busy(const replica_view& a, const replica_view& b) {
  return std::tie(a.outstanding, a.predicted_ttft_s, a.queued) < std::tie(b.outstanding, b.predicted_ttft_s, b.queued);
}

bool in_time(const replica_view& r) { return r.ttft_target_s <= 0 || r.predicted_ttft_s <= r.ttft_target_s; }

}  // namespace

std::optional<int32_t> router::pick(std::span<const replica_view> replicas, uint64_t prefix_hash, double prefix_saving_s) {
  std::optional<int32_t> best, earliest, earliest_refusing;
  const auto at = [&](int32_t i) -> const replica_view& { return replicas[static_cast<size_t>(i)]; };
  for (int32_t i = 0; i < static_cast<int32_t>(replicas.size()); ++i) {
    const replica_view& r = at(i);
    if (!r.up) continue;
    if (r.would_refuse) {
      if (!earliest_refusing || earlier(r, at(*earliest_refusing))) earliest_refusing = i;
      continue;
    }
    if (!earliest || earlier(r, at(*earliest))) earliest = i;
    if (in_time(r) && (!best || less_busy(r, at(*best)))) best = i;
  }
  if (!best) return earliest ? earliest : earliest_refusing;
  if (prefix_hash != 0) {
    auto it = home_.find(prefix_hash);
    if (it != home_.end()) {
      const int32_t home = it->second.first;
      if (home >= 0 && home < static_cast<int32_t>(replicas.size())) {
        const replica_view& h = at(home);
        if (h.up && !h.would_refuse && in_time(h) && h.outstanding <= at(*best).outstanding + 1 &&
            h.predicted_ttft_s <= at(*best).predicted_ttft_s + prefix_saving_s) {
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
