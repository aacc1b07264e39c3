#include "report.hpp"

#include "ideal.hpp"
#include "report_format.hpp"
#include "scheduler/batch_scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tireless::load {

namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// Nearest rank; NaN for no values.
double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return nan;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  const size_t i = std::min(v.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

double ms(std::chrono::milliseconds d) { return static_cast<double>(d.count()); }

double tpot_ms(const request_record& r) {
  if (r.completion_tokens < 2 || r.ttft_ms < 0) return nan;
  return (r.total_ms - r.ttft_ms) / (r.completion_tokens - 1);
}

bool silently_shortened(const request_record& r) {
  return r.done() && r.kind == outcome_kind::completed && r.reason == "max_tokens" &&
         r.completion_tokens < r.plan.max_tokens && r.degradations.empty();
}

// Its first token after twice the later of its tier's target and its own prefill on an idle
// engine (what an infeasible request's degradation line promises).
bool late(const request_record& r, double ttft_target_ms) {
  const double idle_ms = std::isnan(r.idle_ttft_s) ? 0.0 : r.idle_ttft_s * 1000.0;
  return ttft_target_ms > 0 && r.ttft_ms > 2 * std::max(ttft_target_ms, idle_ms);
}

struct samples {
  std::vector<double> ttft, tpot, reject, pause;
};

void add(tier_metrics& m, samples& x, const request_record& r) {
  ++m.offered;
  if (!r.done()) {
    ++m.lost;
    return;
  }
  if (!r.degradations.empty()) ++m.degraded;
  m.silently_shortened += silently_shortened(r);
  switch (r.kind) {
    case outcome_kind::completed: {
      ++m.completed;
      m.late += late(r, m.ttft_target_ms);
      m.completion_tps += r.completion_tokens;
      const double tpot = tpot_ms(r);
      if (r.ttft_ms >= 0) x.ttft.push_back(r.ttft_ms);
      if (!std::isnan(tpot)) x.tpot.push_back(tpot);
      if (r.completion_tokens >= 2) x.pause.push_back(r.longest_pause_ms);
      break;
    }
    case outcome_kind::rejected:
      ++m.rejected;
      ++m.rejected_by_reason[r.reason];
      x.reject.push_back((r.outcome_s - r.submitted_s) * 1000.0);
      m.rejected_after_admission += m.ttft_target_ms > 0 && x.reject.back() >= m.ttft_target_ms;
      break;
    case outcome_kind::cancelled: ++m.cancelled; break;
    case outcome_kind::failed: ++m.failed; break;
  }
}

}  // namespace

bool slo_met(const request_record& r, const tier_metrics& t) {
  const double tpot = tpot_ms(r);
  return r.done() && r.kind == outcome_kind::completed && r.ttft_ms >= 0 && r.ttft_ms <= t.ttft_target_ms &&
         (std::isnan(tpot) || tpot <= t.tpot_target_ms);
}

double on_some_try(const tier_metrics& t) {
  // A request is retried until a try completes: at most one of its tries met the SLO.
  return t.offered > 0 ? static_cast<double>(t.slo_met + t.retry_on_time) / static_cast<double>(t.offered)
                       : std::numeric_limits<double>::quiet_NaN();
}

namespace {

bool feasible(const request_record& r, const tier_metrics& t) {
  return std::isnan(r.idle_ttft_s) || r.idle_ttft_s * 1000.0 <= t.ttft_target_ms ||
         (r.done() && r.kind == outcome_kind::completed && r.ttft_ms >= 0 && r.ttft_ms <= t.ttft_target_ms);
}

}  // namespace

double stall_after_ms(double ttft_target_ms, double tpot_target_ms) {
  if (ttft_target_ms <= 0 && tpot_target_ms <= 0) return 0;
  return std::max(max_step_stretch * tpot_target_ms, ttft_target_ms) + tpot_target_ms;
}

bool in_injected_stall(const request_record& r, const scenario& s) {
  const fault_settings& f = s.config.faults;
  if (f.shard_crash_per_step > 0 || f.shard_crash_every_steps > 0 || f.shard_slow_per_step > 0) return true;  // any time
  const double end = r.done() ? r.plan.arrival_s + (r.outcome_s - r.submitted_s) : r.plan.arrival_s;
  return std::any_of(s.expert_group.begin(), s.expert_group.end(), [&](const auto& e) {
    return e.stall_ms > 0 && r.plan.arrival_s <= e.at_s + e.stall_ms / 1000.0 && end >= e.at_s;
  });
}

