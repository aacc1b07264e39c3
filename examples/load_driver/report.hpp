#pragma once
// What a run measured, per tier and in total, the bars of the overload issue, and the tables
// and the JSON file that carry them.

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runner.hpp"
#include "scenario.hpp"

namespace tireless::load {

// Over the requests that arrived in the run's measurement window.
struct tier_metrics {
  std::string tier;
  double ttft_target_ms = 0, tpot_target_ms = 0;  // 0 for the total
  int64_t offered = 0, completed = 0, degraded = 0, rejected = 0, cancelled = 0, failed = 0, lost = 0;
  int64_t slo_met = 0;
  // Completed with the first token after 2x the TTFT target (or 2x its own prefill on an idle
  // engine, where that is longer: an infeasible request's promise).
  int64_t late = 0;
  int64_t rejected_after_admission = 0;  // refused at least the TTFT target after arrival (not at the door)
  int64_t silently_shortened = 0;  // completed at max_tokens below the asked max_tokens, no degradation said
  std::map<std::string, int64_t> rejected_by_reason;
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0, reject_p50 = 0, reject_p99 = 0;  // ms; NaN: none
  // The longest wait between two tokens of a completion (2+ tokens), p99 and max, ms; NaN: none.
  double pause_p99 = 0, pause_max = 0;
  // Completions with a pause between two tokens longer than the tier allows (stall_after_ms),
  // but for one that was in flight when the scenario injected a stall (an expert-group fault).
  int64_t stalled = 0;
  double slo_attainment = 0;  // slo_met / offered; NaN when nothing was offered
  // Feasible: its prompt could meet the TTFT target on an idle engine (the target's cost
  // model), or it met it anyway; every request where the target has no cost model.
  int64_t feasible = 0, feasible_met = 0;
  double slo_feasible = 0;  // feasible_met / feasible; NaN when none
  // Over the run's windows (a minute each) that hold any: the worst SLO among feasible
  // requests, and the worst late share of completions.
  double worst_window_slo_feasible = 0, worst_window_late = 0;
  // The top tier only (NaN elsewhere): the most requests an ideal engine could have put on time
  // together (ideal.hpp), and the feasible ones that met their SLO as a share of that (at most
  // 1), overall and in the worst window. A count, not a membership: the engine may keep other
  // requests on time than the ideal's choice, as many.
  int64_t ideal = 0;
  double slo_ideal = std::numeric_limits<double>::quiet_NaN(), worst_window_slo_ideal = std::numeric_limits<double>::quiet_NaN();
  double goodput_tps = 0;     // completion tokens per second of the requests that met their SLO
  double completion_tps = 0;  // completion tokens per second of every completed request
  // Clients' retries (scenario::retries) of the requests measured here. hinted: their tries
  // (first tries and retries) refused for load with a retry hint; retried: retries sent, each
  // after its hint with its token; of those, refused again, completed, and within the tier's
  // SLO (counted from the retry); retry_after_end: retries not sent, their hint passing after
  // the run's end. served_on_retry: requests refused first and completed on a
  // retry; their first token p50/p99 counted from the first try (ms; NaN: none).
  int64_t hinted = 0, retried = 0, retry_after_end = 0, retry_refused = 0, retry_completed = 0, retry_on_time = 0, served_on_retry = 0;
  double retry_ttft_p50 = std::numeric_limits<double>::quiet_NaN(), retry_ttft_p99 = std::numeric_limits<double>::quiet_NaN();
};

// One window of the measured part of a run, by arrival time.
struct window_metrics {
  double from_s = 0, to_s = 0;
  struct tier_counts {
    int64_t offered = 0, met = 0, feasible = 0, feasible_met = 0, completed = 0, late = 0, ideal = 0;
    int64_t tokens = 0;  // prompt + max_tokens asked
  };
  std::vector<tier_counts> tiers;  // config order
};

// When a load following `profile` at `multiple` times the capacity drops below the capacity for
// the last time, within [from_s, to_s) (to 1 s); -1 when it never goes over, never drops back in
// that span, or is over the capacity at its end.
double last_drop_s(const rate_profile& profile, double multiple, double from_s, double to_s);

// The longest pause between two tokens a stream of a tier may see: the scheduler lets a
// stream ahead of its pace yield, but never for longer than max_step_stretch of its TPOTs nor
// than its tier's first-token target, whichever is longer (longest_pause_ns), plus one TPOT
// for the step its next token ends. 0 where the tier has no targets.
double stall_after_ms(double ttft_target_ms, double tpot_target_ms);

// Whether a request was in flight (arrival to outcome) when one of the scenario's
// expert-group faults stalled the engine (stall_ms at its at_s): a pause there is the fault's.
// Every request is, where shards crash or slow down at random (--fault).
bool in_injected_stall(const request_record& r, const scenario& s);

struct run_metrics {
  std::vector<tier_metrics> tiers;  // config order, highest priority first
  tier_metrics total;
  int64_t requests = 0, lost = 0, silently_shortened = 0;  // over every request of the run, warm-up too
  double window_s = 60;
  std::vector<window_metrics> windows;
  // A load that drops (arrivals.profile) from above the capacity to below it, for the last time, at drop_s:
  // recovery_s after it, every tier's SLO among feasible requests is >= 99% in each of
  // recovery_windows windows of recovery_step_s in a row (or up to the run's end; NaN: never
  // within the run). drop_s < 0: no drop.
  double drop_s = -1, recovery_s = std::numeric_limits<double>::quiet_NaN();
  static constexpr double recovery_step_s = 10;
  static constexpr int recovery_windows = 3;
  // The top tier's own load in its busiest window, as a share of the capacity in tokens (the
  // capacity's requests/s times the run's mean prompt + max_tokens a request): above 1, its
  // own traffic exceeds the capacity there and its window bar does not apply.
  double top_tier_load = 0;
  // By record (run_result::records): of the top tier, and in what an ideal engine could have
  // put on time (ideal.hpp).
  std::vector<bool> ideal;
};

run_metrics measure(const run_result& run, const scenario& s);

// Whether a request completed within its tier's TTFT and TPOT targets.
bool slo_met(const request_record& r, const tier_metrics& t);
// The share of a tier's measured requests served within its SLO on their first try or on a
// client's retry (a retry counted from when it was sent); NaN without requests.
double on_some_try(const tier_metrics& t);
// Counts by tier of the run's requests arriving in [from, to).
window_metrics count_window(const run_result& run, const run_metrics& m, double from, double to);

struct bar_check {
  std::string name;
  enum class state { pass, fail, skip } result = state::skip;
  std::string detail;
};

// The bars: at 3× capacity with `tireless`, top-tier SLO attainment ≥ 99%, total goodput ≥
// 90% of the goodput at 1×, time-to-reject p99 ≤ 10 ms; at 1×, 2× and 3× with `tireless`, the
// top tier's SLO among feasible requests ≥ 99% in every window (where its own traffic fits
// the capacity; else at least what `priority` gives it), a late share ≤ 1% in every tier and
// window, goodput above every other policy's at the same load, and after a load drop every
// tier back at ≥ 99% within 30 s; and in every run zero lost requests and no silently
// shortened response.
std::vector<bar_check> check_bars(const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics);

std::string run_table(const run_result& run, const run_metrics& m, const scenario& s);
std::string comparison_table(const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics,
                             const scenario& s);
std::string bars_text(const std::vector<bar_check>& bars);

nlohmann::json to_json(const scenario& s, const std::string& target, const capacity_result& capacity,
                       const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics,
                       const std::vector<bar_check>& bars, bool with_requests);

}  // namespace tireless::load
