// The ideal engine's prefix cache (ideal.hpp, runner.cpp): a class's system prompt is computed
// once, by its first request; every later request of the class is charged only the rest, in
// whole KV blocks as the target caches them. Without it, tireless put more premium prompts on
// time than the "at most" an ideal engine could (h200-herd short form at 3x: 914 of at most 842).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "runner.hpp"
#include "target.hpp"

namespace tireless::load {
namespace {

// Completes every request at once; its idle work is the number of tokens it was told are
// cached, so that a record shows what the runner asked.
class instant_session final : public target_session {
 public:
  double now() override { return now_; }
  void advance_to(double t) override { now_ = std::max(now_, t); }
  void submit(const planned_request& r, outcome_fn done) override {
    outcome o;
    o.kind = outcome_kind::completed;
    o.reason = "max_tokens";
    o.completion_tokens = r.max_tokens;
    o.time_to_first_token_ms = 1;
    o.total_ms = 1;
    done(o);
  }
  std::optional<target_probe> probe() override { return std::nullopt; }

 private:
  double now_ = 0;
};

class caching_target final : public target {
 public:
  std::unique_ptr<target_session> open(admission_policy, bool, const std::string&) override {
    return std::make_unique<instant_session>();
  }
  bool virtual_time() const override { return true; }
  std::string describe() const override { return "instant"; }
  double idle_first_token_s(int32_t, double) const override { return 0.01; }
  double idle_prefill_work_s(int32_t, int32_t cached_tokens, double) const override { return cached_tokens; }
  int32_t cacheable_tokens(int32_t shared) const override { return shared / 64 * 64; }
};

request_class chat(std::string name, int32_t system_tokens, double share) {
  request_class c;
  c.name = std::move(name);
  c.share = share;
  c.system_prompt_tokens = system_tokens;
  c.prompt = {length_dist::kind::uniform, 16, 200};
  c.output = {length_dist::kind::fixed, 8, 8};
  return c;
}

TEST(ideal_prefix_cache, a_class_system_prompt_is_computed_by_its_first_request_only) {
  scenario s;
  tier_settings tier;
  tier.name = "premium";
  tier.ttft = std::chrono::milliseconds(500);
  s.config.tiers.push_back(tier);
  s.mix = {chat("with-800", 800, 0.4), chat("with-100", 100, 0.4), chat("without", 0, 0.2)};
  s.warmup_s = 0;
  s.duration_s = 30;
  s.drain_s = 5;
  s.sample_every_s = 1;
  caching_target t;
  const run_result run = run_open_loop(t, s, admission_policy::tireless, 1, 2.0, nullptr);
  ASSERT_GT(run.records.size(), 20u);
  std::map<int32_t, int> seen;
  for (const request_record& r : run.records) {  // in arrival order
    const int32_t cls = r.plan.cls;
    const int32_t system = r.plan.system_tokens;
    const double expected = system == 0 || seen[cls]++ == 0 ? 0.0 : system / 64 * 64;
    EXPECT_EQ(r.idle_work_s, expected) << "class " << cls << " at " << r.plan.arrival_s << " s";
  }
  EXPECT_GT(seen[0], 1);
  EXPECT_GT(seen[1], 1);
}

TEST(ideal_prefix_cache, the_sim_target_charges_the_rest_of_the_prompt_in_whole_blocks_when_it_caches) {
  scenario s = load_scenario(TIRELESS_SOURCE_DIR "/examples/load_driver/scenarios/h200-herd.toml");
  ASSERT_TRUE(s.config.kv.prefix_caching);
  ASSERT_EQ(s.config.kv.block_size, 64);
  {
    const std::unique_ptr<target> t = make_virtual_target(s);
    EXPECT_EQ(t->cacheable_tokens(800), 768);
    EXPECT_EQ(t->cacheable_tokens(63), 0);
    const double whole = t->idle_prefill_work_s(1100, 0, 0), rest = t->idle_prefill_work_s(1100, 768, 0);
    EXPECT_GT(rest, 0);
    EXPECT_LT(rest, 0.5 * whole) << "332 of 1,100 tokens";
    EXPECT_GT(rest, t->idle_prefill_work_s(332, 0, 0)) << "the rest attends the cached positions too";
    EXPECT_GT(t->idle_prefill_work_s(1100, 5000, 0), 0) << "the last token is always computed";
  }
  s.config.kv.prefix_caching = false;
  EXPECT_EQ(make_virtual_target(s)->cacheable_tokens(800), 0);
}

}  // namespace
}  // namespace tireless::load
