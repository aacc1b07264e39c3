#include "scheduler/batch_scheduler.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "scheduler/block_manager.hpp"
#include "scheduler/kv_plan.hpp"

namespace tireless {
namespace {

// A batch_scheduler with a real block pool behind it: run() does one whole step (propose,
// plan_kv, finalize, commit) and samples token 7 for every sequence that samples.
class stepper {
 public:
  explicit stepper(scheduler_limits limits, int32_t n_blocks = 4096, bool prefix_caching = false)
      : limits_(limits), core_(limits), blocks_({.n_blocks = n_blocks, .block_size = limits.block_size,
                                                  .prefix_caching = prefix_caching, .watermark_blocks = 0}) {}

  // Deadlines (ms) make it arrive now (or `arrived_ms_ago`), on the stepper's clock; without
  // them it arrives in id order.
  void add(seq_id id, int32_t priority, int32_t prompt_tokens, int32_t max_tokens, int64_t ttft_ms = 0,
           int64_t tpot_ms = 0, int64_t arrived_ms_ago = 0) {
    sequence_spec s;
    s.id = id;
    s.priority = priority;
    s.arrival = ttft_ms > 0 ? static_cast<uint64_t>(now_ - arrived_ms_ago * 1'000'000) : id;
    s.ttft_target_ns = ttft_ms * 1'000'000;
    s.tpot_target_ns = tpot_ms * 1'000'000;
    s.prompt.resize(static_cast<size_t>(prompt_tokens));
    std::iota(s.prompt.begin(), s.prompt.end(), static_cast<token_id>(100 * id));
    s.max_tokens = max_tokens;
    core_.add(std::move(s));
  }
  // A request arriving now with this prompt, a 500 ms first-token target, and expected_cached
  // of its prompt expected in the prefix cache.
  void add_prompt(seq_id id, std::vector<token_id> prompt, int32_t expected_cached) {
    sequence_spec s;
    s.id = id;
    s.priority = 2;
    s.arrival = static_cast<uint64_t>(now_);
    s.ttft_target_ns = 500'000'000;
    s.prompt = std::move(prompt);
    s.max_tokens = 2;
    s.expected_cached = expected_cached;
    core_.add(std::move(s));
  }

  // One step; returns the tokens each sequence computed in it. The clock moves by the
  // budget's seconds (1 ms without one), and the step's tokens come at its end.
  // timed: the clock moves by what the budget's model says the step costs (its decodes and
  // prompt tokens) instead.
  std::map<seq_id, int32_t> run(const step_time_budget& budget, bool timed = false) {
    const kv_request request = core_.propose(budget, now_);
    if (!timed) now_ += budget.seconds > 0 ? static_cast<int64_t>(budget.seconds * 1e9) : 1'000'000;
    const kv_reply reply = plan_kv(blocks_, request);
    const step_batch batch = core_.finalize(reply);
    std::map<seq_id, int32_t> computed;
    step_result result;
    double seconds = batch.seqs.empty() ? 0.001 : budget.c0;
    for (const sequence_step& s : batch.seqs) {
      computed[s.seq_id] = static_cast<int32_t>(s.tokens.size());
      result.next.push_back(s.sample ? 7 : -1);
      seconds += s.tokens.size() == 1 ? budget.per_decode : budget.per_prefill_token * static_cast<double>(s.tokens.size());
    }
    if (timed) now_ += static_cast<int64_t>(seconds * 1e9);
    for (const scheduler_event& e : core_.commit(result, now_)) {
      if (e.what == scheduler_event::kind::finished) finished_.push_back(e.seq);
      if (e.what == scheduler_event::kind::tokens) token_times_[e.seq].push_back(now_);
      if (e.what == scheduler_event::kind::preempted) ++preempted_[e.seq];
    }
    return computed;
  }

  const std::vector<seq_id>& finished() const { return finished_; }
  int32_t preempted(seq_id id) const { return preempted_.count(id) ? preempted_.at(id) : 0; }
  batch_scheduler& core() { return core_; }
  const std::vector<int64_t>& token_times(seq_id id) { return token_times_[id]; }
  int64_t now() const { return now_; }

