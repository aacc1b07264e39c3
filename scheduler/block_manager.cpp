#include "scheduler/block_manager.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

// Choices:
// - One free queue, intrusive and doubly linked so a cached free block can leave it from the
//   middle when a new sequence attaches it. A block freed without a cached prefix goes to the
//   head and one that still holds a cached prefix goes to the tail, so the queue is always
//   [uncached ...][cached, least recently used first ...]: allocation pops the head and
//   evicts a cached block only when no uncached block is free (vLLM pops the LRU head
//   whatever it holds; an uncached block is worth nothing, so we spend it first).
// - release() frees a table last block first, so a sequence's deeper blocks are evicted
//   before the prefix they extend (a child is useless without its parent).
// - admit() reuses whole blocks only: at most (prompt.size() - 1) / block_size of them, so a
//   32-token prompt with block size 16 reuses one block and recomputes the second (as vLLM v1
//   does). It never attaches a block it would then have to copy to write the last token.
// - A cached block is identified by a generation number that is never reused; a cached block
//   records its parent's generation. A lookup accepts a block only if its tokens and its
//   parent's generation both match, so neither a hash collision nor a parent evicted and
//   reused for other tokens can attach wrong keys and values.
// - commit() keeps the block registered first when another block already holds the same
//   tokens after the same prefix: the newcomer stays private to its table and goes back to
//   the free queue uncached on release. When the key is taken by other contents (a collision,
//   or an orphan whose parent was evicted), a free holder gives the key up to the newcomer
//   and one in use keeps it.
// - Registered blocks are immutable: prepare_write() copies one even when no other table
//   holds it, so the cached prefix survives the write.

namespace tireless {

namespace {

constexpr block_id no_block = -1;

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct block {
  int32_t ref = 0;
  block_id prev = no_block;  // free queue links, meaningful while ref == 0
  block_id next = no_block;
  uint64_t hash = 0;        // prefix-cache key, meaningful while gen != 0
  uint64_t gen = 0;         // cache identity; 0 when not registered
  uint64_t parent_gen = 0;  // the identity of the cached block before it; 0 for the first
};

// A sequence's registered prefix, one link per full committed block: the block's key and the
// identity of the cached block holding those tokens (the table's own block or an equal one
// registered first).
struct chain_link {
  uint64_t hash = 0;
  uint64_t gen = 0;
};

struct sequence {
  std::vector<block_id> table;
  int32_t n_positions = 0;
  std::vector<chain_link> chain;
};

}  // namespace

uint64_t default_block_hash(uint64_t parent_hash, std::span<const token_id> tokens) {
  uint64_t h = mix64(parent_hash ^ 0x9e3779b97f4a7c15ULL);
  for (token_id t : tokens) h = mix64(h ^ (static_cast<uint32_t>(t) + 0x9e3779b97f4a7c15ULL));
  return h;
}

struct block_manager::impl {
  block_manager_config config;
  block_hasher hasher;
  std::vector<block> blocks;
  std::vector<token_id> cached_tokens;             // [n_blocks * block_size]
  std::unordered_map<uint64_t, block_id> cache;    // key -> registered block
  std::unordered_map<seq_id, sequence> sequences;
  block_id head = no_block;
  block_id tail = no_block;
  int32_t n_free = 0;
  int32_t n_cached_free = 0;
  uint64_t next_gen = 1;
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;

  impl(block_manager_config c, block_hasher h) : config(c), hasher(h) {
    if (config.n_blocks < 0 || config.block_size <= 0 || config.watermark_blocks < 0)
      throw std::invalid_argument(fmt::format(
          "block_manager: n_blocks ({}) and watermark_blocks ({}) must be >= 0 and block_size "
          "({}) > 0",
          config.n_blocks, config.watermark_blocks, config.block_size));
    if (hasher == nullptr) throw std::invalid_argument("block_manager: hasher is null");
    blocks.resize(config.n_blocks);
    cached_tokens.resize(static_cast<size_t>(config.n_blocks) * config.block_size);
    for (block_id b = 0; b < config.n_blocks; ++b) push_back(b);
  }

