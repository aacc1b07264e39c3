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

#include <chrono>
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Drive tireless with a load scenario and compare admission policies under overload"};
  std::string scenario_path, out_dir, serve;
  std::vector<double> multiples;
  std::vector<std::string> policies;
  double duration = 0, warmup = -1, capacity = 0, calibration = 0;
  bool json_out = false, with_requests = false;
  app.add_option("scenario", scenario_path, "scenario TOML file")->required()->check(CLI::ExistingFile);
  app.add_option("--out", out_dir, "output folder (default out/<scenario>)");
  app.add_option("--multiples", multiples, "load multiples of the capacity, e.g. 1,2,3,5")->delimiter(',');
  app.add_option("--policies", policies, "admission policies: fcfs,priority,tireless")->delimiter(',');
  app.add_option("--duration", duration, "measured seconds per run (overrides run.duration_s)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "warm-up seconds per run (overrides run.warmup_s)")->check(CLI::NonNegativeNumber);
  app.add_option("--capacity", capacity, "requests/s taken as the capacity instead of measuring it")->check(CLI::PositiveNumber);
  app.add_option("--calibration", calibration, "seconds of the capacity measurement (overrides capacity.calibration_s)")
      ->check(CLI::PositiveNumber);
  app.add_option("--serve", serve, "the tireless-serve program (server scenarios; default: next to this program's build)");
  std::vector<std::string> faults;
  app.add_option("--fault", faults, "inject faults into a virtual target: KEY=VALUE with a key of the config's [faults] "
                                    "(shard_crash_per_step=0.001, shard_slow_per_step, shard_slow_ms, shard_slow_factor, "
                                    "seed), checked as the config checks them; repeatable, and together they replace the target "
                                    "config's [faults]. A server target takes [faults] from its own config");
  app.add_flag("--json", json_out, "print the results as JSON on stdout instead of tables");
  app.add_flag("--requests", with_requests, "include every request in the JSON file");
  CLI11_PARSE(app, argc, argv);

  scenario s;
  try {
    s = load_scenario(scenario_path);
    if (!multiples.empty()) s.multiples = multiples;
    if (!policies.empty()) s.policies = parse_policies(policies);
    if (duration > 0) s.duration_s = duration;
    if (warmup >= 0) s.warmup_s = warmup;
    if (capacity > 0) s.capacity_rps = capacity;
    if (calibration > 0) s.calibration_s = calibration;
    if (!faults.empty() && s.target != target_kind::virtual_sim) {
      throw std::runtime_error("--fault applies to a virtual target; a server takes [faults] from its own config");
    }
    if (!faults.empty()) {  // KEY=VALUE items are the lines of a [faults] table
      std::string table;
      for (const std::string& f : faults) table += f + "\n";
      s.config.faults = parse_faults(table, "--fault");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tireless-load: %s\n", e.what());
    return 2;
  }
  const std::filesystem::path out = out_dir.empty() ? std::filesystem::path("out") / s.name : std::filesystem::path(out_dir);
  std::filesystem::create_directories(out);

  std::string text = fmt::format("$ {}\nscenario {}: {}\n", command_line(argc, argv), s.name, s.description);
  auto print = [&](const std::string& part) {
    text += part;
    if (!json_out) {
      std::fputs(part.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  if (!json_out) std::fputs(text.c_str(), stdout);

  progress_display bar;
  std::unique_ptr<target> t;
  try {
    t = s.target == target_kind::virtual_sim
            ? make_virtual_target(s)
            : make_server_target(s, serve.empty() ? (s.serve.empty() ? default_serve() : s.serve) : std::filesystem::path(serve), out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tireless-load: %s\n", e.what());
    return 2;
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
    return 1;
  }
  print(fmt::format("capacity: {:.4g} requests/s{}\n  {}\n{}\n", cap.rps,
                    cap.given ? "" : fmt::format(" ({:.0f} completion + {:.0f} prompt tokens/s; {} other outcomes in the window)",
                                                 cap.completion_tps, cap.prompt_tps, cap.other_outcomes),
                    cap.method,
                    cap.other_outcomes > 0 ? "  warning: requests ended otherwise than completed while measuring (deadlines? "
                                             "a smaller capacity.concurrency waits less)\n"
                                           : ""));

  std::vector<run_result> runs;
  std::vector<run_metrics> metrics;
  const size_t total = s.multiples.size() * s.policies.size();
  for (double m : s.multiples) {
    for (admission_policy p : s.policies) {
      const std::string name = fmt::format("run {}/{} {} x{:g}", runs.size() + 1, total, to_string(p), m);
      bar.start(name);
      try {
        runs.push_back(run_open_loop(*t, s, p, m, cap.rps, [&](double f, const std::string& st) { bar.update(f, st); }));
      } catch (const std::exception& e) {
        bar.finish(fmt::format("{}: {}", name, e.what()));
        return 1;
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
  const auto bars = check_bars(runs, metrics);
  print(comparison_table(runs, metrics, s) + "\n" + bars_text(bars));

  const nlohmann::json j = to_json(s, t->describe(), cap, runs, metrics, bars, with_requests);
  std::ofstream(out / "results.json") << j.dump(1) << "\n";
  std::string note;
  const auto pngs = write_plots(std::filesystem::absolute(out), s, runs, metrics, note);
  std::string files = fmt::format("\nwritten: {}", (out / "results.json").string());
  for (const auto& p : pngs) files += ", " + std::filesystem::relative(p).string();
  print(files + "\n" + (note.empty() ? "" : "note: " + note + "\n"));
  std::ofstream(out / "results.txt") << text;
  if (json_out) std::fputs((j.dump(1) + "\n").c_str(), stdout);

  int64_t lost = 0, shortened = 0;
  for (const run_metrics& m : metrics) {
    lost += m.lost;
    shortened += m.silently_shortened;
  }
  return lost == 0 && shortened == 0 ? 0 : 1;
}
