// tireless-load: drives a target (the virtual-time sim, or tireless-serve) with a scenario's
// mix at multiples of its measured capacity, once per admission policy, and reports per tier
// what users got: completions, degradations, rejections, latency, SLO attainment, goodput.
//
//   tireless-load examples/load_driver/scenarios/h200-k2-fleet.toml
//   tireless-load examples/load_driver/scenarios/cpu-smollm2.toml --multiples 3 --policies tireless --duration 30
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "plots.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "scenario.hpp"
#include "target.hpp"
#include "workload.hpp"

namespace {

using namespace tireless;
using namespace tireless::load;

// A bar on stderr while a step runs (only on a terminal); one line per finished step.
class progress_display {
 public:
  progress_display() : tty_(isatty(2) != 0) {}

  void start(std::string name) {
    name_ = std::move(name);
    last_ = {};
  }
  void update(double fraction, const std::string& status) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const int width = 30, filled = static_cast<int>(fraction * width + 0.5);
    std::fprintf(stderr, "\r[%s%s] %3.0f%% %s: %s\x1b[K", std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), 100 * fraction, name_.c_str(),
                 status.c_str());
    std::fflush(stderr);
  }
  void finish(const std::string& line) {
    std::fprintf(stderr, "%s%s\n", tty_ ? "\r\x1b[K" : "", line.c_str());
    std::fflush(stderr);
  }

 private:
  bool tty_;
  std::string name_;
  std::chrono::steady_clock::time_point last_;
};

std::filesystem::path default_serve() {
  // build/examples/load_driver/tireless-load → build/tools/tireless-serve
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path("tireless-serve") : (self.parent_path() / "../../tools/tireless-serve").lexically_normal();
}

std::string describe_mix(const scenario& s) {
  std::string out;
  const auto [prompt, output] = mean_lengths(s);
  if (!s.trace.empty()) {
    return fmt::format("trace {} ({} requests; mean {:.0f} prompt, {:.0f} output tokens)\n", s.trace_path.string(),
                       s.trace.size(), prompt, output);
  }
  for (const request_class& c : s.mix) {
    out += fmt::format("  {:<16} {:>5.1f}%  tier {:<9} prompt ~{:.0f} tokens, output ~{:.0f} tokens\n", c.name, 100 * c.share,
                       s.tier(c.tier).name, c.system_prompt_tokens + c.prompt.mean(), c.output.mean());
  }
  return out + fmt::format("  mean ~{:.0f} prompt and ~{:.0f} output tokens a request\n", prompt, output);
}

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) out += (i ? " " : "") + std::string(argv[i]);
  return out;
}


// What one scenario's runs gave.
struct scenario_outcome {
  std::string name;
  std::vector<run_result> runs;
  std::vector<run_metrics> metrics;
  std::vector<bar_check> bars;
  bool ran = false;  // false: it stopped before its runs (the error is printed)
};

struct options {
  std::string out_dir, serve;
  std::vector<double> multiples;
  std::vector<std::string> policies, faults;
  double duration = 0, warmup = -1, capacity = 0, calibration = 0;
  int32_t replicas = 0, retries = -1;
  std::string autoscale;  // "off": the scenario's [target.autoscale] is not used
  bool json_out = false, with_requests = false, short_form = false;
};

// The short form of a scenario (the suite's CI run): its run and its load profile compressed
// into at most 600 virtual seconds, its calibration into at most 120 after 30 of warm-up.
void shorten(scenario& s) {
  const double scale = std::min(1.0, 600.0 / (s.warmup_s + s.duration_s));
  s.warmup_s *= scale;
  s.duration_s *= scale;
  for (auto& [t, f] : s.profile.points) t *= scale;
  for (request_class& c : s.mix) {
    c.burst_every_s *= scale;
    c.burst_for_s *= scale;
  }
  for (auto& e : s.expert_group) {
    e.at_s *= scale;
    e.for_s *= scale;
  }
  if (s.autoscale) {  // its clock with the load's: a replica's start-up keeps its share of the ramp
    autoscale_options& a = *s.autoscale;
    for (double* t : {&a.period_s, &a.startup_s, &a.up_window_s, &a.down_window_s, &a.up_period_s, &a.down_period_s}) *t *= scale;
  }
  s.calibration_s = std::min(s.calibration_s, 120.0);
  s.calibration_warmup_s = std::min(s.calibration_warmup_s, 30.0);
}

