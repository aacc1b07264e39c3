// The embedded runtime with the real SmolLM2 model on the CPU: real threads, real text.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "tireless/runtime.hpp"

namespace tireless {
namespace {

std::string model_path() {
  return std::string(std::getenv("HOME")) + "/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The runtime's stats once the requests that ended have given their blocks back: a release
// rides the engine's next KV request, after the step in flight (a slow one under a sanitizer
// or a loaded host), so it is waited for, up to a minute, not assumed.
template <class Runtime>
runtime_stats settled_stats(Runtime& rt) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  runtime_stats s = rt.stats();
  while ((s.kv_blocks_free != s.kv_blocks_total || s.live_requests != 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = rt.stats();
  }
  return s;
}

runtime_config config(const std::string& extra = "", int kv_blocks = 0, bool prefix_caching = true,
                      int max_context = 512) {
  std::string text = fmt::format(R"(
[model]
path = "{}"
[backend]
kind = "cpu"
threads = 2
max_context = {}
[kv]
blocks = {}
memory_mb = 64
prefix_caching = {}
[admission]
default_max_tokens = 64
[engine]
max_step_tokens = 256
max_step_seqs = 32
[[tiers]]
name = "premium"
priority = 2
ttft_ms = 60000
tpot_ms = 10000
queue_bound = 64
sheddable = false
[[tiers]]
name = "free"
priority = 1
ttft_ms = 60000
tpot_ms = 10000
queue_bound = 64
[[tenants]]
name = "a"
keys = ["key-a"]
tier = "premium"
[[tenants]]
name = "b"
keys = ["key-b"]
tier = "free"
{}
)",
                                 model_path(), max_context, kv_blocks, prefix_caching ? "true" : "false", extra);
  return parse_config(text, "test config");
}

class runtime_model : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "no SmolLM2 model; run scripts/fetch-model";
  }
};

request chat(const std::string& question, int max_tokens, const char* key = "key-a") {
  request r;
  r.api_key = key;
  r.messages = {{"user", question}};
  r.max_tokens = max_tokens;
  return r;
}

const std::vector<std::string> questions = {
    "Name three primary colors.", "What is the capital of Italy?", "Write a haiku about rain.",
    "Explain gravity in one sentence.", "List two fruits that are red.", "What is 7 times 8?",
    "Give a synonym for happy.", "Say hello in French.", "What do bees make?",
    "Name a planet with rings.", "What color is the sky on a clear day?", "Count from one to five.",
    "What is the opposite of cold?", "Name a famous painter.", "What do cows drink?",
    "Describe a cat in three words."};

TEST_F(runtime_model, sixteen_concurrent_requests_give_exactly_the_tokens_each_gives_alone) {
  auto rt = runtime::start(config());
  std::vector<std::vector<int32_t>> alone;
  for (const auto& q : questions) alone.push_back(rt->generate(chat(q, 24)).get().tokens);
  std::vector<std::future<outcome>> together;
  for (size_t i = 0; i < questions.size(); ++i) together.push_back(rt->generate(chat(questions[i], 24, i % 2 ? "key-a" : "key-b")));
  for (size_t i = 0; i < questions.size(); ++i) {
    const outcome o = together[i].get();
    ASSERT_EQ(o.kind, outcome_kind::completed) << o.message;
    EXPECT_EQ(o.tokens, alone[i]) << "question " << i << ": " << questions[i];
  }
  const runtime_stats s = settled_stats(*rt);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
}