 private:
  scheduler_limits limits_;
  batch_scheduler core_;
  block_manager blocks_;
  std::vector<seq_id> finished_;
  std::map<seq_id, std::vector<int64_t>> token_times_;
  std::map<seq_id, int32_t> preempted_;
  int64_t now_ = 1'000'000'000;
};

// A machine slower than the step target (a sanitizer build, a loaded host): a step costs
// more than the whole budget before anything is in it.
step_time_budget slower_than_the_target() {
  return {.seconds = 0.150, .c0 = 0.200, .per_prefill_token = 0.004, .per_decode = 0.020,
          .per_context_position = 0};
}

TEST(batch_scheduler, a_waiting_request_is_prefilled_while_running_decodes_fill_the_time_budget) {
  stepper s({.max_step_tokens = 256, .max_step_seqs = 32});
  s.add(1, 2, 20, 1000);
  s.add(2, 2, 20, 1000);
  // Both start (the first step has room for their prompts' first chunks, or makes progress).
  for (int i = 0; i < 20; ++i) s.run(slower_than_the_target());
  s.add(3, 2, 40, 4);
  // Requests 1 and 2 decode for another ~1000 steps; request 3 must not wait for them, nor
  // request 2 for request 1 (skipping a decode of the tier the budget is for only makes its
  // time per token worse).
  const auto both = s.run(slower_than_the_target());
  EXPECT_EQ(both.count(1) + both.count(2), 2u) << "a running request of the first tier was not decoded";
  int32_t steps = 0;
  while (std::find(s.finished().begin(), s.finished().end(), 3) == s.finished().end()) {
    ASSERT_LT(++steps, 60) << "a waiting request was starved by running decodes that fill the step's time";
    s.run(slower_than_the_target());
  }
}

TEST(batch_scheduler, a_lower_tier_request_waits_behind_a_higher_tier_that_fills_the_budget) {
  // The floor of prefill progress goes to the highest tier that waits: a premium prompt is
  // prefilled before a free request's, whatever the budget.
  stepper s({.max_step_tokens = 256, .max_step_seqs = 32});
  s.add(1, 2, 20, 1000);
  s.add(2, 2, 20, 1000);
  for (int i = 0; i < 20; ++i) s.run(slower_than_the_target());
  s.add(3, 0, 200, 4);   // free
  s.add(4, 2, 200, 4);   // premium, later
  const auto first = s.run(slower_than_the_target());
  EXPECT_GT(first.count(4), 0u) << "the premium prompt got no prefill";
  EXPECT_EQ(first.count(3), 0u) << "the free prompt was prefilled before the premium one";
}

// An H200-like step: 50 ms, most of it prefill (10 tokens a millisecond).
step_time_budget fifty_ms_steps() {
  return {.seconds = 0.050, .c0 = 0.005, .per_prefill_token = 0.0001, .per_decode = 0.0005,
          .per_context_position = 0};
}

TEST(batch_scheduler, within_a_tier_a_short_prompt_after_a_long_one_that_cannot_meet_its_deadline_starts_first) {
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32});
  s.add(1, 2, 9000, 4, 500);  // ~0.9 s of prefill alone: it cannot start within 500 ms
  s.run(fifty_ms_steps());
  s.add(2, 2, 300, 4, 500);   // same tier, later, ~30 ms of prefill
  const auto step = s.run(fifty_ms_steps());
  EXPECT_EQ(step.count(2) ? step.at(2) : 0, 300) << "the short prompt waited behind the long one";
  ASSERT_FALSE(s.token_times(2).empty());
  EXPECT_EQ(s.token_times(1).size(), 0u);
}

TEST(batch_scheduler, within_a_tier_prefill_goes_by_earliest_deadline_and_several_prompts_share_a_step) {
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32});
  s.add(1, 2, 200, 4, 2000);  // the latest deadline, though first
  s.add(2, 2, 3000, 4, 500);  // ~0.3 s of prefill in 0.5 s
  s.add(3, 2, 100, 4, 500);
  const auto step = s.run(fifty_ms_steps());
  // 450 prompt tokens fit: request 2's chunk first (its deadline is the earliest, and it came
  // before request 3), nothing for the others yet.
  EXPECT_GT(step.count(2) ? step.at(2) : 0, 400);
  EXPECT_EQ(step.count(1) + step.count(3), 0u);
  // Each meets its deadline.
  for (int i = 0; i < 20; ++i) s.run(fifty_ms_steps());
  for (seq_id id : {1, 2, 3}) ASSERT_FALSE(s.token_times(id).empty()) << id;
  const int64_t start = 1'000'000'000;
  EXPECT_LE(s.token_times(1)[0] - start, 2'000'000'000);
  EXPECT_LE(s.token_times(2)[0] - start, 500'000'000);
  EXPECT_LE(s.token_times(3)[0] - start, 500'000'000);
}

TEST(batch_scheduler, a_burst_feasible_one_by_one_but_not_together_keeps_the_most_on_time) {
  // Four prompts of one tier at once, each due in 500 ms: ~0.35 s of prefill for the first,
  // ~0.1 s for each of the others; together more than the deadline allows. A stream of the
  // tier decodes at its TPOT meanwhile, so no step can stretch. In deadline order (the first
  // came first) the long one makes the short ones late; with the longest last, the short ones
  // are on time.
  std::map<bool, int> on_time;
  for (const bool most_on_time : {false, true}) {
    stepper s({.max_step_tokens = 4096, .max_step_seqs = 32, .most_on_time = most_on_time});
    s.add(9, 2, 10, 1000, 500, 50);
    s.run(fifty_ms_steps());
    const int64_t start = s.now();
    s.add(1, 2, 3500, 4, 500);
    for (seq_id id : {2, 3, 4}) s.add(id, 2, 1000, 4, 500);
    for (int i = 0; i < 40; ++i) s.run(fifty_ms_steps());
    for (seq_id id : {1, 2, 3, 4}) {
      ASSERT_FALSE(s.token_times(id).empty()) << id;
      on_time[most_on_time] += s.token_times(id)[0] - start <= 500'000'000;
    }
    if (most_on_time) {
      EXPECT_GT(s.token_times(1)[0], s.token_times(4)[0]) << "the longest went last";
    }
  }
  EXPECT_LE(on_time[false], 2) << "deadline order";
  EXPECT_GE(on_time[true], 3) << "longest last";
}

