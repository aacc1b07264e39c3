#include "scheduler/admission_control.hpp"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "tests/scheduler/admission_test_support.hpp"

namespace tireless {
namespace {

using namespace admission_test;

TEST(admission_control, higher_tiers_go_first_and_fcfs_ignores_tiers) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 60s), tier("free", 1, 60s)};
  for (admission_policy p : {admission_policy::priority, admission_policy::tireless, admission_policy::fcfs}) {
    admission_control c(p, {}, tiers, {});
    ASSERT_TRUE(arrive(c, 1, "", "free", 0).admitted);
    ASSERT_TRUE(arrive(c, 2, "", "free", 1).admitted);
    ASSERT_TRUE(arrive(c, 3, "", "gold", 2).admitted);
    std::vector<uint64_t> order;
    while (auto q = c.next()) order.push_back(q->id);
    if (p == admission_policy::fcfs) {
      EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3}));
    } else {
      EXPECT_EQ(order, (std::vector<uint64_t>{3, 1, 2})) << to_string(p);
    }
  }
}

TEST(admission_control, the_least_slack_peer_admits_everything_with_deadlines_and_releases_by_earliest_deadline) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 500ms), tier("free", 1, 8s)};
  admission_control c(admission_policy::least_slack, {}, tiers, {});
  c.observe(busy_engine(1'000'000));  // tireless would refuse every sheddable arrival
  const admission_decision free = arrive(c, 1, "", "free", 0);
  ASSERT_TRUE(free.admitted);
  EXPECT_EQ(free.priority, 0) << "the peer has no tier priority";
  EXPECT_EQ(free.ttft_target, 8s);
  EXPECT_EQ(free.start_within.count(), 0) << "nothing is refused after admission either";
  ASSERT_TRUE(arrive(c, 2, "", "gold", 7 * second).admitted);   // due at 7.5 s, before the free one's 8 s
  ASSERT_TRUE(arrive(c, 3, "", "gold", 9 * second).admitted);   // due at 9.5 s
  std::vector<uint64_t> order;
  while (auto q = c.next()) order.push_back(q->id);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 1, 3}));
  EXPECT_TRUE(c.expire(3600 * second).empty());
}

TEST(admission_control, a_flooding_tenant_cannot_starve_another_of_its_tier) {
  admission_control c(admission_policy::tireless, {}, {tier("free", 1, 600s)},
                      {tenant("flood", "free"), tenant("quiet", "free")});
  uint64_t id = 1;
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(arrive(c, id++, "flood", "free", i).admitted);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(arrive(c, id++, "quiet", "free", 200 + i).admitted);
  int quiet_served = 0, served = 0;
  while (auto q = c.next()) {
    ++served;
    if (q->tenant == "quiet") ++quiet_served;
    if (served == 24) break;
  }
  EXPECT_GE(quiet_served, 10) << "the quiet tenant's 10 requests were all served among the first 24";
}

TEST(admission_control, weights_split_a_tier_by_tokens) {
  admission_control c(admission_policy::tireless, {}, {tier("free", 1, 600s)},
                      {tenant("heavy", "free", 2.0), tenant("light", "free", 1.0)});
  uint64_t id = 1;
  for (int i = 0; i < 300; ++i) {
    arrive(c, id++, "heavy", "free", i);
    arrive(c, id++, "light", "free", i);
  }
  std::map<std::string, int> served;
  for (int i = 0; i < 150; ++i) served[c.next()->tenant]++;
  EXPECT_NEAR(static_cast<double>(served["heavy"]) / served["light"], 2.0, 0.2);
}

TEST(admission_control, a_request_over_its_rate_quota_is_told_the_exact_wait) {
  tenant_settings t = tenant("a", "free");
  t.requests_per_minute = 60;  // one a second, a burst of 60
  admission_control c(admission_policy::tireless, {}, {tier("free", 1, 600s)}, {t});
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(arrive(c, i + 1, "a", "free", 0).admitted);
  const admission_decision d = arrive(c, 100, "a", "free", second / 4);
  ASSERT_FALSE(d.admitted);
  EXPECT_EQ(d.reason, refusal::quota_exceeded);
  EXPECT_EQ(d.retry_after_ms, 750) << "0.25 of a token refilled; 0.75 s to go";
  EXPECT_FALSE(arrive(c, 101, "a", "free", second / 4 + 749'000'000).admitted);
  EXPECT_TRUE(arrive(c, 102, "a", "free", second / 4 + 750'000'000).admitted) << "honest: admitted after the wait";
}

