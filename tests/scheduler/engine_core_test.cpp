#include "scheduler/engine_core.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "scheduler/block_manager.hpp"
#include "scheduler/kv_plan.hpp"

namespace tireless {
namespace {

// An engine_core with a real block pool behind it and a fake model that samples token 7 and
// takes `step_seconds` per step: what the engine actor does, without actors.
class engine_loop {
 public:
  explicit engine_loop(engine_options o, int32_t n_blocks = 64, bool prefix_caching = false)
      : core_(o), blocks_({.n_blocks = n_blocks, .block_size = o.limits.block_size, .prefix_caching = prefix_caching,
                           .watermark_blocks = 0}) {}

  void add(seq_id id, int32_t prompt_tokens, int32_t max_tokens, int64_t ttft_ms = 0, int64_t start_within_ms = 0,
           std::vector<std::string> degradations = {}) {
    sequence_spec s;
    s.id = id;
    s.arrival = static_cast<uint64_t>(now_);
    s.prompt.resize(static_cast<size_t>(prompt_tokens));
    std::iota(s.prompt.begin(), s.prompt.end(), static_cast<token_id>(same_prompts ? 100 : 100 * id));
    s.max_tokens = max_tokens;
    s.sampling = sampling;
    s.token_window = token_window;
    s.expected_cached = expected_cached;
    s.ttft_target_ns = ttft_ms * 1'000'000;
    if (start_within_ms > 0) s.start_by = now_ + start_within_ms * 1'000'000;
    core_.add(std::move(s), std::move(degradations));
    collect();
  }

  // One step through the KV pool and the fake model; false when nothing was proposed.
  // fail: the model fails the step for good (the actor's retries spent). step_seconds < 0:
  // the step takes -step_seconds times what the cost prior says for its shape.
  bool step(double step_seconds = 0.01, bool fail = false) {
    auto request = core_.propose(now_);
    collect();
    if (!request) return false;
    const kv_reply reply = plan_kv(blocks_, *request);
    auto g = core_.granted(reply, now_);
    idle_ = g.batch.seqs.empty() && !g.propose_again;
    wake_at_ = g.wake_at;
    if (g.batch.seqs.empty()) {
      collect();
      return true;
    }
    // The shard's copies of the block tables (and penalized sequences' token histories): what
    // a step sends, less what it says to forget.
    for (seq_id s : g.forget) {
      shard_tables_.erase(s);
      shard_histories_.erase(s);
    }
    for (const sequence_step& s : g.batch.seqs) {
      EXPECT_EQ(s.sampling.penalized(), !s.history.empty());
      if (!s.history.empty()) {
        auto& h = shard_histories_[s.seq_id];
        EXPECT_LE(static_cast<size_t>(s.history_from), h.size()) << "a history delta past what the shard has";
        h.resize(static_cast<size_t>(s.history_from));
        h.insert(h.end(), s.history.begin() + s.history_from, s.history.begin() + s.start_pos);
        h.insert(h.end(), s.tokens.begin(), s.tokens.end());
        EXPECT_TRUE(std::equal(h.begin(), h.end(), s.history.begin(), s.history.end()));
        ++penalized_steps_;
      }
      auto& table = shard_tables_[s.seq_id];
      EXPECT_LE(static_cast<size_t>(s.table_from), table.size()) << "a delta past what the shard has";
      table.resize(static_cast<size_t>(s.table_from));
      table.insert(table.end(), s.block_table.begin() + s.table_from, s.block_table.end());
      EXPECT_TRUE(std::equal(table.begin(), table.end(), s.block_table.begin(), s.block_table.end()));
    }
    if (step_seconds < 0) step_seconds = -step_seconds * prior_cost(g.batch);
    now_ += static_cast<int64_t>(step_seconds * 1e9);
    if (fail) {
      core_.abort("the model failed");
    } else {
      step_result r;
      for (const sequence_step& s : g.batch.seqs) r.next.push_back(s.sample ? 7 : -1);
      core_.commit(r, step_seconds, now_);
    }
    collect();
    return true;
  }
  void run(int max_steps = 1000, double step_seconds = 0.01) {
    for (int i = 0; i < max_steps && step(step_seconds); ++i) {
    }
  }
  void wait(int64_t ms) { now_ += ms * 1'000'000; }
  void wait_until(int64_t t) { now_ = std::max(now_, t); }
  // The last step ran nothing, and proposing again before an event or wake_at() would not change that.
  bool idle() const { return idle_; }
  std::optional<int64_t> wake_at() const { return wake_at_; }
  int64_t now() const { return now_; }
  void lose_backend(const std::string& why) {
    core_.lose_backend(why);
    collect();
  }