  int32_t blocks_for(int64_t n_positions) const {
    if (n_positions < 0)
      throw std::logic_error(fmt::format("block_manager: {} positions", n_positions));
    return static_cast<int32_t>((n_positions + config.block_size - 1) / config.block_size);
  }

  std::span<const token_id> tokens_of(block_id b) const {
    return {cached_tokens.data() + static_cast<size_t>(b) * config.block_size,
            static_cast<size_t>(config.block_size)};
  }

  sequence& find(seq_id seq, const char* op) {
    auto it = sequences.find(seq);
    if (it == sequences.end())
      throw std::logic_error(fmt::format("block_manager::{}: unknown sequence {}", op, seq));
    return it->second;
  }
  const sequence& find(seq_id seq, const char* op) const {
    return const_cast<impl*>(this)->find(seq, op);
  }

  // Free queue.
  void push_front(block_id b) {
    blocks[b].prev = no_block;
    blocks[b].next = head;
    (head == no_block ? tail : blocks[head].prev) = b;
    head = b;
    count_in(b);
  }
  void push_back(block_id b) {
    blocks[b].next = no_block;
    blocks[b].prev = tail;
    (tail == no_block ? head : blocks[tail].next) = b;
    tail = b;
    count_in(b);
  }
  void unlink(block_id b) {
    block& x = blocks[b];
    (x.prev == no_block ? head : blocks[x.prev].next) = x.next;
    (x.next == no_block ? tail : blocks[x.next].prev) = x.prev;
    x.prev = x.next = no_block;
    --n_free;
    if (x.gen != 0) --n_cached_free;
  }
  void count_in(block_id b) {
    ++n_free;
    if (blocks[b].gen != 0) ++n_cached_free;
  }

  // Precondition: n_free > 0. Returns a block with ref 1 and no cached contents.
  block_id take_free() {
    block_id b = head;
    unlink(b);
    if (blocks[b].gen != 0) {
      cache.erase(blocks[b].hash);
      blocks[b].gen = 0;
      ++evictions;
    }
    blocks[b].ref = 1;
    return b;
  }

  // Precondition: b is free and cached. It stays free, now uncached (so at the queue's head).
  void uncache_free(block_id b) {
    unlink(b);
    cache.erase(blocks[b].hash);
    blocks[b].gen = 0;
    push_front(b);
  }

  void hold(block_id b) {
    if (blocks[b].ref++ == 0) unlink(b);
  }

  void drop(block_id b) {
    if (--blocks[b].ref > 0) return;
    if (blocks[b].gen != 0) push_back(b);
    else push_front(b);
  }

  // The registered block holding `tokens` after the cached block `parent_gen`, or no_block.
  block_id lookup(uint64_t hash, uint64_t parent_gen, std::span<const token_id> tokens) const {
    auto it = cache.find(hash);
    if (it == cache.end()) return no_block;
    const block& c = blocks[it->second];
    if (c.parent_gen != parent_gen || !std::ranges::equal(tokens_of(it->second), tokens))
      return no_block;
    return it->second;
  }

  // The cached blocks matching the prompt's leading full blocks, stopping at the first miss;
  // at most (prompt.size() - 1) / block_size of them.
  void match_prefix(std::span<const token_id> prompt, std::vector<block_id>& matched,
                    std::vector<chain_link>& chain) const {
    if (prompt.empty()) return;
    const size_t bs = config.block_size;
    const size_t n_eligible = (prompt.size() - 1) / bs;
    chain_link parent;
    for (size_t k = 0; k < n_eligible; ++k) {
      auto tokens = prompt.subspan(k * bs, bs);
      uint64_t hash = hasher(parent.hash, tokens);
      block_id b = lookup(hash, parent.gen, tokens);
      if (b == no_block) return;
      matched.push_back(b);
      parent = {hash, blocks[b].gen};
      chain.push_back(parent);
    }
  }