TEST(admission_control, token_quota_reserves_and_refunds_what_was_not_used) {
  tenant_settings t = tenant("a", "free");
  t.tokens_per_minute = 1000;
  admission_control c(admission_policy::tireless, {}, {tier("free", 1, 600s)}, {t});
  ASSERT_TRUE(arrive(c, 1, "a", "free", 0, 100, 400).admitted);   // reserves 500
  ASSERT_TRUE(arrive(c, 2, "a", "free", 0, 100, 400).admitted);   // reserves 500
  const admission_decision d = arrive(c, 3, "a", "free", 0, 100, 100);
  ASSERT_FALSE(d.admitted);
  EXPECT_EQ(d.retry_after_ms, 12000) << "200 tokens at 1000 a minute";
  c.next();
  c.finished(1, 150, 0);  // used 150 of 500: 350 come back
  EXPECT_TRUE(arrive(c, 4, "a", "free", 0, 100, 100).admitted);
  const admission_decision too_big = arrive(c, 5, "a", "free", 0, 600, 600);
  ASSERT_FALSE(too_big.admitted);
  EXPECT_EQ(too_big.retry_after_ms, -1) << "more than a minute's quota: waiting cannot help";
}

TEST(admission_control, concurrency_quota_counts_queued_and_running_requests) {
  tenant_settings t = tenant("a", "free");
  t.max_concurrent = 2;
  admission_control c(admission_policy::tireless, {}, {tier("free", 1, 600s)}, {t});
  ASSERT_TRUE(arrive(c, 1, "a", "free", 0).admitted);
  ASSERT_TRUE(arrive(c, 2, "a", "free", 0).admitted);
  const admission_decision d = arrive(c, 3, "a", "free", 0);
  EXPECT_FALSE(d.admitted);
  EXPECT_EQ(d.reason, refusal::quota_exceeded);
  EXPECT_GT(d.retry_after_ms, 0);
  c.next();
  c.finished(1, 200, 0);
  EXPECT_TRUE(arrive(c, 4, "a", "free", 0).admitted);
}

// Early rejection happens exactly when the prediction misses the tier's target.
TEST(admission_control, early_rejection_when_and_only_when_the_prediction_misses_the_target) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const auto target = std::chrono::milliseconds(200 + rng() % 5000);
    admission_control c(admission_policy::tireless, {}, {tier("t", 1, target)}, {});
    c.observe(busy_engine(static_cast<int64_t>(rng() % 20000)));
    const int32_t prompt = 1 + static_cast<int32_t>(rng() % 4000);
    if (c.idle_prefill(prompt) > std::chrono::duration<double>(target).count()) continue;  // infeasible: below
    const double predicted = c.predicted_ttft("t", prompt);
    const admission_decision d = arrive(c, 1, "", "t", 0, prompt);
    const double target_s = std::chrono::duration<double>(target).count();
    EXPECT_EQ(d.admitted, predicted <= target_s) << "predicted " << predicted << " target " << target_s;
    if (!d.admitted) {
      EXPECT_EQ(d.reason, refusal::overloaded);
      EXPECT_EQ(d.retry_after_ms, std::max<int64_t>(100, static_cast<int64_t>(std::ceil((predicted - target_s) * 1000))));
    }
  }
}

// The engine places waiting requests in priority order, so a lower tier's prompts waiting
// there are not ahead of a higher tier's request: only its own tier and those above count.
TEST(admission_control, a_lower_tiers_waiting_prompts_are_not_ahead_of_a_higher_tier) {
  admission_control c(admission_policy::tireless, {}, {tier("gold", 2, 2000ms), tier("free", 1, 8000ms)}, {});
  engine_load l = busy_engine(0);
  l.tiers = {waiting_at(2, 2, 1000), waiting_at(1, 38, 19000)};
  c.observe(l);
  const double gold = c.predicted_ttft("gold", 100), free = c.predicted_ttft("free", 100);
  EXPECT_LT(gold, 2.0) << "1100 tokens: 3 steps of ~0.52 s";
  EXPECT_GT(free, 10 * gold) << "20000 tokens ahead";
  EXPECT_TRUE(arrive(c, 1, "", "gold", 0).admitted);
  EXPECT_FALSE(arrive(c, 2, "", "free", 0).admitted);
}

