#pragma once
// The runtime's actors on CAF's deterministic test scheduler with the sim backend: virtual
// time, no threads, the same order of events every run. Requests enter through the same
// door as in the runtime.

#include <caf/all.hpp>

#include <map>
#include <memory>
#include <random>

#include "actors/messages.hpp"
#include "actors/pipeline.hpp"
#include "actors/request_door.hpp"
#include "actors/session.hpp"
#include "gpu/sim/sim_backend.hpp"

namespace tireless::test {

struct harness_options {
  int32_t kv_blocks = 256;
  int32_t block_size = 16;
  int32_t max_step_tokens = 256;
  int32_t max_step_seqs = 32;
  int32_t max_context = 2048;
  int32_t max_preemptions = 3;
  bool prefix_caching = true;
  std::vector<tier_settings> tiers = {tier("premium", 3, 64), tier("standard", 2, 64), tier("free", 1, 64)};
  admission_policy policy = admission_policy::priority;
  std::vector<tenant_settings> tenants;

  static tier_settings tier(std::string name, int32_t priority, int32_t queue_bound) {
    tier_settings t;
    t.name = std::move(name);
    t.priority = priority;
    t.queue_bound = queue_bound;
    t.ttft = std::chrono::seconds(10);
    t.tpot = std::chrono::seconds(1);
    return t;
  }
  double crash_probability = 0.0;
  int max_shard_restarts = 1 << 20;  // within a minute (virtual)
  uint64_t seed = 1;
  double step_time_target_seconds = 0;  // 0: steps bounded by tokens only
  // The engine's step-cost prior as a share of the backend's real cost (below 1: a machine
  // slower than its prior says, until the engine has measured its steps).
  double prior_scale = 1.0;
};

class sim_harness {
 public:
  explicit sim_harness(harness_options o = {}) : o_(o) {
    cfg_.set("scheduler.policy", caf::atom("testing"));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    sched_ = &dynamic_cast<caf::scheduler::test_coordinator&>(sys_->scheduler());
    // A fixed cost model (about a 2-core CPU on SmolLM2), so tests do not move when the
    // shipped profiles are recalibrated.
    sim::sim_profile profile = sim::named_profile("cpu-smollm2");
    profile.cost = {0.004, 0.0015, 0.004, 2e-6, std::nullopt};
    profile.kv.n_blocks = o.kv_blocks;
    profile.kv.block_size = o.block_size;
    profile.limits.max_context = o.max_context;
    profile.limits.max_step_tokens = o.max_step_tokens;
    profile.limits.max_step_seqs = o.max_step_seqs;
    backend_ = std::make_shared<sim::sim_backend>(profile);
    pipeline_options po;
    po.kv.blocks = {o.kv_blocks, o.block_size, o.prefix_caching, 0};
    po.kv.check_invariants = true;
    po.shard.model = backend_;
    po.engine.step_prior = backend_->cost_prior();
    for (double* c : {&po.engine.step_prior.c0, &po.engine.step_prior.per_prefill_token,
                      &po.engine.step_prior.per_decode_seq, &po.engine.step_prior.per_thousand_context}) {
      *c *= o.prior_scale;
    }
    po.shard.simulated = true;
    po.shard.crash_probability = o.crash_probability;
    po.shard.seed = o.seed;
    po.shard_restarts.max_restarts = o.max_shard_restarts;
    po.admission.tiers = o.tiers;
    po.admission.tenants = o.tenants;
    po.admission.policy = o.policy;
    po.engine.limits = {o.max_step_tokens, o.max_step_seqs, o.max_preemptions, o.max_context, o.block_size};
    po.engine.max_waiting = o.max_step_seqs;
    po.engine.step_time_target_seconds = o.step_time_target_seconds;
    pipeline_ = spawn_pipeline(*sys_, po);
    int32_t queued = 0;
    for (const auto& t : o.tiers) queued += t.queue_bound;
    door_ = std::make_unique<request_door>(queued + o.max_step_seqs + o.kv_blocks);
    run();
  }

  ~sim_harness() {
    stop_pipeline(pipeline_);
    run();
  }

