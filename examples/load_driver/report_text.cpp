// The report as text: a run's tables, a virtual fleet's minutes, the comparison matrix and
// the bars (the numbers come from report.cpp's measure and check_bars).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "report.hpp"
#include "report_format.hpp"

namespace tireless::load {

namespace {

std::string short_reason(const std::string& r) {
  if (r == "overloaded") return "ovl";
  if (r == "quota_exceeded") return "quota";
  if (r == "prompt_too_long") return "long";
  return r;
}

std::string reasons(const tier_metrics& m) {
  std::string out;
  for (const auto& [r, n] : m.rejected_by_reason) out += fmt::format("{}{} {}", out.empty() ? "" : ", ", short_reason(r), n);
  return out.empty() ? "" : "(" + out + ")";
}

std::string tier_row(const tier_metrics& m) {
  return fmt::format("  {:<10} {:>8} {:>9} {:>8} {:>8} {:<22} {:>5} {:>5} {:>5} {:>7} {:>7} {:>6} {:>6} {:>7} {:>9} {:>7} {:>7}\n",
                     m.tier, m.offered, m.completed, m.degraded, m.rejected, reasons(m), m.cancelled, m.failed,
                     m.lost, num(m.ttft_p50), num(m.ttft_p99), num(m.tpot_p50), num(m.tpot_p99),
                     pct(m.slo_attainment), num(m.goodput_tps, "{:.1f}"), num(m.reject_p50, "{:.1f}"),
                     num(m.reject_p99, "{:.1f}"));
}

// A virtual fleet's replicas and what they cost; autoscaled: minute by minute, the offered load
// (times the starting fleet's capacity), the replicas serving and starting at the minute's
// end, and each tier's SLO among feasible requests arriving in it.
std::string fleet_text(const run_result& run, const run_metrics& m) {
  if (!run.fleet) return {};
  const fleet_report& f = *run.fleet;
  const double hours = f.replica_seconds / 3600.0;
  std::string out = fmt::format("  fleet: {} replicas at the start{}; {:.2f} replica-hours paid over the run's {:.0f} s "
                                "({:.1f} replicas on average)\n",
                                f.initial, f.autoscaled ? ", autoscaled" : "", hours, run.end_s,
                                run.end_s > 0 ? f.replica_seconds / run.end_s : 0.0);
  if (!f.autoscaled || m.windows.empty()) return out;
  const double capacity = run.multiple > 0 ? run.rate_rps / run.multiple : 0;
  std::string head = fmt::format("    {:>11} {:>6} {:>8} {:>8}", "arrivals", "load", "serving", "starting");
  for (const tier_metrics& t : m.tiers) head += fmt::format(" {:>9}", t.tier);
  out += head + "   (load: offered / the starting fleet's capacity; SLO among feasible)\n";
  for (const window_metrics& w : m.windows) {
    int64_t offered = 0;
    for (const auto& c : w.tiers) offered += c.offered;
    fleet_point at{};
    for (const fleet_point& p : f.points) {
      if (p.t <= w.to_s + 1e-9) at = p;
    }
    std::string row = fmt::format("    {:>4.0f}-{:<4.0f}s {:>5.2f}x {:>8} {:>8}", w.from_s, w.to_s,
                                  capacity > 0 ? offered / (w.to_s - w.from_s) / capacity : 0.0, at.serving, at.starting);
    for (const auto& c : w.tiers) row += fmt::format(" {:>9}", pct(ratio(c.feasible_met, c.feasible)));
    out += row + "\n";
  }
  return out;
}

}  // namespace

std::string run_table(const run_result& run, const run_metrics& m, const scenario& s) {
  std::string out = fmt::format(
      "{} at {:g}x capacity: {:.3g} requests/s offered, {:g} s measured after {:g} s warm-up; {} requests, {} lost, "
      "{:.1f} s here\n",
      to_string(run.policy), run.multiple, run.rate_rps, run.measure_to_s - run.measure_from_s, run.measure_from_s,
      m.requests, m.lost, run.wall_s);
  out += fmt::format("  {:<10} {:>8} {:>9} {:>8} {:>8} {:<22} {:>5} {:>5} {:>5} {:>15} {:>13} {:>7} {:>9} {:>15}\n", "tier",
                     "offered", "completed", "degraded", "rejected", "(by reason)", "canc", "fail", "lost",
                     "TTFT p50/p99 ms", "TPOT p50/p99", "SLO", "goodput", "reject p50/p99");
  for (const tier_metrics& t : m.tiers) out += tier_row(t);
  out += tier_row(m.total);
  std::string targets;
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    targets += fmt::format("{}{} {}/{} ms", i ? ", " : "", s.tier(i).name, s.tier(i).ttft.count(), s.tier(i).tpot.count());
  }
  out += fmt::format("  (SLO: TTFT/TPOT targets {}; goodput: tokens/s of SLO-meeting completions; reject: submit to "
                     "outcome, ms)\n",
                     targets);
  std::string late;
  for (const tier_metrics& t : m.tiers) {
    late += fmt::format("{}{} {} ({} refused after admission)", late.empty() ? "" : ", ", t.tier,
                        t.completed > 0 ? pct(static_cast<double>(t.late) / t.completed) : std::string("-"),
                        t.rejected_after_admission);
  }
  out += fmt::format("  late (first token after 2x the target, or 2x its own idle prefill if longer; of completions): {}\n",
                     late);
  std::string feasible, worst;
  for (const tier_metrics& t : m.tiers) {
    feasible += fmt::format("{}{} {} ({} of {})", feasible.empty() ? "" : ", ", t.tier, pct(t.slo_feasible), t.feasible_met,
                            t.feasible);
    worst += fmt::format("{}{} {} / {}", worst.empty() ? "" : ", ", t.tier, pct(t.worst_window_slo_feasible),
                         pct(t.worst_window_late));
  }
  out += fmt::format("  SLO among feasible requests (could meet the TTFT target on an idle engine): {}\n", feasible);
  const tier_metrics& top = m.tiers.front();
  if (top.ideal > 0) {
    out += fmt::format("  {}: {} on time of the at most {} an ideal engine could have put on time with the tier's own "
                       "others (the tier alone, prefill only): {}, worst window {}\n",
                       top.tier, top.feasible_met, top.ideal, pct(top.slo_ideal), pct(top.worst_window_slo_ideal));
  }
  std::string pauses;
  for (const tier_metrics& t : m.tiers) {
    pauses += fmt::format("{}{} {} / {} ms ({} past {} ms)", pauses.empty() ? "" : ", ", t.tier, num(t.pause_p99),
                          num(t.pause_max), t.stalled, num(stall_after_ms(t.ttft_target_ms, t.tpot_target_ms)));
  }
  out += fmt::format("  longest pause between two tokens of a completion, p99 / max (completions paused past what the tier "
                     "allows): {}\n",
                     pauses);
  if (s.retries > 0) {
    std::string retries;
    for (const tier_metrics& t : m.tiers) {
      retries += fmt::format("{}{} {} of {} refusals retried ({} hints past the run's end), {} refused again, {} "
                             "completed ({} within the SLO); {} served on a retry, first token p50/p99 {} / {} ms after "
                             "the first try; {} of the tier's requests within the SLO on some try ({} on the first)",
                             retries.empty() ? "" : "; ", t.tier, t.retried, t.hinted, t.retry_after_end, t.retry_refused,
                             t.retry_completed, t.retry_on_time, t.served_on_retry, num(t.retry_ttft_p50),
                             num(t.retry_ttft_p99), pct(on_some_try(t)), pct(t.slo_attainment));
    }
    out += fmt::format("  clients retry a refusal for load after its hint, with its token, up to {} times: {}\n", s.retries,
                       retries);
  }
  // Fair shares inside a tier: each tenant key's SLO and refusals.
  std::map<std::pair<int32_t, std::string>, std::array<int64_t, 3>> by_tenant;  // offered, met, rejected
  for (const request_record& r : run.records) {
    if (r.plan.arrival_s < run.measure_from_s || r.plan.arrival_s >= run.measure_to_s) continue;
    auto& c = by_tenant[{r.plan.tier, r.plan.tenant_key ? *r.plan.tenant_key : std::string("-")}];
    ++c[0];
    c[1] += slo_met(r, m.tiers[static_cast<size_t>(r.plan.tier)]);
    c[2] += r.done() && r.kind == outcome_kind::rejected;
  }
  std::string tenants;
  for (const auto& [key, c] : by_tenant) {
    tenants += fmt::format("{}{} {} SLO {} ({} refused of {})", tenants.empty() ? "" : ", ", s.tier(key.first).name, key.second,
                           pct(ratio(c[1], c[0])), c[2], c[0]);
  }
  out += fmt::format("  by tenant: {}\n", tenants);
  out += fmt::format("  worst {:g}-s window of {}: SLO among feasible / late share: {}\n", m.window_s, m.windows.size(), worst);
  out += fleet_text(run, m);
  // The expert group's faults: each tier before the first and during each, by arrival time.
  const auto span_text = [&](double from, double to) {
    const window_metrics w = count_window(run, m, std::max(from, run.measure_from_s), std::min(to, run.measure_to_s));
    std::string text;
    for (size_t k = 0; k < w.tiers.size(); ++k) {
      const auto& c = w.tiers[k];
      text += fmt::format("{}{} {} / {}", text.empty() ? "" : ", ", m.tiers[k].tier, pct(ratio(c.feasible_met, c.feasible)),
                          c.completed > 0 ? pct(ratio(c.late, c.completed)) : std::string("-"));
    }
    return text;
  };
  for (size_t i = 0; i < s.expert_group.size(); ++i) {
    const auto& e = s.expert_group[i];
    const double end = e.for_s > 0 ? e.at_s + e.for_s : run.measure_to_s;
    if (i == 0 && e.at_s > run.measure_from_s) {
      out += fmt::format("  before the expert group's faults ({:.0f}-{:.0f} s): SLO among feasible / late share: {}\n",
                         run.measure_from_s, e.at_s, span_text(run.measure_from_s, e.at_s));
    }
    if (e.at_s >= run.measure_to_s) {
      out += fmt::format("  expert group fault {} at {:.0f} s: after the measured run\n", i, e.at_s);
      continue;
    }
    out += fmt::format("  expert group fault {} ({} device(s) down, imbalance {:g}, stall {:g} ms; {:.0f}-{:.0f} s): {}\n", i,
                       e.down, e.imbalance, e.stall_ms, e.at_s, std::min(end, run.measure_to_s), span_text(e.at_s, end));
  }
  if (m.drop_s >= 0) {
    out += std::isnan(m.recovery_s)
               ? fmt::format("  recovery: the load drops below the capacity at {:.0f} s; the tiers are not all at >= 99% "
                             "for {:g} s in a row before the end\n",
                             m.drop_s, run_metrics::recovery_windows * run_metrics::recovery_step_s)
               : fmt::format("  recovery: the load drops below the capacity at {:.0f} s; every tier is back at >= 99% "
                             "(feasible, {} {:g}-s windows in a row) {:.0f} s later\n",
                             m.drop_s, run_metrics::recovery_windows, run_metrics::recovery_step_s, m.recovery_s);
  }
  return out;
}

