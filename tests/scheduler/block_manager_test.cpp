#include "scheduler/block_manager.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace tireless {
namespace {

block_manager_config pool(int32_t n_blocks, int32_t block_size = 16, int32_t watermark = 0) {
  return {.n_blocks = n_blocks, .block_size = block_size, .prefix_caching = true,
          .watermark_blocks = watermark};
}

// n distinct tokens; prompts with different `first` share no token.
std::vector<token_id> prompt_of(int32_t n, token_id first = 1000) {
  std::vector<token_id> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

std::vector<block_id> table_of(const block_manager& m, seq_id seq) {
  auto t = m.table(seq);
  return {t.begin(), t.end()};
}

// Admits and computes the whole prompt; returns the number of tokens found cached.
int32_t admit_and_commit(block_manager& m, seq_id seq, const std::vector<token_id>& prompt) {
  auto cached = m.admit(seq, prompt, static_cast<int32_t>(prompt.size()));
  EXPECT_TRUE(cached.has_value());
  m.commit(seq, prompt, static_cast<int32_t>(prompt.size()));
  m.check_invariants();
  return cached.value_or(-1);
}

TEST(block_manager, admitting_growing_and_releasing_conserves_blocks) {
  block_manager m(pool(10));
  EXPECT_EQ(m.blocks_for(0), 0);
  EXPECT_EQ(m.blocks_for(16), 1);
  EXPECT_EQ(m.blocks_for(17), 2);

  EXPECT_EQ(m.admit(1, prompt_of(20), 20), 0);
  m.check_invariants();
  EXPECT_EQ(m.table(1).size(), 2u);
  EXPECT_TRUE(m.grow(1, 33));
  m.check_invariants();
  EXPECT_EQ(m.table(1).size(), 3u);
  EXPECT_TRUE(m.grow(1, 33));  // no change
  EXPECT_EQ(m.admit(2, prompt_of(5, 5000), 40), 0);
  m.check_invariants();
  EXPECT_EQ(m.stats().used, 6);
  EXPECT_EQ(m.stats().free, 4);

  m.release(1);
  m.check_invariants();
  EXPECT_FALSE(m.has(1));
  EXPECT_TRUE(m.table(1).empty());
  EXPECT_EQ(m.stats().used, 3);
  m.release(2);
  m.check_invariants();
  EXPECT_EQ(m.stats().free, 10);
  EXPECT_EQ(m.stats().used, 0);
}

TEST(block_manager, grow_fails_cleanly_when_the_pool_is_full) {
  block_manager m(pool(4));
  ASSERT_TRUE(m.admit(1, prompt_of(30), 30).has_value());  // 2 blocks
  ASSERT_TRUE(m.admit(2, prompt_of(16, 5000), 16).has_value());  // 1 block
  EXPECT_TRUE(m.can_grow(1, 48));
  EXPECT_FALSE(m.can_grow(1, 49));
  const auto before = table_of(m, 1);
  EXPECT_FALSE(m.grow(1, 64));
  m.check_invariants();
  EXPECT_EQ(table_of(m, 1), before);
  EXPECT_EQ(m.stats().free, 1);
  EXPECT_TRUE(m.grow(1, 48));
  m.check_invariants();
  EXPECT_FALSE(m.grow(2, 17));
  EXPECT_EQ(m.table(2).size(), 1u);
  m.check_invariants();
}

TEST(block_manager, admit_respects_the_watermark_but_grow_may_use_it) {
  block_manager m(pool(6, 16, /*watermark=*/2));
  EXPECT_FALSE(m.admit(1, prompt_of(64), 65).has_value());  // 5 blocks would leave 1
  m.check_invariants();
  EXPECT_FALSE(m.has(1));
  EXPECT_EQ(m.stats().free, 6);
  EXPECT_EQ(m.stats().prefix_miss_blocks, 0);  // a refused admit changes nothing

  EXPECT_EQ(m.admit(1, prompt_of(64), 64), 0);  // 4 blocks leave exactly 2
  m.check_invariants();
  EXPECT_FALSE(m.admit(2, prompt_of(1, 5000), 1).has_value());
  EXPECT_TRUE(m.grow(1, 96));  // into the reserve
  m.check_invariants();
  EXPECT_EQ(m.stats().free, 0);
}

TEST(block_manager, engine_bugs_throw_logic_errors) {
  block_manager m(pool(8));
  ASSERT_TRUE(m.admit(1, prompt_of(20), 20).has_value());
  std::vector<std::pair<block_id, block_id>> copies;
  EXPECT_THROW(m.admit(1, prompt_of(20), 20), std::logic_error);
  EXPECT_THROW(m.admit(2, prompt_of(20), -1), std::logic_error);
  EXPECT_THROW(m.grow(7, 20), std::logic_error);
  EXPECT_THROW(m.can_grow(7, 20), std::logic_error);
  EXPECT_THROW(m.grow(1, 19), std::logic_error);
  EXPECT_THROW(m.release(7), std::logic_error);
  EXPECT_THROW(m.commit(7, prompt_of(20), 20), std::logic_error);
  EXPECT_THROW(m.commit(1, prompt_of(20), 21), std::logic_error);
  EXPECT_THROW(m.prepare_write(1, 0, 20, copies), std::logic_error);
  EXPECT_THROW(m.prepare_write(1, 5, 4, copies), std::logic_error);
  EXPECT_THROW(m.prepare_write(7, 0, 0, copies), std::logic_error);
  EXPECT_THROW(m.ref_count(8), std::logic_error);
  EXPECT_THROW(block_manager(pool(8, 0)), std::invalid_argument);
  m.check_invariants();
  EXPECT_EQ(m.table(1).size(), 2u);
}

TEST(block_manager, two_sequences_with_the_same_prompt_share_its_full_blocks) {
  block_manager m(pool(16));
  const auto prompt = prompt_of(40);
  EXPECT_EQ(admit_and_commit(m, 1, prompt), 0);
  EXPECT_EQ(m.stats().prefix_miss_blocks, 2);

  EXPECT_EQ(admit_and_commit(m, 2, prompt), 32);
  const auto a = table_of(m, 1);
  const auto b = table_of(m, 2);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);  // the partial third block is each sequence's own
  EXPECT_EQ(m.ref_count(a[0]), 2);
  EXPECT_EQ(m.ref_count(a[1]), 2);
  EXPECT_EQ(m.ref_count(a[2]), 1);
  EXPECT_EQ(m.stats().prefix_hit_blocks, 2);
  EXPECT_EQ(m.stats().used, 4);

  auto diverging = prompt;
  diverging[20] = 7;  // same first block, different second block
  EXPECT_EQ(admit_and_commit(m, 3, diverging), 16);
  const auto c = table_of(m, 3);
  EXPECT_EQ(c[0], a[0]);
  EXPECT_NE(c[1], a[1]);
  EXPECT_EQ(m.ref_count(a[0]), 3);
  EXPECT_EQ(m.stats().prefix_hit_blocks, 3);
  EXPECT_EQ(m.stats().prefix_miss_blocks, 3);
}

TEST(block_manager, the_last_prompt_token_is_always_computed) {
  block_manager m(pool(8));
  const auto prompt = prompt_of(32);
  EXPECT_EQ(admit_and_commit(m, 1, prompt), 0);
  EXPECT_EQ(admit_and_commit(m, 2, prompt), 16);  // both blocks cached, only one reused
  EXPECT_EQ(admit_and_commit(m, 3, prompt_of(33)), 32);
}

TEST(block_manager, released_prefix_blocks_stay_findable_and_are_reused) {
  block_manager m(pool(16));
  const auto prompt = prompt_of(40);
  admit_and_commit(m, 1, prompt);
  admit_and_commit(m, 2, prompt);
  const auto a = table_of(m, 1);
  m.release(1);
  m.check_invariants();
  EXPECT_EQ(m.ref_count(a[0]), 1);
  m.release(2);
  m.check_invariants();
  EXPECT_EQ(m.stats().free, 16);
  EXPECT_EQ(m.stats().cached_free, 2);
  EXPECT_TRUE(m.is_cached(a[0]));
  EXPECT_FALSE(m.is_cached(a[2]));

  EXPECT_EQ(admit_and_commit(m, 3, prompt), 32);
  const auto c = table_of(m, 3);
  EXPECT_EQ(c[0], a[0]);
  EXPECT_EQ(c[1], a[1]);
  EXPECT_EQ(m.ref_count(a[0]), 1);
  EXPECT_EQ(m.stats().cached_free, 0);
}

TEST(block_manager, eviction_under_pressure_takes_the_least_recently_used_cached_block) {
  block_manager m(pool(8));
  const auto p1 = prompt_of(33, 1000);
  const auto p2 = prompt_of(33, 2000);
  admit_and_commit(m, 1, p1);  // blocks: 2 cached + 1 partial
  admit_and_commit(m, 2, p2);
  const auto a = table_of(m, 1);
  const auto b = table_of(m, 2);
  m.release(1);  // p1 is now the least recently used
  m.release(2);
  m.check_invariants();
  EXPECT_EQ(m.stats().cached_free, 4);

  // 5 blocks: the 4 uncached free blocks first, then p1's deeper block.
  ASSERT_TRUE(m.admit(3, prompt_of(33, 3000), 80).has_value());
  m.check_invariants();
  EXPECT_EQ(m.stats().evictions, 1);
  EXPECT_FALSE(m.is_cached(a[1]));
  EXPECT_TRUE(m.is_cached(a[0]));
  EXPECT_TRUE(m.is_cached(b[0]));
  EXPECT_TRUE(m.is_cached(b[1]));
  m.release(3);
  m.check_invariants();

  EXPECT_EQ(admit_and_commit(m, 4, p1), 16);  // p1's second block misses now
  EXPECT_EQ(table_of(m, 4)[0], a[0]);
  EXPECT_EQ(admit_and_commit(m, 5, p2), 32);
}

TEST(block_manager, prefix_caching_off_never_shares) {
  auto config = pool(16);
  config.prefix_caching = false;
  block_manager m(config);
  const auto prompt = prompt_of(40);
  EXPECT_EQ(admit_and_commit(m, 1, prompt), 0);
  EXPECT_EQ(admit_and_commit(m, 2, prompt), 0);
  const auto a = table_of(m, 1);
  const auto b = table_of(m, 2);
  for (block_id x : a) EXPECT_EQ(std::ranges::count(b, x), 0);
  m.release(1);
  EXPECT_EQ(admit_and_commit(m, 3, prompt), 0);
  EXPECT_EQ(m.stats().cached_free, 0);
  EXPECT_EQ(m.stats().prefix_hit_blocks, 0);
  EXPECT_EQ(m.stats().prefix_miss_blocks, 0);
}

uint64_t constant_hash(uint64_t, std::span<const token_id>) { return 42; }
uint64_t parentless_hash(uint64_t, std::span<const token_id> tokens) {
  return default_block_hash(0, tokens);
}

TEST(block_manager, a_hash_collision_never_reuses_blocks_whose_tokens_differ) {
  block_manager m(pool(16), constant_hash);
  admit_and_commit(m, 1, prompt_of(40, 1000));
  EXPECT_EQ(admit_and_commit(m, 2, prompt_of(40, 2000)), 0);
  const auto a = table_of(m, 1);
  const auto b = table_of(m, 2);
  for (block_id x : a) EXPECT_EQ(std::ranges::count(b, x), 0);
  EXPECT_EQ(admit_and_commit(m, 3, prompt_of(40, 1000)), 16);  // only one block per key
  EXPECT_EQ(table_of(m, 3)[0], a[0]);
}

TEST(block_manager, a_block_cached_after_another_prefix_is_never_reused) {
  // With a key that ignores the parent, "Y after X" and "Y after Z" collide.
  block_manager m(pool(16), parentless_hash);
  const auto x = prompt_of(16, 1000);
  const auto y = prompt_of(16, 2000);
  const auto z = prompt_of(16, 3000);
  auto cat = [](std::vector<token_id> a, const std::vector<token_id>& b) {
    a.insert(a.end(), b.begin(), b.end());
    a.push_back(1);
    return a;
  };
  admit_and_commit(m, 1, cat(x, y));
  EXPECT_EQ(admit_and_commit(m, 2, cat(z, y)), 0);
  EXPECT_EQ(admit_and_commit(m, 3, cat(z, y)), 16);  // z from sequence 2, not y from 1
  EXPECT_NE(table_of(m, 3)[1], table_of(m, 1)[1]);
  EXPECT_EQ(admit_and_commit(m, 4, cat(x, y)), 32);
  EXPECT_EQ(table_of(m, 4)[1], table_of(m, 1)[1]);
}

TEST(block_manager, commit_is_idempotent_and_keeps_the_first_of_two_equal_blocks) {
  block_manager m(pool(16));
  const auto prompt = prompt_of(40);
  ASSERT_EQ(m.admit(1, prompt, 40), 0);
  ASSERT_EQ(m.admit(2, prompt, 40), 0);  // both computing the same prompt at once
  m.commit(1, prompt, 40);
  m.commit(2, prompt, 40);
  m.commit(1, prompt, 40);
  m.check_invariants();
  const auto a = table_of(m, 1);
  const auto b = table_of(m, 2);
  EXPECT_TRUE(m.is_cached(a[0]));
  EXPECT_TRUE(m.is_cached(a[1]));
  EXPECT_FALSE(m.is_cached(b[0]));
  EXPECT_FALSE(m.is_cached(b[1]));
  m.release(2);
  m.release(1);
  m.check_invariants();
  EXPECT_EQ(m.stats().cached_free, 2);
}

TEST(block_manager, generated_tokens_are_cached_once_their_blocks_are_full) {
  block_manager m(pool(16));
  auto tokens = prompt_of(10);
  ASSERT_EQ(m.admit(1, tokens, 10), 0);
  m.commit(1, tokens, 10);
  for (token_id t = 0; t < 30; ++t) {
    tokens.push_back(t);
    ASSERT_TRUE(m.grow(1, static_cast<int32_t>(tokens.size())));
    m.commit(1, tokens, static_cast<int32_t>(tokens.size()));
    m.check_invariants();
  }
  const auto a = table_of(m, 1);
  EXPECT_TRUE(m.is_cached(a[1]));
  EXPECT_FALSE(m.is_cached(a[2]));
  EXPECT_EQ(admit_and_commit(m, 2, tokens), 32);
}

TEST(block_manager, committing_only_the_new_blocks_caches_what_committing_everything_does) {
  block_manager m(pool(16));
  auto tokens = prompt_of(10);
  ASSERT_EQ(m.admit(1, tokens, 10), 0);
  int32_t committed_blocks = 0;
  for (token_id t = 0; t < 30; ++t) {
    tokens.push_back(t);
    ASSERT_TRUE(m.grow(1, static_cast<int32_t>(tokens.size())));
    const int32_t full = static_cast<int32_t>(tokens.size()) / 16;
    if (full == committed_blocks) continue;
    const std::span<const token_id> delta(tokens.data() + committed_blocks * 16, tokens.size() - committed_blocks * 16);
    m.commit_from(1, committed_blocks, delta, static_cast<int32_t>(tokens.size()));
    committed_blocks = full;
    m.check_invariants();
  }
  const auto a = table_of(m, 1);
  EXPECT_TRUE(m.is_cached(a[0]));
  EXPECT_TRUE(m.is_cached(a[1]));
  EXPECT_FALSE(m.is_cached(a[2]));
  EXPECT_EQ(admit_and_commit(m, 2, tokens), 32);
  // A delta past the registered prefix (a gap) registers nothing, and a short one is a bug.
  EXPECT_THROW(m.commit_from(2, 1, std::span<const token_id>(tokens.data(), 4), 40), std::logic_error);
}

TEST(block_manager, prepare_write_copies_a_shared_block_and_reports_the_copy) {
  block_manager m(pool(16));
  const auto prompt = prompt_of(40);
  admit_and_commit(m, 1, prompt);
  admit_and_commit(m, 2, prompt);
  const auto a = table_of(m, 1);

  std::vector<std::pair<block_id, block_id>> copies;
  ASSERT_TRUE(m.prepare_write(2, 20, 35, copies));  // blocks 1 (shared) and 2 (private)
  m.check_invariants();
  const auto b = table_of(m, 2);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, a[1]);
  EXPECT_EQ(copies[0].second, b[1]);
  EXPECT_NE(b[1], a[1]);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(table_of(m, 1), a);
  EXPECT_EQ(m.ref_count(a[1]), 1);
  EXPECT_EQ(m.ref_count(b[1]), 1);
  EXPECT_FALSE(m.is_cached(b[1]));
  EXPECT_TRUE(m.is_cached(a[1]));
}

