// tireless-plan: how many replicas a peak needs, found by simulating the fleet (the real
// engine, policy and actors on the sim backend's virtual clock, N replicas behind the router).
//
//   tireless-plan --scenario examples/load_driver/scenarios/h200-k2-fleet.toml
//       --peak-users 100000 --requests-per-user-hour 5 --peak-share 0.2 --price-per-hour 3.5
//   tireless-plan ... --sweep 12:24 --out out/plan     (attainment and cost per replica count, PNG)
//
// The peak rate is the capacity sketch's (peak users x requests a user an hour x the peak
// hour's share / 3600). A replica count is enough when, at that rate under the tireless
// policy, every tier meets its SLO on at least --slo of its feasible requests with at most
// --late of its completions late, and the top tier still does at twice the rate (headroom).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <chrono>
#include <map>

#include "report.hpp"
#include "runner.hpp"
#include "scenario.hpp"
#include "target.hpp"

namespace fs = std::filesystem;
using namespace tireless;
using namespace tireless::load;

namespace {

struct plan_options {
  std::string scenario_path, out_dir;
  double peak_users = 0, requests_per_user_hour = 0, peak_share = 0.2;
  double price_per_hour = 0;
  double slo = 0.99, slo_lower = 0.95, late = 0.01, max_refused = 0.01;
  double duration = 600, warmup = 120;
  int32_t max_replicas = 256;
  std::string sweep;
};

// One replica count, simulated at the peak and at twice the peak.
struct evaluation {
  int32_t replicas = 0;
  run_metrics peak, double_peak;
  double utilization = 0;  // prompt + completion tokens served at the peak over the fleet's capacity in tokens
  double refused = 0;      // feasible requests refused for load, of those offered at the peak
  bool enough = false;
  bool doubled = false;  // simulated at twice the peak (only where the peak itself was met)
  std::string why;  // the first tier that missed, and how
};

std::string pct(double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.1f}%", 100 * v); }

// Feasible requests (their prompt could meet their tier's first-token target on an idle
// replica) refused for load, of the requests offered in the measured window: what more
// replicas would have served. A prompt too long for its tier's target is refused with a hint
// to split (or served after the feasible ones) however many replicas there are; a tenant's
// quota is a business rule: neither counts.
double refused_feasible_share(const run_result& r, const scenario& s) {
  int64_t offered = 0, refused = 0;
  for (const request_record& q : r.records) {
    if (q.plan.arrival_s < r.measure_from_s || q.plan.arrival_s >= r.measure_to_s) continue;
    ++offered;
    const double target_s = std::chrono::duration<double>(s.tier(q.plan.tier).ttft).count();
    const bool feasible = std::isnan(q.idle_ttft_s) || q.idle_ttft_s <= target_s;
    refused += feasible && q.done() && q.kind == outcome_kind::rejected && q.reason == reason::overloaded;
  }
  return offered > 0 ? static_cast<double>(refused) / offered : 0.0;
}

bool tiers_meet(const run_metrics& m, const plan_options& o, bool top_only, std::string& why) {
  for (size_t k = 0; k < m.tiers.size() && (!top_only || k == 0); ++k) {
    const tier_metrics& t = m.tiers[k];
    const double late = t.completed > 0 ? static_cast<double>(t.late) / t.completed : 0.0;
    const double target = k == 0 ? o.slo : o.slo_lower;
    if (t.feasible > 0 && t.slo_feasible < target) {
      why = fmt::format("{} {} of feasible requests on time (< {})", t.tier, pct(t.slo_feasible), pct(target));
      return false;
    }
    if (late > o.late) {
      why = fmt::format("{} {} of completions late (> {})", t.tier, pct(late), pct(o.late));
      return false;
    }
  }
  return true;
}

class planner {
 public:
  planner(scenario s, plan_options o, double peak_rps, const capacity_result& one)
      : s_(std::move(s)), o_(std::move(o)), peak_rps_(peak_rps), one_(one) {
    s_.policies = {admission_policy::tireless};
    // Tenants' quotas are business rules sized for one replica's share, not capacity: lifted.
    s_.lift_quotas = true;
    s_.duration_s = o_.duration;
    s_.warmup_s = o_.warmup;
    target_ = make_virtual_target(s_);
  }

