#pragma once
// What a run measured, per tier and in total, the bars of the overload issue, and the tables
// and the JSON file that carry them.

#include <cstdint>
#include <filesystem>
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
  int64_t late = 0;                      // completed with the first token after 2x the TTFT target
  int64_t rejected_after_admission = 0;  // refused at least the TTFT target after arrival (not at the door)
  int64_t silently_shortened = 0;  // completed at max_tokens below the asked max_tokens, no degradation said
  std::map<std::string, int64_t> rejected_by_reason;
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0, reject_p50 = 0, reject_p99 = 0;  // ms; NaN: none
  double slo_attainment = 0;  // slo_met / offered; NaN when nothing was offered
  double goodput_tps = 0;     // completion tokens per second of the requests that met their SLO
  double completion_tps = 0;  // completion tokens per second of every completed request
};

struct run_metrics {
  std::vector<tier_metrics> tiers;  // config order, highest priority first
  tier_metrics total;
  int64_t requests = 0, lost = 0, silently_shortened = 0;  // over every request of the run, warm-up too
};

run_metrics measure(const run_result& run, const scenario& s);

struct bar_check {
  std::string name;
  enum class state { pass, fail, skip } result = state::skip;
  std::string detail;
};

// The bars: at 3× capacity with `tireless`, top-tier SLO attainment ≥ 99%, total
// goodput ≥ 90% of the goodput at 1×, time-to-reject p99 ≤ 10 ms; and in every run zero lost
// requests and no silently shortened response.
std::vector<bar_check> check_bars(const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics);

std::string run_table(const run_result& run, const run_metrics& m, const scenario& s);
std::string comparison_table(const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics,
                             const scenario& s);
std::string bars_text(const std::vector<bar_check>& bars);

nlohmann::json to_json(const scenario& s, const std::string& target, const capacity_result& capacity,
                       const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics,
                       const std::vector<bar_check>& bars, bool with_requests);

}  // namespace tireless::load