// 10 ms + 1 ms a prompt token a step (512 a step): a 2000-token prompt alone takes ~2 s
// against a 600 ms target, whatever the load.
TEST(admission_control, an_infeasible_prompt_says_so_and_is_refused_with_a_split_hint_only_when_busy) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 600ms, false), tier("t", 1, 600ms)};
  admission_control idle(admission_policy::tireless, {}, tiers, {});
  idle.observe(busy_engine(0));
  EXPECT_NEAR(idle.idle_prefill(2000), 3 * 0.522 + 0.474, 1e-9);
  admission_decision d = arrive(idle, 1, "", "t", 0, 2000);
  ASSERT_TRUE(d.admitted) << d.message;
  ASSERT_EQ(d.degradations.size(), 1u);
  EXPECT_NE(d.degradations[0].find("a 2000-token prompt cannot start within tier 't''s 600 ms; expect ~2.0 s"),
            std::string::npos)
      << d.degradations[0];
  EXPECT_EQ(d.ttft_target, 600ms) << "the engine schedules by the tier's deadline";

  admission_control busy(admission_policy::tireless, {}, tiers, {});
  engine_load lower_tier_work = busy_engine(0);
  lower_tier_work.tiers = {waiting_at(1, 40, 20000)};  // tier t's
  busy.observe(lower_tier_work);
  d = arrive(busy, 2, "", "t", 0, 2000);
  ASSERT_FALSE(d.admitted);
  EXPECT_EQ(d.reason, refusal::prompt_too_long);
  const int32_t fits = busy.longest_prompt_within(0.6);
  EXPECT_EQ(fits, 580);  // a 512-token step (0.522 s) and one of 68 (0.078 s)
  EXPECT_NE(d.message.find("split it into parts of at most 580 tokens"), std::string::npos) << d.message;
  EXPECT_GT(d.retry_after_ms, 1000) << "the wait ahead of it: ~20 s of prompts";
  // A tier that is not sheddable is served (after its feasible requests) and told: the wait
  // is the lower tier's work.
  d = arrive(busy, 3, "", "gold", 0, 2000);
  ASSERT_TRUE(d.admitted);
  EXPECT_EQ(d.degradations.size(), 1u);
  // A feasible prompt has no such line.
  admission_control fresh(admission_policy::tireless, {}, tiers, {});
  fresh.observe(busy_engine(0));
  d = arrive(fresh, 4, "", "t", 0, 200);
  ASSERT_TRUE(d.admitted);
  EXPECT_TRUE(d.degradations.empty());
}

// An agent's 2000-token prompt whose first 1984 tokens (its system prompt) were sent to the
// engine before: the prefix cache is expected to hold them, so it is judged by the rest, and
// the engine is told what to expect. A prompt the index has not seen is judged whole.
TEST(admission_control, a_prompt_whose_long_prefix_was_sent_before_is_judged_by_the_rest) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 600ms, false), tier("t", 1, 600ms)};
  admission_control c(admission_policy::tireless, {}, tiers, {});
  c.index_prefixes(16, 1000);
  c.observe(busy_engine(0));
  std::vector<token_id> system(1984);
  std::iota(system.begin(), system.end(), 1000);
  auto agent = [&](token_id question) {
    std::vector<token_id> p = system;
    for (token_id k = 0; k < 16; ++k) p.push_back(question + k);
    return p;
  };
  auto arrive_with = [&](uint64_t id, const std::vector<token_id>& prompt) {
    arrival a{id, "", "gold", static_cast<int32_t>(prompt.size()), 100, 0};
    a.prompt = prompt;
    return c.arrive(a);
  };
  const std::vector<token_id> first = agent(1), second = agent(100);
  admission_decision d = arrive_with(1, first);
  ASSERT_TRUE(d.admitted);
  EXPECT_EQ(d.cached_tokens, 0);
  ASSERT_EQ(d.degradations.size(), 1u) << "nothing sent before: ~2 s alone against 600 ms";
  d = arrive_with(2, second);
  ASSERT_TRUE(d.admitted);
  EXPECT_EQ(d.cached_tokens, 1984);
  EXPECT_TRUE(d.degradations.empty()) << d.degradations[0];
  // Without an index (a server without prefix caching), the same prompt is judged whole.
  admission_control whole(admission_policy::tireless, {}, tiers, {});
  whole.observe(busy_engine(0));
  arrival a{3, "", "gold", static_cast<int32_t>(second.size()), 100, 0};
  a.prompt = second;
  d = whole.arrive(a);
  ASSERT_TRUE(d.admitted);
  EXPECT_EQ(d.cached_tokens, 0);
  EXPECT_EQ(d.degradations.size(), 1u);
}

TEST(admission_control, an_admitted_request_that_can_no_longer_start_in_time_is_refused_before_any_work) {
  std::vector<tier_settings> tiers = {tier("gold", 2, 1000ms, false), tier("t", 1, 1000ms), tier("u", 0, 1000ms)};
  tiers[2].start_within = 1500ms;
  admission_control c(admission_policy::tireless, {}, tiers, {});
  c.observe(busy_engine(0));
  ASSERT_TRUE(arrive(c, 1, "", "t", 0).admitted);
  ASSERT_TRUE(arrive(c, 2, "", "gold", 0).admitted);
  ASSERT_TRUE(arrive(c, 3, "", "u", 0).admitted);
  EXPECT_TRUE(c.too_late_to_start(second).empty());
  auto late = c.too_late_to_start(1'600'000'000);  // past u's configured 1.5 s
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].q.id, 3u);
  EXPECT_EQ(late[0].bound_ms, 1500);
  late = c.too_late_to_start(2 * second + 1);  // past twice t's target
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].q.id, 1u);
  EXPECT_EQ(late[0].bound_ms, 2000);
  EXPECT_GE(late[0].retry_after_ms, 100);
  EXPECT_EQ(c.late_refusals(), 2);
  EXPECT_EQ(c.queued(), 1) << "the tier that is not sheddable is never refused this way";
  EXPECT_TRUE(c.too_late_to_start(3600 * second).empty());
  // Other policies keep their requests (only max_queue_wait ends them).
  admission_control p(admission_policy::priority, {}, tiers, {});
  ASSERT_TRUE(arrive(p, 1, "", "t", 0).admitted);
  EXPECT_TRUE(p.too_late_to_start(10 * second).empty());
}