  engine_core& core() { return core_; }
  block_manager& blocks() { return blocks_; }
  const std::map<seq_id, outcome>& outcomes() const { return outcomes_; }
  int32_t tokens(seq_id id) const { return tokens_.count(id) ? tokens_.at(id) : 0; }
  int ended(seq_id id) const { return ended_.count(id) ? ended_.at(id) : 0; }
  int32_t used(seq_id id) const { return used_.count(id) ? used_.at(id) : 0; }
  const std::map<seq_id, std::vector<int32_t>>& shard_tables() const { return shard_tables_; }
  const std::map<seq_id, std::vector<int32_t>>& shard_histories() const { return shard_histories_; }
  int penalized_steps() const { return penalized_steps_; }
  sampling_params sampling;  // of the requests add() makes
  int32_t token_window = 0;  // likewise: tokens it may emit before the client acknowledges
  bool same_prompts = false;  // add() gives every request the same prompt
  int32_t expected_cached = 0;  // of the prompts add() makes, expected in the prefix cache

 private:
  void collect() {
    for (engine_delivery& d : core_.take_deliveries()) {
      if (!d.ended) {
        tokens_[d.seq] += static_cast<int32_t>(d.tokens.size());
        continue;
      }
      ++ended_[d.seq];
      used_[d.seq] = d.used_tokens;
      outcomes_[d.seq] = d.result;
    }
  }
  double prior_cost(const step_batch& b) const {
    const step_cost_prior& p = core_.options().step_prior;
    double seconds = p.c0;
    for (const sequence_step& s : b.seqs) seconds += s.tokens.size() == 1 ? p.per_decode_seq : p.per_prefill_token * s.tokens.size();
    return seconds;
  }
  engine_core core_;
  block_manager blocks_;
  int64_t now_ = 1'000'000'000;
  std::map<seq_id, outcome> outcomes_;
  std::map<seq_id, int32_t> tokens_, used_;
  std::map<seq_id, int> ended_;
  std::map<seq_id, std::vector<int32_t>> shard_tables_, shard_histories_;
  int penalized_steps_ = 0;
  bool idle_ = false;
  std::optional<int64_t> wake_at_;
};

engine_options small_engine() {
  engine_options o;
  o.limits.max_step_tokens = 64;
  o.limits.max_step_seqs = 8;
  o.limits.block_size = 4;
  o.limits.max_context = 256;
  o.max_waiting = 4;
  o.step_prior = {0.001, 0.0001, 0.0005, 0};
  return o;
}

TEST(engine_core, every_request_ends_once_with_its_usage_timings_and_degradations_and_gives_its_blocks_back) {
  engine_loop e(small_engine());
  e.add(1, 10, 5, 0, 0, {"max_tokens capped from 50 to 5"});
  e.add(2, 30, 3);
  e.run();
  for (seq_id id : {seq_id{1}, seq_id{2}}) EXPECT_EQ(e.ended(id), 1) << id;
  const outcome& o = e.outcomes().at(1);
  EXPECT_EQ(o.kind, outcome_kind::completed);
  EXPECT_EQ(o.reason, reason::max_tokens);
  EXPECT_EQ(o.request_id, 1u);
  EXPECT_EQ(o.prompt_tokens, 10);
  EXPECT_EQ(o.completion_tokens, 5);
  EXPECT_EQ(e.tokens(1), 5);
  EXPECT_EQ(e.used(1), 15);
  ASSERT_EQ(o.degradations.size(), 1u);
  EXPECT_EQ(o.degradations[0], "max_tokens capped from 50 to 5");
  EXPECT_GT(o.time_to_first_token_ms, 0);
  EXPECT_GE(o.total_ms, o.time_to_first_token_ms);
  EXPECT_FALSE(e.core().stepping());
  EXPECT_EQ(e.core().stats().running + e.core().stats().waiting, 0);
  // The ended requests' blocks go back with the next KV request.
  e.add(3, 4, 1);
  e.run();
  EXPECT_EQ(e.blocks().stats().free, e.blocks().stats().total);
}

TEST(engine_core, block_tables_reach_the_shard_as_deltas_and_ended_sequences_are_forgotten) {
  engine_options o = small_engine();
  o.limits.max_step_tokens = 8;  // prompts in chunks: tables grow over several steps
  engine_loop e(o, /*n_blocks=*/24);
  for (seq_id id = 1; id <= 12; ++id) e.add(id, 9 + static_cast<int32_t>(id), 12);  // preemptions too
  e.run();
  for (seq_id id = 1; id <= 12; ++id) ASSERT_EQ(e.ended(id), 1) << id;
  e.add(13, 4, 2);  // the next step carries what ended before it
  e.run();
  EXPECT_LE(e.shard_tables().size(), 1u) << "the shard keeps tables of sequences that ended";
}

TEST(engine_core, penalized_sequences_send_their_token_history_as_deltas_through_preemptions) {
  engine_options o = small_engine();
  o.limits.max_step_tokens = 8;
  engine_loop e(o, /*n_blocks=*/24);
  e.sampling.repetition_penalty = 1.3f;
  for (seq_id id = 1; id <= 12; ++id) e.add(id, 9 + static_cast<int32_t>(id), 12);  // preemptions too
  e.run();
  for (seq_id id = 1; id <= 12; ++id) ASSERT_EQ(e.ended(id), 1) << id;
  EXPECT_GT(e.penalized_steps(), 12 * 12);
  e.sampling = {};
  e.add(13, 4, 2);  // not penalized: no history; the ended ones are forgotten
  e.run();
  EXPECT_TRUE(e.shard_histories().empty()) << "the shard keeps histories of sequences that ended";
}

TEST(engine_core, a_penalized_sequence_whose_prompt_came_from_the_prefix_cache_sends_the_cached_tokens_too) {
  engine_loop e(small_engine(), /*n_blocks=*/64, /*prefix_caching=*/true);
  e.sampling.presence_penalty = 0.5f;
  e.same_prompts = true;
  e.add(1, 20, 4);
  e.run();
  e.add(2, 20, 4);  // its first 16 positions (4 blocks) are cached
  e.run();
  ASSERT_EQ(e.ended(2), 1);
  EXPECT_GT(e.outcomes().at(2).cached_prompt_tokens, 0);
}

TEST(engine_core, a_step_that_failed_for_good_fails_its_requests_and_the_engine_goes_on) {
  engine_loop e(small_engine());
  e.add(1, 10, 5);
  ASSERT_TRUE(e.step(0.01, /*fail=*/true));
  ASSERT_EQ(e.ended(1), 1);
  EXPECT_EQ(e.outcomes().at(1).kind, outcome_kind::failed);
  EXPECT_EQ(e.outcomes().at(1).message, "the model failed");
  EXPECT_FALSE(e.core().stepping());
  e.add(2, 10, 2);
  e.run();
  EXPECT_EQ(e.outcomes().at(2).kind, outcome_kind::completed);
  EXPECT_EQ(e.blocks().stats().free, e.blocks().stats().total);
}

TEST(engine_core, a_request_past_its_start_bound_is_refused_before_any_prefill_with_its_wait_as_retry_hint) {
  engine_loop e(small_engine());
  e.add(1, 10, 5, /*ttft_ms=*/100, /*start_within_ms=*/200);
  e.wait(500);
  EXPECT_FALSE(e.step());
  ASSERT_EQ(e.ended(1), 1);
  const outcome& o = e.outcomes().at(1);
  EXPECT_EQ(o.kind, outcome_kind::rejected);
  EXPECT_EQ(o.reason, reason::overloaded);
  EXPECT_EQ(o.retry_after_ms, 400);  // waited 500 ms against a 100 ms target
  EXPECT_NE(o.message.find("waited 500 ms"), std::string::npos) << o.message;
  EXPECT_EQ(e.tokens(1), 0);
  EXPECT_EQ(e.used(1), 0);
  EXPECT_EQ(e.core().stats().late_refusals, 1);
  EXPECT_EQ(o.retry_token, 0u) << "nobody to reserve its return: no token";
}

TEST(engine_core, a_late_refusal_takes_its_retry_hint_and_token_from_whoever_forecasts_the_return) {
  engine_options opts = small_engine();
  std::vector<std::pair<seq_id, int64_t>> asked;
  opts.retry_after_late = [&](seq_id id, int64_t now_ns) -> std::optional<retry_promise> {
    asked.emplace_back(id, now_ns);
    if (id == 2) return std::nullopt;  // not known there: the engine's own hint, no token
    return retry_promise{1234, 77};
  };
  engine_loop e(opts);
  e.add(1, 10, 5, /*ttft_ms=*/100, /*start_within_ms=*/200);
  e.add(2, 10, 5, /*ttft_ms=*/100, /*start_within_ms=*/200);
  e.wait(500);
  EXPECT_FALSE(e.step());
  ASSERT_EQ(asked.size(), 2u);
  for (const auto& [id, at] : asked) EXPECT_EQ(at, 1'000'000'000 + 500'000'000) << "asked at the refusal, id " << id;
  const outcome& one = e.outcomes().at(1);
  EXPECT_EQ(one.retry_after_ms, 1234);
  EXPECT_EQ(one.retry_token, 77u);
  EXPECT_NE(one.message.find("retry in 1234 ms"), std::string::npos) << one.message;
  const outcome& two = e.outcomes().at(2);
  EXPECT_EQ(two.retry_after_ms, 400);
  EXPECT_EQ(two.retry_token, 0u);
}

TEST(engine_core, a_request_waiting_for_blocks_that_paused_streams_hold_is_refused_at_its_start_bound_with_no_event) {
  // Two streams whose clients stopped reading (a window of 2 tokens, never acknowledged) hold
  // 14 of the pool's 16 blocks and used their preemptions (none allowed here), so a third
  // request cannot start. No event will come (nobody reads, nothing ends): the engine is told
  // when to look again, and then refuses it.
  engine_options o = small_engine();
  o.limits.max_preemptions = 0;
  engine_loop e(o, /*n_blocks=*/16);
  e.token_window = 2;
  e.add(1, 26, 10);
  e.add(2, 26, 10);
  e.run(20);
  ASSERT_EQ(e.tokens(1), 2);
  ASSERT_EQ(e.tokens(2), 2);
  e.token_window = 0;
  e.add(3, 20, 4, /*ttft_ms=*/100, /*start_within_ms=*/300);
  const int64_t start_by = e.now() + 300'000'000;
  for (int i = 0; i < 10 && !e.idle(); ++i) ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.idle());
  EXPECT_EQ(e.ended(3), 0);
  ASSERT_TRUE(e.wake_at().has_value()) << "idle with a request waiting, and nothing to wake the engine";
  EXPECT_GT(*e.wake_at(), start_by);
  EXPECT_LE(*e.wake_at(), start_by + 1'000'000);
  e.wait_until(*e.wake_at());
  e.step();
  ASSERT_EQ(e.ended(3), 1);
  EXPECT_EQ(e.outcomes().at(3).kind, outcome_kind::rejected);
  EXPECT_EQ(e.outcomes().at(3).reason, reason::overloaded);
}

TEST(engine_core, a_request_the_pool_can_never_hold_fails_with_what_to_do_instead_of_waiting_forever) {
  engine_options o = small_engine();
  o.limits.max_step_tokens = 256;
  engine_loop e(o, /*n_blocks=*/4);  // 16 positions
  e.add(1, 40, 2);
  e.run(10);
  ASSERT_EQ(e.ended(1), 1);
  EXPECT_EQ(e.outcomes().at(1).kind, outcome_kind::failed);
  EXPECT_NE(e.outcomes().at(1).message.find("more KV cache than the pool holds"), std::string::npos);
}

TEST(engine_core, a_lost_backend_fails_every_held_request_and_every_later_one_at_once) {
  engine_loop e(small_engine());
  e.add(1, 10, 50);
  e.step();
  e.lose_backend("gone");
  ASSERT_EQ(e.ended(1), 1);
  EXPECT_EQ(e.outcomes().at(1).kind, outcome_kind::failed);
  e.add(2, 10, 5);
  ASSERT_EQ(e.ended(2), 1);
  EXPECT_EQ(e.outcomes().at(2).message, "gone");
  EXPECT_EQ(e.core().stats().backend_problem, "gone");
}

TEST(engine_core, a_cancelled_request_hears_nothing_more_and_admission_gets_its_used_tokens) {
  engine_loop e(small_engine());
  e.add(1, 10, 50);
  e.step();
  const auto used = e.core().cancel(1);
  ASSERT_TRUE(used.has_value());
  EXPECT_EQ(*used, 11);  // the prompt and the first token
  EXPECT_FALSE(e.core().cancel(1).has_value());
  e.run();
  EXPECT_EQ(e.ended(1), 0);
  EXPECT_EQ(e.blocks().stats().free, e.blocks().stats().total);
}

TEST(engine_core, the_step_budget_follows_the_step_models_observed_error) {
  engine_options o = small_engine();
  o.step_time_target_seconds = 0.1;
  o.step_prior = {0.001, 0.0001, 0.001, 0};
  engine_loop e(o);
  EXPECT_DOUBLE_EQ(e.core().budget().headroom, step_time_headroom);  // nothing observed yet
  // Steps that take what the model says: the most headroom allowed.
  for (seq_id id = 1; id <= 40; ++id) e.add(id, 8, 30);
  for (int i = 0; i < 150; ++i) e.step(-1.0);
  EXPECT_NEAR(e.core().budget().headroom, step_time_headroom, 0.01);
  // Then every other step a third slower than the fit: the 95th percentile of actual /
  // predicted is ~4/3, so the target is divided by it.
  for (seq_id id = 100; id <= 140; ++id) e.add(id, 8, 30);
  for (int i = 0; i < 300; ++i) e.step(i % 2 ? -1.0 : -4.0 / 3.0);
  EXPECT_LT(e.core().budget().headroom, 0.85);
  EXPECT_GT(e.core().budget().headroom, 0.6);
  // Far slower than any fit: the floor.
  for (seq_id id = 200; id <= 240; ++id) e.add(id, 8, 30);
  for (int i = 0; i < 300; ++i) e.step(i % 2 ? -1.0 : -5.0);
  EXPECT_GE(e.core().budget().headroom, least_step_headroom);
  EXPECT_NEAR(e.core().budget().seconds, 0.1 * e.core().budget().headroom, 1e-12);
}

TEST(engine_core, credits_give_the_waiting_room_and_the_load_admission_predicts_with) {
  engine_options o = small_engine();
  o.limits.max_step_seqs = 1;  // one runs, the rest wait
  engine_loop e(o);
  for (seq_id id = 1; id <= 3; ++id) e.add(id, 10, 20);
  e.step();
  const engine_credits c = e.core().credits();
  EXPECT_EQ(c.max_waiting, 4);
  EXPECT_EQ(c.received_by_priority.at(0), 3);
  EXPECT_EQ(c.load.running() + c.load.waiting(), 3);
  ASSERT_EQ(c.load.tiers.size(), 1u);
  EXPECT_EQ(c.load.tiers[0].waiting, 2);
  EXPECT_EQ(c.load.tiers[0].running, 1);
  EXPECT_EQ(c.load.tiers[0].decodes, 1) << "the one that ran prefilled its prompt";
  EXPECT_EQ(c.load.tiers[0].prompt_tokens, 2 * 10) << "the waiting prompts";
  EXPECT_EQ(c.load.max_step_seqs, 1);
  EXPECT_EQ(c.load.step_observations, 8 + 1);  // the prior's weight, then the step that ran
  EXPECT_EQ(c.load.max_step_tokens, o.limits.max_step_tokens);
  EXPECT_EQ(c.load.step_seconds, 0.0) << "no time target: only the token limit";
}

TEST(credit_ledger, a_higher_priority_has_credit_while_a_lower_one_is_out_of_it) {
  credit_ledger room;
  engine_credits c;
  c.max_waiting = 2;
  c.load.tiers = {tier_load{0, 2, 0, 0, 0, 0, 100, 0}};
  room.update(c);
  EXPECT_FALSE(room.has_credit(0));
  EXPECT_TRUE(room.has_credit(1));  // the lower tier's waiting requests do not count against it
  room.sent(1);
  room.sent(1);
  EXPECT_FALSE(room.has_credit(1));  // two on their way
  c.received_by_priority[1] = 2;     // the engine received them, and they run
  room.update(c);
  EXPECT_TRUE(room.has_credit(1));
}

// 1 ms + 0.1 ms a prompt token a step, 64 tokens a step: a 200-token prompt takes ~25 ms
// alone, 4 uncached tokens ~1.4 ms, against a 10 ms target.
TEST(engine_core, a_request_that_finds_less_of_its_prefix_cached_than_expected_says_so_when_it_cannot_start_in_time) {
  engine_options timed = small_engine();
  timed.step_time_target_seconds = 0.05;  // a time budget: its step model judges feasibility
  engine_loop evicted(timed, 256);
  evicted.expected_cached = 196;
  evicted.add(1, 200, 2, 10);
  evicted.run();
  ASSERT_EQ(evicted.ended(1), 1);
  const outcome& o = evicted.outcomes().at(1);
  ASSERT_EQ(o.degradations.size(), 1u);
  EXPECT_NE(o.degradations[0].find("196 of its 200 prompt tokens were expected in the prefix cache and 0 were found: it "
                                   "cannot start within its tier's 10 ms"),
            std::string::npos)
      << o.degradations[0];

  engine_loop cached(timed, 256, true);
  cached.same_prompts = true;
  cached.add(1, 200, 2);
  cached.run();
  cached.expected_cached = 196;
  cached.add(2, 200, 2, 10);
  cached.run();
  ASSERT_EQ(cached.ended(2), 1);
  EXPECT_EQ(cached.outcomes().at(2).cached_prompt_tokens, 196);
  EXPECT_TRUE(cached.outcomes().at(2).degradations.empty()) << cached.outcomes().at(2).degradations[0];
}

TEST(engine_core, credits_say_how_much_of_a_tiers_prompts_the_prefix_cache_held) {
  engine_options o = small_engine();
  engine_loop e(o, 64, true);
  e.same_prompts = true;  // every prompt the same 64 tokens: after the first, 3 of its 4 blocks are cached
  for (seq_id id = 1; id <= 40; ++id) {
    e.add(id, 64, 2);
    while (e.step()) {
    }
  }
  const engine_credits c = e.core().credits();
  ASSERT_EQ(c.load.tiers.size(), 0u) << "nothing held: no tier reported";
  e.add(100, 64, 2);
  const engine_credits now = e.core().credits();
  ASSERT_EQ(now.load.tiers.size(), 1u);
  EXPECT_GT(now.load.tiers[0].cached_share, 0.5);
  EXPECT_LE(now.load.tiers[0].cached_share, 1.0);
}

}  // namespace
}  // namespace tireless