TEST(block_manager, prepare_write_copies_a_cached_block_so_the_cache_keeps_it) {
  block_manager m(pool(16));
  const auto prompt = prompt_of(40);
  admit_and_commit(m, 1, prompt);
  const auto a = table_of(m, 1);
  std::vector<std::pair<block_id, block_id>> copies;
  ASSERT_TRUE(m.prepare_write(1, 0, 0, copies));
  m.check_invariants();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, a[0]);
  EXPECT_EQ(m.ref_count(a[0]), 0);
  EXPECT_TRUE(m.is_cached(a[0]));
  EXPECT_EQ(m.stats().cached_free, 1);

  copies.clear();
  ASSERT_TRUE(m.prepare_write(1, 33, 39, copies));  // a private, uncached block
  EXPECT_TRUE(copies.empty());
  m.commit(1, prompt, 40);  // the rewritten block holds the same tokens: an equal one is cached
  m.check_invariants();
  EXPECT_FALSE(m.is_cached(table_of(m, 1)[0]));
  EXPECT_EQ(admit_and_commit(m, 2, prompt), 32);
  EXPECT_EQ(table_of(m, 2)[0], a[0]);
}

TEST(block_manager, rewritten_blocks_are_cached_under_their_new_prefix) {
  block_manager m(pool(16));
  const auto old_prompt = prompt_of(40, 1000);
  admit_and_commit(m, 1, old_prompt);
  const auto old_table = table_of(m, 1);

  // Positions [16, 40) are rewritten with other tokens, then 8 more are generated.
  auto tokens = old_prompt;
  std::iota(tokens.begin() + 16, tokens.end(), 2000);
  std::vector<std::pair<block_id, block_id>> copies;
  ASSERT_TRUE(m.prepare_write(1, 16, 39, copies));
  m.commit(1, tokens, 40);
  tokens.insert(tokens.end(), {1, 2, 3, 4, 5, 6, 7, 8});
  ASSERT_TRUE(m.grow(1, 48));
  m.commit(1, tokens, 48);
  m.check_invariants();
  const auto table = table_of(m, 1);

  auto new_prefix = tokens;
  new_prefix.push_back(9);
  EXPECT_EQ(admit_and_commit(m, 2, new_prefix), 48);
  EXPECT_EQ(table_of(m, 2)[1], table[1]);
  EXPECT_EQ(table_of(m, 2)[2], table[2]);

  // The third block was computed after the new second block, not after the old one.
  auto old_prefix = old_prompt;
  old_prefix.resize(32);
  old_prefix.insert(old_prefix.end(), tokens.begin() + 32, tokens.begin() + 48);
  old_prefix.push_back(9);
  EXPECT_EQ(admit_and_commit(m, 3, old_prefix), 32);
  EXPECT_EQ(table_of(m, 3)[1], old_table[1]);
  EXPECT_NE(table_of(m, 3)[2], table[2]);
}

