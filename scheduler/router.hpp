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
  double ttft_target_s = 0;      // the request's tier's first-token target (0: none)
  int32_t outstanding = 0;       // requests the router sent there that have no outcome yet
  int32_t queued = 0;            // requests waiting, admission and engine
};

struct router_options {
  int32_t affinity_prefix_tokens = 64;   // the prompt prefix hashed for cache affinity (0: none)
  size_t affinity_entries = 65'536;      // prefixes remembered (least recently used dropped)
};

class router {
 public:
  explicit router(router_options o = {}) : o_(o) {}

  // The replica for a request. Among those up whose admission would take it and that predict
  // its first token within its tier's target: the fewest outstanding (least connections, as a
  // load balancer counts them; the decodes a replica runs set every stream's pace), then the
  // earliest predicted first token, then the lowest index; the replica that last served the
  // same prefix instead, while it is among them with at most one more outstanding and a
  // predicted first token at most `prefix_saving_s` (the prefill its cached prefix saves) later.
  // None predicted in time: the earliest predicted first token among those that would take
  // it. Every replica would refuse: the one predicting the earliest first token (it refuses
  // with the fleet's best retry hint). Nothing when none is up.
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
