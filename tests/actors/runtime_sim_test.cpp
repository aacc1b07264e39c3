// The runtime's actors under load on the sim backend, deterministic (virtual time).
#include <gtest/gtest.h>

#include <array>
#include <random>

#include "tests/actors/sim_harness.hpp"

namespace tireless::test {
namespace {

void expect_exactly_one_outcome_each(const sim_harness& h, uint64_t submitted) {
  ASSERT_EQ(h.outcomes().size(), submitted);
  for (const auto& [id, list] : h.outcomes()) ASSERT_EQ(list.size(), 1u) << "request " << id;
}

TEST(runtime_sim, a_request_completes_with_its_tokens) {
  sim_harness h;
  const uint64_t id = h.submit(tokens_request(40, 12));
  h.run();
  ASSERT_EQ(h.outcomes().at(id).size(), 1u);
  const outcome& o = h.outcomes().at(id)[0];
  EXPECT_EQ(o.kind, outcome_kind::completed) << o.message;
  EXPECT_EQ(o.reason, "max_tokens");
  EXPECT_EQ(o.tokens.size(), 12u);
  EXPECT_EQ(o.prompt_tokens, 40);
  EXPECT_GT(o.time_to_first_token_ms, 0.0) << "total " << o.total_ms << " virtual " << h.backend().virtual_seconds();
  // Twelve tokens, one a step: the longest pause between two is one step's time, at most all of it after the first.
  EXPECT_GT(o.longest_pause_ms, 0.0);
  EXPECT_LE(o.longest_pause_ms, o.total_ms - o.time_to_first_token_ms + 1e-6);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

TEST(runtime_sim, a_flood_of_10000_requests_ends_each_once_with_mailboxes_bounded) {
  sim_harness h;
  const uint64_t n = 10000;
  for (uint64_t i = 0; i < n; ++i) h.submit(tokens_request(20 + static_cast<int>(i % 50), 8, static_cast<uint32_t>(i)), i % 3);
  h.run();
  expect_exactly_one_outcome_each(h, n);
  int completed = 0, rejected = 0;
  for (const auto& [id, list] : h.outcomes()) {
    if (list[0].kind == outcome_kind::completed) ++completed;
    if (list[0].kind == outcome_kind::rejected) {
      ++rejected;
      EXPECT_GT(list[0].retry_after_ms, 0) << "a refusal for load says when to retry";
    }
  }
  EXPECT_GT(completed, 0);
  EXPECT_EQ(completed + rejected, static_cast<int>(n));
  // The door lets in at most its capacity; every mailbox stays below it.
  const int64_t bound = h.door().capacity();
  EXPECT_LE(h.admission().max_mailbox, bound);
  EXPECT_LE(h.engine().max_mailbox, bound);
  EXPECT_LE(h.kv().max_mailbox, 2);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
  EXPECT_EQ(h.door().inside(), 0);
}

TEST(runtime_sim, a_full_tier_queue_refuses_at_once_with_a_retry_hint) {
  harness_options o;
  o.tiers = {harness_options::tier("only", 1, 4)};
  o.max_step_seqs = 2;
  sim_harness h(o);
  for (int i = 0; i < 20; ++i) h.submit(tokens_request(30, 50, i));
  h.run();
  int rejected = 0;
  for (const auto& [id, list] : h.outcomes()) {
    if (list[0].kind == outcome_kind::rejected) {
      ++rejected;
      EXPECT_EQ(list[0].reason, "overloaded");
      EXPECT_GE(list[0].retry_after_ms, 0);
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

TEST(runtime_sim, higher_tiers_start_first_when_the_engine_is_full) {
  harness_options o;
  o.max_step_seqs = 1;
  sim_harness h(o);
  std::vector<uint64_t> free_ids, premium_ids;
  for (int i = 0; i < 4; ++i) free_ids.push_back(h.submit(tokens_request(30, 20, i), 2));
  for (int i = 0; i < 4; ++i) premium_ids.push_back(h.submit(tokens_request(30, 20, 100 + i), 0));
  h.run();
  double worst_premium = 0, best_late_free = 1e300;
  for (uint64_t id : premium_ids) worst_premium = std::max(worst_premium, h.outcomes().at(id)[0].time_to_first_token_ms);
  for (size_t i = 2; i < free_ids.size(); ++i)
    best_late_free = std::min(best_late_free, h.outcomes().at(free_ids[i])[0].time_to_first_token_ms);
  EXPECT_LT(worst_premium, best_late_free) << "premium requests overtake queued free ones";
}

TEST(runtime_sim, cancelling_queued_and_running_requests_frees_everything) {
  sim_harness h;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 60; ++i) ids.push_back(h.submit(tokens_request(100, 200, i), i % 3));
  h.run_for(std::chrono::milliseconds(300));
  for (size_t i = 0; i < ids.size(); i += 2) h.cancel(ids[i]);
  h.run();
  expect_exactly_one_outcome_each(h, ids.size());
  for (size_t i = 0; i < ids.size(); i += 2) {
    const outcome& o = h.outcomes().at(ids[i])[0];
    if (o.kind == outcome_kind::cancelled) {
      EXPECT_EQ(o.reason, "client");
    }
  }
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

TEST(runtime_sim, deadlines_end_requests_as_cancelled_deadline) {
  sim_harness h;
  request r = tokens_request(50, 1500);
  r.timeout = std::chrono::milliseconds(200);
  const uint64_t id = h.submit(r);
  h.run();
  const outcome& o = h.outcomes().at(id)[0];
  EXPECT_EQ(o.kind, outcome_kind::cancelled);
  EXPECT_EQ(o.reason, "deadline");
  EXPECT_NEAR(o.total_ms, 200.0, 1.0);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

TEST(runtime_sim, an_ended_requests_session_is_not_held_until_its_timeout) {
  sim_harness h;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    request r = tokens_request(20, 100 + i);
    r.timeout = std::chrono::minutes(10);
    ids.push_back(h.submit(r));
  }
  request slow = tokens_request(50, 1500);
  slow.timeout = std::chrono::milliseconds(200);
  const uint64_t slow_id = h.submit(slow);
  h.run_for(std::chrono::milliseconds(1));
  EXPECT_EQ(h.admission().timed_sessions, 9);  // admitted, each waiting for its timeout
  h.run_for(std::chrono::seconds(30));  // long past their ends, long before their timeouts
  for (uint64_t id : ids) {
    ASSERT_EQ(h.outcomes().count(id), 1u);
    EXPECT_EQ(h.outcomes().at(id)[0].kind, outcome_kind::completed);
  }
  EXPECT_EQ(h.outcomes().at(slow_id)[0].reason, "deadline");  // the one timer still fires
  EXPECT_EQ(h.admission().timed_sessions, 0);
}

TEST(runtime_sim, a_small_pool_preempts_and_every_request_still_completes) {
  // Free requests start first; then premium and standard ones arrive and take their blocks
  // back (a start of a tier waits while the pool cannot carry its own tier's running answers,
  // so preemption comes from a higher tier's start).
  harness_options o;
  o.kv_blocks = 24;  // 384 tokens: room for about three of these at once
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(h.submit(tokens_request(60, 60, i), 2));
  h.run_for(std::chrono::milliseconds(20));
  for (int i = 4; i < 12; ++i) ids.push_back(h.submit(tokens_request(60, 60, i), i % 2));
  h.run();
  expect_exactly_one_outcome_each(h, ids.size());
  int preemptions = 0;
  for (uint64_t id : ids) {
    const outcome& out = h.outcomes().at(id)[0];
    EXPECT_EQ(out.kind, outcome_kind::completed) << out.message;
    EXPECT_EQ(out.tokens.size(), 60u);
    preemptions += out.preemptions;
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to be too small";
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

// A step whose time budget fits fewer prompt tokens than a request finds in the prefix cache
// computes nothing for it (its first tokens are cached already, the rest need another KV
// grant). The engine must propose again at once: it used to wait for a change that never came,
// and the request stalled after admission for good (seen under AddressSanitizer, where steps
// are slow, and possible wherever the step model says steps are dear).
TEST(runtime_sim, a_cached_prefix_longer_than_a_steps_budget_does_not_stall_its_request) {
  harness_options o;
  o.step_time_target_seconds = 0.016;  // ~7 prompt tokens a step at the harness's cost model
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(h.submit(tokens_request(70, 6, 7)));  // the same 70-token prompt: 4 blocks cached
    h.run();
  }
  expect_exactly_one_outcome_each(h, ids.size());
  for (uint64_t id : ids) {
    const outcome& out = h.outcomes().at(id)[0];
    EXPECT_EQ(out.kind, outcome_kind::completed) << out.message;
    EXPECT_EQ(out.tokens.size(), 6u);
  }
  EXPECT_GT(h.outcomes().at(ids.back())[0].cached_prompt_tokens, 16);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

// The soak's first minute, on the sim: eight premium documents at once, more than the pool
// holds, twice (the second round finds their prefixes cached). A document that would miss its
// first-token deadline took the whole step from the streams beside it, the pool refused it, and
// the next step planned the same: the streams waited for an event that never came, and every
// request stalled after admission until its timeout.
TEST(runtime_sim, streams_do_not_wait_for_a_prompt_the_pool_cannot_hold) {
  harness_options o;
  o.policy = admission_policy::tireless;
  o.kv_blocks = 96;  // 1536 positions: about five of these at once
  o.step_time_target_seconds = 0.15;
  auto t = harness_options::tier("premium", 3, 64);
  t.ttft = std::chrono::milliseconds(1000);
  t.tpot = std::chrono::milliseconds(150);
  t.sheddable = false;  // as premium in config/tireless.toml: served, however late
  o.tiers = {t};
  sim_harness h(o);
  for (int round = 0; round < 2; ++round) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < 8; ++i) ids.push_back(h.submit(tokens_request(290, 24, i)));
    h.run();
    for (uint64_t id : ids) {
      ASSERT_EQ(h.outcomes().count(id), 1u) << "round " << round << ": request " << id << " never ended";
      const outcome& out = h.outcomes().at(id)[0];
      EXPECT_EQ(out.kind, outcome_kind::completed) << "round " << round << ": " << out.message;
      EXPECT_EQ(out.tokens.size(), 24u);
    }
  }
  const auto e = h.engine();
  EXPECT_EQ(e.running + e.waiting, 0);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

TEST(runtime_sim, a_crashing_shard_is_restarted_and_no_request_is_lost) {
  harness_options o;
  o.crash_probability = 0.05;
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(h.submit(tokens_request(40, 30, i), i % 3));
  h.run();
  expect_exactly_one_outcome_each(h, ids.size());
  int completed = 0;
  for (uint64_t id : ids) completed += h.outcomes().at(id)[0].kind == outcome_kind::completed;
  EXPECT_GT(h.shard_restarts(), 0);
  // The supervisor re-runs a crashed step on the shard it restarts: crashes cost time, not requests.
  EXPECT_EQ(completed, 40) << "a crash failed a request";
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
}

TEST(runtime_sim, a_shard_past_its_restart_budget_fails_every_request_at_once_and_says_why) {
  harness_options o;
  o.max_shard_restarts = 2;
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(h.submit(tokens_request(40, 200, i), i % 3));
  h.run_for(std::chrono::milliseconds(50));
  for (int crash = 0; crash < 3; ++crash) {  // the third is one more than the budget
    h.crash_shard();
    h.run_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(h.engine().backend_problem.find("max_shard_restarts"), std::string::npos) << h.engine().backend_problem;
  // Nothing waits for a step that cannot come: every request has ended, without time passing.
  expect_exactly_one_outcome_each(h, ids.size());
  for (uint64_t id : ids) {
    const outcome& out = h.outcomes().at(id)[0];
    EXPECT_EQ(out.kind, outcome_kind::failed);
    EXPECT_NE(out.message.find("restart the server"), std::string::npos) << out.message;
  }
  // A request that arrives after fails at once, with the same reason.
  const uint64_t late = h.submit(tokens_request(10, 5, 99));
  h.run_for(std::chrono::milliseconds(1));
  ASSERT_EQ(h.outcomes().count(late), 1u);
  EXPECT_EQ(h.outcomes().at(late)[0].kind, outcome_kind::failed);
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
  EXPECT_EQ(h.door().inside(), 0);
}

// 16 requests of 200 tokens at once on a fresh engine with two seats and a free tier that must
// start within 2 s (its ttft 1 s); each takes ~2.4 s (200 tokens at 12 ms), so most cannot. The
// engine's step-cost prior is `prior_scale` times the backend's real cost. Every request ends
// once; a refused one is overloaded with a retry hint and no tokens; blocks and the door's places
// come back.
struct flood_tally {
  int completed = 0, at_arrival = 0, late = 0;  // late: admitted, then refused unstarted
  int64_t engine_late_refusals = 0;
};

flood_tally flood_a_fresh_engine(double prior_scale) {
  harness_options o;
  o.policy = admission_policy::tireless;
  o.max_step_seqs = 2;
  auto t = harness_options::tier("free", 1, 64);
  t.ttft = std::chrono::milliseconds(1000);
  o.tiers = {t};
  o.prior_scale = prior_scale;
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back(h.submit(tokens_request(20, 200, i)));
  h.run();
  expect_exactly_one_outcome_each(h, ids.size());
  flood_tally n;
  for (uint64_t id : ids) {
    const outcome& out = h.outcomes().at(id)[0];
    if (out.kind == outcome_kind::completed) {
      ++n.completed;
      continue;
    }
    EXPECT_EQ(out.kind, outcome_kind::rejected) << out.message;
    EXPECT_EQ(out.reason, "overloaded");
    EXPECT_GE(out.retry_after_ms, 100);
    EXPECT_EQ(out.tokens.size(), 0u) << "a refused request got tokens";
    ++(out.message.find("admitted, but it waited") != std::string::npos ? n.late : n.at_arrival);
  }
  n.engine_late_refusals = h.engine().late_refusals;
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
  EXPECT_EQ(h.door().inside(), 0);
  return n;
}

// A machine ten times slower than the engine's prior says (a prior not probed here): admission
// admits several batches' worth, and those that cannot start in time are refused before any
// prefill, with a retry hint.
TEST(runtime_sim, an_admitted_request_that_cannot_start_in_time_is_refused_before_any_prefill_with_a_retry_hint) {
  const flood_tally n = flood_a_fresh_engine(0.1);
  EXPECT_GE(n.completed, 2);
  EXPECT_GT(n.late, 0) << "every request waited for its turn, however long";
  EXPECT_LE(n.engine_late_refusals, n.late);  // the rest were refused in admission's queue
}

// Where the prior is right, admission counts the batch's seats freeing one batch at a time (no
// completion measured yet) and the requests on their way to the engine: those that cannot start
// in time are refused at arrival, none after waiting.
TEST(runtime_sim, a_flood_on_a_fresh_engine_whose_prior_is_right_is_refused_at_arrival_not_after_waiting) {
  const flood_tally n = flood_a_fresh_engine(1.0);
  EXPECT_GE(n.completed, 2);
  EXPECT_GT(n.at_arrival, 0);
  EXPECT_EQ(n.late, 0);
  EXPECT_EQ(n.engine_late_refusals, 0);
}

// Seeded random mixes of submits, cancels, deadlines and shard crashes.
class random_scenarios : public ::testing::TestWithParam<uint32_t> {};

TEST_P(random_scenarios, every_request_ends_once_blocks_are_conserved_and_mailboxes_bounded) {
  std::mt19937 rng(GetParam());
  harness_options o;
  o.kv_blocks = 48 + static_cast<int32_t>(rng() % 64);
  o.seed = GetParam();
  o.crash_probability = (rng() % 3 == 0) ? 0.02 : 0.0;
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int round = 0; round < 30; ++round) {
    const int arrivals = static_cast<int>(rng() % 12);
    for (int i = 0; i < arrivals; ++i) {
      request r = tokens_request(1 + static_cast<int>(rng() % 300), 1 + static_cast<int>(rng() % 80),
                                 static_cast<uint32_t>(rng()));
      if (rng() % 5 == 0) r.timeout = std::chrono::milliseconds(10 + rng() % 2000);
      if (rng() % 7 == 0) r.token_window = 1 + static_cast<int32_t>(rng() % 8);
      ids.push_back(h.submit(r, rng() % 3));
    }
    if (!ids.empty() && rng() % 3 == 0) h.cancel(ids[rng() % ids.size()]);
    if (rng() % 10 == 0) h.crash_shard();
    h.run_for(std::chrono::milliseconds(rng() % 400));
  }
  h.run();
  const auto e = h.engine();
  EXPECT_EQ(e.running + e.waiting, 0) << "running " << e.running << " waiting " << e.waiting << " queued "
                                       << h.admission().queued << " restarts " << h.shard_restarts();
  expect_exactly_one_outcome_each(h, ids.size());
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
  EXPECT_EQ(h.door().inside(), 0);
  EXPECT_LE(h.admission().max_mailbox, h.door().capacity());
  EXPECT_LE(h.engine().max_mailbox, h.door().capacity());
}

INSTANTIATE_TEST_SUITE_P(seeds, random_scenarios, ::testing::Range(1u, 101u));

// The same, under the tireless policy: deadlines from the tiers (premium never shed), steps
// bounded by the tightest TPOT, and pools small enough for prompts to be refused blocks. Steps
// then stretch, streams yield to prompts at risk, sheddable requests are refused after
// admission, and the engine must never wait for an event that does not come.
class random_deadline_scenarios : public ::testing::TestWithParam<uint32_t> {};

TEST_P(random_deadline_scenarios, every_request_ends_once_and_blocks_are_conserved) {
  std::mt19937 rng(GetParam());
  harness_options o;
  o.policy = admission_policy::tireless;
  o.kv_blocks = 40 + static_cast<int32_t>(rng() % 80);
  o.max_step_tokens = 64 << (rng() % 3);
  o.max_preemptions = static_cast<int32_t>(rng() % 4);
  o.step_time_target_seconds = 0.15;
  o.seed = GetParam();
  o.crash_probability = (rng() % 4 == 0) ? 0.02 : 0.0;
  const std::array<std::array<int, 2>, 3> targets{{{1000, 150}, {3000, 300}, {8000, 600}}};
  for (size_t t = 0; t < o.tiers.size(); ++t) {
    o.tiers[t].ttft = std::chrono::milliseconds(targets[t][0]);
    o.tiers[t].tpot = std::chrono::milliseconds(targets[t][1]);
    o.tiers[t].sheddable = t > 0;
  }
  sim_harness h(o);
  std::vector<uint64_t> ids;
  for (int round = 0; round < 30; ++round) {
    const int arrivals = static_cast<int>(rng() % 8);
    for (int i = 0; i < arrivals; ++i) {
      request r = tokens_request(1 + static_cast<int>(rng() % 600), 1 + static_cast<int>(rng() % 60),
                                 static_cast<uint32_t>(rng() % 6));  // few prompts: prefixes are shared
      if (rng() % 6 == 0) r.timeout = std::chrono::milliseconds(500 + rng() % 5000);
      if (rng() % 5 == 0) r.token_window = 1 + static_cast<int32_t>(rng() % 8);
      ids.push_back(h.submit(r, rng() % 3));
    }
    if (!ids.empty() && rng() % 4 == 0) h.cancel(ids[rng() % ids.size()]);
    h.run_for(std::chrono::milliseconds(rng() % 600));
  }
  h.run();
  const auto e = h.engine();
  EXPECT_EQ(e.running + e.waiting, 0) << "running " << e.running << " waiting " << e.waiting << " queued "
                                       << h.admission().queued;
  expect_exactly_one_outcome_each(h, ids.size());
  EXPECT_EQ(h.kv().blocks.free, h.kv().blocks.total);
  EXPECT_EQ(h.door().inside(), 0);
}

INSTANTIATE_TEST_SUITE_P(seeds, random_deadline_scenarios, ::testing::Range(1u, 101u));

}  // namespace
}  // namespace tireless::test