TEST(block_manager, prepare_write_fails_cleanly_without_a_free_block) {
  block_manager m(pool(4));
  const auto prompt = prompt_of(40);
  admit_and_commit(m, 1, prompt);  // 3 blocks
  const auto a = table_of(m, 1);
  ASSERT_TRUE(m.admit(2, prompt_of(1, 5000), 1).has_value());  // the last block
  std::vector<std::pair<block_id, block_id>> copies;
  EXPECT_FALSE(m.prepare_write(1, 0, 20, copies));
  m.check_invariants();
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table_of(m, 1), a);
}

// The property test plays the backend too: each KV slot holds a fingerprint of the prefix
// that produced it, so a wrong reuse or a write into a shared block shows as a wrong slot.
class random_workload {
 public:
  random_workload(block_manager& m, uint32_t seed) : m_(m), rng_(seed) {
    for (auto& base : bases_)
      for (int i = 0; i < 40; ++i) base.push_back(random_token());
    kv_.assign(static_cast<size_t>(m.config().n_blocks) * bs(), 0);
  }

  void step() {
    int op = pick(0, 9);
    if (live_.empty() || op <= 2) admit();
    else if (op <= 6) decode(pick_live());
    else if (op == 7) rewind(pick_live());
    else release(pick_live());
    m_.check_invariants();
    for (const auto& s : live_) expect_kv(s);
  }

