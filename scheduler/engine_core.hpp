#pragma once
// The engine's decisions and measurements, CAF-free: the step budget and its headroom, the
// fitted step-time model and its observed error, the token budget admission predicts with,
// the "unplaceable" rule, request timings, refusal of requests past their start bound, and
// the flush of a step that failed. The engine actor is glue around one step:
//   kv_request r = propose(now)         → kv_manager
//   granted_step g = granted(reply, now) → the shard runs g.batch (none: propose again if asked)
//   commit(result, seconds, now)         (or abort(why) when the step failed for good)
//   take_deliveries()                    → tokens and outcomes to sessions, used tokens to admission
//   credits()                            → admission

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scheduler/batch_scheduler.hpp"
#include "scheduler/engine_credits.hpp"
#include "scheduler/retry_book.hpp"
#include "scheduler/step_time_model.hpp"
#include "tireless/outcome.hpp"

namespace tireless {

struct engine_options {
  scheduler_limits limits;
  int32_t max_waiting = 64;          // requests held in the engine beyond those running
  int32_t step_retries = 3;          // a failed step (shard crash) is re-run this often
  double rate_window_seconds = 2.0;  // moving-average window of the completion rate
  step_cost_prior step_prior;        // the backend's rough step cost, until measured
  // A step should take at most this long (the tightest tier's time per output token), so
  // prefill chunks are sized to fit beside the decodes; 0: only max_step_tokens limits them.
  double step_time_target_seconds = 0;
  // When a request refused past its start bound should come back, and the reservation of that
  // return (a retry token): admission's answer, whose forecast sees its own queue, the higher
  // tiers' arrivals and the returns reserved before. Unset, or no answer: the wait it had beyond
  // its target, without a token.
  std::function<std::optional<retry_promise>(seq_id id, int64_t now_ns)> retry_after_late;
  // Upper bounds of the step-time histogram (engine_stats::step_time_counts), ascending.
  std::vector<double> step_time_buckets_seconds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};
};

// What the engine answers to a stats request.
struct engine_stats {
  int32_t running = 0, waiting = 0;
  int64_t steps = 0, max_mailbox = 0;
  // Why the engine cannot serve at all ("" while it can): its model shard is gone for good.
  std::string backend_problem;
  int64_t late_refusals = 0;  // admitted requests refused unstarted past their start bound
  // The work of every step so far: prompt tokens prefilled, tokens decoded, seconds taken, and
  // how many steps took at most each of engine_options::step_time_buckets_seconds (the last
  // entry: longer than all).
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double step_seconds = 0;
  std::vector<int64_t> step_time_counts;
};

// Something for a request's session (and, when it ended, for admission).
struct engine_delivery {
  seq_id seq = 0;
  std::vector<token_id> tokens;  // generated, in order (when !ended)
  std::vector<token_logprob> logprobs;  // one per token when the request asked for them
  int64_t first_token_ns = -1;   // set with the request's first token
  bool ended = false;            // then `result` is its one outcome
  outcome result;
  int32_t used_tokens = 0;       // ended: prompt and generated tokens, for admission's quotas
};

// Packed steps aim this far below the time target at most: less headroom costs prefill per
// step, so TTFT (at 0.8, h200-k2-fleet's premium fell to 98.9% at 3x; at 0.9 it keeps 99.2%).
// Less when the step model has been wrong lately: the target divided by the 95th percentile of
// actual / predicted step time, never below half of it.
constexpr double step_time_headroom = 0.9;
constexpr double least_step_headroom = 0.5;
constexpr double stretched_step_targets = 3.0;

class engine_core {
 public:
  explicit engine_core(engine_options o);

  // A request admission released; `degradations` go on its outcome. Fails at once when the
  // backend is lost.
  void add(sequence_spec spec, std::vector<std::string> degradations);
  // The session ended it: nothing more is delivered for it. Its used tokens, for admission;
  // nothing when the engine did not hold it.
  std::optional<int32_t> cancel(seq_id id);
  void acknowledge(seq_id id, int32_t tokens);
  // The model shard is gone for good: every request held fails with `why`, and every later one.
  void lose_backend(std::string why);

