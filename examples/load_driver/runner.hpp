#pragma once
// Runs the scenario against a target: the closed-loop capacity measurement and one open-loop
// run per (load multiple, policy), recording every request's outcome and the load over time.

#include <functional>
#include <string>
#include <vector>

#include "scenario.hpp"
#include "target.hpp"
#include "tireless/runtime.hpp"
#include "workload.hpp"

namespace tireless::load {

struct request_record {
  planned_request plan;
  double submitted_s = -1;  // the target's clock
  double outcome_s = -1;    // -1: no outcome (lost)
  outcome_kind kind = outcome_kind::failed;
  std::string reason;
  std::string message;  // why, for an outcome other than completed
  int64_t retry_after_ms = -1;  // rejected: the target's retry hint; -1: none
  std::vector<std::string> degradations;
  int32_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0, preemptions = 0;
  double ttft_ms = -1, total_ms = 0;
  double longest_pause_ms = 0;  // between two of its tokens (outcome::longest_pause_ms)
  double idle_ttft_s = 0;  // its first token on an idle engine (target::idle_first_token_s); NaN: not known
  // That prefill less its steps' fixed cost and what an ideal prefix cache holds (an earlier
  // request's system prompt; target::idle_prefill_work_s); NaN: not known.
  double idle_work_s = 0;
  // A client's retry (run_result::retries): its request's first try in run_result::records and
  // which retry it is (1, 2, ...); -1 and 0 for a first try.
  int64_t first_try = -1;
  int32_t attempt = 0;

  bool done() const { return outcome_s >= 0; }
};

// A refusal its client sends again once the hint has passed (tireless_client's
// RETRYABLE_REJECTIONS): for load or a quota, with a retry hint.
bool retryable(const request_record& r);

struct load_sample {
  double t = 0;
  int32_t queued = -1, running = -1, waiting = -1;  // the target's own counts (target_probe); -1: not reported
  std::vector<int32_t> queued_by_tier;  // by config tier; empty: not reported
  std::vector<int32_t> in_system;       // by tier: submitted, no outcome yet (the driver's count)
};

struct run_result {
  std::string label;
  admission_policy policy = admission_policy::tireless;
  double multiple = 1, rate_rps = 0;
  double measure_from_s = 0, measure_to_s = 0;  // requests arriving in [from, to) are measured
  std::vector<request_record> records;  // the planned requests' first tries, in arrival order
  // The clients' retries (scenario::retries), in the order they were sent: each after the
  // retry_after of its request's previous refusal for load, with that refusal's retry token.
  std::vector<request_record> retries;
  std::vector<load_sample> samples;
  double end_s = 0;   // the target's clock when the run ended
  double wall_s = 0;  // how long it took here
  std::string target_broken;  // why the target went away before the run ended; "" if it did not
  int64_t shard_restarts = -1;  // in the run, as the target counts them; -1: not reported
  std::optional<fleet_report> fleet;  // a virtual fleet's replicas over the run
  std::vector<std::pair<double, double>> stalls;  // the target's (target::stalls)
};

struct capacity_result {
  double rps = 0;            // completed requests per second in the window
  double completion_tps = 0, prompt_tps = 0;  // tokens per second in the window
  int64_t completed = 0, other_outcomes = 0;  // in the window
  int32_t concurrency = 0;
  double window_s = 0, warmup_s = 0, wall_s = 0;
  bool given = false;        // taken from the scenario, not measured
  std::string method;        // how it was measured, in words
};

// Progress of the current step: fraction done in [0, 1] and a short status.
using progress_fn = std::function<void(double fraction, const std::string& status)>;

// Closed loop: `concurrency` requests from the mix in flight at all times (each outcome is
// replaced at once), policy fcfs, tenant quotas lifted, for warm-up + calibration; capacity is
// the completed requests per second after the warm-up.
capacity_result measure_capacity(target& t, const scenario& s, const progress_fn& progress);

// Open loop at multiple × capacity requests per second over warm-up + duration, then a bounded
// wait (scenario.drain_seconds()) for every outcome; a request without one is lost. A request
// refused for load with a retry hint is sent again after it, with its token, up to
// scenario.retries times (as tireless_client and examples/cpp_client.cpp retry).
run_result run_open_loop(target& t, const scenario& s, admission_policy policy, double multiple,
                         double capacity_rps, const progress_fn& progress);

}  // namespace tireless::load
