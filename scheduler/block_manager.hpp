#pragma once
// The accounting of a paged KV cache: a pool of fixed-size blocks, each sequence's block
// table, reference counts, and a prefix cache of full blocks found by the hash of their
// tokens (and of everything before them). The bytes live on a device; this class only
// decides which block holds what. CAF-free; the kv_manager actor wraps it.
//
// Invariants (check_invariants()): every block is exactly one of free-uncached,
// free-cached (reference count 0, still findable by its hash, evictable, least recently
// used first) or used (reference count = the number of tables holding it); free + used =
// total; a cached block's hash maps back to it.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer.hpp"

namespace tireless {

using block_id = int32_t;
using seq_id = uint64_t;

// The prefix-cache key of a full block: a hash chained over the previous block's key (0 for
// the first block) and the block's tokens [block_size]. A lookup never trusts the key alone:
// it also compares the tokens and the identity of the cached parent block, so a collision
// costs a cache miss, never wrong keys and values. Injectable so tests can force collisions.
using block_hasher = uint64_t (*)(uint64_t parent_hash, std::span<const token_id> tokens);
uint64_t default_block_hash(uint64_t parent_hash, std::span<const token_id> tokens);

struct block_manager_config {
  int32_t n_blocks = 0;
  int32_t block_size = 16;
  bool prefix_caching = true;
  // Blocks kept free for running sequences to grow into: admit() refuses new sequences that
  // would leave fewer than this many free.
  int32_t watermark_blocks = 0;
};

struct block_stats {
  int32_t total = 0;
  int32_t free = 0;         // free-uncached + free-cached
  int32_t cached_free = 0;  // free but still holding a reusable prefix
  int32_t used = 0;
  int64_t prefix_hit_blocks = 0;   // blocks reused from the prefix cache, cumulative
  int64_t prefix_miss_blocks = 0;  // full prompt blocks looked up and not found, cumulative
  int64_t evictions = 0;           // cached blocks reclaimed for other contents, cumulative
};

class block_manager {
 public:
  // Throws std::invalid_argument for a config that cannot describe a pool.
  explicit block_manager(block_manager_config config, block_hasher hasher = default_block_hash);
  ~block_manager();
  block_manager(block_manager&&) noexcept;
  block_manager& operator=(block_manager&&) noexcept;

  const block_manager_config& config() const;

  // Blocks needed to hold n positions.
  int32_t blocks_for(int32_t n_positions) const;

  // Starts a sequence whose first tokens are `prompt`: attaches the longest run of cached
  // full blocks matching the prompt's leading full blocks (at most prompt.size() - 1 tokens
  // are reused, so the last prompt token is always computed) and allocates blocks for
  // `n_positions` positions in all. Returns the number of prompt tokens whose keys and values
  // are already cached, or nullopt (and changes nothing) when the blocks are not available
  // without going below the watermark.
  std::optional<int32_t> admit(seq_id seq, std::span<const token_id> prompt, int32_t n_positions);

  // Grows a running sequence's table to hold n_positions positions, ignoring the watermark.
  // false (and no change) when the pool has too few free blocks.
  bool grow(seq_id seq, int32_t n_positions);
  bool can_grow(seq_id seq, int32_t n_positions) const;

  // Before the backend writes positions [first, last] of seq: every block in that range that
  // is shared with another table (or held by the prefix cache) is replaced in this table by a
  // fresh copy. Appends to `copies` the (source, destination) copies the backend must make
  // first. false when no free block is left for a copy (nothing changed). Blocks written from
  // `first` on are no longer part of seq's registered prefix; commit() registers them again.
  bool prepare_write(seq_id seq, int32_t first, int32_t last,
                     std::vector<std::pair<block_id, block_id>>& copies);

  // After positions [0, n_computed) of seq hold `tokens[0, n_computed)`: registers its full
  // blocks in the prefix cache (no-op without prefix caching).
  void commit(seq_id seq, std::span<const token_id> tokens, int32_t n_computed);
  // The same with the tokens from full block `first_block` on only (positions
  // [first_block * block_size, n_computed)): the blocks before it were committed earlier.
  // Registers nothing when the sequence's registered prefix ends before first_block.
  void commit_from(seq_id seq, int32_t first_block, std::span<const token_id> tokens, int32_t n_computed);

  // Ends a sequence (finished, cancelled or preempted): drops its references. Blocks that
  // hold a cached prefix stay findable until evicted.
  void release(seq_id seq);

  bool has(seq_id seq) const;
  std::span<const block_id> table(seq_id seq) const;  // empty for an unknown sequence
  block_stats stats() const;

  // For tests and diagnostics: the number of tables holding block b, and whether b is
  // registered in the prefix cache (findable by its hash).
  int32_t ref_count(block_id b) const;
  bool is_cached(block_id b) const;

  // Throws std::logic_error describing the first broken invariant.
  void check_invariants() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tireless