  // Starts a step: refuses requests past their start bound (deliveries), then the KV request
  // for the step; nothing while a step is out or when there is no work.
  std::optional<kv_request> propose(int64_t now);
  struct granted_step {
    step_batch batch;  // empty: nothing ran (the step is over); spans valid until commit/abort
    std::vector<std::pair<block_id, block_id>> copies;
    std::vector<seq_id> forget;  // the shard may drop these sequences' block tables
    bool propose_again = false;  // nothing ran, but proposing again may place something
    // Nothing ran and proposing now would not change that: propose again at this time (on the
    // requests' clock), when a waiting request reaches its start bound or a stream that
    // yielded comes due, unless an event comes first. None: only an event can change it.
    std::optional<int64_t> wake_at;
  };
  // The KV pool's answer to propose()'s request.
  granted_step granted(const kv_reply& reply, int64_t now);
  // The step ran for `seconds`: measurements, tokens, finished requests.
  void commit(const step_result& result, double seconds, int64_t now);
  // The step failed past its retries: its requests fail with `why`, the step is flushed.
  void abort(const std::string& why);

  std::vector<engine_delivery> take_deliveries() { return std::exchange(deliveries_, {}); }
  bool stepping() const { return stepping_; }
  engine_credits credits() const;
  engine_stats stats() const;
  // This step's time budget: the tightest tier's time per output token, less the headroom.
  step_time_budget budget() const;
  const engine_options& options() const { return o_; }

 private:
  struct request_info {
    std::vector<std::string> degradations;
    int32_t priority = 0, prompt_tokens = 0;
    int32_t expected_cached = 0;  // of the prompt, expected in the prefix cache (sequence_spec)
    int64_t arrival_ns = 0;
    int64_t ttft_target_ms = 0;
    int64_t scheduled_ns = -1;
    int64_t first_token_ns = -1;
  };
  void end(seq_id id, outcome o, int32_t used_tokens);
  void fail(seq_id id, const std::string& why);
  void refuse_late(int64_t now);
  void fail_unplaceable(const kv_reply& reply);
  void deliver(std::vector<scheduler_event> events, int64_t now);
  void started(seq_id id, request_info& info, int64_t now);
  void observe_step(double seconds);

  engine_options o_;
  batch_scheduler core_;
  std::unordered_map<seq_id, request_info> requests_;
  std::vector<engine_delivery> deliveries_;
  bool stepping_ = false;
  bool changed_ = false;  // an event arrived since the current step was proposed
  kv_request proposed_;   // the request of the step out
  step_shape_counts shape_;     // of the batch out
  std::vector<seq_id> batch_;   // its sequences
  int64_t steps_ = 0;
  int64_t prefill_tokens_ = 0, decode_tokens_ = 0;
  double step_seconds_ = 0;
  std::vector<int64_t> step_time_counts_;
  int64_t received_ = 0;
  std::map<int32_t, int64_t> received_by_priority_;
  step_time_model step_model_;
  step_residuals residuals_;  // of step_model_'s predictions
  double residual_p95_ = 1.0, residual_p50_ = 1.0;
  // Of the steps predicted past stretched_step_targets time targets (a step stretched for a
  // prompt's deadline, far out of the budget's steps the fit is mostly measured on: a long
  // prompt's attention grows with its length, which the linear fit does not see): a stretched
  // step keeps its own p95 error under the pause its streams may wait.
  step_residuals stretched_residuals_{64, 8};
  double stretched_p95_ = 1.0;
  // By priority: the share of prompt tokens its requests found in the prefix cache, a moving
  // average over their first tokens (cached_share_weight each).
  std::map<int32_t, double> cached_share_;
  static constexpr double cached_share_weight = 1.0 / 32;
  double finished_per_second_ = 0;
  bool finish_rate_seeded_ = false;
  std::string backend_problem_;
  int64_t late_refusals_ = 0;
};

}  // namespace tireless