TEST(batch_scheduler, the_least_slack_peer_prefills_the_prompt_with_the_least_time_to_spare_first) {
  // Request 1's deadline is the earliest, but request 2 has less slack: ~0.9 s of prefill due
  // in 1 s, against request 1's 30 ms in 500 ms. Earliest deadline first picks 1, least slack 2.
  for (const bool least_slack : {false, true}) {
    stepper s({.max_step_tokens = 4096, .max_step_seqs = 32, .least_slack = least_slack});
    s.add(1, 0, 300, 4, 500);
    s.add(2, 0, 9000, 4, 1000);
    const auto step = s.run(fifty_ms_steps());
    if (least_slack) {
      EXPECT_EQ(step.count(1), 0u) << "least slack: the whole step's prefill goes to request 2";
      EXPECT_GT(step.count(2) ? step.at(2) : 0, 400);
    } else {
      EXPECT_EQ(step.count(1) ? step.at(1) : 0, 300) << "earliest deadline: request 1's prompt goes first, whole";
    }
  }
}

TEST(batch_scheduler, a_step_stretches_within_its_decodes_slack_when_a_prompt_would_miss_its_deadline) {
  // ~385 ms of prefill due in 400 ms: at a 50 ms budget's pace (~450 tokens a step) it takes 9
  // steps, 450 ms. With no decode to wait for, the step takes the whole prompt.
  {
    stepper s({.max_step_tokens = 4096, .max_step_seqs = 32});
    s.add(1, 2, 3800, 4, 400);
    const auto step = s.run(fifty_ms_steps());
    EXPECT_GT(step.at(1), 1000) << "the step kept its budget while the prompt would miss its deadline";
  }
  // A decode whose next token is due within the budget keeps the step at it.
  {
    stepper s({.max_step_tokens = 4096, .max_step_seqs = 32});
    s.add(2, 2, 10, 1000, 400, 50);
    s.run(fifty_ms_steps());
    ASSERT_EQ(s.token_times(2).size(), 1u);
    s.add(1, 2, 3800, 4, 400);
    const auto step = s.run(fifty_ms_steps());
    EXPECT_EQ(step.count(2), 1u);
    EXPECT_LE(step.count(1) ? step.at(1) : 0, 450) << "the step stretched past a decode's deadline";
  }
  // A prompt that meets its deadline at the budget's pace: no stretch.
  {
    stepper s({.max_step_tokens = 4096, .max_step_seqs = 32});
    s.add(1, 2, 3800, 4, 2000);
    EXPECT_LE(s.run(fifty_ms_steps()).at(1), 450);
  }
}

TEST(batch_scheduler, a_prompt_an_idle_engine_puts_on_time_is_done_in_one_step_when_the_decodes_beside_it_can_wait) {
  // A premium prompt of 4,300 tokens due in 440 ms: 435 ms of prefill in one step, as on an
  // idle engine, but 3 steps of max_step_stretch budgets (150 ms, ~1,450 tokens each) would
  // take 450 ms with their step overhead. A free stream far ahead of its deadline (a token per
  // 200 ms, a step of 50 ms each) can wait that long: the prompt goes in one step.
  {
    stepper s({.max_step_tokens = 8192, .max_step_seqs = 32}, 4096);
    s.add(1, 0, 10, 1000, 1000, 200);
    for (int i = 0; i < 20; ++i) s.run(fifty_ms_steps());
    ASSERT_GE(s.token_times(1).size(), 18u);
    s.add(2, 2, 4300, 4, 440, 50);
    const auto step = s.run(fifty_ms_steps());
    EXPECT_EQ(step.count(2) ? step.at(2) : 0, 4300) << "the prompt was cut into steps that miss its deadline";
  }
  // A stream of the prompt's tier (a token per 100 ms) 250 ms ahead of its next token's
  // deadline: the step stretches past max_step_stretch budgets (~1,450 tokens), within that.
  {
    stepper s({.max_step_tokens = 8192, .max_step_seqs = 32}, 4096);
    s.add(1, 2, 10, 1000, 250, 100);
    for (int i = 0; i < 5; ++i) s.run(fifty_ms_steps());
    const std::vector<int64_t> t = s.token_times(1);
    ASSERT_EQ(t.size(), 5u);
    const int64_t slack = t.front() + 5 * 100'000'000 - s.now();
    ASSERT_EQ(slack, 300'000'000);
    s.add(2, 2, 4300, 4, 440, 50);
    const auto step = s.run(fifty_ms_steps());
    EXPECT_EQ(step.count(1), 1u) << "the stream skipped the step it is due at the end of";
    EXPECT_GT(step.count(2) ? step.at(2) : 0, 1450) << "the step kept max_step_stretch budgets";
    EXPECT_LE(step.count(2) ? step.at(2) : 0, 2950) << "the step ran past the stream's next token (c0 5 ms, a decode 0.5 ms)";
  }
}

