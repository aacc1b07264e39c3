#pragma once
// The server's Prometheus metrics (prometheus-cpp), named with metrics.prefix ("tireless_..."):
//
// From every ended request (observe(), any transport), by tier (and tenant with
// metrics.per_tenant):
//   _requests_total{outcome, reason, tier[, tenant]}, _prompt_tokens_total, _generation_tokens_total,
//   _preemptions_total, _degradations_total{tier, rung}, and histograms (metrics.* buckets):
//   _time_to_first_token_seconds, _time_per_output_token_seconds, _e2e_request_latency_seconds,
//   _request_queue_time_seconds, each {tier}; _slo_requests_total{tier, met}: requests that ran,
//   "true" when completed within the tier's TTFT and TPOT targets (failed, deadline-cancelled
//   and late ones "false"; refusals are counted by _requests_total, not here).
// From the config: _tier_ttft_target_seconds{tier}, _tier_tpot_target_seconds{tier}.
// From the runtime at each scrape (update()):
//   _num_requests_running, _num_requests_waiting (admission's queues and the engine's waiting
//   room), _queue_depth{tier}, _kv_cache_usage_perc (0..1), _kv_blocks{state}, _cache_config_info
//   {block_size, num_gpu_blocks}, _live_requests, _door_capacity, _steps_total,
//   _prefill_tokens_processed_total, _decode_tokens_processed_total, _step_time_seconds
//   (histogram), _refusals_after_admission_total, _shard_restarts_total, _prefix_cache_*_total,
//   _kv_evictions_total, _backend_up.
// With MoE experts on expert shards: _expert_pairs_total{expert} (token-expert pairs, all
//   layers), _expert_shard_pairs_total{shard}, _expert_shards{state: live, fenced},
//   _expert_shard_failures_total, _expert_shard_revivals_total, _expert_rebalances_total,
//   _expert_replicas, _expert_shard_imbalance, _expert_wire_bytes_total{direction: out, in},
//   _expert_dispatch_seconds_total, _expert_layer_calls_total, _expert_last_recovery_seconds.
//
// The Gateway API Inference Extension's model-server protocol reads _num_requests_waiting
// (TotalQueuedRequests), _num_requests_running (TotalRunningRequests), _kv_cache_usage_perc
// (KVCacheUtilization, 0..1) and _cache_config_info (block size, in vLLM's label format).

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/runtime_config.hpp"
#include "tireless/outcome.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

class server_metrics {
 public:
  server_metrics(const runtime_config& config, int32_t kv_block_size);

  // An ended request of the tenant holding `api_key` (thread-safe).
  void observe(const std::string& api_key, const outcome& o);
  // The runtime's state now (thread-safe; call before each scrape).
  void update(const runtime_stats& s);
  // Everything in Prometheus's text format.
  std::string text() const;
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // A short label for a degradation sentence ("max_tokens_cap", "infeasible_prompt", "other").
  static std::string rung_of(const std::string& degradation);

 private:
  struct labels_of_key {
    std::string tenant, tier;
  };
  labels_of_key labels(const std::string& api_key) const;
  prometheus::Histogram& histogram(prometheus::Family<prometheus::Histogram>& f, const std::string& tier,
                                   const std::vector<double>& bounds_ms);
  // Counters that follow a total the runtime keeps: add what it grew by since the last update.
  void follow(prometheus::Counter& c, double total);

  std::shared_ptr<prometheus::Registry> registry_;
  bool per_tenant_;
  std::map<std::string, std::string> tenant_of_key_, tier_of_tenant_;
  struct targets {
    double ttft_ms = 0, tpot_ms = 0;  // 0: none
  };
  std::map<std::string, targets> targets_of_tier_;
  std::string default_tier_;
  std::vector<double> ttft_ms_, tpot_ms_;  // bucket bounds (e2e and queue time use the TTFT ones)

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& prompt_tokens_;
  prometheus::Family<prometheus::Counter>& generation_tokens_;
  prometheus::Family<prometheus::Counter>& preemptions_;
  prometheus::Family<prometheus::Counter>& degradations_;
  prometheus::Family<prometheus::Histogram>& ttft_;
  prometheus::Family<prometheus::Histogram>& tpot_;
  prometheus::Family<prometheus::Histogram>& e2e_;
  prometheus::Family<prometheus::Histogram>& queue_time_;
  prometheus::Family<prometheus::Counter>& slo_;
  prometheus::Family<prometheus::Gauge>& ttft_target_;
  prometheus::Family<prometheus::Gauge>& tpot_target_;

  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Gauge& kv_usage_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_;
  prometheus::Family<prometheus::Gauge>& cache_info_;
  prometheus::Gauge& live_;
  prometheus::Gauge& door_;
  prometheus::Gauge& backend_up_;
  prometheus::Counter& steps_;
  prometheus::Counter& prefill_processed_;
  prometheus::Counter& decode_processed_;
  prometheus::Counter& late_refusals_;
  prometheus::Counter& shard_restarts_;
  // MoE experts on expert shards: series added at the first update that has shards.
  prometheus::Family<prometheus::Counter>&expert_pairs_, &expert_shard_pairs_, &expert_failures_, &expert_revivals_,
      &expert_rebalances_, &expert_calls_, &expert_dispatch_, &expert_wire_bytes_;
  prometheus::Family<prometheus::Gauge>&expert_shards_, &expert_replicas_, &expert_imbalance_, &expert_recovery_;
  void update_experts(const runtime_stats::experts_stats& e);
  prometheus::Counter& prefix_hits_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& evictions_;
  prometheus::Histogram& step_time_;
  std::vector<double> step_bounds_seconds_;
  int32_t kv_block_size_;
  bool cache_info_set_ = false;

  mutable std::mutex mu_;  // update()'s bookkeeping of the runtime's totals
  std::map<const prometheus::Counter*, double> followed_;
  std::vector<int64_t> step_counts_seen_;
  double step_seconds_seen_ = 0;
};

// A Prometheus collectable that asks the runtime for its state at each scrape (for
// prometheus-cpp's own HTTP exposer on server.metrics_listen).
class scraped_metrics final : public prometheus::Collectable {
 public:
  scraped_metrics(runtime& rt, server_metrics& m) : rt_(rt), m_(m) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  runtime& rt_;
  server_metrics& m_;
};

}  // namespace tireless
