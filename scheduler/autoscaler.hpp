#pragma once
// The fleet's autoscaler, computed as Kubernetes' HorizontalPodAutoscaler (autoscaling/v2)
// computes it for deploy/kubernetes/hpa.yaml: Pods metrics with an average target per replica,
// a tolerance, stabilization windows and rate policies, evaluated every sync period. Used by
// the simulated fleet (virtual_runtime) to show what each tier gets while replicas start.
//
// Each sync, for every metric: average = sum over serving replicas / current replicas (those
// still starting publish nothing and count as 0, as the HPA counts pods without metrics when
// it scales up); within the tolerance of the target the metric proposes no change, otherwise
// ceil(sum / target). The largest proposal wins, clamped to [min, max]. A scale-up takes the
// smallest proposal of the up window, a scale-down the largest of the down window (so a dip
// must last the whole window). At most up_step replicas are added per up_period_s and
// down_step removed per down_period_s. CAF-free.

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace tireless {

struct autoscale_metric {
  enum class kind {
    queue_depth,    // requests waiting in admission (tireless_queue_depth{tier}); tier "" = every tier's
    waiting,        // in admission or admitted and waiting in the engine (tireless_num_requests_waiting)
    refused_per_s,  // refused for load (overloaded), per second since the last sync
  };
  kind what = kind::queue_depth;
  std::string tier;
  double target = 2;  // the average per replica to keep
};

struct autoscale_options {
  int32_t min_replicas = 1, max_replicas = 10;
  double period_s = 15;      // the HPA's sync period
  double tolerance = 0.1;    // no change while |average / target - 1| <= tolerance
  double startup_s = 120;    // a new replica loads its model this long before it serves
  double up_window_s = 0;    // stabilization windows (the HPA's defaults: 0 up, 300 s down)
  double down_window_s = 300;
  int32_t up_step = 2;       // at most this many replicas added per up_period_s
  double up_period_s = 60;
  int32_t down_step = 1;     // at most this many removed per down_period_s
  double down_period_s = 120;
  std::vector<autoscale_metric> metrics;
};

// What the fleet reads at a sync.
struct fleet_reading {
  int32_t serving = 0;         // replicas that serve (their metrics are summed)
  int32_t starting = 0;        // started, still loading their model
  std::vector<double> totals;  // per options.metrics: the sum over serving replicas
};

const char* to_string(autoscale_metric::kind k);
// "queue_depth" / "waiting" / "refused_per_s"; throws std::invalid_argument naming the choices.
autoscale_metric::kind parse_autoscale_metric(const std::string& s);

class autoscaler {
 public:
  // Throws std::invalid_argument saying which option is wrong and what it must be.
  explicit autoscaler(autoscale_options o);

  // The number of replicas wanted now (serving + starting count as the current number); the
  // caller starts or retires the difference, then the autoscaler remembers it did.
  int32_t desired(double now_s, const fleet_reading& r);
  const autoscale_options& options() const { return o_; }
  // The raw proposal of the last sync (before windows and rate policies), for reports.
  int32_t last_proposal() const { return last_proposal_; }

 private:
  int32_t propose(const fleet_reading& r) const;

  autoscale_options o_;
  std::deque<std::pair<double, int32_t>> proposals_;  // (time, proposal) over the longest window
  std::deque<std::pair<double, int32_t>> changes_;    // (time, replicas added > 0 or removed < 0)
  int32_t last_proposal_ = 0;
};

}  // namespace tireless
