#pragma once
// What the driver drives: a fresh runtime per run, behind one synchronous interface. The
// virtual target is a virtual_runtime on the sim backend (time is virtual); the server target
// starts tireless-serve with the run's policy (or talks to a running server) and speaks Cap'n
// Proto RPC to it (time is the wall clock).

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario.hpp"
#include "tireless/runtime.hpp"
#include "workload.hpp"

namespace tireless::load {

// The target's own view of its load at one moment.
struct target_probe {
  int32_t queued = -1, running = -1;  // in admission; running in the engine; -1: not reported
  int32_t waiting = -1;               // admitted, waiting in the engine; -1: not reported
  std::vector<std::pair<std::string, int32_t>> queued_by_tier;  // empty: not reported
  int64_t shard_restarts = -1;        // since the session opened; -1: not reported
};

// A virtual fleet over a run: its replicas at each autoscaler sync, and what it paid for.
struct fleet_point {
  double t = 0;
  int32_t serving = 0, starting = 0;
};
struct fleet_report {
  int32_t initial = 1;              // replicas at the start
  bool autoscaled = false;
  std::vector<fleet_point> points;  // one per autoscaler sync (none for a fixed fleet)
  double replica_seconds = 0;       // every replica from when it was asked for until retired
};

class target_session {
 public:
  using outcome_fn = std::function<void(const outcome&)>;
  virtual ~target_session() = default;
  virtual double now() = 0;               // seconds since the session opened
  virtual void advance_to(double t) = 0;  // runs the target (and delivers outcomes) until time t
  // `done` runs at most once, inside advance_to, with the request's outcome.
  virtual void submit(const planned_request& r, outcome_fn done) = 0;
  virtual std::optional<target_probe> probe() = 0;
  // Why the target went away ("" while it is there): no more outcomes will come.
  virtual std::string broken() { return {}; }
  // A virtual fleet's replicas over the session so far; none for other targets.
  virtual std::optional<fleet_report> fleet() { return std::nullopt; }
};

class target {
 public:
  virtual ~target() = default;
  // A fresh session running `policy` (quotas lifted when asked); label names its files.
  virtual std::unique_ptr<target_session> open(admission_policy policy, bool lift_quotas, const std::string& label) = 0;
  virtual bool virtual_time() const = 0;
  // Whether open() can change the policy (not for a server that was already running).
  virtual bool switches_policy() const { return true; }
  virtual std::string describe() const = 0;
  // Seconds to the first token of a prompt of this many tokens on an idle engine (its whole
  // prefill, in steps of engine.max_step_tokens, by the target's own cost model); NaN when the
  // target has none. Longer than its tier's TTFT target: the request is infeasible. at_s: when
  // in the run it arrives (a target with faults over time counts those in force then).
  virtual double idle_first_token_s(int32_t prompt_tokens, double at_s) const;
  // The same prefill's work less the fixed cost of its steps (which prompts sharing a step pay
  // once), its first `cached_tokens` already in the prefix cache: what an ideal engine spends on
  // it (ideal.hpp); NaN when the target has no model.
  virtual double idle_prefill_work_s(int32_t prompt_tokens, int32_t cached_tokens, double at_s) const;
  // Of a prefix this many tokens long that an earlier prompt sent too, how many the target's
  // prefix cache can hold for the next (whole KV blocks); 0 where it caches none or is not known.
  virtual int32_t cacheable_tokens(int32_t /*shared_prefix_tokens*/) const { return 0; }
  // [from, to) spans of a run's time in which the target computes nothing (an expert group's
  // failure detection and re-run); empty where it has none.
  virtual std::vector<std::pair<double, double>> stalls() const { return {}; }
};

std::unique_ptr<target> make_virtual_target(const scenario& s);
// Any OpenAI-compatible server at scenario.base_url (its policy is its own).
std::unique_ptr<target> make_openai_target(const scenario& s);
// serve: the tireless-serve program (ignored with scenario.address); out_dir: where the config
// copies and server logs go.
std::unique_ptr<target> make_server_target(const scenario& s, std::filesystem::path serve,
                                           std::filesystem::path out_dir);

}  // namespace tireless::load
