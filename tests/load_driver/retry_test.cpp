// Clients that retry a refusal for load (scenario::retries): run_open_loop sends each retry once
// its hint has passed, with the refusal's token, at most `retries` times; a hint that passes
// after the run's end is not sent and not lost; the report counts them by tier.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "report.hpp"
#include "runner.hpp"

namespace tireless::load {
namespace {

// A target on its own clock: it refuses every try without a token (hint hint_ms, a token of
// its own), refuses a retry with a wrong token as well, and completes a retry with its token
// after 100 ms. What it was sent is kept, in order.
struct sent_try {
  double at = 0;
  uint64_t token = 0;
  int32_t prompt_tokens = 0;
};

class refusing_session final : public target_session {
 public:
  refusing_session(std::vector<sent_try>& sent, int64_t hint_ms, bool refuse_retries)
      : sent_(sent), hint_ms_(hint_ms), refuse_retries_(refuse_retries) {}
  double now() override { return now_; }
  void advance_to(double t) override {
    while (!due_.empty() && due_.begin()->first <= t) {
      auto it = due_.begin();
      now_ = std::max(now_, it->first);
      auto [o, done] = std::move(it->second);
      due_.erase(it);
      done(o);
    }
    now_ = std::max(now_, t);
  }
  void submit(const planned_request& r, outcome_fn done) override {
    sent_.push_back({now_, r.retry_token, r.prompt_tokens});
    outcome o;
    if (r.retry_token != 0 && r.retry_token == issued_[r.prompt_tokens] && !refuse_retries_) {
      o.kind = outcome_kind::completed;
      o.reason = "max_tokens";
      o.completion_tokens = r.max_tokens;
      o.time_to_first_token_ms = 50;
      o.total_ms = 100;
      due_.emplace(now_ + 0.1, std::make_pair(o, std::move(done)));
      return;
    }
    o = rejected_outcome(0, reason::overloaded, "shedding", hint_ms_);
    o.retry_token = issued_[r.prompt_tokens] = ++tokens_;
    due_.emplace(now_, std::make_pair(o, std::move(done)));
  }
  std::optional<target_probe> probe() override { return std::nullopt; }

 private:
  std::vector<sent_try>& sent_;
  int64_t hint_ms_;
  bool refuse_retries_;
  double now_ = 0;
  uint64_t tokens_ = 0;
  std::map<int32_t, uint64_t> issued_;  // by prompt length (each request's own): its last token
  std::multimap<double, std::pair<outcome, outcome_fn>> due_;
};

class refusing_target final : public target {
 public:
  refusing_target(int64_t hint_ms, bool refuse_retries) : hint_ms_(hint_ms), refuse_retries_(refuse_retries) {}
  std::unique_ptr<target_session> open(admission_policy, bool, const std::string&) override {
    return std::make_unique<refusing_session>(sent, hint_ms_, refuse_retries_);
  }
  bool virtual_time() const override { return true; }
  std::string describe() const override { return "refusing"; }
  std::vector<sent_try> sent;

 private:
  int64_t hint_ms_;
  bool refuse_retries_;
};

// One tier, requests a second apart on average for 20 s, each prompt a length of its own.
scenario retrying(int32_t retries) {
  scenario s;
  tier_settings tier;
  tier.name = "free";
  tier.ttft = std::chrono::milliseconds(5000);
  tier.tpot = std::chrono::milliseconds(200);
  s.config.tiers.push_back(tier);
  request_class c;
  c.name = "chat";
  c.share = 1;
  c.prompt = {length_dist::kind::uniform, 1, 1'000'000};
  c.output = {length_dist::kind::fixed, 8, 8};
  s.mix.push_back(c);
  s.warmup_s = 0;
  s.duration_s = 20;
  s.drain_s = 5;
  s.sample_every_s = 1;
  s.retries = retries;
  return s;
}

TEST(client_retries, each_refusal_is_sent_again_after_its_hint_with_its_token_and_served) {
  refusing_target t(700, false);
  const scenario s = retrying(2);
  const run_result run = run_open_loop(t, s, admission_policy::tireless, 1, 1.0, nullptr);
  ASSERT_GT(run.records.size(), 5u);
  ASSERT_EQ(run.retries.size(), run.records.size()) << "one retry each: the first is served";
  for (const request_record& r : run.retries) {
    const request_record& first = run.records.at(static_cast<size_t>(r.first_try));
    EXPECT_EQ(r.attempt, 1);
    EXPECT_EQ(r.plan.prompt_tokens, first.plan.prompt_tokens) << "the same request";
    EXPECT_GE(r.submitted_s, first.outcome_s + 0.7 - 1e-9) << "not before its hint";
    EXPECT_LE(r.submitted_s, first.outcome_s + 0.7 + 0.06) << "nor long after it";
    EXPECT_NE(r.plan.retry_token, 0u);
    EXPECT_EQ(r.kind, outcome_kind::completed);
  }
  const run_metrics m = measure(run, s);
  EXPECT_EQ(m.lost, 0);
  EXPECT_EQ(m.requests, static_cast<int64_t>(2 * run.records.size())) << "every try is a request of the run";
  const tier_metrics& f = m.tiers.front();
  EXPECT_EQ(f.offered, static_cast<int64_t>(run.records.size())) << "the tables count first tries";
  EXPECT_EQ(f.rejected, f.offered);
  EXPECT_EQ(f.hinted, f.offered);
  EXPECT_EQ(f.retried, f.offered);
  EXPECT_EQ(f.retry_refused, 0);
  EXPECT_EQ(f.served_on_retry, f.offered);
  EXPECT_EQ(f.retry_on_time, f.offered);
  EXPECT_EQ(f.slo_attainment, 0.0) << "no first try was served";
  EXPECT_EQ(on_some_try(f), 1.0) << "every request was served within the SLO on its retry";
  EXPECT_NEAR(f.retry_ttft_p50, 700 + 50, 60) << "the hint's wait, then its first token";
}

TEST(client_retries, a_client_gives_up_after_its_retries_and_a_hint_past_the_end_is_not_lost) {
  refusing_target t(4000, true);  // every try refused, each hint 4 s
  const scenario s = retrying(3);
  const run_result run = run_open_loop(t, s, admission_policy::tireless, 1, 1.0, nullptr);
  std::map<int64_t, int32_t> tries;
  for (const request_record& r : run.retries) {
    if (r.submitted_s < 0) continue;
    EXPECT_LE(r.attempt, 3);
    EXPECT_EQ(r.kind, outcome_kind::rejected);
    ++tries[r.first_try];
  }
  EXPECT_EQ(tries.at(0), 3) << "the first request's client tried three times more, then gave up";
  const run_metrics m = measure(run, s);
  EXPECT_EQ(m.lost, 0) << "a retry never sent (its hint passed after the drain) is no request";
  const tier_metrics& f = m.tiers.front();
  EXPECT_GT(f.retry_after_end, 0) << "the last requests' hints pass after the run";
  EXPECT_EQ(f.retry_refused, f.retried);
  EXPECT_EQ(f.served_on_retry, 0);
  EXPECT_EQ(on_some_try(f), 0.0) << "refused on every try";
  EXPECT_EQ(t.sent.size(), run.records.size() + static_cast<size_t>(f.retried));
}

TEST(client_retries, without_retries_a_refusal_ends_the_request) {
  refusing_target t(700, false);
  const run_result run = run_open_loop(t, retrying(0), admission_policy::tireless, 1, 1.0, nullptr);
  EXPECT_TRUE(run.retries.empty());
  EXPECT_EQ(t.sent.size(), run.records.size());
}

}  // namespace
}  // namespace tireless::load