// A lower tier's wait counts the higher tiers' work that will arrive while it waits, not only
// what is queued now.
TEST(admission_control, a_lower_tiers_prediction_counts_the_higher_tiers_arrivals) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 60s, false), tier("free", 1, 60s)};
  admission_control quiet(admission_policy::tireless, {}, tiers, {});
  admission_control busy(admission_policy::tireless, {}, tiers, {});
  quiet.observe(busy_engine(5000));
  busy.observe(busy_engine(5000));
  // gold: 300 tokens a second for 20 s (about 60% of the 512-tokens-a-0.522-s-step capacity)
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(arrive(busy, static_cast<uint64_t>(i), "", "gold", i * second / 10, 30).admitted);
    busy.next();  // released to the engine: the queue stays empty
  }
  const double alone = quiet.predicted_ttft("free", 100);
  const double behind = busy.predicted_ttft("free", 100);
  // gold's rate (a 10 s moving average, read for the 19.9 s observed) times a prompt token's
  // share of a step: ρ ≈ 0.30.
  double rate = 0;
  for (int i = 0; i < 200; ++i) rate += 30 / 10.0 * std::exp(-(199 - i) / 10.0 / 10.0);
  rate /= 1 - std::exp(-19.9 / 10.0);
  const double rho = rate * 0.522 / 512;
  EXPECT_NEAR(behind, alone / (1 - rho), 1e-6) << "alone " << alone << " s, with gold arriving " << behind << " s";
  EXPECT_GT(behind, 1.3 * alone);
  EXPECT_LT(busy.predicted_ttft("gold", 100), behind) << "gold's own prediction is not stretched by itself";
}

// And the decodes those arrivals bring: gold's 30-token prompts are light, but each generates 60
// tokens (measured as they end), two a second at 4 ms a token: about half of the engine.
TEST(admission_control, a_lower_tiers_prediction_counts_the_decodes_the_higher_tiers_arrivals_bring) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 60s, false), tier("free", 1, 60s)};
  engine_load load = busy_engine(5000);
  load.step_model[2] = 0.004;
  admission_control measured(admission_policy::tireless, {}, tiers, {});
  admission_control unmeasured(admission_policy::tireless, {}, tiers, {});
  for (admission_control* c : {&measured, &unmeasured}) {
    c->observe(load);
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(arrive(*c, static_cast<uint64_t>(i), "", "gold", i * second / 2, 30).admitted);
      c->next();
      if (c == &measured) c->finished(static_cast<uint64_t>(i), 30 + 60, i * second / 2 + second / 4);
    }
  }
  const double prompts_only = unmeasured.predicted_ttft("free", 100);
  const double with_decodes = measured.predicted_ttft("free", 100);
  EXPECT_GT(with_decodes, 1.6 * prompts_only) << "prompts only " << prompts_only << " s";
  EXPECT_DOUBLE_EQ(measured.predicted_ttft("gold", 100), unmeasured.predicted_ttft("gold", 100))
      << "gold's own arrivals do not stretch its prediction";
}

TEST(admission_control, a_tier_that_is_not_sheddable_is_refused_only_when_its_own_work_holds_it_past_its_start_bound) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 100ms, false), tier("free", 1, 100ms)};
  // ~20 s of the lower tier's prompts wait: no reason to refuse gold.
  admission_control c(admission_policy::tireless, {}, tiers, {});
  engine_load lower = busy_engine(0);
  lower.tiers = {waiting_at(1, 40, 20000)};
  c.observe(lower);
  const admission_decision calm = arrive(c, 1, "", "gold", 0);
  EXPECT_TRUE(calm.admitted) << "the lower tier's load is no reason: " << calm.message;
  // ~1 s of gold's own prompts wait, past its start bound (2 x 100 ms): gold alone is over
  // the capacity; refused now, with a retry hint, rather than served late.
  admission_control over(admission_policy::tireless, {}, tiers, {});
  engine_load own = busy_engine(0);
  own.tiers = {waiting_at(2, 4, 1000)};
  over.observe(own);
  ASSERT_GT(over.predicted_ttft("gold", 100), 0.2);
  const admission_decision d = arrive(over, 2, "", "gold", 0);
  ASSERT_FALSE(d.admitted);
  EXPECT_EQ(d.reason, refusal::overloaded);
  EXPECT_NE(d.message.find("start_within_ms"), std::string::npos) << d.message;
  EXPECT_GT(d.retry_after_ms, 0);
}