  // Extends seq's registered prefix over its full blocks [chain.size(), n_full).
  // tokens: from full block first_block on (whose earlier blocks are in s.chain).
  void register_blocks(sequence& s, std::span<const token_id> tokens, int32_t n_full, int32_t first_block = 0) {
    const size_t bs = config.block_size;
    for (size_t k = s.chain.size(); k < static_cast<size_t>(n_full); ++k) {
      chain_link parent = k == 0 ? chain_link{} : s.chain[k - 1];
      auto block_tokens = tokens.subspan((k - static_cast<size_t>(first_block)) * bs, bs);
      uint64_t hash = hasher(parent.hash, block_tokens);
      block& b = blocks[s.table[k]];
      if (b.gen != 0) {
        // Attached from the cache, or registered before a prepare_write() earlier in the
        // table: it stays in the chain only if it holds these tokens after this prefix.
        if (b.hash != hash || b.parent_gen != parent.gen ||
            !std::ranges::equal(tokens_of(s.table[k]), block_tokens))
          return;
        s.chain.push_back({hash, b.gen});
        continue;
      }
      if (auto it = cache.find(hash); it != cache.end()) {
        if (block_id c = lookup(hash, parent.gen, block_tokens); c != no_block) {
          s.chain.push_back({hash, blocks[c].gen});
          continue;
        }
        // The key belongs to other tokens or to an orphan whose parent was evicted. A block
        // in use keeps it (the chain stops here); a free one gives it up.
        if (blocks[it->second].ref > 0) return;
        uncache_free(it->second);
      }
      b.hash = hash;
      b.gen = next_gen++;
      b.parent_gen = parent.gen;
      std::ranges::copy(block_tokens,
                        cached_tokens.begin() + static_cast<ptrdiff_t>(s.table[k] * bs));
      cache.emplace(hash, s.table[k]);
      s.chain.push_back({hash, b.gen});
    }
  }

