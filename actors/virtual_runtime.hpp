#pragma once
// The runtime on the sim backend with a virtual clock: the same actors and the same intake
// as the threaded runtime, run by CAF's deterministic scheduler in one thread. Steps take
// the sim profile's modelled time on the virtual clock, so an hour of traffic replays in
// seconds, and the same inputs give the same run every time. For load studies and tests.

#include <memory>
#include <optional>
#include <vector>

#include "config/runtime_config.hpp"
#include "scheduler/autoscaler.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

struct fleet_options {
  int32_t replicas = 1;  // at the start (with autoscale: clamped into [min, max])
  // An autoscaler (scheduler/autoscaler.hpp) that starts replicas, each serving startup_s after
  // it was asked for, and retires them (a retired replica takes no new requests and finishes
  // its own), evaluated every period_s of virtual time.
  std::optional<autoscale_options> autoscale;
};

// The fleet at one autoscaler sync.
struct fleet_sample {
  double t = 0;
  int32_t serving = 0, starting = 0;  // after the sync's decision
  int32_t desired = 0, proposal = 0;  // the decision, and the metrics' raw proposal
  std::vector<double> totals;         // the metrics read, summed over the serving replicas
};

class virtual_runtime {
 public:
  // config.backend.kind must be "sim". Throws std::runtime_error otherwise or on a bad profile.
  // replicas > 1: a fleet of that many replicas (each its own backend, KV pool, actors and
  // admission) behind one router (scheduler/router.hpp) that picks a replica per request from
  // what each publishes (its admission's prediction, whether it would refuse, its queue) and by
  // prefix affinity; each replica enforces 1/replicas of every tenant's quotas.
  explicit virtual_runtime(const runtime_config& config, int32_t replicas = 1);
  virtual_runtime(const runtime_config& config, const fleet_options& fleet);
  ~virtual_runtime();
  virtual_runtime(const virtual_runtime&) = delete;
  virtual_runtime& operator=(const virtual_runtime&) = delete;

  // As runtime::submit; callbacks run inside run() / run_until().
  uint64_t submit(request r, runtime::token_callback on_token, runtime::outcome_callback on_outcome);
  bool cancel(uint64_t request_id);

  double now() const;  // virtual seconds since the start
  // Runs every message and timer up to virtual time t (seconds), then stops the clock at t.
  void run_until(double t);
  // Runs until nothing is left to do.
  void run();

  runtime_stats stats();  // the fleet's, summed over its replicas
  std::string describe() const;
  int32_t replicas() const;
  std::vector<int64_t> routed() const;  // requests the router sent to each replica
  int64_t affinity_hits() const;        // of them, sent by prefix affinity
  int32_t serving() const;              // replicas that take requests now
  int32_t starting() const;             // asked for, still loading their model
  std::vector<fleet_sample> fleet_timeline() const;  // one per autoscaler sync
  // Replica-seconds paid for so far: every replica from the moment it was asked for (its model
  // load is paid too) until it was retired.
  double replica_seconds() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace tireless
