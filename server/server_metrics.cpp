#include "server/server_metrics.hpp"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace tireless {

namespace {

std::string name(const runtime_config& c, const char* suffix) { return c.metrics.prefix + "_" + suffix; }

prometheus::Histogram::BucketBoundaries seconds_of(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  for (double& x : ms) x /= 1000.0;
  return ms;
}

}  // namespace

server_metrics::server_metrics(const runtime_config& c, int32_t kv_block_size)
    : registry_(std::make_shared<prometheus::Registry>()),
      per_tenant_(c.metrics.per_tenant),
      default_tier_(c.tiers.empty() ? "" : c.tiers.front().name),
      ttft_ms_(c.metrics.ttft_buckets_ms),
      tpot_ms_(c.metrics.tpot_buckets_ms),
      requests_(prometheus::BuildCounter().Name(name(c, "requests_total"))
                    .Help("Requests that ended, by outcome (completed, rejected, cancelled, failed), reason and tier")
                    .Register(*registry_)),
      prompt_tokens_(prometheus::BuildCounter().Name(name(c, "prompt_tokens_total"))
                         .Help("Prompt tokens of ended requests, by tier").Register(*registry_)),
      generation_tokens_(prometheus::BuildCounter().Name(name(c, "generation_tokens_total"))
                             .Help("Tokens generated for ended requests, by tier").Register(*registry_)),
      preemptions_(prometheus::BuildCounter().Name(name(c, "preemptions_total"))
                       .Help("Preemptions of ended requests (KV given up, recomputed later), by tier")
                       .Register(*registry_)),
      degradations_(prometheus::BuildCounter().Name(name(c, "degradations_total"))
                        .Help("Degradations applied to requests because of load, by tier and rung")
                        .Register(*registry_)),
      ttft_(prometheus::BuildHistogram().Name(name(c, "time_to_first_token_seconds"))
                .Help("Arrival to first token, by tier").Register(*registry_)),
      tpot_(prometheus::BuildHistogram().Name(name(c, "time_per_output_token_seconds"))
                .Help("Mean time between tokens after the first, per request, by tier").Register(*registry_)),
      e2e_(prometheus::BuildHistogram().Name(name(c, "e2e_request_latency_seconds"))
               .Help("Arrival to outcome of completed requests, by tier").Register(*registry_)),
      queue_time_(prometheus::BuildHistogram().Name(name(c, "request_queue_time_seconds"))
                      .Help("Arrival to first scheduled, by tier").Register(*registry_)),
      slo_(prometheus::BuildCounter().Name(name(c, "slo_requests_total"))
               .Help("Requests that ran, by tier and whether they met its TTFT and TPOT targets").Register(*registry_)),
      ttft_target_(prometheus::BuildGauge().Name(name(c, "tier_ttft_target_seconds"))
                       .Help("Each tier's time-to-first-token target").Register(*registry_)),
      tpot_target_(prometheus::BuildGauge().Name(name(c, "tier_tpot_target_seconds"))
                       .Help("Each tier's time-per-output-token target").Register(*registry_)),
      running_(prometheus::BuildGauge().Name(name(c, "num_requests_running"))
                   .Help("Requests holding KV and being stepped").Register(*registry_).Add({})),
      waiting_(prometheus::BuildGauge().Name(name(c, "num_requests_waiting"))
                   .Help("Requests waiting: in admission's tier queues and the engine's waiting room")
                   .Register(*registry_).Add({})),
      queue_depth_(prometheus::BuildGauge().Name(name(c, "queue_depth"))
                       .Help("Requests waiting in admission, by tier").Register(*registry_)),
      kv_usage_(prometheus::BuildGauge().Name(name(c, "kv_cache_usage_perc"))
                    .Help("KV cache blocks in use, as a fraction of all (0..1)").Register(*registry_).Add({})),
      kv_blocks_(prometheus::BuildGauge().Name(name(c, "kv_blocks"))
                     .Help("KV cache blocks by state (used, free, cached_free: free but holding a reusable prefix)")
                     .Register(*registry_)),
      cache_info_(prometheus::BuildGauge().Name(name(c, "cache_config_info"))
                      .Help("The KV cache's configuration, in labels").Register(*registry_)),
      live_(prometheus::BuildGauge().Name(name(c, "live_requests"))
                .Help("Requests inside the runtime (admission, engine, sessions)").Register(*registry_).Add({})),
      door_(prometheus::BuildGauge().Name(name(c, "door_capacity"))
                .Help("The most requests the runtime holds at once").Register(*registry_).Add({})),
      backend_up_(prometheus::BuildGauge().Name(name(c, "backend_up"))
                      .Help("1 while the model shard can serve; 0 once it failed for good (restart the process)")
                      .Register(*registry_).Add({})),
      steps_(prometheus::BuildCounter().Name(name(c, "steps_total")).Help("Engine steps run")
                 .Register(*registry_).Add({})),
      prefill_processed_(prometheus::BuildCounter().Name(name(c, "prefill_tokens_processed_total"))
                             .Help("Prompt tokens prefilled by the engine's steps").Register(*registry_).Add({})),
      decode_processed_(prometheus::BuildCounter().Name(name(c, "decode_tokens_processed_total"))
                            .Help("Tokens decoded by the engine's steps").Register(*registry_).Add({})),
      late_refusals_(prometheus::BuildCounter().Name(name(c, "refusals_after_admission_total"))
                         .Help("Admitted requests refused before they started (past their tier's start bound); "
                               "refusals at arrival are the other rejected requests")
                         .Register(*registry_).Add({})),
      shard_restarts_(prometheus::BuildCounter().Name(name(c, "shard_restarts_total"))
                          .Help("Model shard crashes its supervisor restarted").Register(*registry_).Add({})),
      expert_pairs_(prometheus::BuildCounter().Name(name(c, "expert_pairs_total"))
                        .Help("MoE: token-expert pairs computed on expert shards, by expert (all layers)")
                        .Register(*registry_)),
      expert_shard_pairs_(prometheus::BuildCounter().Name(name(c, "expert_shard_pairs_total"))
                              .Help("MoE: token-expert pairs each expert shard computed").Register(*registry_)),
      expert_failures_(prometheus::BuildCounter().Name(name(c, "expert_shard_failures_total"))
                           .Help("MoE: calls to an expert shard that failed (its pairs went to replicas or waited for it)")
                           .Register(*registry_)),
      expert_revivals_(prometheus::BuildCounter().Name(name(c, "expert_shard_revivals_total"))
                           .Help("MoE: failed expert shards brought back (restarted, reconnected)").Register(*registry_)),
      expert_rebalances_(prometheus::BuildCounter().Name(name(c, "expert_rebalances_total"))
                             .Help("MoE: times hot experts were replicated from the measured load").Register(*registry_)),
      expert_calls_(prometheus::BuildCounter().Name(name(c, "expert_layer_calls_total"))
                        .Help("MoE: layer calls dispatched to expert shards").Register(*registry_)),
      expert_dispatch_(prometheus::BuildCounter().Name(name(c, "expert_dispatch_seconds_total"))
                           .Help("MoE: time of layer calls beyond their slowest shard's compute").Register(*registry_)),
      expert_wire_bytes_(prometheus::BuildCounter().Name(name(c, "expert_wire_bytes_total"))
                             .Help("MoE: serialized bytes to (out) and from (in) expert shards").Register(*registry_)),
      expert_shards_(prometheus::BuildGauge().Name(name(c, "expert_shards"))
                         .Help("MoE: expert shards by state (live, fenced)").Register(*registry_)),
      expert_replicas_(prometheus::BuildGauge().Name(name(c, "expert_replicas"))
                           .Help("MoE: expert copies beyond one per expert and layer").Register(*registry_)),
      expert_imbalance_(prometheus::BuildGauge().Name(name(c, "expert_shard_imbalance"))
                            .Help("MoE: max over mean pairs per shard, per layer, since the last rebalance")
                            .Register(*registry_)),
      expert_recovery_(prometheus::BuildGauge().Name(name(c, "expert_last_recovery_seconds"))
                           .Help("MoE: from the last failed shard call to its layer's completion").Register(*registry_)),
      prefix_hits_(prometheus::BuildCounter().Name(name(c, "prefix_cache_hits_total"))
                       .Help("KV blocks found in the prefix cache").Register(*registry_).Add({})),
      prefix_queries_(prometheus::BuildCounter().Name(name(c, "prefix_cache_queries_total"))
                          .Help("KV blocks looked up in the prefix cache").Register(*registry_).Add({})),
      evictions_(prometheus::BuildCounter().Name(name(c, "kv_evictions_total"))
                     .Help("Cached KV blocks evicted for reuse").Register(*registry_).Add({})),
      step_time_(prometheus::BuildHistogram().Name(name(c, "step_time_seconds"))
                     .Help("Engine step durations").Register(*registry_)
                     .Add({}, seconds_of(c.metrics.step_time_buckets_ms))),
      step_bounds_seconds_(seconds_of(c.metrics.step_time_buckets_ms)),
      kv_block_size_(kv_block_size) {
  for (const tenant_settings& t : c.tenants) {
    for (const std::string& k : t.keys) tenant_of_key_[k] = t.name;
    tier_of_tenant_[t.name] = t.tier;
  }
  backend_up_.Set(1);
  // Every tier's series exist from the start (a dashboard or alert sees 0, not "no data").
  for (const tier_settings& t : c.tiers) {
    targets_of_tier_[t.name] = {static_cast<double>(t.ttft.count()), static_cast<double>(t.tpot.count())};
    if (t.ttft.count() > 0) ttft_target_.Add({{"tier", t.name}}).Set(t.ttft.count() / 1000.0);
    if (t.tpot.count() > 0) tpot_target_.Add({{"tier", t.name}}).Set(t.tpot.count() / 1000.0);
    slo_.Add({{"tier", t.name}, {"met", "true"}});
    slo_.Add({{"tier", t.name}, {"met", "false"}});
    queue_depth_.Add({{"tier", t.name}}).Set(0);
    histogram(ttft_, t.name, ttft_ms_);
    histogram(tpot_, t.name, tpot_ms_);
    histogram(e2e_, t.name, ttft_ms_);
    histogram(queue_time_, t.name, ttft_ms_);
    requests_.Add({{"tier", t.name}, {"outcome", "completed"}, {"reason", "stop_token"}});
  }
}

