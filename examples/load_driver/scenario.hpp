#pragma once
// A load scenario: what to drive (the virtual-time sim or a running server), for how long, at
// which loads (multiples of the measured capacity) and with which policies, and the mix of
// requests (classes with a share, a tenant key and length distributions) or a recorded trace.
// Read from one TOML file and validated once, every problem naming its key.

#include <cstdint>
#include <filesystem>
#include <map>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/runtime_config.hpp"
#include "scheduler/autoscaler.hpp"

namespace tireless::load {

class scenario_error : public std::runtime_error {
 public:
  explicit scenario_error(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

// A token count drawn per request; results are always within [min, max].
struct length_dist {
  enum class kind { fixed, uniform, lognormal };
  kind shape = kind::fixed;
  int32_t min = 1, max = 1;      // fixed: min == max
  double median = 0, sigma = 0;  // lognormal: exp(N(ln median, sigma)), redrawn outside the bounds
  double mean() const;           // estimated, for descriptions
};

struct request_class {
  std::string name;
  double share = 0;  // normalized to sum to 1 over the mix
  std::string tenant_key;
  int32_t tier = 0;  // index into the target config's tiers (highest priority first)
  length_dist prompt, output;
  int32_t system_prompt_tokens = 0;  // a prefix shared by every request of the class
  int64_t timeout_ms = 0;            // the request's deadline; 0: the server's default
  // Bursts (key burst = { every_s, for_s, factor }): the class arrives `factor` times faster
  // for for_s of every every_s, and slower in between, so its mean share is kept.
  double burst_every_s = 0, burst_for_s = 0, burst_factor = 1;
  // Its rate at t, relative to its mean (1 without bursts).
  double burst_at(double t) const;
  double burst_peak() const { return burst_every_s > 0 ? burst_factor : 1.0; }
};

// A piecewise-linear rate over the run (key arrivals.profile = [[t_s, factor], ...]), times
// from the start of the run (warm-up included); held at the ends. Empty: a constant rate.
struct rate_profile {
  std::vector<std::pair<double, double>> points;  // time-ordered
  double at(double t) const;
  double peak() const;
};

// One row of a replayed trace (CSV: arrival_s, tenant_key, prompt_tokens, output_tokens).
struct trace_row {
  double arrival_s = 0;
  std::string tenant_key;
  int32_t tier = 0;
  int32_t prompt_tokens = 0, output_tokens = 0;
};

enum class target_kind { virtual_sim, server, openai };
enum class arrival_kind { poisson, trace };

struct scenario {
  std::string name;
  std::string description;
  std::filesystem::path file;

  // [target]
  target_kind target = target_kind::virtual_sim;
  std::filesystem::path config_path;
  runtime_config config;           // the target's base configuration, loaded
  bool lift_quotas = false;        // quotas = "lifted": tenants' quotas removed in every run
  int32_t replicas = 1;            // virtual: engine replicas behind one router (the fleet)
  // virtual, [target.autoscale]: the fleet starts at `replicas` and an autoscaler (the HPA's
  // algorithm, scheduler/autoscaler.hpp) grows and shrinks it; the capacity is measured without it.
  std::optional<autoscale_options> autoscale;
  std::string address;             // server: "host:port" of a running server ("" = spawn one)
  std::filesystem::path serve;     // server: the tireless-serve program ("" = next to this one)
  std::string base_url;            // openai: "http://host:port" of an OpenAI-compatible server
  // openai: the key sent for each scenario tenant key (absent: the scenario's key itself)
  std::map<std::string, std::string> target_keys;

  // [run]
  double duration_s = 60, warmup_s = 10;
  double drain_s = 0;              // bounded wait for outcomes after the last arrival; 0: derived
  double sample_every_s = 0.5;
  uint64_t seed = 1;
  std::vector<double> multiples{1, 2, 3, 5};
  std::vector<admission_policy> policies{admission_policy::fcfs, admission_policy::priority,
                                         admission_policy::tireless};

  // [clients]
  // How many times a client sends a request again after a refusal for load that carries a
  // retry hint (reason overloaded or quota_exceeded, retry_after_ms >= 0): once the hint has
  // passed, with the refusal's retry token, as tireless_client does. 0: clients give up.
  int32_t retries = 0;

  // [capacity]
  double capacity_rps = 0;         // > 0: given, no measurement
  double calibration_s = 60, calibration_warmup_s = 10;
  int32_t concurrency = 0;         // closed-loop requests in flight; 0: engine.max_step_seqs

  // [arrivals]
  arrival_kind arrivals = arrival_kind::poisson;
  rate_profile profile;  // poisson only
  std::filesystem::path trace_path;
  std::vector<trace_row> trace;

  std::vector<request_class> mix;  // empty for a trace

  // [[faults.expert_group]] (virtual target): the expert-parallel group's conditions during
  // the measured runs (not the capacity calibration), in seconds from the run's start: devices
  // down, a hot expert. The same keys as the runtime config's [[faults.expert_group]].
  std::vector<fault_settings::expert_group_event> expert_group;

  const tier_settings& tier(int32_t i) const { return config.tiers.at(static_cast<size_t>(i)); }
  int32_t tier_count() const { return static_cast<int32_t>(config.tiers.size()); }
  // The wait for outcomes after the last arrival: drain_s, or the config's request timeout
  // plus its longest queue wait plus a minute.
  double drain_seconds() const;
};

// Reads, resolves (paths relative to the scenario's folder, tenant keys to tiers) and
// validates. Throws scenario_error listing every problem, or config_error for the target's
// configuration.
scenario load_scenario(const std::filesystem::path& file);

// Where the files a scenario names come from: the file system, or (a fuzz target) memory.
struct scenario_files {
  std::function<runtime_config(const std::filesystem::path&)> config;     // the target's configuration
  std::function<std::optional<std::string>(const std::filesystem::path&)> text;  // a trace; nothing: unreadable
  static scenario_files from_disk();
};

// The same for a scenario's text in memory, named `file` (its folder resolves relative paths).
scenario parse_scenario(std::string_view toml_text, const std::filesystem::path& file, const scenario_files& files);

// The target configuration for one run: `policy`, quotas lifted when asked, and the
// scenario's faults where `faults` (not for the capacity calibration).
runtime_config run_config(const scenario& s, admission_policy policy, bool lift_quotas, bool faults = true);

std::vector<admission_policy> parse_policies(const std::vector<std::string>& names);  // throws

}  // namespace tireless::load