  const evaluation& at(int32_t n) {
    auto it = done_.find(n);
    if (it != done_.end()) return it->second;
    evaluation e;
    e.replicas = n;
    s_.replicas = n;
    const auto quiet = [](double, const std::string&) {};
    const run_result peak = run_open_loop(*target_, s_, admission_policy::tireless, 1.0, peak_rps_, quiet);
    if (peak.records.empty()) throw std::runtime_error("the simulation of " + std::to_string(n) + " replicas sent nothing");
    e.peak = measure(peak, s_);
    const double tokens_per_s = (e.peak.total.completion_tps + served_prompt_tps(peak));
    e.utilization = tokens_per_s / (n * (one_.completion_tps + one_.prompt_tps));
    e.enough = tiers_meet(e.peak, o_, false, e.why);
    e.refused = refused_feasible_share(peak, s_);
    if (e.enough && e.refused > o_.max_refused) {
      e.enough = false;
      e.why = fmt::format("{} of requests refused for load though they could meet their target (> {})", pct(e.refused),
                          pct(o_.max_refused));
    }
    if (e.enough) {
      const run_result twice = run_open_loop(*target_, s_, admission_policy::tireless, 2.0, peak_rps_, quiet);
      e.double_peak = measure(twice, s_);
      e.doubled = true;
      std::string why;
      if (!tiers_meet(e.double_peak, o_, true, why)) {
        e.enough = false;
        e.why = "at 2x the peak: " + why;
      }
    }
    std::fprintf(stderr, "  %d replicas: %s%s\n", n, e.enough ? "enough" : "not enough: ", e.enough ? "" : e.why.c_str());
    return done_.emplace(n, std::move(e)).first->second;
  }

  // The smallest count that is enough, searching from `start` (enough at the result, not at one fewer).
  int32_t smallest(int32_t start) {
    int32_t n = std::clamp(start, 1, o_.max_replicas);
    if (at(n).enough) {
      while (n > 1 && at(n - 1).enough) --n;
      return n;
    }
    // Not enough: double until it is, then narrow down.
    int32_t lo = n, hi = n;
    while (!at(hi).enough) {
      lo = hi;
      if (hi >= o_.max_replicas) return -1;
      hi = std::min(o_.max_replicas, hi * 2);
    }
    while (hi - lo > 1) {
      const int32_t mid = lo + (hi - lo) / 2;
      (at(mid).enough ? hi : lo) = mid;
    }
    return hi;
  }

  const scenario& s() const { return s_; }

 private:
  double served_prompt_tps(const run_result& r) const {
    double tokens = 0;
    for (const request_record& q : r.records) {
      if (q.plan.arrival_s >= r.measure_from_s && q.plan.arrival_s < r.measure_to_s && q.kind == outcome_kind::completed) {
        tokens += q.prompt_tokens;
      }
    }
    return tokens / std::max(1e-9, r.measure_to_s - r.measure_from_s);
  }