server_metrics::labels_of_key server_metrics::labels(const std::string& api_key) const {
  labels_of_key l;
  if (auto it = tenant_of_key_.find(api_key); it != tenant_of_key_.end()) {
    l.tenant = it->second;
    l.tier = tier_of_tenant_.at(it->second);
  } else if (tenant_of_key_.empty()) {
    l.tier = default_tier_;  // no tenants: every request is the first tier's
  } else {
    l.tier = "none";  // an unknown key: refused, unauthenticated
  }
  return l;
}

prometheus::Histogram& server_metrics::histogram(prometheus::Family<prometheus::Histogram>& f, const std::string& tier,
                                                 const std::vector<double>& bounds_ms) {
  return f.Add({{"tier", tier}}, seconds_of(bounds_ms));
}

std::string server_metrics::rung_of(const std::string& d) {
  if (d.rfind("max_tokens capped", 0) == 0) return "max_tokens_cap";
  if (d.find("cannot start within") != std::string::npos) return "infeasible_prompt";
  return "other";
}

void server_metrics::observe(const std::string& api_key, const outcome& o) {
  const labels_of_key l = labels(api_key);
  const char* kind = o.kind == outcome_kind::completed   ? "completed"
                     : o.kind == outcome_kind::rejected  ? "rejected"
                     : o.kind == outcome_kind::cancelled ? "cancelled"
                                                         : "failed";
  prometheus::Labels labels{{"tier", l.tier}, {"outcome", kind}, {"reason", o.reason}};
  if (per_tenant_ && !l.tenant.empty()) labels["tenant"] = l.tenant;
  requests_.Add(labels).Increment();
  prompt_tokens_.Add({{"tier", l.tier}}).Increment(o.prompt_tokens);
  generation_tokens_.Add({{"tier", l.tier}}).Increment(o.completion_tokens);
  if (o.preemptions > 0) preemptions_.Add({{"tier", l.tier}}).Increment(o.preemptions);
  for (const std::string& d : o.degradations) degradations_.Add({{"tier", l.tier}, {"rung", rung_of(d)}}).Increment();
  const bool ran = o.kind == outcome_kind::failed || o.time_to_first_token_ms >= 0 ||
                   (o.kind == outcome_kind::cancelled && o.reason == reason::deadline);
  if (!ran) return;  // refused, or cancelled by its client before it started
  double per_token_ms = 0;
  if (o.time_to_first_token_ms >= 0) {
    histogram(ttft_, l.tier, ttft_ms_).Observe(o.time_to_first_token_ms / 1000.0);
    histogram(queue_time_, l.tier, ttft_ms_).Observe(o.queued_ms / 1000.0);
    if (o.completion_tokens > 1) {
      per_token_ms = std::max((o.total_ms - o.time_to_first_token_ms) / (o.completion_tokens - 1), 0.0);
      histogram(tpot_, l.tier, tpot_ms_).Observe(per_token_ms / 1000.0);
    }
  }
  if (o.kind != outcome_kind::cancelled || o.reason == reason::deadline) {
    const auto t = targets_of_tier_.find(l.tier);
    const targets tg = t == targets_of_tier_.end() ? targets{} : t->second;
    const bool met = o.kind == outcome_kind::completed &&
                     (tg.ttft_ms <= 0 || o.time_to_first_token_ms <= tg.ttft_ms) &&
                     (tg.tpot_ms <= 0 || per_token_ms <= tg.tpot_ms);
    slo_.Add({{"tier", l.tier}, {"met", met ? "true" : "false"}}).Increment();
  }
  if (o.kind == outcome_kind::completed) histogram(e2e_, l.tier, ttft_ms_).Observe(o.total_ms / 1000.0);
}