std::string comparison_table(const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics,
                             const scenario& s) {
  std::string head = fmt::format("  {:>5} {:<9} {:>9} {:>7} {:>7} {:>7} {:>5}", "load", "policy", "offered/s", "compl",
                                 "degr", "rej", "lost");
  for (int32_t i = 0; i < s.tier_count(); ++i) head += fmt::format(" {:>9}", "SLO " + s.tier(i).name.substr(0, 5));
  head += fmt::format(" {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8}\n", "SLO all", "goodput",
                      "TTFT99 " + s.tier(0).name.substr(0, 3), "reject p99", "feas " + s.tier(0).name.substr(0, 4),
                      "worst min", "late max", "recovery");
  std::string out = "comparison (measured windows; goodput in completion tokens/s; times in ms)\n" + head;
  for (size_t i = 0; i < runs.size(); ++i) {
    const tier_metrics& t = metrics[i].total;
    auto share = [&](int64_t n) { return t.offered > 0 ? pct(static_cast<double>(n) / t.offered) : std::string("-"); };
    out += fmt::format("  {:>4g}x {:<9} {:>9.3g} {:>7} {:>7} {:>7} {:>5}", runs[i].multiple, to_string(runs[i].policy),
                       runs[i].rate_rps, share(t.completed), share(t.degraded), share(t.rejected), metrics[i].lost);
    for (const tier_metrics& m : metrics[i].tiers) out += fmt::format(" {:>9}", pct(m.slo_attainment));
    const run_metrics& rm = metrics[i];
    double late_max = 0;
    for (const tier_metrics& m : rm.tiers) late_max = std::max(late_max, std::isnan(m.worst_window_late) ? 0.0 : m.worst_window_late);
    out += fmt::format(" {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8}\n", pct(t.slo_attainment),
                       num(t.goodput_tps, "{:.1f}"), num(rm.tiers.front().ttft_p99), num(t.reject_p99, "{:.1f}"),
                       pct(rm.tiers.front().slo_feasible), pct(rm.tiers.front().worst_window_slo_feasible), pct(late_max),
                       rm.drop_s < 0 ? std::string("-") : std::isnan(rm.recovery_s) ? std::string("never")
                                                                                      : fmt::format("{:.0f} s", rm.recovery_s));
  }
  return out;
}

std::string bars_text(const std::vector<bar_check>& bars) {
  std::string out = "bars\n";
  for (const bar_check& b : bars) {
    const char* word = b.result == bar_check::state::pass ? "PASS" : b.result == bar_check::state::fail ? "FAIL" : "SKIP";
    out += fmt::format("  {}  {}: {}\n", word, b.name, b.detail);
  }
  return out;
}

}  // namespace tireless::load