namespace {

// For each record: whether it is of the top tier and an ideal engine could have put it on time
// with the tier's other requests (ideal.hpp).
std::vector<bool> ideal_top_tier(const run_result& run, const run_metrics& m) {
  std::vector<ideal_request> top;
  std::vector<size_t> at;
  for (size_t i = 0; i < run.records.size(); ++i) {
    const request_record& r = run.records[i];
    if (r.plan.tier != 0) continue;
    // Only what the report counts as feasible (its idle prefill, step costs and all, fits).
    const bool can = std::isnan(r.idle_ttft_s) || r.idle_ttft_s * 1000.0 <= m.tiers.front().ttft_target_ms;
    top.push_back({r.plan.arrival_s, can ? r.idle_work_s : std::numeric_limits<double>::infinity()});
    at.push_back(i);
  }
  const std::vector<bool> on_time = ideal_on_time(top, m.tiers.front().ttft_target_ms / 1000.0, run.stalls);
  std::vector<bool> out(run.records.size(), false);
  for (size_t k = 0; k < at.size(); ++k) out[at[k]] = on_time[k];
  return out;
}

}  // namespace

window_metrics count_window(const run_result& run, const run_metrics& m, double from, double to) {
  window_metrics w;
  w.from_s = from;
  w.to_s = to;
  w.tiers.resize(m.tiers.size());
  for (size_t i = 0; i < run.records.size(); ++i) {
    const request_record& r = run.records[i];
    if (r.plan.arrival_s < from || r.plan.arrival_s >= to) continue;
    const tier_metrics& t = m.tiers[static_cast<size_t>(r.plan.tier)];
    window_metrics::tier_counts& c = w.tiers[static_cast<size_t>(r.plan.tier)];
    const bool met = slo_met(r, t), can = feasible(r, t);
    if (i < m.ideal.size() && m.ideal[i]) ++c.ideal;
    ++c.offered;
    c.tokens += r.plan.prompt_tokens + r.plan.max_tokens;
    c.met += met;
    c.feasible += can;
    c.feasible_met += can && met;
    if (r.done() && r.kind == outcome_kind::completed) {
      ++c.completed;
      c.late += late(r, t.ttft_target_ms);
    }
  }
  return w;
}

namespace {

void measure_windows(const run_result& run, run_metrics& m) {
  const double span = run.measure_to_s - run.measure_from_s;
  m.window_s = std::min(60.0, span);
  const auto n = static_cast<size_t>(std::max(1.0, std::round(span / m.window_s)));
  for (size_t i = 0; i < n; ++i) {
    const double from = run.measure_from_s + static_cast<double>(i) * m.window_s;
    m.windows.push_back(count_window(run, m, from, i + 1 == n ? run.measure_to_s : from + m.window_s));
  }
  for (size_t k = 0; k < m.tiers.size(); ++k) {
    double worst_slo = nan, worst_late = nan, worst_ideal = nan;
    for (const window_metrics& w : m.windows) {
      const auto& c = w.tiers[k];
      if (c.feasible > 0) worst_slo = std::isnan(worst_slo) ? ratio(c.feasible_met, c.feasible) : std::min(worst_slo, ratio(c.feasible_met, c.feasible));
      if (c.completed > 0) worst_late = std::isnan(worst_late) ? ratio(c.late, c.completed) : std::max(worst_late, ratio(c.late, c.completed));
      if (k == 0 && c.ideal > 0) {
        const double share = std::min(1.0, ratio(c.feasible_met, c.ideal));
        worst_ideal = std::isnan(worst_ideal) ? share : std::min(worst_ideal, share);
      }
    }
    m.tiers[k].worst_window_slo_feasible = worst_slo;
    m.tiers[k].worst_window_late = worst_late;
    if (k == 0) m.tiers[k].worst_window_slo_ideal = worst_ideal;
  }
}

}  // namespace

double last_drop_s(const rate_profile& profile, double multiple, double from_s, double to_s) {
  if (profile.points.empty() || multiple * profile.peak() <= 1.0) return -1;  // never over the capacity
  double peak_at = 0, peak = -1;
  for (const auto& [t, f] : profile.points) {
    if (f > peak) {
      peak = f;
      peak_at = t;
    }
  }
  // The last drop: a load that swings over and under the capacity recovers after its last swing
  // (measured from the first, the next swing reads as a recovery that never came).
  double drop = -1;
  bool over = true;  // at the peak
  for (double t = peak_at; t < to_s; t += 1.0) {
    const bool now_over = multiple * profile.at(t) >= 1.0;
    if (over && !now_over) drop = t;
    over = now_over;
  }
  return over || drop < from_s ? -1 : drop;  // over the capacity to the end, or no drop inside [from_s, to_s)
}

