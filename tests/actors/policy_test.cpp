// The overload policy end to end on the virtual-time runtime (sim backend, deterministic).
#include <gtest/gtest.h>

#include <map>

#include <fmt/format.h>

#include "actors/virtual_runtime.hpp"
#include "tests/actors/sim_harness.hpp"

namespace tireless {
namespace {

// A small sim machine (the shipped CPU profile's cost model) with three tiers.
runtime_config small_config(const std::string& policy, const std::string& standard_ladder = "") {
  return parse_config(fmt::format(R"(
[backend]
kind = "sim"
sim_profile = "cpu-smollm2"
max_context = 2048
real_time = false
[kv]
blocks = 512
[engine]
max_step_tokens = 256
max_step_seqs = 32
[admission]
policy = "{}"
default_max_tokens = 64
max_queue_wait_ms = 30000
[[tiers]]
name = "premium"
priority = 3
ttft_ms = 1000
tpot_ms = 200
queue_bound = 256
sheddable = false
[[tiers]]
name = "standard"
priority = 2
ttft_ms = 3000
tpot_ms = 400
queue_bound = 256
{}
[[tiers]]
name = "free"
priority = 1
ttft_ms = 8000
tpot_ms = 600
queue_bound = 256
[[tenants]]
name = "p"
keys = ["kp"]
tier = "premium"
[[tenants]]
name = "s"
keys = ["ks"]
tier = "standard"
[[tenants]]
name = "f"
keys = ["kf"]
tier = "free"
)",
                                  policy, standard_ladder),
                      "policy test");
}

request req(const char* key, int prompt, int max_tokens, int salt) {
  request r = test::tokens_request(prompt, max_tokens, static_cast<uint32_t>(salt));
  r.api_key = key;
  return r;
}

TEST(policy, a_client_that_waits_the_retry_hint_is_then_admitted_in_most_cases) {
  virtual_runtime rt(small_config("tireless"));
  struct refused {
    int salt;
    double at;
    int64_t retry_after_ms;
  };
  std::vector<refused> refusals;
  std::map<uint64_t, int> salt_of;
  // A burst far beyond what the free tier's target allows, then nothing.
  for (int i = 0; i < 600; ++i) {
    const uint64_t id = rt.submit(req("kf", 200, 32, i), nullptr, [&, i](const outcome& o) {
      if (o.kind == outcome_kind::rejected && o.reason == "overloaded") refusals.push_back({i, rt.now(), o.retry_after_ms});
    });
    salt_of[id] = i;
    rt.run_until(0.001 * i);
  }
  rt.run();
  ASSERT_GT(refusals.size(), 50u) << "the burst was meant to overload the tier";
  // Each refused client comes back after exactly its hint.
  std::sort(refusals.begin(), refusals.end(), [](const refused& a, const refused& b) {
    return a.at + a.retry_after_ms / 1000.0 < b.at + b.retry_after_ms / 1000.0;
  });
  int admitted = 0, answered = 0;
  for (const refused& r : refusals) {
    ASSERT_GE(r.retry_after_ms, 0);
    rt.run_until(r.at + r.retry_after_ms / 1000.0);
    rt.submit(req("kf", 200, 32, 1000 + r.salt), nullptr, [&](const outcome& o) {
      ++answered;
      if (!(o.kind == outcome_kind::rejected && o.reason == "overloaded")) ++admitted;
    });
  }
  rt.run();
  ASSERT_EQ(answered, static_cast<int>(refusals.size()));
  EXPECT_GE(admitted, 0.8 * answered) << admitted << " of " << answered << " retries admitted";
}

TEST(policy, degradations_are_applied_and_reported_on_the_outcome) {
  // A ladder that caps max_tokens from the start (pressure 0).
  virtual_runtime rt(small_config("tireless", "[[tiers.degrade]]\npressure = 0.0\nmax_tokens = 16\n"));
  std::vector<outcome> out;
  for (int i = 0; i < 20; ++i) rt.submit(req("ks", 50, 60, i), nullptr, [&](const outcome& o) { out.push_back(o); });
  rt.run();
  ASSERT_EQ(out.size(), 20u);
  for (const outcome& o : out) {
    ASSERT_EQ(o.kind, outcome_kind::completed);
    EXPECT_LE(o.completion_tokens, 16);
    ASSERT_EQ(o.degradations.size(), 1u) << "a shortened answer always says so";
    EXPECT_NE(o.degradations[0].find("max_tokens capped from 60 to 16"), std::string::npos) << o.degradations[0];
  }
}

TEST(policy, premium_keeps_its_latency_under_an_overload_of_other_tiers) {
  std::map<std::string, std::map<std::string, int>> met;  // policy → tier → met TTFT target
  for (const char* policy : {"fcfs", "tireless"}) {
    virtual_runtime rt(small_config(policy));
    int premium_total = 0;
    double t = 0;
    for (int i = 0; i < 600; ++i, t += 0.02) {  // 50 requests a second, mostly free
      const char* key = i % 10 == 0 ? "kp" : (i % 10 < 4 ? "ks" : "kf");
      if (key[1] == 'p') ++premium_total;
      rt.submit(req(key, 150, 48, i), nullptr, [&, key, policy](const outcome& o) {
        const double target = key[1] == 'p' ? 1000 : (key[1] == 's' ? 3000 : 8000);
        if (o.kind == outcome_kind::completed && o.time_to_first_token_ms <= target) met[policy][key]++;
      });
      rt.run_until(t);
    }
    rt.run();
    met[policy]["total"] = premium_total;
  }
  const int premium = met["tireless"]["total"];
  EXPECT_GE(met["tireless"]["kp"], static_cast<int>(0.99 * premium)) << "tireless keeps premium's TTFT";
  EXPECT_LT(met["fcfs"]["kp"], met["tireless"]["kp"]) << "without admission control premium suffers";
}

TEST(policy, preemption_takes_the_lowest_tier_youngest_first) {
  test::harness_options o;
  o.kv_blocks = 64;  // 1024 tokens: the three premium requests (250 tokens each) fit, not all seven
  o.max_context = 512;
  test::sim_harness h(o);
  std::vector<uint64_t> free_ids, premium_ids;
  for (int i = 0; i < 4; ++i) free_ids.push_back(h.submit(test::tokens_request(100, 150, i), 2));
  h.run_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 3; ++i) premium_ids.push_back(h.submit(test::tokens_request(100, 150, 100 + i), 0));
  h.run();
  int premium_preempted = 0, free_preempted = 0;
  for (uint64_t id : premium_ids) premium_preempted += h.outcomes().at(id)[0].preemptions;
  for (uint64_t id : free_ids) free_preempted += h.outcomes().at(id)[0].preemptions;
  EXPECT_EQ(premium_preempted, 0);
  EXPECT_GT(free_preempted, 0);
  // Youngest first: the free request that arrived last is preempted at least as often as the first.
  EXPECT_GE(h.outcomes().at(free_ids.back())[0].preemptions, h.outcomes().at(free_ids.front())[0].preemptions);
}

}  // namespace
}  // namespace tireless