TEST(batch_scheduler, without_deadlines_a_tier_keeps_arrival_order) {
  stepper s({.max_step_tokens = 256, .max_step_seqs = 32});
  s.add(1, 2, 2000, 4);
  s.add(2, 2, 100, 4);
  const auto step = s.run(step_time_budget{});
  EXPECT_EQ(step.at(1), 256);
  EXPECT_EQ(step.count(2), 0u);
}

TEST(batch_scheduler, a_lower_tier_decode_yields_to_a_higher_tier_prompt_only_within_its_own_slack) {
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32}, 4096);
  s.add(1, 0, 10, 1000, 10'000, 200);  // free: a token every 200 ms
  for (int i = 0; i < 3; ++i) s.run(fifty_ms_steps());
  ASSERT_FALSE(s.token_times(1).empty());
  s.add(2, 2, 30'000, 4, 10'000, 50);  // premium: ~3 s of prefill, it fills every step
  bool yielded = false;
  for (int i = 0; i < 60; ++i) {
    const auto step = s.run(fifty_ms_steps());
    yielded |= step.count(1) == 0;
    EXPECT_GT(step.count(2), 0u) << "the premium prompt got no prefill";
  }
  EXPECT_TRUE(yielded) << "the free decode never yielded to the premium prompt";
  // ... but never past its own next token's due time (plus the step it comes at the end of).
  const std::vector<int64_t>& t = s.token_times(1);
  ASSERT_GT(t.size(), 10u) << "the free decode starved behind the premium prompt";
  for (size_t k = 1; k < t.size(); ++k) {
    EXPECT_LE(t[k], t[0] + static_cast<int64_t>(k) * 200'000'000 + 50'000'000) << "token " << k;
  }
}