namespace {

// After the load drops below the capacity (for the last time, last_drop_s): the first moment
// from which recovery_windows windows of recovery_step_s in a row have every tier at >= 99%
// among feasible requests (back, and staying back; a single miss minutes later, a burst of the
// quiet load's own, is not the spike's). Not at the capacity itself: a load of exactly the capacity keeps a queue on the
// edge, where a mix's lower tiers are below 99% however long it lasts; there is nothing to
// recover to.
void measure_recovery(const run_result& run, const scenario& s, run_metrics& m) {
  const double drop = last_drop_s(s.profile, run.multiple, run.measure_from_s, run.measure_to_s);
  if (drop < 0) return;
  m.drop_s = drop;
  double back_since = drop;
  int good = 0;
  for (double from = drop; from + 1e-9 < run.measure_to_s; from += run_metrics::recovery_step_s) {
    const double to = std::min(from + run_metrics::recovery_step_s, run.measure_to_s);
    const window_metrics w = count_window(run, m, from, to);
    bool ok = true;
    for (const auto& c : w.tiers) ok &= c.feasible == 0 || ratio(c.feasible_met, c.feasible) >= 0.99;
    if (!ok) {
      good = 0;
      back_since = to;
    } else if (++good == run_metrics::recovery_windows || to >= run.measure_to_s - 1e-9) {
      m.recovery_s = back_since - drop;
      return;
    }
  }
}

// The clients' retries of the measured requests, by the tier of each: every retry is also a
// request of the run (lost when it has no outcome).
void measure_retries(const run_result& run, run_metrics& m) {
  std::vector<std::vector<double>> waits(m.tiers.size());
  auto measured = [&](const request_record& r) {
    return r.plan.arrival_s >= run.measure_from_s && r.plan.arrival_s < run.measure_to_s;
  };
  for (const request_record& r : run.records) {
    if (measured(r)) m.tiers[static_cast<size_t>(r.plan.tier)].hinted += retryable(r);
  }
  // The last try of each request that was retried.
  std::map<int64_t, const request_record*> last;
  for (const request_record& r : run.retries) {
    const request_record& first = run.records.at(static_cast<size_t>(r.first_try));
    tier_metrics& t = m.tiers[static_cast<size_t>(r.plan.tier)];
    if (r.submitted_s < 0) {  // its hint passed after the run's end: its client was still waiting
      t.retry_after_end += measured(first);
      continue;
    }
    ++m.requests;
    m.lost += !r.done();
    if (!measured(first)) continue;
    ++t.retried;
    t.hinted += retryable(r);
    t.retry_refused += r.done() && r.kind == outcome_kind::rejected;
    t.retry_completed += r.done() && r.kind == outcome_kind::completed;
    t.retry_on_time += slo_met(r, t);
    const request_record*& l = last[r.first_try];
    if (!l || r.attempt > l->attempt) l = &r;
  }
  for (const auto& [first, r] : last) {
    if (!r->done() || r->kind != outcome_kind::completed || r->ttft_ms < 0) continue;
    const size_t k = static_cast<size_t>(r->plan.tier);
    ++m.tiers[k].served_on_retry;
    waits[k].push_back((r->submitted_s - run.records[static_cast<size_t>(first)].submitted_s) * 1000.0 + r->ttft_ms);
  }
  for (size_t k = 0; k < m.tiers.size(); ++k) {
    m.tiers[k].retry_ttft_p50 = percentile(waits[k], 50);
    m.tiers[k].retry_ttft_p99 = percentile(waits[k], 99);
    for (auto f : {&tier_metrics::hinted, &tier_metrics::retried, &tier_metrics::retry_after_end, &tier_metrics::retry_refused,
                   &tier_metrics::retry_completed, &tier_metrics::retry_on_time, &tier_metrics::served_on_retry}) {
      m.total.*f += m.tiers[k].*f;
    }
  }
}

void finish(tier_metrics& m, samples& x, double window_s) {
  m.slo_feasible = ratio(m.feasible_met, m.feasible);
  m.ttft_p50 = percentile(x.ttft, 50);
  m.ttft_p99 = percentile(x.ttft, 99);
  m.tpot_p50 = percentile(x.tpot, 50);
  m.tpot_p99 = percentile(x.tpot, 99);
  m.reject_p50 = percentile(x.reject, 50);
  m.reject_p99 = percentile(x.reject, 99);
  m.pause_p99 = percentile(x.pause, 99);
  m.pause_max = percentile(x.pause, 100);
  m.slo_attainment = m.offered > 0 ? static_cast<double>(m.slo_met) / m.offered : nan;
  m.goodput_tps /= window_s;
  m.completion_tps /= window_s;
}

const run_result* find_run(const std::vector<run_result>& runs, admission_policy p, double multiple, size_t* index) {
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].policy == p && std::abs(runs[i].multiple - multiple) < 1e-9) {
      *index = i;
      return &runs[i];
    }
  }
  return nullptr;
}

}  // namespace