  void release_all() {
    while (!live_.empty()) release(0);
    m_.check_invariants();
  }

  int64_t admitted() const { return admitted_; }
  int64_t reused_tokens() const { return reused_tokens_; }
  int64_t copies() const { return copies_; }

 private:
  struct live_seq {
    seq_id id;
    std::vector<token_id> tokens;  // computed positions [0, tokens.size())
    int32_t n_positions;
  };

  int32_t bs() const { return m_.config().block_size; }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  token_id random_token() { return pick(0, 3); }
  size_t pick_live() { return static_cast<size_t>(pick(0, static_cast<int>(live_.size()) - 1)); }

  // [tokens.size()]: a fingerprint of each prefix [0, pos].
  static std::vector<uint64_t> fingerprints(const std::vector<token_id>& tokens) {
    std::vector<uint64_t> out(tokens.size());
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < tokens.size(); ++i)
      out[i] = h = (h ^ static_cast<uint32_t>(tokens[i] + 1)) * 1099511628211ULL;
    return out;
  }
  uint64_t& slot(seq_id id, size_t pos) {
    return kv_[static_cast<size_t>(m_.table(id)[pos / bs()]) * bs() + pos % bs()];
  }
  void expect_kv(const live_seq& s) {
    const auto expected = fingerprints(s.tokens);
    for (size_t pos = 0; pos < s.tokens.size(); ++pos)
      ASSERT_EQ(slot(s.id, pos), expected[pos]) << "sequence " << s.id << " at " << pos;
  }

  // Computes positions [first, tokens.size()) of s; false when prepare_write finds no room.
  bool write(const live_seq& s, size_t first, bool expect_no_copies) {
    if (first == s.tokens.size()) return true;
    std::vector<std::pair<block_id, block_id>> copies;
    if (!m_.prepare_write(s.id, static_cast<int32_t>(first),
                          static_cast<int32_t>(s.tokens.size()) - 1, copies))
      return false;
    EXPECT_TRUE(!expect_no_copies || copies.empty());
    copies_ += static_cast<int64_t>(copies.size());
    for (auto [from, to] : copies)
      std::copy_n(kv_.begin() + from * bs(), bs(), kv_.begin() + to * bs());
    const auto expected = fingerprints(s.tokens);
    for (size_t pos = first; pos < s.tokens.size(); ++pos) {
      block_id b = m_.table(s.id)[pos / bs()];
      EXPECT_EQ(m_.ref_count(b), 1);
      EXPECT_FALSE(m_.is_cached(b));
      slot(s.id, pos) = expected[pos];
    }
    return true;
  }

  void admit() {
    std::vector<token_id> prompt(bases_[pick(0, 3)]);
    prompt.resize(pick(1, 40));
    for (int n = pick(0, 6); n > 0; --n) prompt.push_back(random_token());
    const seq_id id = next_id_++;
    const int32_t n_positions = static_cast<int32_t>(prompt.size()) + pick(0, 6);
    auto cached = m_.admit(id, prompt, n_positions);
    if (!cached) {
      EXPECT_FALSE(m_.has(id));
      return;
    }
    EXPECT_EQ(*cached % bs(), 0);
    EXPECT_LT(*cached, static_cast<int32_t>(prompt.size()));
    live_seq s{id, prompt, n_positions};
    const auto expected = fingerprints(prompt);
    for (size_t pos = 0; pos < static_cast<size_t>(*cached); ++pos)
      ASSERT_EQ(slot(id, pos), expected[pos]) << "reused wrong KV at " << pos;
    EXPECT_TRUE(write(s, *cached, /*expect_no_copies=*/true));
    m_.commit(id, s.tokens, static_cast<int32_t>(s.tokens.size()));
    if (pick(0, 3) == 0) m_.commit(id, s.tokens, static_cast<int32_t>(s.tokens.size()));
    live_.push_back(std::move(s));
    ++admitted_;
    reused_tokens_ += *cached;
  }

  void decode(size_t i) {
    live_seq& s = live_[i];
    const size_t first = s.tokens.size();
    const int32_t n = static_cast<int32_t>(first) + pick(1, 6);
    if (n > s.n_positions) {
      if (!m_.grow(s.id, n)) return;
      s.n_positions = n;
    }
    while (static_cast<int32_t>(s.tokens.size()) < n) s.tokens.push_back(random_token());
    EXPECT_TRUE(write(s, first, /*expect_no_copies=*/true));
    m_.commit(s.id, s.tokens, n);
  }

  void rewind(size_t i) {
    live_seq& s = live_[i];
    if (s.tokens.empty()) return;
    const size_t first = static_cast<size_t>(pick(0, static_cast<int>(s.tokens.size()) - 1));
    const auto old = s.tokens;
    for (size_t pos = first; pos < s.tokens.size(); ++pos) s.tokens[pos] = random_token();
    if (!write(s, first, /*expect_no_copies=*/false)) {
      s.tokens = old;
      return;
    }
    m_.commit(s.id, s.tokens, static_cast<int32_t>(s.tokens.size()));
  }

  void release(size_t i) {
    m_.release(live_[i].id);
    live_.erase(live_.begin() + static_cast<ptrdiff_t>(i));
  }

  block_manager& m_;
  std::mt19937 rng_;
  std::vector<token_id> bases_[4];
  std::vector<uint64_t> kv_;
  std::vector<live_seq> live_;
  seq_id next_id_ = 1;
  int64_t admitted_ = 0, reused_tokens_ = 0, copies_ = 0;
};