// Steps of a 50 ms budget: 5 ms + 0.1 ms a prompt token + 0.3 ms a decode; 150 decodes of
// the lower tier (a token per 200 ms) running. Charged to every step they would take 45 ms.
engine_load lower_tier_decoding() {
  engine_load l;
  l.step_model = {0.005, 0.0001, 0.0003, 0.0};
  l.step_observations = 100;
  l.max_step_tokens = 8192;
  l.max_step_seqs = 512;
  l.step_seconds = 0.050;
  tier_load free;
  free.priority = 1;
  free.running = free.decodes = 150;
  free.tpot_seconds = 0.200;
  l.tiers = {free};
  l.finished_per_second = 20;
  return l;
}

TEST(admission_control, a_tier_that_is_never_shed_is_judged_with_the_lower_tiers_decodes_yielding_to_it) {
  // A 1000-token gold prompt, target 300 ms: beside 150 free decodes that yield within their
  // slack (22.5% of the time at their TPOT), ~3 steps; charged whole to every step they leave
  // 16 tokens a step, seconds. Gold is judged by the first (the engine packs it that way),
  // the free tier by the second (a margin for the tiers above it).
  std::vector<tier_settings> tiers = {tier("gold", 2, 300ms, false), tier("free", 1, 5000ms)};
  tiers[1].tpot = 200ms;
  admission_control c(admission_policy::tireless, {}, tiers, {});
  c.observe(lower_tier_decoding());
  const double own = c.predicted_ttft("gold", 1000, 0, true), all = c.predicted_ttft("gold", 1000);
  EXPECT_LT(own, 0.2);
  EXPECT_GT(all, 2.0);
  const admission_decision d = arrive(c, 1, "", "gold", 0, 1000);
  EXPECT_TRUE(d.admitted) << d.message;
  EXPECT_TRUE(d.degradations.empty());
}

TEST(admission_control, an_infeasible_prompts_wait_counts_its_own_tiers_arrivals_which_go_before_it) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 600ms, false)};
  admission_control quiet(admission_policy::tireless, {}, tiers, {});
  admission_control busy(admission_policy::tireless, {}, tiers, {});
  quiet.observe(busy_engine(0));
  busy.observe(busy_engine(0));
  for (int i = 0; i < 100; ++i) {  // 30 feasible gold tokens every 100 ms, released at once
    ASSERT_TRUE(arrive(busy, static_cast<uint64_t>(i), "", "gold", i * second / 10, 30).admitted);
    busy.next();
  }
  // A feasible prompt goes before the arrivals after it (earliest deadline first): not stretched.
  EXPECT_NEAR(busy.predicted_ttft("gold", 100), quiet.predicted_ttft("gold", 100), 1e-9);
  // An infeasible one (2000 tokens, ~2 s alone against 600 ms) goes after them: stretched.
  EXPECT_GT(busy.predicted_ttft("gold", 2000), 1.05 * quiet.predicted_ttft("gold", 2000));
}

TEST(admission_control, a_queued_request_is_refused_once_its_prefill_can_no_longer_end_within_its_start_bound) {
  // 10 ms + 1 ms a token, 512 a step: 2000 tokens take ~2 s alone, 100 take 0.11 s. Tier t's
  // start bound is 3 s: the long prompt cannot end its prefill within it once it waited 1 s.
  std::vector<tier_settings> tiers = {tier("t", 1, 1500ms)};
  tiers[0].start_within = 3000ms;
  admission_control c(admission_policy::tireless, {}, tiers, {});
  c.observe(busy_engine(0));
  ASSERT_TRUE(arrive(c, 1, "", "t", 0, 100).admitted);
  const admission_decision d = arrive(c, 2, "", "t", 0, 2000);
  ASSERT_TRUE(d.admitted);
  ASSERT_EQ(d.degradations.size(), 1u) << "infeasible: ~2 s alone against 1.5 s";
  // Its bound is stretched as far as its own prefill exceeds the target: 3 s x 2.0 / 1.5.
  EXPECT_NEAR(static_cast<double>(d.start_within.count()), 3e9 * c.idle_prefill(2000) / 1.5, 1e3);
  // It is refused once what it waited and its prefill (~2 s) pass that (~4 s): after ~2 s,
  // long before the bound itself; the short one once ~2.9 s passed.
  const double prefill = c.idle_prefill(2000);
  const double bound = static_cast<double>(d.start_within.count()) * 1e-9;
  EXPECT_TRUE(c.too_late_to_start(static_cast<int64_t>((bound - prefill - 0.05) * 1e9)).empty());
  auto late = c.too_late_to_start(static_cast<int64_t>((bound - prefill + 0.05) * 1e9));
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].q.id, 2u);
  EXPECT_EQ(late[0].bound_ms, d.start_within.count() / 1'000'000);
  EXPECT_TRUE(c.too_late_to_start(static_cast<int64_t>(2.85e9)).empty());
  late = c.too_late_to_start(static_cast<int64_t>(2.9e9));
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].q.id, 1u) << "0.11 s of prefill no longer ends within 3 s of its arrival";
}

