#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "actors/virtual_runtime.hpp"

namespace tireless {
namespace {

runtime_config k2() { return load_config(std::string(TIRELESS_SOURCE_DIR) + "/config/sim-h200-k2.toml"); }

TEST(virtual_runtime, replays_minutes_of_traffic_with_one_outcome_each) {
  runtime_config c = k2();
  virtual_runtime rt(c);
  std::map<uint64_t, int> outcomes;
  int completed = 0;
  const std::string key = c.tenants.front().keys.front();
  for (int i = 0; i < 2000; ++i) {
    request r;
    r.api_key = key;
    for (int t = 0; t < 200 + (i % 7) * 300; ++t) r.prompt_tokens.push_back(1000 + (t * 13 + i) % 9000);
    r.max_tokens = 50 + (i % 5) * 40;
    rt.submit(r, nullptr, [&](const outcome& o) {
      ++outcomes[o.request_id];
      completed += o.kind == outcome_kind::completed;
    });
    rt.run_until(i * 0.25);  // 4 requests a second (~4.4k prompt tokens/s) for 500 virtual seconds
  }
  rt.run();
  EXPECT_EQ(outcomes.size(), 2000u);
  for (const auto& [id, n] : outcomes) EXPECT_EQ(n, 1);
  EXPECT_GT(completed, 1900);
  EXPECT_GT(rt.now(), 499.0);
  const runtime_stats s = rt.stats();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
  EXPECT_EQ(s.live_requests, 0);
}

// One request of 1,000 prompt and 200 output tokens alone on the engine: its outcome.
outcome alone(const runtime_config& c) {
  virtual_runtime rt(c);
  request r;
  r.api_key = c.tenants.front().keys.front();
  for (int t = 0; t < 1000; ++t) r.prompt_tokens.push_back(1000 + t);
  r.max_tokens = 200;
  outcome out;
  rt.submit(r, nullptr, [&](const outcome& o) { out = o; });
  rt.run();
  return out;
}

// Agents of the premium tier (500 ms) whose prompts share a 6,000-token system prompt (~0.9 s
// of prefill alone): the first cannot start in time and says so; the later ones find it in
// the prefix cache, which admission expected, and are neither called infeasible nor late.
// Without prefix caching every one of them says so (further apart: each takes ~0.9 s).
std::vector<outcome> agents(const runtime_config& c, double gap_s = 2.0) {
  virtual_runtime rt(c);
  std::vector<outcome> out(8);
  for (int i = 0; i < 8; ++i) {
    request r;
    r.api_key = c.tenants.front().keys.front();
    for (int t = 0; t < 6000; ++t) r.prompt_tokens.push_back(1000 + t);
    for (int t = 0; t < 40; ++t) r.prompt_tokens.push_back(20000 + 100 * i + t);
    r.max_tokens = 20;
    rt.submit(r, nullptr, [&out, i](const outcome& o) { out[static_cast<size_t>(i)] = o; });
    rt.run_until(gap_s * (i + 1));
  }
  rt.run();
  return out;
}

TEST(virtual_runtime, an_agents_cached_system_prompt_is_not_judged_infeasible_for_its_length) {
  const std::vector<outcome> cached = agents(k2());
  ASSERT_EQ(cached[0].kind, outcome_kind::completed);
  ASSERT_EQ(cached[0].degradations.size(), 1u);
  EXPECT_NE(cached[0].degradations[0].find("cannot start within"), std::string::npos) << cached[0].degradations[0];
  for (size_t i = 1; i < cached.size(); ++i) {
    ASSERT_EQ(cached[i].kind, outcome_kind::completed) << i;
    EXPECT_GE(cached[i].cached_prompt_tokens, 5900) << i;
    EXPECT_TRUE(cached[i].degradations.empty()) << i << ": " << cached[i].degradations[0];
    EXPECT_LT(cached[i].time_to_first_token_ms, 500) << i;
  }
  runtime_config uncached = k2();
  uncached.kv.prefix_caching = false;
  for (const outcome& o : agents(uncached, 6.0)) {
    ASSERT_EQ(o.kind, outcome_kind::completed) << o.message;
    EXPECT_EQ(o.degradations.size(), 1u) << "computes all 6,040 tokens: cannot start in 500 ms";
  }
}

TEST(virtual_runtime, the_expert_groups_faults_slow_the_steps_while_they_last) {
  const runtime_config healthy = k2();
  const outcome even = alone(healthy);
  ASSERT_EQ(even.kind, outcome_kind::completed);
  runtime_config hot = healthy;
  hot.faults.expert_group.push_back({.at_s = 0, .imbalance = 2.0});
  const outcome slow = alone(hot);
  ASSERT_EQ(slow.kind, outcome_kind::completed);
  // The routed-expert work (2/3 of the per-token costs) twice as long, the prefill bound by the
  // hot device's link: 1,000 × 137 µs × 0.66 + 200 × 293 µs × 0.66 + (1,000 × 2 × 142 µs - 137 ms) ≈ 275 ms
  EXPECT_GT(slow.total_ms, even.total_ms + 150);
  runtime_config later = healthy;
  later.faults.expert_group.push_back({.at_s = 3600, .down = 8, .imbalance = 2.0, .stall_ms = 5000});
  EXPECT_DOUBLE_EQ(alone(later).total_ms, even.total_ms);  // not yet in force
  runtime_config stall = healthy;
  stall.faults.expert_group.push_back({.at_s = 0, .for_s = 1, .stall_ms = 2000});
  const outcome stalled = alone(stall);
  // the stall, and the engine's step-time model catching up with a 2-s step
  EXPECT_GE(stalled.total_ms - even.total_ms, 2000.0);
  EXPECT_LT(stalled.total_ms - even.total_ms, 2500.0);
  EXPECT_GE(stalled.longest_pause_ms + stalled.time_to_first_token_ms, 2000.0);
}

// Requests of 200..2000 prompt tokens at `rate` a second for `seconds`, on a fleet of
// `replicas`; the share refused, and every request's outcome counted once.
struct fleet_run {
  double refused = 0;
  std::vector<int64_t> routed;
  int64_t affinity_hits = 0;
  runtime_stats stats;
  bool one_outcome_each = true;
  std::vector<fleet_sample> timeline;
  double replica_seconds = 0;
  int32_t serving_at_end = 0;
};

// idle_after: virtual seconds run with no traffic after the last request (an autoscaler
// scales down in them).
fleet_run drive(const fleet_options& fleet, double rate, double seconds, int shared_prefixes = 0, double idle_after = 0) {
  runtime_config c = k2();
  virtual_runtime rt(c, fleet);
  std::map<uint64_t, int> outcomes;
  int rejected = 0;
  const std::string key = c.tenants.front().keys.front();
  const int n = static_cast<int>(rate * seconds);
  for (int i = 0; i < n; ++i) {
    request r;
    r.api_key = key;
    // shared_prefixes > 0: requests open with one of that many 100-token system prompts
    for (int t = 0; shared_prefixes > 0 && t < 100; ++t) r.prompt_tokens.push_back(500 + (i % shared_prefixes) * 100 + t);
    for (int t = 0; t < 200 + (i % 7) * 300; ++t) r.prompt_tokens.push_back(1000 + (t * 13 + i) % 9000);
    r.max_tokens = 50 + (i % 5) * 40;
    rt.submit(r, nullptr, [&](const outcome& o) {
      ++outcomes[o.request_id];
      rejected += o.kind == outcome_kind::rejected;
    });
    rt.run_until(i / rate);
  }
  if (idle_after > 0) rt.run_until(seconds + idle_after);
  rt.run();
  fleet_run out;
  out.one_outcome_each = static_cast<int>(outcomes.size()) == n;
  for (const auto& [id, k] : outcomes) out.one_outcome_each = out.one_outcome_each && k == 1;
  out.refused = static_cast<double>(rejected) / n;
  out.routed = rt.routed();
  out.affinity_hits = rt.affinity_hits();
  out.stats = rt.stats();
  out.timeline = rt.fleet_timeline();
  out.replica_seconds = rt.replica_seconds();
  out.serving_at_end = rt.serving();
  return out;
}

fleet_run drive(int32_t replicas, double rate, double seconds, int shared_prefixes = 0) {
  return drive(fleet_options{replicas, std::nullopt}, rate, seconds, shared_prefixes);
}

TEST(virtual_fleet, two_replicas_behind_the_router_serve_what_one_would_refuse_and_lose_nothing) {
  // 10 requests a second of this mix is well over one H200's share, about right for two.
  const fleet_run one = drive(1, 10, 120), two = drive(2, 10, 120);
  EXPECT_TRUE(one.one_outcome_each);
  EXPECT_TRUE(two.one_outcome_each);
  EXPECT_GT(one.refused, 0.2);
  EXPECT_LT(two.refused, one.refused / 2);
  ASSERT_EQ(two.routed.size(), 2u);
  EXPECT_EQ(two.routed[0] + two.routed[1], 1200);
  EXPECT_GT(two.routed[1], 400);  // both replicas serve
  EXPECT_GT(two.routed[0], 400);
  // every KV block back, on both replicas; the fleet's pool is twice one's
  EXPECT_EQ(two.stats.kv_blocks_total, 2 * one.stats.kv_blocks_total);
  EXPECT_EQ(two.stats.kv_blocks_free, two.stats.kv_blocks_total);
  EXPECT_EQ(two.stats.live_requests, 0);
  EXPECT_EQ(two.stats.completed + two.stats.rejected, 1200);
}

TEST(virtual_fleet, requests_sharing_a_system_prompt_go_back_to_the_replica_that_cached_it) {
  const fleet_run r = drive(4, 2, 120, 4);
  EXPECT_TRUE(r.one_outcome_each);
  EXPECT_GT(r.affinity_hits, 150);  // of 240, the first of each prefix excepted, while the fleet is idle enough
  EXPECT_GT(r.stats.prefix_hit_blocks, 0);
}

TEST(virtual_fleet, the_autoscaler_adds_replicas_that_serve_only_once_started_and_removes_them_when_idle) {
  autoscale_options o;
  o.min_replicas = 1;
  o.max_replicas = 4;
  o.startup_s = 90;
  o.metrics = {{autoscale_metric::kind::waiting, "", 4}, {autoscale_metric::kind::refused_per_s, "", 0.2}};
  const fleet_run one = drive(1, 10, 900);
  const fleet_run scaled = drive(fleet_options{1, o}, 10, 900, 0, 1200);
  EXPECT_TRUE(scaled.one_outcome_each);
  // It grew: more than one replica served, the later ones only from 90 s after they were asked for.
  ASSERT_FALSE(scaled.timeline.empty());
  int32_t most = 0;
  double first_ask = -1, first_serving = -1;
  for (const fleet_sample& f : scaled.timeline) {
    most = std::max(most, f.serving);
    if (first_ask < 0 && f.starting > 0) first_ask = f.t;
    if (first_serving < 0 && f.serving > 1) first_serving = f.t;
    EXPECT_LE(f.serving + f.starting, 4);
    EXPECT_GE(f.serving, 1);
  }
  EXPECT_GE(most, 2);
  ASSERT_GE(first_ask, 0);
  EXPECT_GE(first_serving - first_ask, 90.0);
  ASSERT_GE(scaled.routed.size(), 2u);
  EXPECT_GT(scaled.routed[1], 0);
  // It served more than one fixed replica could, and paid for what it ran.
  EXPECT_LT(scaled.refused, one.refused * 0.7);
  EXPECT_GT(scaled.replica_seconds, 2100.0);
  EXPECT_LT(scaled.replica_seconds, 4.0 * 2100);
  // Idle for 20 minutes afterwards: back to the minimum; every KV block back everywhere.
  EXPECT_EQ(scaled.serving_at_end, 1);
  EXPECT_EQ(scaled.stats.kv_blocks_free, scaled.stats.kv_blocks_total);
  EXPECT_EQ(scaled.stats.live_requests, 0);
}

TEST(virtual_runtime, refuses_a_non_sim_backend) {
  runtime_config c = k2();
  c.backend.kind = backend_kind::cpu;
  EXPECT_THROW(virtual_runtime{c}, std::runtime_error);
}

}  // namespace
}  // namespace tireless
