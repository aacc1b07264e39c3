#pragma once
// What admission expects the engine's prefix cache to hold for a prompt, before the engine
// sees it: the block hashes of the prompts it sent the engine lately (the prefix-cache
// scorer of the Kubernetes Gateway API Inference Extension keeps such an index per server).
// A prompt whose leading blocks were sent before is expected to find them cached, so its
// feasibility is judged by the rest: an agent's 4k-token system prompt, cached, is not an
// infeasible prompt. An estimate, never trusted for keys and values: the engine's block
// manager decides what is really reused (an evicted block costs only a wrong expectation).
//
// Blocks are keyed as the block manager keys them (default_block_hash, chained from the first
// block), and forgotten least recently used first beyond `capacity_blocks` (the KV pool's
// size: the engine cannot hold more). Prompts only: the generated tokens a multi-turn client
// sends back are not known here, so its history reads as uncached (conservative).

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>

#include "scheduler/block_manager.hpp"

namespace tireless {

class prefix_index {
 public:
  // block_size <= 0 or capacity_blocks <= 0: an index that expects nothing cached.
  prefix_index(int32_t block_size = 0, int64_t capacity_blocks = 0);

  // Leading prompt tokens in full blocks recorded before, at most prompt.size() - 1 (the
  // engine always computes the last prompt token, as block_manager::admit reuses).
  int32_t cached_tokens(std::span<const token_id> prompt) const;
  // The prompt went to the engine: its full blocks are expected cached from now on.
  void record(std::span<const token_id> prompt);

  bool enabled() const { return capacity_ > 0; }
  int64_t size() const { return static_cast<int64_t>(order_.size()); }

 private:
  int32_t block_size_;
  int64_t capacity_;
  std::list<uint64_t> order_;  // most recently recorded first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

}  // namespace tireless
