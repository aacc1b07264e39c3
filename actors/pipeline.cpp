#include "actors/pipeline.hpp"

#include "actors/messages.hpp"
#include "scheduler/admission_gate.hpp"

#include <algorithm>
#include <thread>

namespace tireless {

pipeline spawn_pipeline(caf::actor_system& sys, const pipeline_options& o) {
  pipeline p;
  p.kv = spawn_kv_manager(sys, o.kv);
  p.shard = spawn_shard_supervisor(sys, o.shard, o.shard_restarts);
  p.gate = make_admission_gate(o.admission);
  p.admission = spawn_admission(sys, p.gate);
  engine_options eo = o.engine;
  eo.retry_after_late = [gate = p.gate](seq_id id, int64_t now_ns) {  // admission says when to come back
    auto lock = gate->lock();
    return gate->control().retry_after_late_start(id, now_ns);
  };
  p.engine = spawn_engine(sys, std::move(eo), p.kv, p.shard, p.admission);
  caf::anon_send(p.admission, attach_atom::value, p.engine);
  return p;
}

void configure_actor_system(caf::actor_system_config& cfg) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(std::max(2u, std::thread::hardware_concurrency())));
  // CAF's idle workers otherwise poll for 25-50 ms after each burst of messages, waking
  // thousands of times a second and pushing the model's compute threads off the cores
  // (measured: 14-18% of throughput on 2 cores; bench/results/bench_runtime_vs_bare.txt).
  // Messages from other threads wake a sleeping worker directly.
  cfg.set("work-stealing.aggressive-poll-attempts", size_t{1});
  cfg.set("work-stealing.moderate-poll-attempts", size_t{1});
}

pipeline_options make_pipeline_options(const runtime_config& c, const resolved_limits& lim,
                                       std::shared_ptr<backend> model) {
  const kv_geometry geo = model->kv();
  pipeline_options po;
  po.kv.blocks.n_blocks = geo.n_blocks;
  po.kv.blocks.block_size = geo.block_size;
  po.kv.blocks.prefix_caching = c.kv.prefix_caching;
  // Of the pool the backend has (which it may have sized itself: lim.kv_blocks = 0).
  po.kv.blocks.watermark_blocks = lim.kv_blocks > 0 ? lim.kv_watermark_blocks : watermark_blocks(c.kv.watermark, geo.n_blocks);
  po.engine.step_prior = model->cost_prior();
  po.shard.model = std::move(model);
  po.shard.simulated = c.backend.kind == backend_kind::sim;
  po.shard.crash_probability = c.faults.shard_crash_per_step;
  po.shard.crash_every = c.faults.shard_crash_every_steps;
  po.shard.slow_probability = c.faults.shard_slow_per_step;
  po.shard.slow_seconds = std::chrono::duration<double>(c.faults.shard_slow).count();
  po.shard.slow_factor = c.faults.shard_slow_factor;
  po.shard.seed = static_cast<uint64_t>(c.faults.seed);
  po.shard_restarts.max_restarts = c.backend.max_shard_restarts;
  po.shard_restarts.window = c.backend.shard_restart_window;
  po.admission.policy = c.admission.policy;
  po.admission.settings = c.admission;
  po.admission.tiers = c.tiers;
  po.admission.tenants = c.tenants;
  if (c.kv.prefix_caching) {
    po.admission.prefix_block_size = geo.block_size;
    po.admission.prefix_index_blocks = geo.n_blocks;
  }
  engine_options& eo = po.engine;
  eo.limits.max_step_tokens = c.engine.max_step_tokens;
  eo.limits.max_step_seqs = c.engine.max_step_seqs;
  eo.limits.max_preemptions = c.engine.max_preemptions;
  eo.limits.max_context = lim.max_context;
  eo.limits.block_size = geo.block_size;
  eo.limits.least_slack = c.admission.policy == admission_policy::least_slack;
  eo.max_waiting = c.engine.max_step_seqs;
  eo.rate_window_seconds = std::chrono::duration<double>(c.admission.pressure_window).count();
  eo.step_time_target_seconds = std::chrono::duration<double>(c.step_time_target()).count();
  eo.step_time_buckets_seconds.clear();
  for (double ms : c.metrics.step_time_buckets_ms) eo.step_time_buckets_seconds.push_back(ms / 1000);
  std::sort(eo.step_time_buckets_seconds.begin(), eo.step_time_buckets_seconds.end());
  return po;
}