// A shard that crashes mid-step (after the backend ran it, before it answered) is restarted and
// its step re-run: every request ends once, with exactly the tokens of a run without faults
// (sampled ones too: a draw depends on the request's seed and position only), and the KV
// blocks all come back. Slow spells on top change timings, not tokens.
TEST_F(runtime_model, shard_crashes_mid_step_and_slow_spells_change_no_token) {
  auto sampled = [](request r, uint64_t seed) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = seed;
    return r;
  };
  auto run = [&](const std::string& faults) {
    runtime_config c = config(faults);
    c.backend.max_shard_restarts = 1000;
    auto rt = runtime::start(c);
    std::vector<std::future<outcome>> out;
    for (size_t i = 0; i < 8; ++i) {
      request r = chat(questions[i], 20, i % 2 ? "key-a" : "key-b");
      out.push_back(rt->generate(i % 3 == 0 ? sampled(r, 100 + i) : r));
    }
    std::vector<outcome> done;
    for (auto& f : out) done.push_back(f.get());
    const runtime_stats s = settled_stats(*rt);
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    return std::make_pair(done, s.shard_restarts);
  };
  const auto [clean, no_restarts] = run("");
  const auto [faulty, restarts] =
      run("[faults]\nshard_crash_per_step = 0.15\nshard_slow_per_step = 0.1\nshard_slow_ms = 200\n"
          "shard_slow_factor = 2\nseed = 11");
  EXPECT_EQ(no_restarts, 0);
  EXPECT_GT(restarts, 0) << "no fault was injected";
  for (size_t i = 0; i < clean.size(); ++i) {
    ASSERT_EQ(faulty[i].kind, outcome_kind::completed) << faulty[i].message;
    EXPECT_EQ(faulty[i].tokens, clean[i].tokens) << "request " << i;
  }
}

TEST_F(runtime_model, requests_sharing_a_system_prompt_reuse_its_blocks_with_identical_outputs) {
  const std::string system(
      "You are a careful assistant for a library. Answer briefly and politely. Always name the section "
      "of the library where a book can be found: fiction, history, science, art or children. If you do not "
      "know, say so and suggest asking a librarian at the front desk, which is open from nine to five on "
      "weekdays and from ten to four on Saturdays. Never invent titles.");
  auto ask = [&](runtime& rt, const std::string& q) {
    request r;
    r.api_key = "key-a";
    r.messages = {{"system", system}, {"user", q}};
    r.max_tokens = 16;
    return rt.generate(r).get();
  };
  const std::vector<std::string> qs = {"Where are books about volcanoes?", "Where is Peter Pan?",
                                       "Where are books on Roman emperors?", "Where are painting books?"};
  std::vector<outcome> cached, uncached;
  int64_t hits = 0;
  {
    auto rt = runtime::start(config("", 0, true));
    for (const auto& q : qs) cached.push_back(ask(*rt, q));
    hits = rt->stats().prefix_hit_blocks;
  }
  {
    auto rt = runtime::start(config("", 0, false));
    for (const auto& q : qs) uncached.push_back(ask(*rt, q));
    EXPECT_EQ(rt->stats().prefix_hit_blocks, 0);
  }
  EXPECT_GE(hits, 3 * 4) << "the later requests reuse the shared prompt's full blocks";
  int reused_tokens = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    EXPECT_EQ(cached[i].tokens, uncached[i].tokens) << qs[i];
    reused_tokens += cached[i].cached_prompt_tokens;
  }
  EXPECT_GT(reused_tokens, 0);
}

TEST_F(runtime_model, a_kv_pool_too_small_for_the_load_preempts_and_outputs_stay_exact) {
  const std::vector<std::string> stories = {"a dragon", "a castle", "the sea", "a robot",
                                             "a forest", "a train", "the moon", "a garden"};
  auto story = [&](int i, const char* key) {
    return chat("Write a long story about " + stories[i] + ".", 80, key);
  };
  std::vector<std::vector<int32_t>> expected;
  {
    auto rt = runtime::start(config("", 0, true, 256));
    for (int i = 0; i < 8; ++i) expected.push_back(rt->generate(story(i, "key-a")).get().tokens);
  }
  auto rt = runtime::start(config("", 16, true, 256));  // 256 tokens: two of these requests at once
  // Free requests first; once one streams, premium ones arrive and take their blocks back (a
  // start waits while the pool cannot carry its own tier's running answers: preemption comes
  // from a higher tier's start).
  std::vector<std::promise<outcome>> ended(8);
  std::vector<std::future<outcome>> results;
  for (auto& e : ended) results.push_back(e.get_future());
  std::promise<void> streaming;
  std::atomic<bool> streams{false};
  for (int i = 4; i < 8; ++i) {
    rt->submit(story(i, "key-b"), [&](const token_event&) { if (!streams.exchange(true)) streaming.set_value(); },
               [&, i](const outcome& o) { ended[static_cast<size_t>(i)].set_value(o); });
  }
  streaming.get_future().wait();
  for (int i = 0; i < 4; ++i) {
    rt->submit(story(i, "key-a"), nullptr, [&, i](const outcome& o) { ended[static_cast<size_t>(i)].set_value(o); });
  }
  int preemptions = 0;
  for (int i = 0; i < 8; ++i) {
    const outcome o = results[i].get();
    ASSERT_EQ(o.kind, outcome_kind::completed) << o.message;
    EXPECT_EQ(o.tokens, expected[i]) << "recomputed after preemption, question " << i;
    preemptions += o.preemptions;
  }
  EXPECT_GT(preemptions, 0);
  const runtime_stats s = settled_stats(*rt);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
}