// The default hash caches enough blocks to evict some; a constant one caches one at a time.
void run_random_workload(block_hasher hasher, uint32_t seed, bool expect_evictions = true) {
  block_manager m(pool(40, 4, /*watermark=*/2), hasher);
  random_workload w(m, seed);
  for (int i = 0; i < 4000; ++i) {
    w.step();
    if (::testing::Test::HasFatalFailure()) FAIL() << "at step " << i;
  }
  w.release_all();
  EXPECT_EQ(m.stats().free, m.stats().total);
  EXPECT_EQ(m.stats().used, 0);
  // The workload exercised what it is meant to.
  EXPECT_GT(w.admitted(), 500);
  EXPECT_GT(w.reused_tokens(), 0);
  EXPECT_GT(w.copies(), 0);
  if (expect_evictions) {
    EXPECT_GT(m.stats().evictions, 0);
  }
}

TEST(block_manager, random_operations_keep_every_invariant) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    run_random_workload(default_block_hash, seed);
  }
}

TEST(block_manager, random_operations_with_colliding_hashes_never_reuse_wrong_kv) {
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE(seed);
    run_random_workload(parentless_hash, seed);
    run_random_workload(constant_hash, seed, /*expect_evictions=*/false);
  }
}

}  // namespace
}  // namespace tireless
