#include "scheduler/autoscaler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tireless {

const char* to_string(autoscale_metric::kind k) {
  switch (k) {
    case autoscale_metric::kind::queue_depth: return "queue_depth";
    case autoscale_metric::kind::waiting: return "waiting";
    case autoscale_metric::kind::refused_per_s: return "refused_per_s";
  }
  return "?";
}

autoscale_metric::kind parse_autoscale_metric(const std::string& s) {
  for (auto k : {autoscale_metric::kind::queue_depth, autoscale_metric::kind::waiting, autoscale_metric::kind::refused_per_s}) {
    if (s == to_string(k)) return k;
  }
  throw std::invalid_argument(fmt::format("autoscale metric '{}': it is queue_depth, waiting or refused_per_s", s));
}

autoscaler::autoscaler(autoscale_options o) : o_(std::move(o)) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("autoscale: " + what);
  };
  need(o_.min_replicas >= 1, fmt::format("min_replicas is {}; at least 1 must serve", o_.min_replicas));
  need(o_.max_replicas >= o_.min_replicas,
       fmt::format("max_replicas ({}) is below min_replicas ({})", o_.max_replicas, o_.min_replicas));
  need(o_.period_s > 0, "period_s must be above 0 (the HPA syncs every 15 s)");
  need(o_.tolerance >= 0 && o_.tolerance < 1, "tolerance must be in [0, 1) (the HPA's is 0.1)");
  need(o_.startup_s >= 0, "startup_s (a replica's model load) cannot be negative");
  need(o_.up_window_s >= 0 && o_.down_window_s >= 0, "the stabilization windows cannot be negative");
  need(o_.up_step >= 1 && o_.down_step >= 1, "up_step and down_step must be at least 1");
  need(o_.up_period_s > 0 && o_.down_period_s > 0, "up_period_s and down_period_s must be above 0");
  need(!o_.metrics.empty(), "no metrics: give at least one [[...autoscale.metrics]] with what and target");
  for (const autoscale_metric& m : o_.metrics) {
    need(m.target > 0, fmt::format("metric {}: its target must be above 0", to_string(m.what)));
  }
}

int32_t autoscaler::propose(const fleet_reading& r) const {
  const int32_t current = std::max(1, r.serving + r.starting);
  int32_t proposal = 0;
  for (size_t i = 0; i < o_.metrics.size(); ++i) {
    const double total = i < r.totals.size() ? std::max(0.0, r.totals[i]) : 0.0;
    const double ratio = total / current / o_.metrics[i].target;
    const int32_t p = std::abs(ratio - 1) <= o_.tolerance ? current
                                                          : static_cast<int32_t>(std::ceil(total / o_.metrics[i].target - 1e-9));
    proposal = std::max(proposal, p);
  }
  return std::clamp(proposal, o_.min_replicas, o_.max_replicas);
}

int32_t autoscaler::desired(double now_s, const fleet_reading& r) {
  const int32_t current = r.serving + r.starting;
  last_proposal_ = propose(r);
  proposals_.emplace_back(now_s, last_proposal_);
  const double longest = std::max({o_.up_window_s, o_.down_window_s, o_.up_period_s, o_.down_period_s});
  while (!proposals_.empty() && proposals_.front().first < now_s - longest) proposals_.pop_front();
  while (!changes_.empty() && changes_.front().first < now_s - longest) changes_.pop_front();

  // Stabilization: up to the smallest proposal of the up window, down to the largest of the down one.
  int32_t up = last_proposal_, down = last_proposal_;
  for (const auto& [t, p] : proposals_) {
    if (t >= now_s - o_.up_window_s) up = std::min(up, p);
    if (t >= now_s - o_.down_window_s) down = std::max(down, p);
  }
  int32_t target = current;
  if (up > current) target = up;
  else if (down < current) target = down;
  // Rate policies: what was already added (removed) within the period counts against the step.
  int32_t added = 0, removed = 0;
  for (const auto& [t, n] : changes_) {
    if (n > 0 && t > now_s - o_.up_period_s) added += n;
    if (n < 0 && t > now_s - o_.down_period_s) removed -= n;
  }
  if (target > current) target = std::min(target, current + std::max(0, o_.up_step - added));
  if (target < current) target = std::max(target, current - std::max(0, o_.down_step - removed));
  target = std::clamp(target, o_.min_replicas, o_.max_replicas);
  if (target != current) changes_.emplace_back(now_s, target - current);
  return target;
}

}  // namespace tireless