// Loads the scenario, applies the options, runs it, writes its files under out; prints as it goes.
scenario_outcome run_scenario(const std::string& scenario_path, const options& o, const std::filesystem::path& out_dir,
                              const std::string& header, progress_display& bar) {
  scenario_outcome result;
  scenario s;
  try {
    s = load_scenario(scenario_path);
    if (o.short_form) shorten(s);
    if (!o.multiples.empty()) s.multiples = o.multiples;
    if (!o.policies.empty()) s.policies = parse_policies(o.policies);
    if (o.duration > 0) s.duration_s = o.duration;
    if (o.warmup >= 0) s.warmup_s = o.warmup;
    if (o.capacity > 0) s.capacity_rps = o.capacity;
    if (o.calibration > 0) s.calibration_s = o.calibration;
    if (o.retries >= 0) s.retries = o.retries;
    if (o.replicas > 0) {
      if (s.target != target_kind::virtual_sim) throw std::runtime_error("--replicas applies to a virtual target");
      s.replicas = o.replicas;
    }
    if (o.autoscale == "off") s.autoscale.reset();
    if (!o.faults.empty() && s.target != target_kind::virtual_sim) {
      throw std::runtime_error("--fault applies to a virtual target; a server takes [faults] from its own config");
    }
    if (!o.faults.empty()) {  // KEY=VALUE items are the lines of a [faults] table
      std::string table;
      for (const std::string& f : o.faults) table += f + "\n";
      s.config.faults = parse_faults(table, "--fault");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tireless-load: %s: %s\n", scenario_path.c_str(), e.what());
    return result;
  }
  result.name = s.name;
  const std::filesystem::path out = out_dir.empty() ? std::filesystem::path("out") / s.name : out_dir;
  std::filesystem::create_directories(out);

  std::string text = fmt::format("{}scenario {}: {}\n", header, s.name, s.description);
  auto print = [&](const std::string& part) {
    text += part;
    if (!o.json_out) {
      std::fputs(part.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  if (!o.json_out) std::fputs(text.c_str(), stdout);

  std::unique_ptr<target> t;
  try {
    t = s.target == target_kind::virtual_sim ? make_virtual_target(s)
        : s.target == target_kind::openai
            ? make_openai_target(s)
            : make_server_target(s, o.serve.empty() ? (s.serve.empty() ? default_serve() : s.serve) : std::filesystem::path(o.serve),
                                 out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tireless-load: %s\n", e.what());
    return result;
  }
  if (!t->switches_policy()) {
    s.policies = {s.config.admission.policy};
    print(fmt::format("note: a running server keeps its own policy; one run per multiple, labelled \"{}\" from {}\n",
                      to_string(s.config.admission.policy), s.config_path.string()));
  }
  print(fmt::format("target: {}\nquotas: {}\nmix:\n{}", t->describe(),
                    s.lift_quotas ? "lifted (tenants' quotas removed in every run)" : "as configured", describe_mix(s)));
  if (const fault_settings& f = s.config.faults; f.any()) {
    print(fmt::format("faults: a shard crashes mid-step with p={} a step{}, a slow spell ({} ms, {}x) begins with p={} "
                      "(seed {}); the shard supervisor restarts and re-runs (backend.max_shard_restarts = {} in {} ms)\n",
                      f.shard_crash_per_step,
                      f.shard_crash_every_steps > 0 ? fmt::format(" and at every {}th", f.shard_crash_every_steps) : "",
                      f.shard_slow.count(), f.shard_slow_factor, f.shard_slow_per_step, f.seed,
                      s.config.backend.max_shard_restarts, s.config.backend.shard_restart_window.count()));
  }

  capacity_result cap;
  try {
    if (s.capacity_rps > 0) {
      cap.rps = s.capacity_rps;
      cap.given = true;
      cap.method = "given (scenario capacity.rps or --capacity), not measured";
    } else {
      bar.start("capacity");
      cap = measure_capacity(*t, s, [&](double f, const std::string& st) { bar.update(f, st); });
      bar.finish(fmt::format("capacity: {:.3g} requests/s ({:.1f} s here)", cap.rps, cap.wall_s));
      if (cap.rps <= 0) throw std::runtime_error("no request completed while measuring the capacity; see the target's log");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tireless-load: %s\n", e.what());
    return result;
  }
  print(fmt::format("capacity: {:.4g} requests/s{}\n  {}\n{}\n", cap.rps,
                    cap.given ? "" : fmt::format(" ({:.0f} completion + {:.0f} prompt tokens/s; {} other outcomes in the window)",
                                                 cap.completion_tps, cap.prompt_tps, cap.other_outcomes),
                    cap.method,
                    cap.other_outcomes > 0 ? "  warning: requests ended otherwise than completed while measuring (deadlines? "
                                             "a smaller capacity.concurrency waits less)\n"
                                           : ""));

  std::vector<run_result>& runs = result.runs;
  std::vector<run_metrics>& metrics = result.metrics;
  const size_t total = s.multiples.size() * s.policies.size();
  for (double m : s.multiples) {
    for (admission_policy p : s.policies) {
      const std::string name = fmt::format("run {}/{} {} x{:g}", runs.size() + 1, total, to_string(p), m);
      bar.start(name);
      try {
        runs.push_back(run_open_loop(*t, s, p, m, cap.rps, [&](double f, const std::string& st) { bar.update(f, st); }));
      } catch (const std::exception& e) {
        bar.finish(fmt::format("{}: {}", name, e.what()));
        return result;
      }
      metrics.push_back(measure(runs.back(), s));
      const run_metrics& rm = metrics.back();
      bar.finish(fmt::format("{}: {} requests, {} lost, SLO {:.1f}%, goodput {:.1f} tokens/s ({:.1f} s)", name, rm.requests,
                             rm.lost, 100 * rm.total.slo_attainment, rm.total.goodput_tps, runs.back().wall_s));
      if (s.config.faults.any() && runs.back().shard_restarts >= 0) {
        print(fmt::format("faults in {}: {} shard restarts\n", name, runs.back().shard_restarts));
      }
      if (!runs.back().target_broken.empty()) {
        print(fmt::format("warning: the target went away {:.1f} s into the run: {}\n", runs.back().end_s,
                          runs.back().target_broken));
      }
      print(run_table(runs.back(), rm, s) + "\n");
    }
  }
  result.bars = check_bars(runs, metrics);
  result.ran = true;
  print(comparison_table(runs, metrics, s) + "\n" + bars_text(result.bars));

  const nlohmann::json j = to_json(s, t->describe(), cap, runs, metrics, result.bars, o.with_requests);
  std::ofstream(out / "results.json") << j.dump(1) << "\n";
  std::string note;
  const auto pngs = write_plots(std::filesystem::absolute(out), s, runs, metrics, note);
  std::string files = fmt::format("\nwritten: {}", (out / "results.json").string());
  for (const auto& p : pngs) files += ", " + std::filesystem::relative(p).string();
  print(files + "\n" + (note.empty() ? "" : "note: " + note + "\n"));
  std::ofstream(out / "results.txt") << text;
  if (o.json_out) std::fputs((j.dump(1) + "\n").c_str(), stdout);
  return result;
}

bool clean(const scenario_outcome& r) {
  if (!r.ran) return false;
  for (const run_metrics& m : r.metrics) {
    if (m.lost > 0 || m.silently_shortened > 0) return false;
  }
  return true;
}

bool bars_hold(const std::vector<bar_check>& bars) {
  return std::none_of(bars.begin(), bars.end(), [](const bar_check& b) { return b.result == bar_check::state::fail; });
}

std::string percent(double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.1f}%", 100 * v); }

// One matrix over every scenario: per load and policy, the top tier's SLO among feasible
// requests and the total goodput; for tireless also its worst window, the worst late share
// and the recovery after a load drop; then each scenario's bars.
std::string suite_matrix(const std::vector<scenario_outcome>& all, const std::vector<admission_policy>& policies) {
  std::string out = "suite matrix: per policy, the top tier's SLO among feasible requests / goodput (completion tokens/s "
                    "of SLO-meeting requests); tireless: worst window of its top tier (and among what an ideal engine "
                    "could have put on time, ideal.hpp), worst late share of any tier, recovery after a load drop\n";
  out += fmt::format("  {:<20} {:>5}", "scenario", "load");
  for (admission_policy p : policies) out += fmt::format(" {:>22}", to_string(p));
  out += fmt::format(" {:>10} {:>11} {:>9} {:>9}\n", "worst min", "worst ideal", "late max", "recovery");
  for (const scenario_outcome& r : all) {
    if (!r.ran) {
      out += fmt::format("  {:<20} did not run (see the error above)\n", r.name.empty() ? "?" : r.name);
      continue;
    }
    std::vector<double> loads;
    for (const run_result& run : r.runs) {
      if (std::find(loads.begin(), loads.end(), run.multiple) == loads.end()) loads.push_back(run.multiple);
    }
    for (double m : loads) {
      out += fmt::format("  {:<20} {:>4g}x", r.name, m);
      const run_metrics* ours = nullptr;
      for (admission_policy p : policies) {
        std::string cell = "-";
        for (size_t i = 0; i < r.runs.size(); ++i) {
          if (r.runs[i].policy != p || r.runs[i].multiple != m) continue;
          const run_metrics& rm = r.metrics[i];
          cell = fmt::format("{} / {:.0f}", percent(rm.tiers.front().slo_feasible), rm.total.goodput_tps);
          if (p == admission_policy::tireless) ours = &rm;
        }
        out += fmt::format(" {:>22}", cell);
      }
      if (ours) {
        double late = 0;
        for (const tier_metrics& t : ours->tiers) late = std::max(late, std::isnan(t.worst_window_late) ? 0.0 : t.worst_window_late);
        out += fmt::format(" {:>10} {:>11} {:>9} {:>9}", percent(ours->tiers.front().worst_window_slo_feasible),
                           percent(ours->tiers.front().worst_window_slo_ideal), percent(late),
                           ours->drop_s < 0 ? std::string("-")
                           : std::isnan(ours->recovery_s) ? std::string("never")
                                                          : fmt::format("{:.0f} s", ours->recovery_s));
      }
      out += "\n";
    }
  }
  out += "suite bars\n";
  for (const scenario_outcome& r : all) {
    if (!r.ran) continue;
    for (const bar_check& b : r.bars) {
      const char* word = b.result == bar_check::state::pass ? "PASS" : b.result == bar_check::state::fail ? "FAIL" : "SKIP";
      out += fmt::format("  {}  {}: {}: {}\n", word, r.name, b.name, b.detail);
    }
  }
  return out;
}

int run_suite(const std::string& dir, options o, bool virtual_only, bool assert_bars, const std::string& header,
              progress_display& bar) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".toml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "tireless-load: no scenario (*.toml) in %s\n", dir.c_str());
    return 2;
  }
  if (o.multiples.empty()) o.multiples = {1, 2, 3, 5};
  if (o.policies.empty()) o.policies = {"fcfs", "priority", "tireless", "least-slack"};
  std::vector<admission_policy> policies;
  try {
    policies = parse_policies(o.policies);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tireless-load: %s\n", e.what());
    return 2;
  }
  const std::filesystem::path root = o.out_dir.empty() ? std::filesystem::path("out") / "suite" : std::filesystem::path(o.out_dir);
  std::vector<scenario_outcome> all;
  for (const auto& f : files) {
    if (virtual_only) {
      try {
        if (load_scenario(f).target != target_kind::virtual_sim) {
          std::printf("suite: %s drives a server; skipped (--virtual-only)\n", f.filename().c_str());
          continue;
        }
      } catch (const std::exception&) {  // run_scenario reports it
      }
    }
    all.push_back(run_scenario(f.string(), o, root / f.stem(), header, bar));
    if (all.back().name.empty()) all.back().name = f.stem().string();
  }
  const std::string matrix = suite_matrix(all, policies);
  std::fputs(("\n" + matrix).c_str(), stdout);
  std::ofstream(root / "matrix.txt") << header << matrix;
  bool ok = true;
  for (const scenario_outcome& r : all) ok = ok && clean(r) && (!assert_bars || bars_hold(r.bars));
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Drive tireless with a load scenario and compare admission policies under overload"};
  std::string scenario_path, suite_dir;
  options o;
  bool virtual_only = false, assert_bars = false;
  app.add_option("scenario", scenario_path, "scenario TOML file")->check(CLI::ExistingFile);
  app.add_option("--suite", suite_dir, "run every scenario (*.toml) of this folder at 1x, 2x, 3x and 5x under fcfs, "
                                       "priority, tireless and least-slack (unless --multiples/--policies say otherwise) "
                                       "and print one matrix")
      ->check(CLI::ExistingDirectory);
  app.add_flag("--short", o.short_form, "the short form: each run and load profile compressed into 600 virtual seconds, "
                                        "calibration into 120");
  app.add_flag("--virtual-only", virtual_only, "with --suite: skip the scenarios that drive a server");
  app.add_flag("--assert-bars", assert_bars, "exit 1 unless every bar of every scenario passes (or is skipped)");
  app.add_option("--out", o.out_dir, "output folder (default out/<scenario>; with --suite, out/suite/<scenario>)");
  app.add_option("--multiples", o.multiples, "load multiples of the capacity, e.g. 1,2,3,5")->delimiter(',');
  app.add_option("--policies", o.policies, "admission policies: fcfs,priority,tireless,least-slack")->delimiter(',');
  app.add_option("--duration", o.duration, "measured seconds per run (overrides run.duration_s)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "warm-up seconds per run (overrides run.warmup_s)")->check(CLI::NonNegativeNumber);
  app.add_option("--replicas", o.replicas,
                 "a virtual target's fleet: this many engine replicas behind one router (overrides target.replicas)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--autoscale", o.autoscale, "off: a fixed fleet of target.replicas, without the scenario's [target.autoscale]")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--retries", o.retries,
                 "clients retry a refusal for load after its retry hint, with its token, up to N times "
                 "(overrides clients.retries)")
      ->check(CLI::Range(0, 10));
  app.add_option("--capacity", o.capacity, "requests/s taken as the capacity instead of measuring it")->check(CLI::PositiveNumber);
  app.add_option("--calibration", o.calibration, "seconds of the capacity measurement (overrides capacity.calibration_s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--serve", o.serve, "the tireless-serve program (server scenarios; default: next to this program's build)");
  app.add_option("--fault", o.faults, "inject faults into a virtual target: KEY=VALUE with a key of the config's [faults] "
                                      "(shard_crash_per_step=0.001, shard_slow_per_step, shard_slow_ms, shard_slow_factor, "
                                      "seed), checked as the config checks them; repeatable, and together they replace the target "
                                      "config's [faults]. A server target takes [faults] from its own config");
  app.add_flag("--json", o.json_out, "print the results as JSON on stdout instead of tables");
  app.add_flag("--requests", o.with_requests, "include every request in the JSON file");
  CLI11_PARSE(app, argc, argv);
  if (scenario_path.empty() == suite_dir.empty()) {
    std::fprintf(stderr, "tireless-load: give a scenario file or --suite DIR (one of them)\n");
    return 2;
  }
  progress_display bar;
  const std::string header = fmt::format("$ {}\n", command_line(argc, argv));
  if (!suite_dir.empty()) return run_suite(suite_dir, o, virtual_only, assert_bars, header, bar);

  const scenario_outcome r = run_scenario(scenario_path, o, o.out_dir, header, bar);
  if (!r.ran) return 1;
  if (assert_bars && !bars_hold(r.bars)) return 1;
  return clean(r) ? 0 : 1;
}
