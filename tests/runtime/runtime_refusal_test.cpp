// Refusals by the admission policy on the threaded runtime: when a tier is full, a request
// given as token ids is refused on the submitting thread (before submit returns), with the
// policy's reason and retry hint; a bad request under the same load still hears what is wrong
// with it; and every request ends once.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tireless/runtime.hpp"

namespace tireless {
namespace {

using namespace std::chrono_literals;

// One sequence runs, one waits in the engine, one in the tier's queue: a fourth is refused.
runtime_config full_tier_config() {
  return parse_config(R"(
[model]
path = "unused-by-the-sim-backend.gguf"
[backend]
kind = "sim"
sim_profile = "cpu-smollm2"
[engine]
max_step_seqs = 1
[admission]
policy = "tireless"
[[tiers]]
name = "bulk"
priority = 1
ttft_ms = 60000
tpot_ms = 1000
queue_bound = 1
sheddable = false
[[tenants]]
name = "user"
keys = ["sk-user"]
tier = "bulk"
)", "full_tier_config");
}

request tiny(int32_t max_tokens) {
  request r;
  r.api_key = "sk-user";
  r.prompt_tokens = {1, 2, 3, 4};
  r.max_tokens = max_tokens;
  return r;
}

TEST(runtime_refusal, a_full_tier_refuses_on_the_submitting_thread_and_a_bad_request_still_hears_why) {
  auto rt = runtime::start(full_tier_config());
  // Holders fill the tier one at a time (one that arrives while another is still queued is
  // refused: the queue holds one). Each runs ~10 s (1500 tokens): the third's predicted wait, two
  // of them one after the other on the one seat, stays within max_queue_wait (60 s), as a
  // request predicted to wait past it is refused at once.
  std::atomic<int> holders{0}, holder_outcomes{0};
  runtime_stats s;
  for (int i = 0; i < 500; ++i) {
    s = rt->stats();
    if (s.queued_in_admission == 1 && s.running + s.waiting_in_engine == 2) break;
    if (s.live_requests < 3) {
      ++holders;
      rt->submit(tiny(1500), nullptr, [&](const outcome&) { ++holder_outcomes; });
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(s.queued_in_admission, 1) << "the holders did not fill the tier: running " << s.running
                                      << ", waiting " << s.waiting_in_engine << ", live " << s.live_requests;
  const runtime_stats before = s;

  constexpr int n = 50;
  const std::thread::id submitter = std::this_thread::get_id();
  std::atomic<int> refused{0}, other{0}, at_once{0};
  for (int i = 0; i < n; ++i) {
    std::atomic<bool> heard{false};
    rt->submit(tiny(8), nullptr, [&](const outcome& o) {
      if (std::this_thread::get_id() == submitter) ++at_once;
      heard = true;
      if (o.kind == outcome_kind::rejected && o.reason == "overloaded" && o.retry_after_ms > 0) {
        ++refused;
      } else {
        ++other;
      }
    });
    // Outcomes that come later come from a runtime thread: wait for this one before `heard` goes.
    while (!heard) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(refused.load(), n);
  EXPECT_EQ(other.load(), 0);
  // The admission actor holds the policy's lock for a few microseconds per engine step; a
  // request that finds it busy takes the long way (session → admission) and is refused there.
  EXPECT_GE(at_once.load(), n / 2) << "policy refusals should not need a session and an actor message";

  request bad = tiny(8);
  bad.sampling.top_p = 0.0f;
  const outcome o = rt->generate(bad).get();
  EXPECT_EQ(o.kind, outcome_kind::rejected);
  EXPECT_EQ(o.reason, "invalid") << o.message;

  const runtime_stats end = rt->stats();
  EXPECT_EQ(end.rejected, before.rejected + n + 1);
  EXPECT_EQ(end.live_requests, before.live_requests);
  rt->shutdown(0ms);
  EXPECT_EQ(holder_outcomes.load(), holders.load());
}

}  // namespace
}  // namespace tireless