TEST(admission_control, a_tier_whose_prompts_the_prefix_cache_holds_is_predicted_to_compute_the_rest) {
  const std::vector<tier_settings> tiers = {tier("gold", 2, 60s)};
  admission_control cold(admission_policy::tireless, {}, tiers, {});
  admission_control warm(admission_policy::tireless, {}, tiers, {});
  engine_load l = busy_engine(0);
  l.tiers = {waiting_at(2, 0, 0)};
  cold.observe(l);
  l.tiers[0].cached_share = 0.75;  // a shared system prompt: three quarters of each prompt cached
  warm.observe(l);
  // 10 ms + 1 ms a token: 2000 tokens are ~2.04 s cold; 500 of them ~0.51 s.
  EXPECT_NEAR(cold.predicted_ttft("gold", 2000), 3 * 0.522 + 0.474, 1e-9);
  EXPECT_NEAR(warm.predicted_ttft("gold", 2000), 0.510, 1e-9);
  // Prompts waiting in the engine were counted as what is left to compute of them already.
  l.tiers[0].prompt_tokens = 1000;
  warm.observe(l);
  EXPECT_NEAR(warm.predicted_ttft("gold", 2000), 2 * 0.522 + 0.486, 1e-9);
}

// Gold (target 1 s, start bound 2 s, never shed) offers 800-token prompts every `every` ns on
// `engine`, then finds `waiting` tokens of its own waiting there: its next prompt's own forecast
// is past its target and within its start bound. Admitted unless gold is over the capacity;
// then refused, and told why.
void expect_refused_only_when_over(const std::vector<tier_settings>& tiers, const engine_load& engine, int64_t every,
                                   int64_t waiting, bool over) {
  admission_control c(admission_policy::tireless, {}, tiers, {});
  c.observe(engine);
  int64_t t = 0;
  for (uint64_t id = 1; id <= 100; ++id, t += every) {
    c.arrive({id, "", "gold", 800, 10, t});
    c.next();  // released: nothing queued here
  }
  engine_load busy = engine;
  busy.tiers.insert(busy.tiers.begin(), waiting_at(2, 1, waiting));
  c.observe(busy);
  const double own = c.predicted_ttft("gold", 800, 0, true);
  ASSERT_GT(own, 1.0);
  ASSERT_LT(own, 2.0);
  const admission_decision d = c.arrive({1000, "", "gold", 800, 10, t});
  EXPECT_EQ(d.admitted, !over) << (over ? "over its capacity: refused once it would miss its target" : d.message);
  if (over) {
    EXPECT_NE(d.message.find("more than the server's whole capacity"), std::string::npos) << d.message;
  }
}