TEST_F(runtime_model, bad_requests_are_refused_with_a_reason_and_nothing_is_lost) {
  auto rt = runtime::start(config());
  auto expect_rejected = [&](request r, const std::string& reason) {
    const outcome o = rt->generate(std::move(r)).get();
    EXPECT_EQ(o.kind, outcome_kind::rejected) << reason;
    EXPECT_EQ(o.reason, reason) << o.message;
    EXPECT_FALSE(o.message.empty());
  };
  expect_rejected(chat("hi", 8, "wrong-key"), "unauthenticated");
  request none;
  none.api_key = "key-a";
  expect_rejected(none, "invalid");
  request bad_temperature = chat("hi", 8);
  bad_temperature.sampling.temperature = -1;
  expect_rejected(bad_temperature, "invalid");
  request bad_top_p = chat("hi", 8);
  bad_top_p.sampling.top_p = 0;
  expect_rejected(bad_top_p, "invalid");
  request bad_role = chat("hi", 8);
  bad_role.messages[0].role = "robot";
  expect_rejected(bad_role, "invalid");
  expect_rejected(chat(std::string(4000, 'x'), 8), "prompt_too_long");
  expect_rejected(chat("hi", 100000), "invalid");
  request bad_token = chat("", 8);
  bad_token.messages.clear();
  bad_token.prompt_tokens = {1, 2, 999999};
  expect_rejected(bad_token, "invalid");
  const runtime_stats s = settled_stats(*rt);
  EXPECT_EQ(s.live_requests, 0);
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
}

