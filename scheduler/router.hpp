#pragma once
// The fleet's endpoint picker: which replica a request goes to, from what each replica
// publishes (its admission's predicted first-token time for the request, whether its policy
// would refuse it, its queue and KV use), and prefix-cache affinity by a hash of the prompt's
// first tokens, as an inference gateway's endpoint picker filters and scores model servers.
// CAF-free; the virtual fleet and tests drive it.

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace tireless {

struct replica_view {
  bool up = true;
  bool would_refuse = false;     // its admission would refuse the request now
  double predicted_ttft_s = 0;   // its admission's prediction for the request's tier and prompt
  int32_t queued = 0;            // requests waiting, admission and engine
  double kv_utilization = 0;     // used KV blocks over all of them, 0..1
};

struct router_options {
  int32_t affinity_prefix_tokens = 64;   // the prompt prefix hashed for cache affinity (0: none)
  size_t affinity_entries = 65'536;      // prefixes remembered (least recently used dropped)
};

class router {
 public:
  explicit router(router_options o = {}) : o_(o) {}

  // The replica for a request: among those up whose admission would take it, the one with the
  // earliest predicted first token (fewest queued, then least KV use, then lowest index on
  // ties), unless the replica that last served the same prefix predicts a first token at most
  // `prefix_saving_s` later (the prefill its cached prefix saves, which the predictions do not
  // count); when every replica would refuse, the one that predicts the earliest first token
  // (it refuses with the fleet's best retry hint). Nothing when none is up.
  std::optional<int32_t> pick(std::span<const replica_view> replicas, uint64_t prefix_hash, double prefix_saving_s = 0);
  // The request went to `replica`: later requests with its prefix prefer it.
  void served(uint64_t prefix_hash, int32_t replica);
  // The replica is gone: its prefixes are forgotten.
  void forget(int32_t replica);

  // FNV-1a of the first affinity_prefix_tokens tokens (0 when affinity is off or the prompt is empty).
  uint64_t prefix_hash(std::span<const int32_t> prompt) const;
  int64_t affinity_hits() const { return hits_; }

 private:
  router_options o_;
  std::list<uint64_t> lru_;  // most recent first
  std::unordered_map<uint64_t, std::pair<int32_t, std::list<uint64_t>::iterator>> home_;
  int64_t hits_ = 0;
};

}  // namespace tireless