TEST(admission_control, a_tier_that_is_never_shed_and_alone_over_the_capacity_is_refused_once_it_would_miss_its_target) {
  // ~980 prompt tokens a second: an 800-token prompt every 0.65 s is ~1.25 times it, every 3 s
  // a quarter. 500 tokens waiting: 1.3 s for the next.
  const std::vector<tier_settings> tiers = {tier("gold", 2, 1000ms, false)};
  expect_refused_only_when_over(tiers, busy_engine(0), 3'000'000'000, 500, false);
  expect_refused_only_when_over(tiers, busy_engine(0), 650'000'000, 500, true);
}

// Whether a tier that is never shed is over the capacity is judged by its own work alone: the
// lower tier's decodes, which take 22.5% of the engine at their TPOT, are theirs to shed.
TEST(admission_control, a_tier_never_shed_is_over_the_capacity_by_its_own_work_not_the_lower_tiers_decodes) {
  // Alone, gold prefills 450 tokens a 50-ms step (9,000 a second); beside the decodes, 337.5
  // (6,750). 800-token prompts at 7,800 tokens a second are over only the second; at 11,000,
  // over both. 9,000 tokens waiting: ~1.45 s for the next.
  const std::vector<tier_settings> tiers = {tier("gold", 2, 1000ms, false), tier("free", 1, 5000ms)};
  expect_refused_only_when_over(tiers, lower_tier_decoding(), 102'564'103, 9000, false);
  expect_refused_only_when_over(tiers, lower_tier_decoding(), 72'727'273, 9000, true);
}

TEST(admission_control, each_degradation_level_applies_and_is_reported) {
  const std::vector<degrade_step> ladder = {{0.5, degrade_action::cap_max_tokens, 64},
                                            {0.8, degrade_action::cap_prompt_tokens, 500},
                                            {1.5, degrade_action::shed, 0}};
  // The target is large against the engine's speed, so pressure is set by the work ahead.
  auto decide = [&](int64_t waiting, int32_t prompt, int32_t max_tokens) {
    admission_control c(admission_policy::tireless, {}, {tier("std", 1, 10000ms, true, ladder)}, {});
    c.observe(busy_engine(waiting));
    return std::pair(arrive(c, 1, "", "std", 0, prompt, max_tokens), c.predicted_ttft("std", prompt) / 10.0);
  };
  auto [calm, p0] = decide(0, 100, 200);
  ASSERT_LT(p0, 0.5);
  EXPECT_TRUE(calm.admitted);
  EXPECT_EQ(calm.max_tokens, 200);
  EXPECT_TRUE(calm.degradations.empty());

  auto [capped, p1] = decide(5000, 100, 200);
  ASSERT_GE(p1, 0.5);
  ASSERT_LT(p1, 0.8);
  EXPECT_TRUE(capped.admitted);
  EXPECT_EQ(capped.max_tokens, 64);
  ASSERT_EQ(capped.degradations.size(), 1u);
  EXPECT_NE(capped.degradations[0].find("capped from 200 to 64"), std::string::npos) << capped.degradations[0];

  auto [long_prompt, p2] = decide(8000, 600, 200);
  ASSERT_GE(p2, 0.8);
  ASSERT_LT(p2, 1.0);
  EXPECT_FALSE(long_prompt.admitted);
  EXPECT_EQ(long_prompt.reason, refusal::prompt_too_long);
  EXPECT_NE(long_prompt.message.find("split"), std::string::npos);
  auto [short_prompt, p3] = decide(8000, 100, 200);
  EXPECT_TRUE(short_prompt.admitted) << "pressure " << p3;
  EXPECT_EQ(short_prompt.max_tokens, 64);

  auto [shed, p4] = decide(40000, 100, 200);
  ASSERT_GE(p4, 1.5);
  EXPECT_FALSE(shed.admitted);
  EXPECT_EQ(shed.reason, refusal::overloaded);
  EXPECT_GT(shed.retry_after_ms, 0);
}

TEST(admission_control, requests_that_wait_too_long_expire) {
  admission_settings s;
  s.max_queue_wait = 1000ms;
  admission_control c(admission_policy::tireless, s, {tier("t", 1, 600s)}, {});
  ASSERT_TRUE(arrive(c, 1, "", "t", 0).admitted);
  ASSERT_TRUE(arrive(c, 2, "", "t", second / 2).admitted);
  EXPECT_TRUE(c.expire(second).empty());
  const auto gone = c.expire(second + 1);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, 1u);
  EXPECT_EQ(c.queued(), 1);
}

TEST(admission_control, priority_policy_bounds_queues_but_does_not_predict) {
  tier_settings t = tier("t", 1, 1ms);
  t.queue_bound = 2;
  admission_control c(admission_policy::priority, {}, {t}, {});
  c.observe(busy_engine(1000000));
  EXPECT_TRUE(arrive(c, 1, "", "t", 0).admitted);
  EXPECT_TRUE(arrive(c, 2, "", "t", 0).admitted);
  const admission_decision d = arrive(c, 3, "", "t", 0);
  EXPECT_FALSE(d.admitted);
  EXPECT_EQ(d.reason, refusal::overloaded);
}

// refusal() is arrive() without the queueing: it refuses exactly what arrive refuses, with
// the same reason and message, and queues nothing either way.
TEST(admission_control, refusal_refuses_what_arrive_would_and_queues_nothing) {
  tier_settings bounded = tier("bounded", 2, 60000ms, false);
  bounded.queue_bound = 2;
  const tier_settings shed = tier("shed", 1, 1000ms);
  admission_control c(admission_policy::tireless, {}, {bounded, shed}, {});
  c.observe(busy_engine(0));
  EXPECT_FALSE(c.refusal({1, "", "bounded", 100, 100, 0}).has_value());
  EXPECT_EQ(c.queued(), 0);
  ASSERT_TRUE(arrive(c, 1, "", "bounded", 0).admitted);
  ASSERT_TRUE(arrive(c, 2, "", "bounded", 0).admitted);
  const std::optional<admission_decision> full = c.refusal({3, "", "bounded", 100, 100, 0});
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->reason, refusal::overloaded);
  EXPECT_GT(full->retry_after_ms, 0);
  EXPECT_EQ(c.queued(), 2);
  EXPECT_EQ(arrive(c, 4, "", "bounded", 0).message, full->message);

  // A sheddable tier's prediction: at ~0.5 s predicted it is taken, at 2 s it is refused.
  EXPECT_FALSE(c.refusal({5, "", "shed", 100, 100, 0}).has_value());
  c.observe(busy_engine(1500));
  const std::optional<admission_decision> late = c.refusal({6, "", "shed", 100, 100, 0});
  ASSERT_TRUE(late.has_value());
  const admission_decision by_arrive = arrive(c, 7, "", "shed", 0);
  EXPECT_FALSE(by_arrive.admitted);
  EXPECT_EQ(by_arrive.reason, late->reason);
  EXPECT_EQ(c.queued(), 2);
}