// A chat request the policy refuses is tokenized and refused on the submitting thread (no
// session, no actor message) when its text is short; a long one is refused by its session; a
// bad one still hears what is wrong with it.
TEST_F(runtime_model, chat_requests_over_a_quota_are_refused_on_the_submitting_thread) {
  auto rt = runtime::start(config(R"(
[[tenants]]
name = "c"
keys = ["key-c"]
tier = "free"
requests_per_minute = 1
)", 0, true, 2048));
  const outcome first = rt->generate(chat("Say hi.", 1, "key-c")).get();
  ASSERT_EQ(first.kind, outcome_kind::completed) << first.reason << ": " << first.message;

  const std::thread::id submitter = std::this_thread::get_id();
  constexpr int n = 20;
  std::atomic<int> quota{0}, here{0}, other{0};
  std::vector<std::future<outcome>> waits;
  for (int i = 0; i < n; ++i) {
    auto done = std::make_shared<std::promise<outcome>>();
    waits.push_back(done->get_future());
    rt->submit(chat(questions[i % questions.size()], 8, "key-c"), nullptr, [&, done](const outcome& o) {
      if (std::this_thread::get_id() == submitter) ++here;
      if (o.kind == outcome_kind::rejected && o.reason == "quota_exceeded" && o.retry_after_ms > 0) {
        ++quota;
      } else {
        ++other;
      }
      done->set_value(o);
    });
  }
  for (auto& w : waits) w.get();
  EXPECT_EQ(quota.load(), n);
  EXPECT_EQ(other.load(), 0);
  EXPECT_GE(here.load(), n / 2) << "short chat prompts the policy refuses should be refused without a session";

  std::string long_text;
  while (long_text.size() < 5000) long_text += " hello";
  const outcome long_one = rt->generate(chat(long_text, 8, "key-c")).get();
  EXPECT_EQ(long_one.reason, "quota_exceeded") << long_one.message;
  request bad = chat("Hello", 8, "key-c");
  bad.messages[0].role = "robot";
  const outcome refused_bad = rt->generate(bad).get();
  EXPECT_EQ(refused_bad.reason, "invalid") << refused_bad.message;
}

TEST_F(runtime_model, cancel_stop_strings_and_timeouts_each_end_a_request_once) {
  auto rt = runtime::start(config());
  // A stop string ends the answer before it and is not shown.
  request stop = chat("Count from one to ten, separated by commas.", 64);
  stop.stop = {","};
  const outcome s = rt->generate(stop).get();
  EXPECT_EQ(s.kind, outcome_kind::completed);
  EXPECT_EQ(s.reason, "stop_string");
  EXPECT_EQ(s.text.find(','), std::string::npos) << s.text;
  // A timeout shorter than the answer.
  request slow = chat("Write a long story about a dragon.", 400);
  slow.timeout = std::chrono::milliseconds(300);
  const outcome t = rt->generate(slow).get();
  EXPECT_EQ(t.kind, outcome_kind::cancelled);
  EXPECT_EQ(t.reason, "deadline");
  // A cancel in the middle of a stream.
  std::promise<outcome> done;
  std::atomic<int> tokens{0};
  uint64_t id = 0;
  id = rt->submit(chat("Write a long story about a castle.", 400), [&](const token_event&) { ++tokens; },
                  [&](const outcome& o) { done.set_value(o); });
  while (tokens.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(rt->cancel(id));
  const outcome c = done.get_future().get();
  EXPECT_EQ(c.kind, outcome_kind::cancelled);
  EXPECT_EQ(c.reason, "client");
  EXPECT_FALSE(rt->cancel(id)) << "an ended request cannot be cancelled again";
  const runtime_stats st = settled_stats(*rt);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total) << "cancelled requests give their blocks back";
}

// Heap bytes in use (glibc's count; a sanitizer's allocator keeps its own).
size_t heap_in_use() { return mallinfo2().uordblks; }

TEST_F(runtime_model, a_finished_request_leaves_no_memory_behind) {
#ifdef TIRELESS_SANITIZED
  GTEST_SKIP() << "the sanitizer's allocator is not glibc's; LeakSanitizer checks leaks there";
#endif
  auto rt = runtime::start(config());
  // Short deadlines, so the timers that hold a request's session until its deadline are gone
  // when memory is counted.
  auto run = [&](int n) {
    for (int i = 0; i < n; ++i) {
      request r = chat("Say hi.", 2);
      r.timeout = std::chrono::milliseconds(1000);
      ASSERT_EQ(rt->generate(r).get().kind, outcome_kind::completed);
    }
    settled_stats(*rt);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  };
  run(30);  // warm: pools, caches, the step model
  const size_t before = heap_in_use();
  const int n = 300;
  run(n);
  const double per_request = (static_cast<double>(heap_in_use()) - static_cast<double>(before)) / n;
  // Each session used to stay allocated for good (~1.7 KB: its monitors on admission and the
  // engine kept a weak reference to it).
  EXPECT_LT(per_request, 256) << "bytes kept per finished request";
}

TEST_F(runtime_model, shutdown_gives_every_in_flight_request_an_outcome) {
  auto rt = runtime::start(config());
  std::mutex mu;
  std::map<uint64_t, int> outcomes;
  for (int i = 0; i < 12; ++i) {
    rt->submit(chat(questions[i], 300), nullptr, [&](const outcome& o) {
      std::lock_guard lock(mu);
      ++outcomes[o.request_id];
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  rt->shutdown(std::chrono::milliseconds(100));
  ASSERT_EQ(outcomes.size(), 12u);
  for (const auto& [id, n] : outcomes) EXPECT_EQ(n, 1);
  const outcome after = rt->generate(chat("hi", 4)).get();
  EXPECT_EQ(after.reason, "shutting_down");
}

}  // namespace
}  // namespace tireless