  void check_invariants() const;
};

block_manager::block_manager(block_manager_config config, block_hasher hasher)
    : impl_(std::make_unique<impl>(config, hasher)) {}
block_manager::~block_manager() = default;
block_manager::block_manager(block_manager&&) noexcept = default;
block_manager& block_manager::operator=(block_manager&&) noexcept = default;

const block_manager_config& block_manager::config() const { return impl_->config; }

int32_t block_manager::blocks_for(int32_t n_positions) const {
  return impl_->blocks_for(n_positions);
}

std::optional<int32_t> block_manager::admit(seq_id seq, std::span<const token_id> prompt,
                                            int32_t n_positions) {
  impl& m = *impl_;
  if (m.sequences.contains(seq))
    throw std::logic_error(fmt::format("block_manager::admit: sequence {} already admitted", seq));
  if (n_positions < 0)
    throw std::logic_error(
        fmt::format("block_manager::admit: sequence {} with {} positions", seq, n_positions));

  sequence s;
  std::vector<block_id> matched;
  if (m.config.prefix_caching) m.match_prefix(prompt, matched, s.chain);
  const int32_t n_hit = static_cast<int32_t>(matched.size());
  const int32_t hit_tokens = n_hit * m.config.block_size;
  s.n_positions = std::max(n_positions, hit_tokens);
  const int32_t n_new = m.blocks_for(s.n_positions) - n_hit;
  const auto n_hit_free =
      std::ranges::count_if(matched, [&](block_id b) { return m.blocks[b].ref == 0; });
  if (m.n_free - n_hit_free - n_new < m.config.watermark_blocks) return std::nullopt;

  s.table.reserve(static_cast<size_t>(n_hit + n_new));
  for (block_id b : matched) {
    m.hold(b);
    s.table.push_back(b);
  }
  for (int32_t i = 0; i < n_new; ++i) s.table.push_back(m.take_free());
  if (m.config.prefix_caching && !prompt.empty()) {
    m.hits += n_hit;
    m.misses += static_cast<int64_t>((prompt.size() - 1) / m.config.block_size) - n_hit;
  }
  m.sequences.emplace(seq, std::move(s));
  return hit_tokens;
}

bool block_manager::can_grow(seq_id seq, int32_t n_positions) const {
  const sequence& s = impl_->find(seq, "can_grow");
  if (n_positions < s.n_positions)
    throw std::logic_error(fmt::format(
        "block_manager::can_grow: sequence {} from {} to {} positions", seq, s.n_positions,
        n_positions));
  return impl_->blocks_for(n_positions) - static_cast<int32_t>(s.table.size()) <= impl_->n_free;
}

bool block_manager::grow(seq_id seq, int32_t n_positions) {
  impl& m = *impl_;
  sequence& s = m.find(seq, "grow");
  if (n_positions < s.n_positions)
    throw std::logic_error(fmt::format("block_manager::grow: sequence {} from {} to {} positions",
                                       seq, s.n_positions, n_positions));
  const int32_t n_new = m.blocks_for(n_positions) - static_cast<int32_t>(s.table.size());
  if (n_new > m.n_free) return false;
  for (int32_t i = 0; i < n_new; ++i) s.table.push_back(m.take_free());
  s.n_positions = n_positions;
  return true;
}

bool block_manager::prepare_write(seq_id seq, int32_t first, int32_t last,
                                  std::vector<std::pair<block_id, block_id>>& copies) {
  impl& m = *impl_;
  sequence& s = m.find(seq, "prepare_write");
  if (first < 0 || first > last || last >= s.n_positions)
    throw std::logic_error(fmt::format(
        "block_manager::prepare_write: positions [{}, {}] outside sequence {} of {} positions",
        first, last, seq, s.n_positions));
  const int32_t k_first = first / m.config.block_size;
  const int32_t k_last = last / m.config.block_size;
  auto must_copy = [&](block_id b) { return m.blocks[b].ref > 1 || m.blocks[b].gen != 0; };
  int32_t n_copies = 0;
  for (int32_t k = k_first; k <= k_last; ++k) n_copies += must_copy(s.table[k]) ? 1 : 0;
  if (n_copies > m.n_free) return false;

  // Take every copy before dropping any source, so no source can be handed out as a copy.
  const size_t first_copy = copies.size();
  for (int32_t k = k_first; k <= k_last; ++k) {
    if (!must_copy(s.table[k])) continue;
    block_id copy = m.take_free();
    copies.emplace_back(s.table[k], copy);
    s.table[k] = copy;
  }
  for (size_t i = first_copy; i < copies.size(); ++i) m.drop(copies[i].first);
  if (s.chain.size() > static_cast<size_t>(k_first)) s.chain.resize(k_first);
  return true;
}

void block_manager::commit(seq_id seq, std::span<const token_id> tokens, int32_t n_computed) {
  impl& m = *impl_;
  sequence& s = m.find(seq, "commit");
  if (n_computed < 0 || static_cast<size_t>(n_computed) > tokens.size() ||
      n_computed > s.n_positions)
    throw std::logic_error(fmt::format(
        "block_manager::commit: sequence {} with {} computed positions, {} tokens and {} "
        "positions",
        seq, n_computed, tokens.size(), s.n_positions));
  if (!m.config.prefix_caching) return;
  m.register_blocks(s, tokens, n_computed / m.config.block_size);
}

void block_manager::commit_from(seq_id seq, int32_t first_block, std::span<const token_id> tokens,
                                int32_t n_computed) {
  impl& m = *impl_;
  sequence& s = m.find(seq, "commit_from");
  const int64_t first = static_cast<int64_t>(first_block) * m.config.block_size;
  if (first_block < 0 || n_computed < first || static_cast<size_t>(n_computed - first) > tokens.size() ||
      n_computed > s.n_positions)
    throw std::logic_error(fmt::format(
        "block_manager::commit_from: sequence {} from block {} with {} computed positions, {} tokens and {} "
        "positions",
        seq, first_block, n_computed, tokens.size(), s.n_positions));
  if (!m.config.prefix_caching || s.chain.size() < static_cast<size_t>(first_block)) return;
  m.register_blocks(s, tokens, n_computed / m.config.block_size, first_block);
}

void block_manager::release(seq_id seq) {
  impl& m = *impl_;
  sequence& s = m.find(seq, "release");
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) m.drop(*it);
  m.sequences.erase(seq);
}

bool block_manager::has(seq_id seq) const { return impl_->sequences.contains(seq); }

std::span<const block_id> block_manager::table(seq_id seq) const {
  auto it = impl_->sequences.find(seq);
  if (it == impl_->sequences.end()) return {};
  return it->second.table;
}