void server_metrics::follow(prometheus::Counter& c, double total) {
  double& seen = followed_[&c];
  if (total > seen) c.Increment(total - seen);
  seen = std::max(seen, total);
}

void server_metrics::update(const runtime_stats& s) {
  std::lock_guard lock(mu_);
  running_.Set(s.running);
  waiting_.Set(s.queued_in_admission + s.waiting_in_engine);
  for (const auto& [tier, n] : s.queued_by_tier) queue_depth_.Add({{"tier", tier}}).Set(n);
  kv_usage_.Set(s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  kv_blocks_.Add({{"state", "used"}}).Set(s.kv_blocks_used);
  kv_blocks_.Add({{"state", "free"}}).Set(s.kv_blocks_free);
  kv_blocks_.Add({{"state", "cached_free"}}).Set(s.kv_blocks_cached_free);
  if (!cache_info_set_ && s.kv_blocks_total > 0) {  // the pool's size is known once the runtime runs
    cache_info_.Add({{"block_size", std::to_string(kv_block_size_)}, {"num_gpu_blocks", std::to_string(s.kv_blocks_total)}})
        .Set(1);
    cache_info_set_ = true;
  }
  live_.Set(s.live_requests);
  door_.Set(static_cast<double>(s.door_capacity));
  backend_up_.Set(s.backend_problem.empty() ? 1 : 0);
  follow(steps_, static_cast<double>(s.steps));
  follow(prefill_processed_, static_cast<double>(s.prefill_tokens));
  follow(decode_processed_, static_cast<double>(s.decode_tokens));
  follow(late_refusals_, static_cast<double>(s.late_refusals));
  follow(shard_restarts_, static_cast<double>(s.shard_restarts));
  follow(prefix_hits_, static_cast<double>(s.prefix_hit_blocks));
  follow(prefix_queries_, static_cast<double>(s.prefix_hit_blocks + s.prefix_miss_blocks));
  follow(evictions_, static_cast<double>(s.evictions));
  if (s.experts.shards > 0) update_experts(s.experts);
  // The step-time histogram: the runtime's bucket counts grew by this much since the last update.
  if (s.step_time_counts.size() == step_bounds_seconds_.size() + 1) {
    step_counts_seen_.resize(s.step_time_counts.size());
    std::vector<double> increments(s.step_time_counts.size());
    bool grew = false;
    for (size_t i = 0; i < increments.size(); ++i) {
      increments[i] = static_cast<double>(std::max<int64_t>(s.step_time_counts[i] - step_counts_seen_[i], 0));
      grew |= increments[i] > 0;
      step_counts_seen_[i] = std::max(step_counts_seen_[i], s.step_time_counts[i]);
    }
    if (grew) step_time_.ObserveMultiple(increments, std::max(s.step_seconds - step_seconds_seen_, 0.0));
    step_seconds_seen_ = std::max(step_seconds_seen_, s.step_seconds);
  }
}

void server_metrics::update_experts(const runtime_stats::experts_stats& e) {
  for (size_t i = 0; i < e.pairs_per_expert.size(); ++i) {
    follow(expert_pairs_.Add({{"expert", std::to_string(i)}}), static_cast<double>(e.pairs_per_expert[i]));
  }
  for (size_t i = 0; i < e.pairs_per_shard.size(); ++i) {
    follow(expert_shard_pairs_.Add({{"shard", std::to_string(i)}}), static_cast<double>(e.pairs_per_shard[i]));
  }
  follow(expert_failures_.Add({}), static_cast<double>(e.failures));
  follow(expert_revivals_.Add({}), static_cast<double>(e.revivals));
  follow(expert_rebalances_.Add({}), static_cast<double>(e.rebalances));
  follow(expert_calls_.Add({}), static_cast<double>(e.calls));
  follow(expert_dispatch_.Add({}), e.dispatch_seconds);
  follow(expert_wire_bytes_.Add({{"direction", "out"}}), static_cast<double>(e.bytes_out));
  follow(expert_wire_bytes_.Add({{"direction", "in"}}), static_cast<double>(e.bytes_in));
  expert_shards_.Add({{"state", "live"}}).Set(e.live);
  expert_shards_.Add({{"state", "fenced"}}).Set(e.fenced);
  expert_replicas_.Add({}).Set(static_cast<double>(e.replicas));
  expert_imbalance_.Add({}).Set(e.shard_imbalance);
  expert_recovery_.Add({}).Set(e.last_recovery_seconds);
}

std::string server_metrics::text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

std::vector<prometheus::MetricFamily> scraped_metrics::Collect() const {
  m_.update(rt_.stats());
  return m_.registry()->Collect();
}

}  // namespace tireless