run_metrics measure(const run_result& run, const scenario& s) {
  run_metrics m;
  std::vector<samples> x(static_cast<size_t>(s.tier_count()));
  samples all;
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    tier_metrics t;
    t.tier = s.tier(i).name;
    t.ttft_target_ms = ms(s.tier(i).ttft);
    t.tpot_target_ms = ms(s.tier(i).tpot);
    m.tiers.push_back(t);
  }
  m.total.tier = "total";
  auto target_of = [&](const request_record& r) -> tier_metrics& { return m.tiers[static_cast<size_t>(r.plan.tier)]; };
  m.ideal = ideal_top_tier(run, m);
  for (size_t i = 0; i < run.records.size(); ++i) {
    const request_record& r = run.records[i];
    ++m.requests;
    m.lost += !r.done();
    m.silently_shortened += silently_shortened(r);
    if (r.plan.arrival_s < run.measure_from_s || r.plan.arrival_s >= run.measure_to_s) continue;
    const auto k = static_cast<size_t>(r.plan.tier);
    tier_metrics& t = m.tiers[k];
    add(t, x[k], r);
    // The total's late and after-admission counts go by each request's own tier.
    m.total.ttft_target_ms = target_of(r).ttft_target_ms;
    add(m.total, all, r);
    m.total.ttft_target_ms = 0;
    const double allowed = stall_after_ms(t.ttft_target_ms, t.tpot_target_ms);
    if (r.done() && r.kind == outcome_kind::completed && allowed > 0 && r.longest_pause_ms > allowed &&
        !in_injected_stall(r, s)) {
      ++t.stalled;
      ++m.total.stalled;
    }
    const bool met = slo_met(r, t);
    const bool can = feasible(r, t);
    if (met) {
      ++t.slo_met;
      ++m.total.slo_met;
      t.goodput_tps += r.completion_tokens;
      m.total.goodput_tps += r.completion_tokens;
    }
    t.feasible += can;
    m.total.feasible += can;
    t.feasible_met += can && met;
    m.total.feasible_met += can && met;
    t.ideal += m.ideal[i];
  }
  measure_retries(run, m);
  m.tiers.front().slo_ideal = std::min(1.0, ratio(m.tiers.front().feasible_met, m.tiers.front().ideal));
  const double window = run.measure_to_s - run.measure_from_s;
  for (size_t k = 0; k < m.tiers.size(); ++k) finish(m.tiers[k], x[k], window);
  finish(m.total, all, window);
  measure_windows(run, m);
  measure_recovery(run, s, m);
  int64_t tokens = 0, requests = 0;
  for (const window_metrics& w : m.windows) {
    for (const auto& c : w.tiers) {
      tokens += c.tokens;
      requests += c.offered;
    }
  }
  const double capacity_tokens_per_s = requests > 0 ? run.rate_rps / run.multiple * static_cast<double>(tokens) / requests : 0;
  for (const window_metrics& w : m.windows) {
    const double top = static_cast<double>(w.tiers.front().tokens) / std::max(w.to_s - w.from_s, 1e-9);
    if (capacity_tokens_per_s > 0) m.top_tier_load = std::max(m.top_tier_load, top / capacity_tokens_per_s);
  }
  return m;
}