block_stats block_manager::stats() const {
  const impl& m = *impl_;
  return {.total = m.config.n_blocks,
          .free = m.n_free,
          .cached_free = m.n_cached_free,
          .used = m.config.n_blocks - m.n_free,
          .prefix_hit_blocks = m.hits,
          .prefix_miss_blocks = m.misses,
          .evictions = m.evictions};
}

int32_t block_manager::ref_count(block_id b) const {
  if (b < 0 || b >= impl_->config.n_blocks)
    throw std::logic_error(fmt::format("block_manager::ref_count: no block {}", b));
  return impl_->blocks[b].ref;
}

bool block_manager::is_cached(block_id b) const {
  if (b < 0 || b >= impl_->config.n_blocks)
    throw std::logic_error(fmt::format("block_manager::is_cached: no block {}", b));
  return impl_->blocks[b].gen != 0;
}

void block_manager::check_invariants() const { impl_->check_invariants(); }

void block_manager::impl::check_invariants() const {
  auto fail = [](const std::string& what) {
    throw std::logic_error("block_manager invariant broken: " + what);
  };
  const int32_t n = config.n_blocks;

  std::vector<int32_t> holders(n, 0);
  for (const auto& [id, s] : sequences) {
    if (static_cast<int32_t>(s.table.size()) != blocks_for(s.n_positions))
      fail(fmt::format("sequence {} has {} blocks for {} positions", id, s.table.size(),
                       s.n_positions));
    if (s.chain.size() > s.table.size())
      fail(fmt::format("sequence {} has a registered prefix longer than its table", id));
    for (block_id b : s.table) {
      if (b < 0 || b >= n) fail(fmt::format("sequence {} holds block {}", id, b));
      ++holders[b];
    }
  }

  int32_t used = 0;
  int32_t registered = 0;
  for (block_id b = 0; b < n; ++b) {
    if (blocks[b].ref != holders[b])
      fail(fmt::format("block {} has refcount {} but {} tables hold it", b, blocks[b].ref,
                       holders[b]));
    if (blocks[b].ref > 0) ++used;
    if (blocks[b].gen != 0) {
      ++registered;
      if (blocks[b].gen >= next_gen) fail(fmt::format("block {} has a future generation", b));
      auto it = cache.find(blocks[b].hash);
      if (it == cache.end() || it->second != b)
        fail(fmt::format("cached block {} is not found by its hash", b));
    }
  }

  std::vector<bool> queued(n, false);
  int32_t n_queued = 0;
  int32_t n_queued_cached = 0;
  block_id prev = no_block;
  for (block_id b = head; b != no_block; prev = b, b = blocks[b].next) {
    if (b < 0 || b >= n) fail(fmt::format("free queue links to block {}", b));
    if (queued[b]) fail(fmt::format("block {} is in the free queue twice", b));
    queued[b] = true;
    if (blocks[b].prev != prev) fail(fmt::format("block {} has a wrong back link", b));
    if (blocks[b].ref != 0)
      fail(fmt::format("block {} is free with refcount {}", b, blocks[b].ref));
    ++n_queued;
    if (blocks[b].gen != 0) ++n_queued_cached;
    else if (n_queued_cached > 0) fail(fmt::format("uncached free block {} after a cached one", b));
  }
  if (tail != prev) fail("the free queue's tail is not its last block");
  if (n_queued + used != n)
    fail(fmt::format("{} free + {} used blocks != {} total", n_queued, used, n));
  if (n_queued != n_free || n_queued_cached != n_cached_free)
    fail(fmt::format("stats say {} free ({} cached) but the queue holds {} ({} cached)", n_free,
                     n_cached_free, n_queued, n_queued_cached));

  for (const auto& [hash, b] : cache) {
    if (b < 0 || b >= n) fail(fmt::format("hash {:#x} maps to block {}", hash, b));
    if (blocks[b].gen == 0 || blocks[b].hash != hash)
      fail(fmt::format("hash {:#x} maps to block {}, which holds {:#x}", hash, b, blocks[b].hash));
  }
  if (static_cast<int32_t>(cache.size()) != registered)
    fail(fmt::format("{} cache entries for {} cached blocks", cache.size(), registered));
  if (hits < 0 || misses < 0 || evictions < 0) fail("negative cumulative stats");
}

}  // namespace tireless
