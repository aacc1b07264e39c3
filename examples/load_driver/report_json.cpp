#include "report.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

// The JSON file of a scenario's runs (results.json): what the tables say, with the windows, the
// samples over time and, when asked, every request.

namespace tireless::load {

namespace {

nlohmann::json metrics_json(const tier_metrics& m) {
  return {{"tier", m.tier},
          {"ttft_target_ms", m.ttft_target_ms},
          {"tpot_target_ms", m.tpot_target_ms},
          {"offered", m.offered},
          {"completed", m.completed},
          {"degraded", m.degraded},
          {"rejected", m.rejected},
          {"rejected_by_reason", m.rejected_by_reason},
          {"cancelled", m.cancelled},
          {"failed", m.failed},
          {"lost", m.lost},
          {"silently_shortened", m.silently_shortened},
          {"slo_met", m.slo_met},
          {"late", m.late},
          {"rejected_after_admission", m.rejected_after_admission},
          {"slo_attainment", m.slo_attainment},
          {"feasible", m.feasible},
          {"feasible_met", m.feasible_met},
          {"slo_attainment_feasible", m.slo_feasible},
          {"worst_window_slo_feasible", m.worst_window_slo_feasible},
          {"ideal", m.ideal},
          {"share_of_ideal", m.slo_ideal},
          {"worst_window_slo_ideal", m.worst_window_slo_ideal},
          {"worst_window_late_share", m.worst_window_late},
          {"goodput_tokens_per_s", m.goodput_tps},
          {"completion_tokens_per_s", m.completion_tps},
          {"ttft_ms", {{"p50", m.ttft_p50}, {"p99", m.ttft_p99}}},
          {"tpot_ms", {{"p50", m.tpot_p50}, {"p99", m.tpot_p99}}},
          {"time_to_reject_ms", {{"p50", m.reject_p50}, {"p99", m.reject_p99}}},
          {"longest_pause_ms", {{"p99", m.pause_p99}, {"max", m.pause_max}}},
          {"stalled", m.stalled},
          {"retries", {{"hinted_refusals", m.hinted}, {"retried", m.retried}, {"hint_past_the_end", m.retry_after_end}, {"refused_again", m.retry_refused},
                       {"completed", m.retry_completed}, {"within_slo", m.retry_on_time},
                       {"served_on_retry", m.served_on_retry},
                       {"slo_on_some_try", on_some_try(m)},
                       {"first_token_after_first_try_ms", {{"p50", m.retry_ttft_p50}, {"p99", m.retry_ttft_p99}}}}}};
}

nlohmann::json samples_json(const run_result& run, const scenario& s) {
  nlohmann::json t = nlohmann::json::array(), queued = nlohmann::json::array(), running = nlohmann::json::array(),
                 waiting = nlohmann::json::array();
  nlohmann::json by_tier = nlohmann::json::object(), in_system = nlohmann::json::object();
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    by_tier[s.tier(i).name] = nlohmann::json::array();
    in_system[s.tier(i).name] = nlohmann::json::array();
  }
  for (const load_sample& x : run.samples) {
    t.push_back(x.t);
    queued.push_back(x.queued);
    running.push_back(x.running);
    waiting.push_back(x.waiting);
    for (int32_t i = 0; i < s.tier_count(); ++i) {
      const auto k = static_cast<size_t>(i);
      by_tier[s.tier(i).name].push_back(x.queued_by_tier.empty() ? -1 : x.queued_by_tier[k]);
      in_system[s.tier(i).name].push_back(x.in_system[k]);
    }
  }
  return {{"t_s", t}, {"queued", queued}, {"running", running}, {"waiting_in_engine", waiting},
          {"queued_by_tier", by_tier},
          {"in_system_by_tier", in_system}};
}

nlohmann::json requests_json(const run_result& run, const scenario& s) {
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const request_record& r) {
    nlohmann::json j = {{"arrival_s", r.plan.arrival_s},
                        {"tier", s.tier(r.plan.tier).name},
                        {"class", r.plan.cls >= 0 ? s.mix[static_cast<size_t>(r.plan.cls)].name : "trace"},
                        {"prompt_tokens_asked", r.plan.prompt_tokens},
                        {"max_tokens", r.plan.max_tokens},
                        {"idle_ttft_ms", r.idle_ttft_s * 1000.0},
                        {"outcome", r.done() ? nlohmann::json(std::string(r.kind == outcome_kind::completed ? "completed"
                                                              : r.kind == outcome_kind::rejected ? "rejected"
                                                              : r.kind == outcome_kind::cancelled ? "cancelled"
                                                                                                   : "failed"))
                                             : nlohmann::json("lost")}};
    if (r.done()) {
      j["reason"] = r.reason;
      if (!r.message.empty()) j["message"] = r.message;
      j["outcome_after_ms"] = (r.outcome_s - r.submitted_s) * 1000.0;
      j["prompt_tokens"] = r.prompt_tokens;
      j["completion_tokens"] = r.completion_tokens;
      j["ttft_ms"] = r.ttft_ms;
      j["total_ms"] = r.total_ms;
      j["longest_pause_ms"] = r.longest_pause_ms;
      if (!r.degradations.empty()) j["degradations"] = r.degradations;
      if (r.retry_after_ms >= 0) j["retry_after_ms"] = r.retry_after_ms;
    }
    if (r.first_try >= 0) {  // a client's retry: which request (its index here) and which retry
      j["retry_of"] = r.first_try;
      j["attempt"] = r.attempt;
    }
    out.push_back(std::move(j));
  };
  for (const request_record& r : run.records) add(r);
  for (const request_record& r : run.retries) {
    if (r.submitted_s >= 0) add(r);  // not the retries whose hint passed after the run's end
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const scenario& s, const std::string& target, const capacity_result& capacity,
                       const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics,
                       const std::vector<bar_check>& bars, bool with_requests) {
  nlohmann::json tiers = nlohmann::json::array();
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    tiers.push_back({{"name", s.tier(i).name}, {"priority", s.tier(i).priority}, {"ttft_ms", s.tier(i).ttft.count()},
                     {"tpot_ms", s.tier(i).tpot.count()}});
  }
  nlohmann::json j = {{"scenario", {{"name", s.name}, {"file", s.file.string()}, {"description", s.description},
                                    {"config", s.config_path.string()}, {"target", target},
                                    {"quotas", s.lift_quotas ? "lifted" : "config"}, {"duration_s", s.duration_s},
                                    {"warmup_s", s.warmup_s}, {"seed", s.seed}, {"tiers", tiers}}},
                      {"capacity", {{"requests_per_s", capacity.rps}, {"completion_tokens_per_s", capacity.completion_tps},
                                    {"prompt_tokens_per_s", capacity.prompt_tps}, {"completed", capacity.completed},
                                    {"other_outcomes", capacity.other_outcomes}, {"concurrency", capacity.concurrency},
                                    {"window_s", capacity.window_s}, {"warmup_s", capacity.warmup_s},
                                    {"given", capacity.given}, {"method", capacity.method}}}};
  nlohmann::json out_runs = nlohmann::json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const run_result& r = runs[i];
    nlohmann::json per_tier = nlohmann::json::array();
    for (const tier_metrics& t : metrics[i].tiers) per_tier.push_back(metrics_json(t));
    nlohmann::json run = {{"label", r.label}, {"policy", to_string(r.policy)}, {"multiple", r.multiple},
                          {"offered_requests_per_s", r.rate_rps}, {"measure_from_s", r.measure_from_s},
                          {"measure_to_s", r.measure_to_s}, {"end_s", r.end_s}, {"wall_s", r.wall_s},
                          {"requests", metrics[i].requests}, {"lost", metrics[i].lost},
                          {"silently_shortened", metrics[i].silently_shortened},
                          {"target_broken", r.target_broken}, {"tiers", per_tier},
                          {"total", metrics_json(metrics[i].total)}, {"samples", samples_json(r, s)}};
    nlohmann::json windows = nlohmann::json::array();
    for (const window_metrics& w : metrics[i].windows) {
      nlohmann::json per = nlohmann::json::object();
      for (size_t k = 0; k < w.tiers.size(); ++k) {
        const auto& c = w.tiers[k];
        per[s.tier(static_cast<int32_t>(k)).name] = {{"offered", c.offered}, {"slo_met", c.met}, {"feasible", c.feasible},
                                                     {"feasible_met", c.feasible_met}, {"completed", c.completed},
                                                     {"late", c.late}};
      }
      windows.push_back({{"from_s", w.from_s}, {"to_s", w.to_s}, {"tiers", per}});
    }
    run["windows"] = std::move(windows);
    run["load_drop_s"] = metrics[i].drop_s < 0 ? nlohmann::json(nullptr) : nlohmann::json(metrics[i].drop_s);
    run["recovery_s"] = metrics[i].recovery_s;
    run["top_tier_load"] = metrics[i].top_tier_load;
    if (r.fleet) {
      nlohmann::json points = nlohmann::json::array();
      for (const fleet_point& p : r.fleet->points) points.push_back({{"t_s", p.t}, {"serving", p.serving}, {"starting", p.starting}});
      run["fleet"] = {{"initial", r.fleet->initial}, {"autoscaled", r.fleet->autoscaled},
                      {"replica_seconds", r.fleet->replica_seconds}, {"points", points}};
    }
    if (with_requests) run["request_samples"] = requests_json(r, s);
    out_runs.push_back(std::move(run));
  }
  j["runs"] = std::move(out_runs);
  nlohmann::json out_bars = nlohmann::json::array();
  for (const bar_check& b : bars) {
    out_bars.push_back({{"name", b.name},
                        {"result", b.result == bar_check::state::pass ? "pass" : b.result == bar_check::state::fail ? "fail" : "skip"},
                        {"detail", b.detail}});
  }
  j["bars"] = std::move(out_bars);
  return j;
}

}  // namespace tireless::load