  // Submits through the door; returns the id. tier is an index into the options' tiers.
  uint64_t submit(request r, size_t tier = 0) {
    const uint64_t id = next_id_++;
    if (!door_->enter()) {
      outcome o;
      o.request_id = id;
      o.kind = outcome_kind::rejected;
      o.reason = "overloaded";
      o.retry_after_ms = 1000;  // as runtime::submit
      record(o);
      return id;
    }
    auto reporter = std::make_shared<request_reporter>(
        id, nullptr, [this](const outcome& o) { record(o); }, [this](const outcome&) { door_->leave(); });
    session_options so;
    so.reporter = reporter;
    so.req = std::move(r);
    so.tenant = "t";
    so.tier = o_.tiers[tier].name;
    so.tier_priority = o_.tiers[tier].priority;
    so.limits = {o_.max_context, o_.max_context - 1, 16};
    so.admission = pipeline_.admission;
    sessions_[id] = spawn_session(*sys_, std::move(so));
    return id;
  }

  void cancel(uint64_t id) {
    if (auto it = sessions_.find(id); it != sessions_.end()) caf::anon_send(it->second, cancel_atom::value, int32_t{0});
  }
  void crash_shard() { caf::anon_send(pipeline_.shard, crash_atom::value); }

  // Runs every message, then lets virtual time pass to the next timeout, until nothing is left.
  void run() {
    do {
      sched_->run();
    } while (sched_->trigger_timeout());
    sched_->run();
  }
  // Runs messages and timeouts for at most `span` of virtual time.
  void run_for(caf::timespan span) {
    const auto until = sched_->clock().now() + span;
    for (;;) {
      sched_->run();
      if (sched_->clock().schedule().empty()) return;
      const auto next = sched_->clock().schedule().begin()->first;
      if (next > until) {
        sched_->clock().advance_time(until - sched_->clock().now());
        sched_->run();
        return;
      }
      sched_->trigger_timeout();
    }
  }

  engine_stats engine() {
    engine_stats out;
    ask(pipeline_.engine, [&](const engine_stats& e) { out = e; });
    return out;
  }
  kv_stats kv() {
    kv_stats out;
    ask(pipeline_.kv, [&](const kv_stats& k) { out = k; });
    return out;
  }
  admission_stats admission() {
    admission_stats out;
    ask(pipeline_.admission, [&](const admission_stats& a) { out = a; });
    return out;
  }
  int shard_restarts() {
    int out = -1;
    ask(pipeline_.shard, [&](int restarts) { out = restarts; });
    return out;
  }

  const std::map<uint64_t, std::vector<outcome>>& outcomes() const { return outcomes_; }
  const pipeline& actors() const { return pipeline_; }
  sim::sim_backend& backend() { return *backend_; }
  const request_door& door() const { return *door_; }
  caf::actor_system& system() { return *sys_; }
  caf::scheduler::test_coordinator& scheduler() { return *sched_; }

 private:
  void record(const outcome& o) { outcomes_[o.request_id].push_back(o); }

  template <class F>
  void ask(const caf::actor& a, F f) {
    caf::scoped_actor self{*sys_};
    auto reply = self->request(a, caf::infinite, stats_atom::value);
    sched_->run();
    reply.receive(f, [](caf::error&) {});
  }

  harness_options o_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::scheduler::test_coordinator* sched_ = nullptr;
  std::shared_ptr<sim::sim_backend> backend_;
  pipeline pipeline_;
  std::unique_ptr<request_door> door_;
  std::map<uint64_t, caf::actor> sessions_;
  std::map<uint64_t, std::vector<outcome>> outcomes_;
  uint64_t next_id_ = 1;
};

inline request tokens_request(int prompt_tokens, int max_tokens, uint32_t salt = 0) {
  request r;
  for (int i = 0; i < prompt_tokens; ++i) r.prompt_tokens.push_back(1000 + static_cast<int32_t>((i * 31 + salt * 7) % 5000));
  r.max_tokens = max_tokens;
  return r;
}

}  // namespace tireless::test