TEST(batch_scheduler, a_decode_ahead_of_its_deadline_yields_to_a_prompt_of_its_tier_or_higher_that_would_miss) {
  // A decode due a token a second has slack; a 4300-token prompt due in 440 ms misses at the
  // budget's pace beside it. Another decode (a token per 100 ms) is due in 200 ms: the step
  // stretches to that, too short for the whole prompt, so the first decode yields when the
  // prompt is of its tier or higher, never when it is of a lower tier; the second, due at
  // the step's end, runs.
  for (const int32_t prompt_priority : {2, 3, 0}) {
    stepper s({.max_step_tokens = 8192, .max_step_seqs = 32}, 1024);
    s.add(1, 2, 10, 1000, 10'000, 1000);
    s.add(3, 2, 10, 1000, 10'000, 100);
    for (int i = 0; i < 3; ++i) s.run(fifty_ms_steps());
    ASSERT_EQ(s.token_times(1).size(), 3u);
    ASSERT_EQ(s.token_times(3).front() + 300'000'000 - s.now(), 200'000'000);
    s.add(2, prompt_priority, 4300, 4, 440, 50);
    const auto step = s.run(fifty_ms_steps());
    EXPECT_GT(step.count(2), 0u) << "priority " << prompt_priority;
    EXPECT_EQ(step.count(3), 1u) << "priority " << prompt_priority;
    EXPECT_EQ(step.count(1), prompt_priority >= 2 ? 0u : 1u) << "priority " << prompt_priority;
    // The yielding decode is never late.
    for (int i = 0; i < 40; ++i) s.run(fifty_ms_steps());
    const std::vector<int64_t>& t = s.token_times(1);
    for (size_t k = 1; k < t.size(); ++k) EXPECT_LE(t[k], t[0] + static_cast<int64_t>(k) * 1'000'000'000) << k;
  }
}

TEST(batch_scheduler, streams_never_yield_to_a_prompt_the_kv_pool_cannot_hold_until_blocks_come_back) {
  // Two streams far ahead of their deadlines hold 14 blocks of a pool of 16. A 150-token
  // prompt would miss its first-token deadline at the budget's pace, so its first chunk would
  // take the step's whole token budget and the streams would yield; but the pool cannot hold
  // it beside what the streams are still to write (10 blocks). Yielding to it would stall the
  // streams for good: nothing else changes (the engine proposes again only on an event). So
  // it is not proposed (no refusal, no replan), the streams run, and the prompt waits until
  // blocks come back; then it is served.
  stepper s({.max_step_tokens = 64, .max_step_seqs = 32}, 16);
  s.add(1, 2, 200, 8, 10'000, 1000);
  s.add(2, 2, 10, 8, 10'000, 1000);
  for (int i = 0; i < 6; ++i) s.run(fifty_ms_steps());
  ASSERT_EQ(s.token_times(1).size(), 3u);
  s.add(3, 2, 150, 4, 120, 50);
  const auto next = s.run(fifty_ms_steps());
  EXPECT_EQ(next.count(3), 0u);
  EXPECT_EQ(next.count(1), 1u) << "the stream yielded to a prompt the pool cannot hold";
  EXPECT_EQ(next.count(2), 1u);
  EXPECT_FALSE(s.core().take_replan()) << "nothing was refused: nothing to propose again";
  // The streams end (8 tokens each) and give their blocks back: the prompt is served.
  for (int i = 0; i < 20 && s.finished().size() < 3; ++i) s.run(fifty_ms_steps());
  EXPECT_EQ(s.finished(), (std::vector<seq_id>{1, 2, 3}));
}

TEST(batch_scheduler, a_start_never_takes_the_blocks_its_own_tiers_running_answers_will_need) {
  // Two premium streams with long answers ahead (1000 tokens each, 16-token blocks: 69 blocks
  // each by their end) run in a pool of 160 blocks. A third premium prompt would fit the pool
  // now, but not beside what the two will still write: started, it would later preempt one of
  // them (a stall of a stream of its own tier). It waits instead.
  stepper s({.max_step_tokens = 512, .max_step_seqs = 32}, 160);
  s.add(1, 3, 100, 1000, 10'000, 1000);
  s.add(2, 3, 100, 1000, 10'000, 1000);
  for (int i = 0; i < 3; ++i) s.run(fifty_ms_steps());
  s.add(3, 3, 400, 1000, 10'000, 1000);
  for (int i = 0; i < 20; ++i) {
    const auto step = s.run(fifty_ms_steps());
    EXPECT_EQ(step.count(3), 0u) << "step " << i;
    EXPECT_EQ(step.count(1), 1u) << "step " << i;
    EXPECT_EQ(step.count(2), 1u) << "step " << i;
  }
  for (seq_id id : {1, 2}) EXPECT_EQ(s.preempted(id), 0) << id;
  for (int i = 0; i < 4000 && s.finished().size() < 3; ++i) s.run(fifty_ms_steps());
  EXPECT_EQ(s.finished(), (std::vector<seq_id>{1, 2, 3}));
}

// A stream's tokens from the `from`th on: more than four came, none later than `most_ns` after
// the one before.
void expect_pauses_at_most(const std::vector<int64_t>& t, size_t from, int64_t most_ns) {
  ASSERT_GT(t.size(), from + 4) << "the stream stalled";
  for (size_t k = std::max<size_t>(from, 1); k < t.size(); ++k) {
    EXPECT_LE(t[k] - t[k - 1], most_ns) << "token " << k;
  }
}

TEST(batch_scheduler, a_stream_far_ahead_of_its_deadline_never_pauses_longer_than_its_tier_waits_for_a_first_token) {
  // A free stream (a token per 200 ms, the first within 400 ms) runs alone at a token a step
  // (50 ms) for 60 steps: ~9 s ahead of its deadline. Then a premium prompt fills every step
  // for ~3 s. The free stream yields, but never for longer than longest_pause_ns() (600 ms,
  // max_step_stretch TPOTs here) plus the step its token ends.
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32}, 4096);
  s.add(1, 0, 10, 1000, 400, 200);
  for (int i = 0; i < 60; ++i) s.run(fifty_ms_steps());
  const size_t before = s.token_times(1).size();
  ASSERT_GE(before, 55u);
  s.add(2, 2, 30'000, 4, 10'000, 50);
  bool yielded = false;
  for (int i = 0; i < 60; ++i) yielded |= s.run(fifty_ms_steps()).count(1) == 0;
  EXPECT_TRUE(yielded) << "the free decode never yielded to the premium prompt";
  expect_pauses_at_most(s.token_times(1), before, 600'000'000 + 50'000'000);
}

TEST(batch_scheduler, a_stretched_step_keeps_its_own_error_margin_under_the_pause_its_streams_may_wait) {
  // A stream (a token per 100 ms, pauses of 300 ms at most) runs ahead of its deadlines; a
  // 4,000-token prompt due in 420 ms would miss at the budget's pace (~445 tokens a step) but
  // not on an idle engine (0.41 s): the step stretches as far as the stream can wait (300 ms).
  // Where such long steps ran slower than the fit says (stretch_headroom 0.5: their p95 was
  // twice the prediction), the stretched step takes half the wait.
  auto stretched_tokens = [](double stretch_headroom) {
    stepper s({.max_step_tokens = 8192, .max_step_seqs = 32}, 4096);
    s.add(1, 2, 10, 1000, 200, 100);
    for (int i = 0; i < 10; ++i) s.run(fifty_ms_steps());
    s.add(2, 2, 4000, 4, 420);
    step_time_budget b = fifty_ms_steps();
    b.stretch_headroom = stretch_headroom;
    const auto step = s.run(b);
    return step.count(2) ? step.at(2) : 0;
  };
  const int32_t full = stretched_tokens(1.0), margin = stretched_tokens(0.5);
  EXPECT_GT(full, 2500) << "the step did not stretch to the stream's pause";
  EXPECT_GT(margin, 445) << "no stretch at all";
  EXPECT_LT(margin, full * 6 / 10);
}

TEST(batch_scheduler, a_step_stretched_for_a_prompt_leaves_a_stream_out_of_the_step_its_next_token_in_time) {
  // Two places a step. A free stream (a token per 200 ms, pauses of 600 ms at most) runs far
  // ahead of its deadlines; then premium prompts of 1,000-3,000 tokens, each due in 500 ms,
  // arrive one a step and take both places: the stream is left out of the step (no place)
  // until its token is due within two steps. Each prompt would miss its deadline at the
  // budget's pace, so its steps stretch; a stretched step must leave the stream, a step after
  // it, within its 600 ms (the clock moves by each step's modelled cost). Before, only the
  // streams in the step bounded the stretch (random machine seed 12: 28 ms past a 6-s bound).
  stepper s({.max_step_tokens = 8192, .max_step_seqs = 2}, 4096);
  s.add(1, 0, 10, 2000, 400, 200);
  for (int i = 0; i < 60; ++i) s.run(fifty_ms_steps(), true);
  const size_t before = s.token_times(1).size();
  ASSERT_GE(before, 55u);
  for (seq_id id = 2; id < 200; ++id) {
    s.add(id, 2, 1000 + static_cast<int32_t>(id * 737 % 2000), 1, 500, 50);
    s.run(fifty_ms_steps(), true);
  }
  expect_pauses_at_most(s.token_times(1), before, 600'000'000);
}

TEST(batch_scheduler, a_queue_of_higher_tier_prompts_takes_no_place_a_running_stream_needs_to_keep_its_pace) {
  // Four places a step. A free stream runs; then eight premium prompts arrive, more than the
  // step's tokens take at once. They come first in keep order, but a place a prompt gets no
  // tokens in is wasted, and the free stream's next token is due: it keeps a place whenever
  // skipping would make it late, so it never pauses longer than longest_pause_ns() (600 ms)
  // plus the step its token ends. (Before, the prompts took every place and the stream
  // waited for all of them: 19 s on the CPU through the real server.)
  stepper s({.max_step_tokens = 512, .max_step_seqs = 4}, 4096);
  s.add(1, 0, 10, 1000, 400, 200);
  for (int i = 0; i < 5; ++i) s.run(fifty_ms_steps());
  const size_t before = s.token_times(1).size();
  ASSERT_GE(before, 3u);
  for (seq_id id = 2; id < 10; ++id) s.add(id, 2, 3'000, 4, 10'000, 50);
  for (int i = 0; i < 80; ++i) s.run(fifty_ms_steps());
  expect_pauses_at_most(s.token_times(1), before, 600'000'000 + 50'000'000);
  for (seq_id id = 2; id < 10; ++id) {
    EXPECT_FALSE(s.token_times(id).empty()) << "premium prompt " << id << " never got its first token";
  }
}

TEST(batch_scheduler, a_prompt_further_back_in_line_that_would_miss_its_deadline_stretches_the_step) {
  // Request 1 (400 tokens, due in 300 ms) is first in line and makes its deadline at the
  // budget's pace (~445 tokens a step); request 2 (4200 tokens, due in 500 ms) comes after it
  // and would not: 11 steps, 550 ms. A decode far ahead of its deadline leaves the slack, so
  // the step stretches for request 2 although request 1, first in line, would not need it:
  // once request 1 is done (in a step of the budget: one for both would make it late),
  // request 2 takes the next step whole. Then request 1 of 1,300 tokens (due in 300 ms) and
  // request 2 of 2,300 (due in 420 ms: 9 steps at the budget's pace, 450 ms, though both are
  // on time on an idle engine, 135 + 235 ms): one step for both (~366 ms) would make request 1
  // late, so the step stretches to take request 1 whole (~136 ms) and ends with it.
  struct line {
    int32_t first_tokens;
    int64_t first_due_ms;
    int32_t second_tokens;
    int64_t second_due_ms;
  };
  for (const line& l : {line{400, 300, 4200, 500}, line{1300, 300, 2300, 420}}) {
    stepper s({.max_step_tokens = 8192, .max_step_seqs = 32}, 1024);
    s.add(9, 2, 10, 1000, 10'000, 10'000);
    s.run(fifty_ms_steps());
    s.add(1, 2, l.first_tokens, 4, l.first_due_ms);
    s.add(2, 2, l.second_tokens, 4, l.second_due_ms);
    const auto step = s.run(fifty_ms_steps());
    EXPECT_EQ(step.count(1) ? step.at(1) : 0, l.first_tokens) << "request 1 was not taken whole";
    const int32_t first = step.count(2) ? step.at(2) : 0;
    EXPECT_LE(first, 50) << "the step ran on past request 1's deadline (" << l.first_tokens << " tokens)";
    if (l.first_tokens > 1000) continue;  // the stepper's clock moves 50 ms, not the step's length
    const auto next = s.run(fifty_ms_steps());
    EXPECT_EQ(next.count(2) ? next.at(2) : 0, l.second_tokens - first) << "the step kept the budget's pace though request 2 would miss at it";
  }
  // Without request 2, request 1 alone gets the budget's pace.
  stepper alone({.max_step_tokens = 8192, .max_step_seqs = 32});
  alone.add(9, 2, 10, 1000, 10'000, 10'000);
  alone.run(fifty_ms_steps());
  alone.add(1, 2, 4000, 4, 2000);
  EXPECT_LE(alone.run(fifty_ms_steps()).at(1), 450);
}

TEST(batch_scheduler, a_started_prompt_about_to_be_late_goes_ahead_of_higher_tier_prompts_with_time_to_spare) {
  // At most 512 tokens a step (~445 at the budget's pace). A free prompt of 3,000 tokens
  // (target 5 s: late after 10 s) that arrived 9 s ago gets a first chunk; then four premium
  // prompts of 2,000 tokens arrive. Behind them (~18 steps, 900 ms) the free prompt's first
  // token would come after its late line, a second away. Due in 3 s, they have time to spare:
  // its rest (~6 steps) goes first once it would otherwise be late, and they still make their
  // deadline. Due in 1 s they have none: they go first, and make it.
  for (const int64_t premium_due_ms : {3000, 1000}) {
    SCOPED_TRACE(premium_due_ms);
    stepper s({.max_step_tokens = 512, .max_step_seqs = 32}, 4096);
    for (int i = 0; i < 200; ++i) s.run(fifty_ms_steps());  // a clock past the free prompt's arrival
    const int64_t late_line = s.now() - 9'000'000'000 + 10'000'000'000;
    s.add(1, 0, 3000, 4, 5000, 200, 9000);
    EXPECT_GT(s.run(fifty_ms_steps()).count(1), 0u) << "the free prompt did not start";
    const int64_t premium_arrival = s.now();
    for (seq_id id = 2; id < 6; ++id) s.add(id, 2, 2000, 4, premium_due_ms, 50);
    for (int i = 0; i < 60; ++i) s.run(fifty_ms_steps());
    for (seq_id id = 2; id < 6; ++id) {
      ASSERT_FALSE(s.token_times(id).empty());
      EXPECT_LE(s.token_times(id).front() - premium_arrival, premium_due_ms * 1'000'000) << "premium prompt " << id;
    }
    ASSERT_FALSE(s.token_times(1).empty());
    if (premium_due_ms == 3000) EXPECT_LE(s.token_times(1).front(), late_line) << "the started free prompt was late";
  }
}

TEST(batch_scheduler, a_prompt_of_a_tier_never_shed_that_missed_its_target_goes_by_its_late_line) {
  // All of one tier that is never refused after admission (no start_by), 300 tokens each
  // (~30 ms; a step takes ~445): request 1 arrived 600 ms ago (due at 500, late at 1000 ms,
  // twice its target), request 2 arrives now (due in 500 ms), request 3 arrived 1100 ms ago
  // (past its late line too). The step's prefill goes to 1 first (its late line is before 2's
  // deadline), then 2, and 3 last (it is late whatever happens now).
  stepper s({.max_step_tokens = 500, .max_step_seqs = 32});
  s.add(1, 2, 300, 4, 500, 0, 600);
  s.add(2, 2, 300, 4, 500);
  s.add(3, 2, 300, 4, 500, 0, 1100);
  const auto step = s.run(fifty_ms_steps());
  EXPECT_EQ(step.count(1) ? step.at(1) : 0, 300) << "the one still able to make its late line went first";
  EXPECT_EQ(step.count(2) ? step.at(2) : 0, 200) << "the fresh one next";
  EXPECT_EQ(step.count(3), 0u) << "the one past its late line went last";
}

TEST(batch_scheduler, an_unstarted_request_is_taken_out_once_its_prefill_can_no_longer_end_by_its_start_bound) {
  // 10 tokens a millisecond: 4000 tokens take ~0.4 s on an idle engine, 100 take ~15 ms. Both
  // may start for 50 ms more: the long one cannot end its prefill by then, the short one can.
  batch_scheduler core({.max_step_tokens = 4096, .max_step_seqs = 32});
  const int64_t now = 10'000'000'000;
  for (const auto& [id, tokens] : {std::pair<seq_id, int32_t>{1, 4000}, {2, 100}}) {
    sequence_spec spec;
    spec.id = id;
    spec.arrival = static_cast<uint64_t>(now - 450'000'000);
    spec.ttft_target_ns = 250'000'000;
    spec.start_by = now + 50'000'000;
    spec.prompt.assign(static_cast<size_t>(tokens), 5);
    core.add(std::move(spec));
  }
  EXPECT_EQ(core.take_late(now, fifty_ms_steps()), std::vector<seq_id>{1});
  EXPECT_TRUE(core.knows(2));
  EXPECT_TRUE(core.take_late(now, fifty_ms_steps()).empty());
  EXPECT_EQ(core.take_late(now + 60'000'000, fifty_ms_steps()), std::vector<seq_id>{2}) << "past its start bound";
}

TEST(batch_scheduler, a_start_bound_counts_the_steps_a_prompt_shares_with_the_decodes_of_its_tier_and_above) {
  // 80 running decodes of priority 2 take 40 of each 50 ms step. A 1000-token prompt takes
  // ~105 ms on an idle engine: beside them (5 ms of prefill a step) it needs 20 steps, ~1 s,
  // and cannot have its first token within its 150 ms start bound; of priority 3, they yield
  // to it (3 steps, ~115 ms) and it can.
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 128});
  for (seq_id id = 1; id <= 80; ++id) s.add(id, 2, 1, 1000);
  s.run(fifty_ms_steps());  // all of them decoding now
  for (const auto& [id, priority] : {std::pair<seq_id, int32_t>{101, 1}, {102, 3}}) {
    sequence_spec spec;
    spec.id = id;
    spec.priority = priority;
    spec.arrival = static_cast<uint64_t>(s.now());
    spec.ttft_target_ns = 100'000'000;
    spec.start_by = s.now() + 150'000'000;
    spec.prompt.assign(1000, 5);
    s.core().add(std::move(spec));
  }
  EXPECT_EQ(s.core().take_late(s.now(), fifty_ms_steps()), std::vector<seq_id>{101});
  EXPECT_TRUE(s.core().knows(102));
  const auto wake = s.core().wake_at(s.now(), fifty_ms_steps());
  ASSERT_TRUE(wake.has_value());
  EXPECT_LE(*wake, s.now() + 50'000'000) << "woken while the higher one can still start in time";
}

// An agent's 9008-token prompt whose first 8992 tokens (its system prompt) an earlier request
// left in the prefix cache: ~0.9 s of prefill whole, 16 tokens of it expected to compute. It
// is feasible, goes by its deadline, and computes only the rest; the same prompt expected
// uncached is infeasible and goes after a later feasible one.
TEST(batch_scheduler, a_prompt_whose_prefix_is_expected_cached_is_judged_and_planned_by_the_rest) {
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32, .max_context = 16384}, 2048, true);
  std::vector<token_id> system(8992);
  std::iota(system.begin(), system.end(), 1000);
  auto agent = [&](token_id question) {
    std::vector<token_id> p = system;
    for (token_id k = 0; k < 16; ++k) p.push_back(question + k);
    return p;
  };
  s.add_prompt(1, agent(1), 0);
  for (int i = 0; i < 100 && s.finished().empty(); ++i) s.run(fifty_ms_steps());
  ASSERT_EQ(s.finished(), std::vector<seq_id>{1});

  s.add_prompt(2, agent(100), 8992);
  s.add(3, 2, 3000, 2, 500);  // later in line: ~0.3 s of prefill
  sequence_counts c = s.core().counts(fifty_ms_steps());
  EXPECT_EQ(c.tiers[0].later_tokens, 0) << "judged infeasible by its whole length";
  EXPECT_EQ(c.tiers[0].prompt_tokens, 16 + 3000);
  auto step = s.run(fifty_ms_steps());
  EXPECT_EQ(step[2], 16) << "it computes only what the cache does not hold";
  EXPECT_EQ(s.token_times(2).size(), 1u) << "its first token in the first step";
  EXPECT_EQ(s.core().cached_tokens(2), 8992);

  // Expected uncached: infeasible, after the feasible prompt that arrived after it.
  s.add_prompt(4, agent(200), 0);
  s.add(5, 2, 3000, 2, 500);
  c = s.core().counts(fifty_ms_steps());
  EXPECT_EQ(c.tiers[0].later_tokens, 9008);
  step = s.run(fifty_ms_steps());
  EXPECT_GT(step[5], 0);
  EXPECT_EQ(step.count(4), 0u) << "the infeasible prompt went before a feasible one";
}

// An expectation the pool does not meet (the prefix was evicted): the new sequence computes
// no more than its step planned for it, then goes on by what it really holds.
TEST(batch_scheduler, a_prefix_expected_cached_but_not_there_costs_no_more_than_the_step_planned) {
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32, .max_context = 16384}, 2048, true);
  std::vector<token_id> prompt(9008);
  std::iota(prompt.begin(), prompt.end(), 1000);
  s.add_prompt(1, prompt, 8992);
  auto step = s.run(fifty_ms_steps());
  EXPECT_EQ(step[1], 16) << "planned for the 16 tokens it was expected to compute";
  EXPECT_EQ(s.core().counts(fifty_ms_steps()).tiers[0].later_tokens, 8992) << "now judged by what it holds";
  for (int i = 0; i < 100 && s.finished().empty(); ++i) s.run(fifty_ms_steps());
  EXPECT_EQ(s.finished(), std::vector<seq_id>{1});
}