// would_refuse asks without promising: the retry hints given afterwards are those given
// without the questions (each hint given is a promise that staggers the next ones).
TEST(admission_control, would_refuse_promises_nothing) {
  const tier_settings shed = tier("shed", 1, 100ms);
  admission_control asked(admission_policy::tireless, {}, {shed}, {});
  admission_control quiet(admission_policy::tireless, {}, {shed}, {});
  asked.observe(busy_engine(5000));
  quiet.observe(busy_engine(5000));
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(asked.would_refuse({100u + i, "", "shed", 600, 100, 0}));
  for (uint64_t id = 1; id <= 3; ++id) {
    const auto a = asked.refusal({id, "", "shed", 400, 100, 0});
    const auto q = quiet.refusal({id, "", "shed", 400, 100, 0});
    ASSERT_TRUE(a && q);
    EXPECT_EQ(a->retry_after_ms, q->retry_after_ms);
  }
  // And hints are staggered by what was promised before (the check above can fail).
  const auto later = quiet.refusal({4, "", "shed", 400, 100, 0});
  const auto fresh = admission_control(admission_policy::tireless, {}, {shed}, {}).refusal({4, "", "shed", 400, 100, 0});
  EXPECT_FALSE(fresh.has_value()) << "an engine with nothing observed predicts no wait";
  ASSERT_TRUE(later.has_value());
  EXPECT_GT(later->retry_after_ms, 100);
  EXPECT_EQ(asked.queued(), 0);
}

TEST(admission_control, a_client_back_with_its_retry_token_at_the_hinted_time_is_admitted_not_shed_again) {
  const tier_settings free_tier = tier("free", 1, 500ms, true, {{0.85, degrade_action::shed, 0}});
  admission_control c(admission_policy::tireless, {}, {free_tier}, {tenant("a", "free"), tenant("b", "free")});
  c.observe(busy_engine(8000));  // far over the target: the tier sheds
  const admission_decision refused = arrive(c, 1, "a", "free", 0);
  ASSERT_FALSE(refused.admitted);
  ASSERT_EQ(refused.reason, refusal::overloaded);
  ASSERT_NE(refused.retry_token, 0u);
  ASSERT_GT(refused.retry_after_ms, 0);
  const int64_t back = refused.retry_after_ms * 1'000'000;
  // The load did not fall as predicted: a newcomer is still shed...
  EXPECT_FALSE(arrive(c, 2, "b", "free", back).admitted);
  // ...and so is a client back too early, or with another tenant's token, or a made-up one.
  arrival early{3, "a", "free", 100, 100, back / 2};
  early.retry_token = refused.retry_token;
  EXPECT_FALSE(c.arrive(early).admitted);
  arrival stolen{4, "b", "free", 100, 100, back};
  stolen.retry_token = refused.retry_token;
  EXPECT_FALSE(c.arrive(stolen).admitted);
  arrival forged{5, "a", "free", 100, 100, back};
  forged.retry_token = refused.retry_token + 1;
  EXPECT_FALSE(c.arrive(forged).admitted);
  // The client back at its time with its token holds its reservation: admitted, once.
  arrival honest{6, "a", "free", 100, 100, back};
  honest.retry_token = refused.retry_token;
  EXPECT_TRUE(c.arrive(honest).admitted);
  honest.id = 7;
  EXPECT_FALSE(c.arrive(honest).admitted) << "a token is good for one retry";
  // Past its window a reservation is gone.
  const admission_decision again = arrive(c, 8, "a", "free", back);
  ASSERT_NE(again.retry_token, 0u);
  arrival late{9, "a", "free", 100, 100, back + again.retry_after_ms * 1'000'000 + 60 * second};
  late.retry_token = again.retry_token;
  EXPECT_FALSE(c.arrive(late).admitted);
}

TEST(admission_control, a_shed_requests_hint_waits_until_the_pressure_is_under_the_shedding_rung) {
  // Shedding from 0.5 of the target on: a hint to the target itself would bring the client back
  // into the same refusal.
  const tier_settings t = tier("t", 1, 1000ms, true, {{0.5, degrade_action::shed, 0}});
  admission_control c(admission_policy::tireless, {}, {t}, {});
  c.observe(busy_engine(6000));
  const double predicted = c.predicted_ttft("t", 100);
  ASSERT_GT(predicted, 0.5);
  const admission_decision d = arrive(c, 1, "", "t", 0);
  ASSERT_FALSE(d.admitted);
  EXPECT_GE(d.retry_after_ms, static_cast<int64_t>((predicted - 0.5) * 1000));
}

}  // namespace
}  // namespace tireless
