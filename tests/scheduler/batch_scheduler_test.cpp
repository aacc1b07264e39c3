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
  explicit stepper(scheduler_limits limits, int32_t n_blocks = 256)
      : limits_(limits), core_(limits), blocks_({.n_blocks = n_blocks, .block_size = limits.block_size,
                                                  .prefix_caching = false, .watermark_blocks = 0}) {}

  void add(seq_id id, int32_t priority, int32_t prompt_tokens, int32_t max_tokens) {
    sequence_spec s;
    s.id = id;
    s.priority = priority;
    s.arrival = id;
    s.prompt.resize(static_cast<size_t>(prompt_tokens));
    std::iota(s.prompt.begin(), s.prompt.end(), static_cast<token_id>(100 * id));
    s.max_tokens = max_tokens;
    core_.add(std::move(s));
  }

  // One step; returns the tokens each sequence computed in it.
  std::map<seq_id, int32_t> run(const step_time_budget& budget) {
    const kv_request request = core_.propose(budget);
    const kv_reply reply = plan_kv(blocks_, request);
    const step_batch batch = core_.finalize(reply);
    std::map<seq_id, int32_t> computed;
    step_result result;
    for (const sequence_step& s : batch.seqs) {
      computed[s.seq_id] = static_cast<int32_t>(s.tokens.size());
      result.next.push_back(s.sample ? 7 : -1);
    }
    for (const scheduler_event& e : core_.commit(result)) {
      if (e.what == scheduler_event::kind::finished) finished_.push_back(e.seq);
    }
    return computed;
  }

  const std::vector<seq_id>& finished() const { return finished_; }

 private:
  scheduler_limits limits_;
  batch_scheduler core_;
  block_manager blocks_;
  std::vector<seq_id> finished_;
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

}  // namespace
}  // namespace tireless