TEST(batch_scheduler, counts_give_each_priority_its_decodes_and_its_prompt_work_due_before_and_after_a_newcomer) {
  stepper s({.max_step_tokens = 4096, .max_step_seqs = 32});
  s.add(1, 2, 100, 1000, 500, 50);
  s.add(2, 1, 200, 1000, 5000, 200);
  s.run(fifty_ms_steps());  // both prefilled, now decoding
  s.add(3, 2, 300, 4, 500);      // feasible: ~35 ms of prefill in 500 ms
  s.add(4, 2, 9000, 4, 500);     // infeasible: ~0.9 s alone, prefilled after the others
  const sequence_counts c = s.core().counts(fifty_ms_steps());
  ASSERT_EQ(c.tiers.size(), 2u);
  const tier_load& premium = c.tiers[0];
  EXPECT_EQ(premium.priority, 2);
  EXPECT_EQ(premium.decodes, 1);
  EXPECT_EQ(premium.context, 100.0);
  EXPECT_EQ(premium.waiting, 2);
  EXPECT_EQ(premium.running, 1);
  EXPECT_EQ(premium.prompt_tokens, 300);
  EXPECT_EQ(premium.later_tokens, 9000);
  EXPECT_DOUBLE_EQ(premium.tpot_seconds, 0.050);
  EXPECT_EQ(c.tiers[1].priority, 1);
  EXPECT_EQ(c.tiers[1].decodes, 1);
  EXPECT_EQ(c.tiers[1].prompt_tokens + c.tiers[1].later_tokens, 0);
  // Without a model of the step, nothing is infeasible.
  EXPECT_EQ(s.core().counts().tiers[0].prompt_tokens, 9300);
}

}  // namespace
}  // namespace tireless
