#include <gtest/gtest.h>

#include <map>

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

TEST(virtual_runtime, refuses_a_non_sim_backend) {
  runtime_config c = k2();
  c.backend.kind = backend_kind::cpu;
  EXPECT_THROW(virtual_runtime{c}, std::runtime_error);
}

}  // namespace
}  // namespace tireless