  scenario s_;
  plan_options o_;
  double peak_rps_;
  capacity_result one_;
  std::unique_ptr<target> target_;
  std::map<int32_t, evaluation> done_;
};

std::string row(const evaluation& e, const plan_options& o, double peak_rps) {
  std::string tiers;
  for (const tier_metrics& t : e.peak.tiers) {
    const double late = t.completed > 0 ? static_cast<double>(t.late) / t.completed : 0.0;
    tiers += fmt::format(" {:>8} {:>6}", pct(t.slo_feasible), pct(late));
  }
  const double day = e.replicas * o.price_per_hour * 24;
  const double per_1000 = o.price_per_hour * e.replicas / (peak_rps * 3600) * 1000;
  const double refused = e.refused;
  return fmt::format("  {:>8} {:>6} {:>7} {} {:>9} {:>10.0f} {:>11.0f} {:>11.3f}  {}\n", e.replicas, pct(e.utilization), pct(refused), tiers,
                     e.doubled ? pct(e.double_peak.tiers.front().slo_feasible) : std::string("-"), day, day * 30, per_1000,
                     e.enough ? "enough" : e.why);
}

std::string header(const scenario& s) {
  std::string tiers;
  for (int32_t i = 0; i < s.tier_count(); ++i) tiers += fmt::format(" {:>8} {:>6}", s.tier(i).name.substr(0, 8), "late");
  return fmt::format("  {:>8} {:>6} {:>7} {} {:>9} {:>10} {:>11} {:>11}\n", "replicas", "util", "overload", tiers,
                     s.tier(0).name.substr(0, 5) + " 2x", "$/day", "$/month", "$/1k req");
}

void write_sweep_plot(const fs::path& dir, const std::vector<const evaluation*>& rows, const scenario& s,
                      const plan_options& o) {
  fs::create_directories(dir);
  std::ofstream dat(dir / "sweep.dat");
  dat << "# replicas";
  for (int32_t i = 0; i < s.tier_count(); ++i) dat << " slo_" << s.tier(i).name;
  dat << " dollars_per_day slo_" << s.tier(0).name << "_2x\n";
  for (const evaluation* e : rows) {
    dat << e->replicas;
    for (const tier_metrics& t : e->peak.tiers) dat << ' ' << (std::isnan(t.slo_feasible) ? 0.0 : 100 * t.slo_feasible);
    dat << ' ' << e->replicas * o.price_per_hour * 24 << ' ';
    if (e->doubled) {
      dat << 100 * e->double_peak.tiers.front().slo_feasible << '\n';
    } else {
      dat << "NaN\n";  // not simulated: the peak itself was missed
    }
  }
  dat.close();
  std::ofstream gp(dir / "sweep.gp");
  gp << "set terminal pngcairo size 900,500\nset output '" << (dir / "sweep.png").string() << "'\n"
     << "set title 'SLO attainment (feasible requests) and cost against replicas, at the peak'\n"
     << "set xlabel 'replicas'\nset ylabel 'SLO attainment, %'\nset y2label 'dollars a day'\n"
     << "set ytics nomirror\nset y2tics\nset key bottom right\nset grid\n"
     << "plot ";
  for (int32_t i = 0; i < s.tier_count(); ++i) {
    gp << "'" << (dir / "sweep.dat").string() << "' using 1:" << i + 2 << " with linespoints title '" << s.tier(i).name
       << "', ";
  }
  gp << "'" << (dir / "sweep.dat").string() << "' using 1:" << s.tier_count() + 3 << " with linespoints dashtype 3 title '"
     << s.tier(0).name << " at 2x the peak', ";
  gp << "'" << (dir / "sweep.dat").string() << "' using 1:" << s.tier_count() + 2
     << " axes x1y2 with lines dashtype 2 title 'cost ($/day)'\n";
  gp.close();
  const std::string cmd = fmt::format("gnuplot '{}' 2>'{}.err'", (dir / "sweep.gp").string(), (dir / "sweep.gp").string());
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0 || std::system(cmd.c_str()) != 0) {
    std::printf("sweep: data and script in %s (no PNG: gnuplot missing or failed)\n", dir.string().c_str());
  } else {
    std::printf("sweep: %s\n", (dir / "sweep.png").string().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"How many replicas a peak needs: the smallest fleet that keeps every tier's SLO at the peak, found by "
               "simulating it (the real engine and policy on the sim backend, replicas behind the router)."};
  plan_options o;
  app.add_option("--scenario", o.scenario_path, "a virtual load-driver scenario: the traffic mix, tiers and device profile")
      ->required()->check(CLI::ExistingFile);
  app.add_option("--peak-users", o.peak_users, "users at the peak")->required()->check(CLI::PositiveNumber);
  app.add_option("--requests-per-user-hour", o.requests_per_user_hour, "requests a user sends an hour")
      ->required()->check(CLI::PositiveNumber);
  app.add_option("--peak-share", o.peak_share, "the peak hour's share of the traffic")->check(CLI::Range(1e-6, 1.0))->capture_default_str();
  app.add_option("--price-per-hour", o.price_per_hour, "a replica's price an hour (its devices)")->check(CLI::NonNegativeNumber);
  app.add_option("--slo", o.slo, "the share of the top tier's feasible requests that must meet its TTFT/TPOT targets")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--slo-lower", o.slo_lower, "the same for every lower tier")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--max-refused", o.max_refused,
                 "the most of the peak's requests that may be refused for load though their prompt could meet their tier's "
                 "target (a prompt too long for it is refused with a hint to split, or served last, at any fleet size)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--late", o.late, "the most a tier's completions may be late (first token after 2x its target)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--duration", o.duration, "virtual seconds measured per simulation")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup, "virtual seconds of warm-up per simulation")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-replicas", o.max_replicas, "give up above this many")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--sweep", o.sweep, "FROM:TO: simulate every replica count in the range and plot attainment and cost");
  app.add_option("--out", o.out_dir, "where the sweep's data and PNG go (default out/plan)");
  CLI11_PARSE(app, argc, argv);

  try {
    scenario s = load_scenario(o.scenario_path);
    if (s.target != target_kind::virtual_sim) throw std::runtime_error("tireless-plan simulates: the scenario's target must be virtual");
    if (s.mix.empty()) throw std::runtime_error("tireless-plan needs a scenario with a [[mix]] (not a trace)");
    const double peak_rps = o.peak_users * o.requests_per_user_hour * o.peak_share / 3600.0;
    s.replicas = 1;
    auto one_target = make_virtual_target(s);
    const capacity_result one = measure_capacity(*one_target, s, [](double, const std::string&) {});
    double mean_prompt = 0, mean_output = 0;
    for (const request_class& c : s.mix) {
      mean_prompt += c.share * (c.prompt.mean() + c.system_prompt_tokens);
      mean_output += c.share * c.output.mean();
    }
    // The articles' estimate: Little's law on the average, no queueing, no tiers, no SLO.
    const int32_t naive = static_cast<int32_t>(std::ceil(peak_rps / one.rps));
    std::printf("tireless-plan: %s\n", s.name.c_str());
    std::printf("peak: %.0f users x %.2f requests a user an hour x %.0f%% in the peak hour = %.2f requests/s\n", o.peak_users,
                o.requests_per_user_hour, 100 * o.peak_share, peak_rps);
    std::printf("one replica (%s): %.3f requests/s at full load (%.0f completion + %.0f prompt tokens/s), mix mean %.0f "
                "prompt + %.0f output tokens\n",
                s.config.backend.sim_profile.c_str(), one.rps, one.completion_tps, one.prompt_tps, mean_prompt, mean_output);
    std::printf("naive estimate: ceil(%.2f / %.3f) = %d replicas\n\n", peak_rps, one.rps, naive);
    std::fprintf(stderr, "simulating %.0f + %.0f virtual seconds per replica count:\n", o.warmup, o.duration);

    planner p(s, o, peak_rps, one);
    std::vector<const evaluation*> rows;
    int32_t answer = -1;
    if (!o.sweep.empty()) {
      const auto colon = o.sweep.find(':');
      if (colon == std::string::npos) throw std::runtime_error("--sweep FROM:TO, e.g. 10:30");
      const int32_t from = std::stoi(o.sweep.substr(0, colon)), to = std::stoi(o.sweep.substr(colon + 1));
      if (from < 1 || to < from) throw std::runtime_error("--sweep FROM:TO with 1 <= FROM <= TO");
      for (int32_t n = from; n <= to; ++n) rows.push_back(&p.at(n));
      for (const evaluation* e : rows) {
        if (e->enough && (e->replicas == 1 || !p.at(e->replicas - 1).enough)) {
          answer = e->replicas;
          break;
        }
      }
    } else {
      answer = p.smallest(naive);
      if (answer > 1) rows.push_back(&p.at(answer - 1));
      if (answer > 0) rows.push_back(&p.at(answer));
    }
    std::printf("at the peak (tireless policy; SLO among feasible requests, late share of completions):\n%s",
                header(p.s()).c_str());
    for (const evaluation* e : rows) std::printf("%s", row(*e, o, peak_rps).c_str());
    if (answer < 0) {
      std::printf("\nno replica count up to %d keeps every tier's SLO at the peak\n", o.max_replicas);
      return 1;
    }
    const evaluation& a = p.at(answer);
    std::printf("\nanswer: %d replicas: at the peak %s >= %s and every other tier >= %s of feasible requests on time, "
                "at most %s late, at most %s refused for load; %s >= %s at twice the peak; %s\n",
                answer, p.s().tier(0).name.c_str(), pct(o.slo).c_str(), pct(o.slo_lower).c_str(), pct(o.late).c_str(),
                pct(o.max_refused).c_str(),
                p.s().tier(0).name.c_str(), pct(o.slo).c_str(),
                answer > 1 ? fmt::format("{} replicas miss ({})", answer - 1, p.at(answer - 1).why).c_str() : "one is the least there is");
    std::printf("cost: $%.0f a day, $%.0f a month, $%.3f per 1,000 requests at the peak (at $%.2f a replica an hour)\n",
                answer * o.price_per_hour * 24, answer * o.price_per_hour * 24 * 30,
                o.price_per_hour * answer / (peak_rps * 3600) * 1000, o.price_per_hour);
    const double refused = a.refused;
    std::string reasons;
    for (const auto& [why, n] : a.peak.total.rejected_by_reason) {
      reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", why, pct(static_cast<double>(n) / a.peak.total.offered));
    }
    std::printf("refused at the peak at the answer: %s of requests (%s); feasible requests refused for load: %s\n",
                pct(static_cast<double>(a.peak.total.rejected) / std::max<int64_t>(1, a.peak.total.offered)).c_str(),
                reasons.empty() ? "none" : reasons.c_str(), pct(refused).c_str());
    if (answer < naive) {
      std::printf("naive estimate %d vs %d: the naive count divides the peak by one replica's throughput at full load under "
                  "fcfs, every request served however late, the long documents included. At %d replicas tireless serves "
                  "%.2f requests/s a replica: the prompts too long for their tier's first-token target are refused with a "
                  "hint to split (prompt_too_long above) or served after the feasible ones, and the rest keep their SLO.\n",
                  naive, answer, answer, peak_rps / answer);
    } else if (answer > naive) {
      std::printf("naive estimate %d vs %d: the average hides the queueing: at %d replicas %s.\n", naive, answer, naive,
                  p.at(naive).why.c_str());
    } else {
      std::printf("naive estimate %d vs %d: the same here; %s of requests refused early at the peak.\n", naive, answer,
                  pct(refused).c_str());
    }
    std::printf("utilization at the answer: %s of the fleet's token capacity\n", pct(a.utilization).c_str());
    if (!o.sweep.empty()) write_sweep_plot(o.out_dir.empty() ? fs::path("out/plan") : fs::path(o.out_dir), rows, p.s(), o);
  } catch (const scenario_error& e) {
    for (const auto& problem : e.problems()) std::cerr << problem << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tireless-plan: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