std::vector<bar_check> check_bars(const std::vector<run_result>& runs, const std::vector<run_metrics>& metrics) {
  using st = bar_check::state;
  std::vector<bar_check> bars;
  size_t i3 = 0, i1 = 0;
  const run_result* at3 = find_run(runs, admission_policy::tireless, 3, &i3);
  const run_result* at1 = find_run(runs, admission_policy::tireless, 1, &i1);
  const char* needs3 = "needs the run of tireless at 3x capacity";

  bar_check top{"top tier SLO attainment >= 99% at 3x capacity (tireless)", st::skip, ""};
  if (at3) {
    const tier_metrics& t = metrics[i3].tiers.front();
    top.result = t.slo_attainment >= 0.99 ? st::pass : st::fail;
    top.detail = fmt::format("{}: {} ({} of {})", t.tier, pct(t.slo_attainment), t.slo_met, t.offered);
  } else {
    top.detail = needs3;
  }
  bars.push_back(top);

  bar_check good{"total goodput at 3x >= 90% of the goodput at 1x (tireless)", st::skip, ""};
  if (at3 && at1) {
    const double g3 = metrics[i3].total.goodput_tps, g1 = metrics[i1].total.goodput_tps;
    good.result = g1 > 0 && g3 >= 0.9 * g1 ? st::pass : st::fail;
    good.detail = fmt::format("{:.1f} vs {:.1f} tokens/s ({})", g3, g1, g1 > 0 ? pct(g3 / g1) : "-");
  } else {
    good.detail = "needs the runs of tireless at 1x and 3x capacity";
  }
  bars.push_back(good);

  bar_check reject{"time-to-reject p99 <= 10 ms at 3x capacity (tireless)", st::skip, ""};
  if (at3) {
    const tier_metrics& t = metrics[i3].total;
    reject.result = t.rejected == 0 || t.reject_p99 <= 10.0 ? st::pass : st::fail;
    reject.detail = t.rejected == 0 ? "no rejections" : fmt::format("p99 {:.2f} ms over {} rejections", t.reject_p99, t.rejected);
  } else {
    reject.detail = needs3;
  }
  bars.push_back(reject);

  // At 1x, 2x and 3x (those that ran): one bar each for the top tier's windows, late shares,
  // goodput against the other policies, and recovery after a load drop.
  bar_check windows{"top tier SLO among feasible >= 99% in every window at 1-3x (tireless; where its own traffic "
                    "exceeds the capacity: at least priority's SLO)", st::skip, ""};
  bar_check late{"late share <= 1% in every tier and window at 1-3x (tireless)", st::skip, ""};
  bar_check beats{"goodput above every other policy's at 1-3x, or equal where they serve the same (tireless)", st::skip, ""};
  bar_check recovery{"every tier back at >= 99% within 30 s of a load drop at 1-3x (tireless)", st::skip, ""};
  auto record = [](bar_check& b, bool ok, const std::string& detail) {
    if (b.result != st::fail) b.result = ok ? st::pass : st::fail;
    b.detail += (b.detail.empty() ? "" : "; ") + detail;
  };
  for (double mult : {1.0, 2.0, 3.0}) {
    size_t it = 0;
    if (!find_run(runs, admission_policy::tireless, mult, &it)) continue;
    const run_metrics& m = metrics[it];
    const tier_metrics& top = m.tiers.front();
    size_t ip = 0;
    const run_result* prio = find_run(runs, admission_policy::priority, mult, &ip);
    if (m.top_tier_load <= 1.0) {
      record(windows, top.worst_window_slo_feasible >= 0.99 || std::isnan(top.worst_window_slo_feasible),
             fmt::format("{:g}x worst {} ({} overall; of the most an ideal engine could have put on time: worst {})", mult,
                         pct(top.worst_window_slo_feasible), pct(top.slo_feasible), pct(top.worst_window_slo_ideal)));
    } else if (prio) {
      const double theirs = metrics[ip].tiers.front().slo_attainment;
      record(windows, top.slo_attainment >= theirs,
             fmt::format("{:g}x {} alone is {:.1f}x the capacity: {} vs priority's {}", mult, top.tier, m.top_tier_load,
                         pct(top.slo_attainment), pct(theirs)));
    }
    double worst_late = 0;
    std::string worst_tier = "-";
    for (const tier_metrics& t : m.tiers) {
      if (!std::isnan(t.worst_window_late) && t.worst_window_late >= worst_late) {
        worst_late = t.worst_window_late;
        worst_tier = t.tier;
      }
    }
    record(late, worst_late <= 0.01, fmt::format("{:g}x worst {} ({})", mult, pct(worst_late), worst_tier));
    double best_other = -1;
    std::string best_name;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].policy == admission_policy::tireless || std::abs(runs[i].multiple - mult) > 1e-9) continue;
      if (metrics[i].total.goodput_tps > best_other) {
        best_other = metrics[i].total.goodput_tps;
        best_name = std::string(to_string(runs[i].policy));
      }
    }
    if (best_other >= 0) {
      // Equal to a tenth of a token per second: both met the SLO for the same requests (a
      // light load that an SLO-aware peer serves as well).
      const bool equal = std::abs(m.total.goodput_tps - best_other) < 0.1;
      record(beats, m.total.goodput_tps > best_other || equal,
             fmt::format("{:g}x {:.1f} vs {} {:.1f}{}", mult, m.total.goodput_tps, best_name, best_other,
                         equal ? " (equal)" : ""));
    }
    if (m.drop_s >= 0) {
      record(recovery, m.recovery_s <= 30.0,
             fmt::format("{:g}x {}", mult, std::isnan(m.recovery_s) ? std::string("not within the run")
                                                                     : fmt::format("{:.0f} s", m.recovery_s)));
    }
  }
  for (bar_check* b : {&windows, &late, &beats, &recovery}) {
    if (b->detail.empty()) b->detail = "needs tireless runs at 1x, 2x or 3x (and other policies, a load drop)";
    bars.push_back(*b);
  }

  int64_t lost = 0, shortened = 0, stalled = 0, completed = 0, requests = 0;
  std::string where_lost, where_short, where_stalled;
  for (size_t i = 0; i < runs.size(); ++i) {
    requests += metrics[i].requests;
    lost += metrics[i].lost;
    shortened += metrics[i].silently_shortened;
    const bool ours = runs[i].policy == admission_policy::tireless;  // the others promise no pace
    stalled += ours ? metrics[i].total.stalled : 0;
    completed += ours ? metrics[i].total.completed : 0;
    if (metrics[i].lost) where_lost += fmt::format(" {} {};", runs[i].label, metrics[i].lost);
    if (metrics[i].silently_shortened) where_short += fmt::format(" {} {};", runs[i].label, metrics[i].silently_shortened);
    if (ours && metrics[i].total.stalled) where_stalled += fmt::format(" {} {};", runs[i].label, metrics[i].total.stalled);
  }
  bars.push_back({"zero lost requests (every run)", lost == 0 ? st::pass : st::fail,
                  fmt::format("{} lost of {} requests{}", lost, requests, where_lost.empty() ? "" : ":" + where_lost)});
  bars.push_back({"every degraded response says so (every run)", shortened == 0 ? st::pass : st::fail,
                  fmt::format("{} silently shortened{}", shortened, where_short.empty() ? "" : ":" + where_short)});
  bars.push_back({"no stream paused longer than its tier allows (tireless runs; max(3 TPOTs, TTFT target) + 1 TPOT, "
                  "an injected stall excused)",
                  stalled == 0 ? st::pass : st::fail,
                  fmt::format("{} of {} completions of tireless runs{}", stalled, completed,
                              where_stalled.empty() ? "" : ":" + where_stalled)});
  // A retry hint is a promise: back then, with its token, the client is served within its
  // tier's SLO. Over tireless runs whose clients retry (scenario::retries).
  int64_t retried = 0, on_time = 0;
  double worst_wait = nan;
  std::string where_hints;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].policy != admission_policy::tireless || metrics[i].total.retried == 0) continue;
    const tier_metrics& t = metrics[i].total;
    retried += t.retried;
    on_time += t.retry_on_time;
    for (const tier_metrics& k : metrics[i].tiers) {
      if (!std::isnan(k.retry_ttft_p99)) worst_wait = std::isnan(worst_wait) ? k.retry_ttft_p99 : std::max(worst_wait, k.retry_ttft_p99);
    }
    where_hints += fmt::format(" {} {} of {};", runs[i].label, t.retry_on_time, t.retried);
  }
  bars.push_back({"retry hints hold: >= 99% of the retries sent after their hint, with their token, served within "
                  "their tier's SLO (tireless runs whose clients retry)",
                  retried == 0 ? st::skip : (on_time >= 0.99 * static_cast<double>(retried) ? st::pass : st::fail),
                  retried == 0 ? std::string("needs clients that retry (clients.retries, --retries)")
                               : fmt::format("{} of {} ({}); first token after the first try, worst tier's p99 {:.1f} s:{}",
                                             on_time, retried, pct(ratio(on_time, retried)), worst_wait / 1000.0,
                                             where_hints)});
  if (runs.empty()) {
    for (auto& b : bars) b.result = st::skip;
  }
  return bars;
}

}  // namespace tireless::load