int64_t door_capacity(const runtime_config& c, const pipeline_options& o) {
  // fcfs and least-slack model servers without admission control: an unbounded queue.
  if (c.admission.policy == admission_policy::fcfs || c.admission.policy == admission_policy::least_slack) {
    return int64_t{1} << 40;
  }
  int64_t queued = 0;
  for (const tier_settings& t : c.tiers) queued += t.queue_bound;
  return queued + o.engine.max_waiting + o.kv.blocks.n_blocks;
}

void add_to(runtime_stats& s, const engine_stats& e) {
  s.running = e.running;
  s.waiting_in_engine = e.waiting;
  s.steps = e.steps;
  s.max_mailbox_engine = e.max_mailbox;
  s.backend_problem = e.backend_problem;
  s.late_refusals = e.late_refusals;
  s.prefill_tokens = e.prefill_tokens;
  s.decode_tokens = e.decode_tokens;
  s.step_seconds = e.step_seconds;
  s.step_time_counts = e.step_time_counts;
}

void add_to(runtime_stats& s, const admission_stats& a) {
  s.queued_in_admission = a.queued;
  s.max_mailbox_admission = a.max_mailbox;
  s.queued_by_tier = a.queued_by_tier;
  s.timed_sessions = a.timed_sessions;
}

void add_to(runtime_stats& s, const kv_stats& k) {
  s.kv_blocks_total = k.blocks.total;
  s.kv_blocks_free = k.blocks.free;
  s.kv_blocks_cached_free = k.blocks.cached_free;
  s.kv_blocks_used = k.blocks.used;
  s.prefix_hit_blocks = k.blocks.prefix_hit_blocks;
  s.prefix_miss_blocks = k.blocks.prefix_miss_blocks;
  s.evictions = k.blocks.evictions;
  s.max_mailbox_kv_manager = k.max_mailbox;
}

void stop_pipeline(const pipeline& p) {
  for (const caf::actor& a : {p.engine, p.admission, p.kv, p.shard}) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
}

void add_replica(runtime_stats& t, const runtime_stats& r) {
  t.running += r.running;
  t.waiting_in_engine += r.waiting_in_engine;
  t.queued_in_admission += r.queued_in_admission;
  t.live_requests += r.live_requests;
  t.timed_sessions += r.timed_sessions;
  t.kv_blocks_total += r.kv_blocks_total;
  t.kv_blocks_free += r.kv_blocks_free;
  t.kv_blocks_cached_free += r.kv_blocks_cached_free;
  t.kv_blocks_used += r.kv_blocks_used;
  t.prefix_hit_blocks += r.prefix_hit_blocks;
  t.prefix_miss_blocks += r.prefix_miss_blocks;
  t.evictions += r.evictions;
  t.steps += r.steps;
  t.shard_restarts += r.shard_restarts;
  t.prefill_tokens += r.prefill_tokens;
  t.decode_tokens += r.decode_tokens;
  t.step_seconds += r.step_seconds;
  if (t.step_time_counts.size() < r.step_time_counts.size()) t.step_time_counts.resize(r.step_time_counts.size(), 0);
  for (size_t i = 0; i < r.step_time_counts.size(); ++i) t.step_time_counts[i] += r.step_time_counts[i];
  t.completed += r.completed;
  t.rejected += r.rejected;
  t.cancelled += r.cancelled;
  t.failed += r.failed;
  t.late_refusals += r.late_refusals;
  for (const auto& q : r.queued_by_tier) {
    auto it = std::find_if(t.queued_by_tier.begin(), t.queued_by_tier.end(), [&](const auto& e) { return e.first == q.first; });
    if (it == t.queued_by_tier.end()) {
      t.queued_by_tier.push_back(q);
    } else {
      it->second += q.second;
    }
  }
  t.max_mailbox_engine = std::max(t.max_mailbox_engine, r.max_mailbox_engine);
  t.max_mailbox_admission = std::max(t.max_mailbox_admission, r.max_mailbox_admission);
  t.max_mailbox_kv_manager = std::max(t.max_mailbox_kv_manager, r.max_mailbox_kv_manager);
  t.door_capacity += r.door_capacity;
  if (t.backend_problem.empty()) t.backend_problem = r.backend_problem;
}

}  // namespace tireless
