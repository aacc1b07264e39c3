// The virtual target: a fresh virtual_runtime per run, on the sim backend's virtual clock.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "actors/virtual_runtime.hpp"
#include "actors/sim_config.hpp"
#include "target.hpp"

namespace tireless::load {

namespace {

class virtual_session final : public target_session {
 public:
  virtual_session(const runtime_config& c, const fleet_options& fleet)
      : rt_(c, fleet), default_timeout_(c.session.request_timeout), fleet_(fleet) {}

  double now() override { return rt_.now(); }
  void advance_to(double t) override {
    if (t > rt_.now()) rt_.run_until(t);
  }

  void submit(const planned_request& r, outcome_fn done) override {
    request q;
    if (r.tenant_key) q.api_key = *r.tenant_key;
    q.prompt_tokens = prompt_token_ids(r);
    q.max_tokens = r.max_tokens;
    q.retry_token = r.retry_token;
    // As tireless-serve does for its clients: the configured deadline, or less when asked.
    q.timeout = r.timeout_ms > 0 ? std::min(std::chrono::milliseconds(r.timeout_ms), default_timeout_) : default_timeout_;
    rt_.submit(std::move(q), nullptr, std::move(done));
  }

  std::optional<target_probe> probe() override {
    const runtime_stats s = rt_.stats();
    return target_probe{s.queued_in_admission, s.running, s.waiting_in_engine, s.queued_by_tier, s.shard_restarts};
  }

  std::optional<fleet_report> fleet() override {
    if (fleet_.replicas <= 1 && !fleet_.autoscale) return std::nullopt;
    fleet_report f;
    f.initial = fleet_.replicas;
    f.autoscaled = fleet_.autoscale.has_value();
    for (const fleet_sample& x : rt_.fleet_timeline()) f.points.push_back({x.t, x.serving, x.starting});
    f.replica_seconds = rt_.replica_seconds();
    return f;
  }

  // Asked before each submit: the runtime is asked at most once a virtual second.
  std::string broken() override {
    if (problem_.empty() && rt_.now() >= next_check_) {
      problem_ = rt_.stats().backend_problem;
      next_check_ = rt_.now() + 1.0;
    }
    return problem_;
  }

 private:
  virtual_runtime rt_;
  std::chrono::milliseconds default_timeout_;
  fleet_options fleet_;
  std::string problem_;
  double next_check_ = 0;
};

class virtual_target final : public target {
 public:
  explicit virtual_target(const scenario& s) : s_(s), profile_(configured_sim_profile(s.config)) {
    // The scenario's faults must fit the profile's expert-parallel group: refused here, before any run.
    try {
      make_configured_sim(run_config(s_, admission_policy::fcfs, false), limits_, false);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: [[faults.expert_group]]: {}", s_.file.string(), e.what()));
    }
  }

  // At at_s of a run: under the expert group's faults in force then.
  double idle_first_token_s(int32_t prompt_tokens, double at_s) const override { return prefill_s(prompt_tokens, at_s, 0); }
  double idle_prefill_work_s(int32_t prompt_tokens, int32_t cached_tokens, double at_s) const override {
    return prefill_s(prompt_tokens, at_s, profile_.cost.c0, cached_tokens);
  }
  int32_t cacheable_tokens(int32_t shared_prefix_tokens) const override {
    const int32_t block = std::max(s_.config.kv.block_size, 1);
    return s_.config.kv.prefix_caching ? shared_prefix_tokens / block * block : 0;
  }
  std::vector<std::pair<double, double>> stalls() const override {
    std::vector<std::pair<double, double>> out;
    for (const sim::expert_event& e : events_) {
      if (e.stall_s > 0) out.emplace_back(e.at_s, e.at_s + e.stall_s);
    }
    return out;
  }

  std::unique_ptr<target_session> open(admission_policy policy, bool lift_quotas, const std::string& label) override {
    // The capacity is the starting fleet's, without the autoscaler.
    const bool measuring = label == "capacity";
    fleet_options fleet{s_.replicas, measuring ? std::nullopt : s_.autoscale};
    if (fleet.autoscale) fleet.replicas = std::clamp(fleet.replicas, fleet.autoscale->min_replicas, fleet.autoscale->max_replicas);
    return std::make_unique<virtual_session>(run_config(s_, policy, lift_quotas, !measuring), fleet);
  }
  bool virtual_time() const override { return true; }
  std::string describe() const override {
    if (s_.autoscale) {
      return fmt::format("virtual-time sim ({}, profile {}), {} replicas behind a router to start, autoscaled in [{}, {}] "
                         "(replicas serve {:g} s after they are asked for)",
                         s_.config_path.string(), s_.config.backend.sim_profile, s_.replicas, s_.autoscale->min_replicas,
                         s_.autoscale->max_replicas, s_.autoscale->startup_s);
    }
    if (s_.replicas > 1) {
      return fmt::format("virtual-time sim ({}, profile {}), {} replicas behind a router", s_.config_path.string(),
                         s_.config.backend.sim_profile, s_.replicas);
    }
    return fmt::format("virtual-time sim ({}, profile {})", s_.config_path.string(), s_.config.backend.sim_profile);
  }

 private:
  // The steps of a prompt's prefill alone, under the expert group's faults in force at at_s:
  // chunks of max_step_tokens from its first position not cached, each attending the positions
  // before it (the last one samples the first token), each less `fixed` seconds.
  double prefill_s(int32_t prompt_tokens, double at_s, double fixed, int32_t cached = 0) const {
    const sim::expert_condition condition = sim::condition_at(events_, profile_.ep.degree, at_s);
    const int64_t chunk = std::max(s_.config.engine.max_step_tokens, 1);
    double seconds = 0;
    for (int64_t at = std::min(std::max(cached, 0), std::max(prompt_tokens - 1, 0)); at < prompt_tokens; at += chunk) {
      const int64_t n = std::min<int64_t>(chunk, prompt_tokens - at);
      sim::step_shape shape;
      shape.prefill_tokens = n;
      shape.prefill_context = n * at + n * (n + 1) / 2;  // sum over its tokens of pos + 1
      seconds += sim::step_seconds(profile_, shape, condition) - fixed;
    }
    return seconds;
  }

  const scenario& s_;
  sim::sim_profile profile_;
  resolved_limits limits_;
  std::vector<sim::expert_event> events_ = expert_events(s_.expert_group);
};

}  // namespace

double target::idle_first_token_s(int32_t, double) const { return std::numeric_limits<double>::quiet_NaN(); }
double target::idle_prefill_work_s(int32_t, int32_t, double) const { return std::numeric_limits<double>::quiet_NaN(); }

std::unique_ptr<target> make_virtual_target(const scenario& s) { return std::make_unique<virtual_target>(s); }

}  // namespace tireless::load
