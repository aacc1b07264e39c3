#include "actors/virtual_runtime.hpp"

#include <caf/all.hpp>

#include <fmt/format.h>

#include "actors/intake.hpp"
#include "actors/messages.hpp"
#include "actors/pipeline.hpp"
#include "actors/sim_config.hpp"
#include "scheduler/router.hpp"

#include <unordered_map>
#include <vector>

namespace tireless {

namespace {

// One replica: its configuration (the intake keeps a reference), backend, actors and intake.
struct replica {
  runtime_config cfg;
  resolved_limits lim;
  std::shared_ptr<sim::sim_backend> be;
  pipeline actors;
  std::unique_ptr<intake> entry;
  double ready_at = 0;        // virtual seconds: it serves from then (its model is loaded)
  double retired_at = -1;     // >= 0: takes no new requests since then
  int64_t rejected_seen = 0;  // its intake's refusals at the last autoscaler sync
  bool serves(double now) const { return retired_at < 0 && now >= ready_at; }
  bool paid() const { return retired_at < 0; }
};

// A replica's share of a tenant's quotas: the router spreads a tenant's requests over the
// fleet, so each replica enforces 1/n of them (rounded up) and the fleet about the whole.
void share_quotas(runtime_config& c, int32_t n) {
  if (n <= 1) return;
  for (tenant_settings& t : c.tenants) {
    if (t.requests_per_minute > 0) t.requests_per_minute = (t.requests_per_minute + n - 1) / n;
    if (t.tokens_per_minute > 0) t.tokens_per_minute = (t.tokens_per_minute + n - 1) / n;
    if (t.max_concurrent > 0) t.max_concurrent = (t.max_concurrent + n - 1) / n;
  }
}

}  // namespace

struct virtual_runtime::impl {
  runtime_config cfg;
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::vector<std::unique_ptr<replica>> replicas;
  tireless::router router;
  caf::actor_clock::time_point start;
  // Fleet request ids -> (replica, its intake's id); only with more than one replica.
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, std::pair<int32_t, uint64_t>> placed;
  std::vector<int64_t> routed;
  std::vector<int32_t> outstanding;  // per replica: routed there, no outcome yet
  bool fleet = false;                // more than one replica, or one that may grow: ids are the fleet's
  int32_t quota_share = 1;           // each replica enforces 1/quota_share of every tenant's quotas
  std::optional<autoscaler> scaler;
  double next_sync = 0;
  std::vector<fleet_sample> timeline;
  double paid_seconds = 0, paid_since = 0;  // replica-seconds up to paid_since

  double now() const { return std::chrono::duration<double>(sched->clock().now() - start).count(); }
  void add_replica(double ready_at);
  void advance_to(double t);
  void sync();
  int32_t paid_count() const {
    int32_t n = 0;
    for (const auto& r : replicas) n += r->paid();
    return n;
  }
  void account(double t) {
    paid_seconds += paid_count() * (t - paid_since);
    paid_since = t;
  }

  template <class F>
  void ask(const caf::actor& a, F f) {
    caf::scoped_actor self{*sys};
    auto reply = self->request(a, caf::infinite, stats_atom::value);
    sched->run();
    reply.receive(f, [](caf::error&) {});
  }
};

void virtual_runtime::impl::add_replica(double ready) {
  auto r = std::make_unique<replica>();
  r->cfg = cfg;
  share_quotas(r->cfg, quota_share);
  r->be = make_configured_sim(r->cfg, r->lim, true);
  const pipeline_options po = make_pipeline_options(r->cfg, r->lim, r->be);
  r->actors = spawn_pipeline(*sys, po);
  r->entry = std::make_unique<intake>(*sys, r->cfg, r->lim, nullptr, r->actors, door_capacity(r->cfg, po));
  r->ready_at = ready;
  replicas.push_back(std::move(r));
  routed.push_back(0);
  outstanding.push_back(0);
  sched->run();
}

virtual_runtime::virtual_runtime(const runtime_config& config, int32_t replicas)
    : virtual_runtime(config, fleet_options{replicas, std::nullopt}) {}

virtual_runtime::virtual_runtime(const runtime_config& config, const fleet_options& fleet) : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  m.cfg = config;
  if (m.cfg.backend.kind != backend_kind::sim) {
    throw std::runtime_error("the virtual-time runtime runs the sim backend only: set backend.kind = \"sim\"");
  }
  int32_t replicas = fleet.replicas;
  if (fleet.autoscale) {
    m.scaler.emplace(*fleet.autoscale);  // throws on bad options
    replicas = std::clamp(replicas, fleet.autoscale->min_replicas, fleet.autoscale->max_replicas);
    m.next_sync = fleet.autoscale->period_s;
  }
  if (replicas < 1) throw std::invalid_argument(fmt::format("a fleet of {} replicas: at least one is needed", replicas));
  m.fleet = replicas > 1 || m.scaler.has_value();
  m.quota_share = replicas;
  m.sys_cfg.set("scheduler.policy", caf::atom("testing"));
  m.sys = std::make_unique<caf::actor_system>(m.sys_cfg);
  m.sched = &dynamic_cast<caf::scheduler::test_coordinator&>(m.sys->scheduler());
  m.start = m.sched->clock().now();
  for (int32_t i = 0; i < replicas; ++i) m.add_replica(0);
}

virtual_runtime::~virtual_runtime() {
  impl& m = *impl_;
  for (auto& r : m.replicas) {
    r->entry->close();
    r->entry->cancel_all();
  }
  run();
  for (auto& r : m.replicas) {
    stop_pipeline(r->actors);
    r->entry->detach();
    r->actors = pipeline{};
  }
  m.sched->run();
}

uint64_t virtual_runtime::submit(request r, runtime::token_callback on_token, runtime::outcome_callback on_outcome) {
  impl& m = *impl_;
  if (!m.fleet) {
    ++m.routed[0];
    return m.replicas[0]->entry->submit(std::move(r), std::move(on_token), std::move(on_outcome));
  }
  // The router picks from what each serving replica publishes; the request's id is the fleet's.
  std::vector<replica_view> views;
  views.reserve(m.replicas.size());
  const double now = m.now();
  for (size_t i = 0; i < m.replicas.size(); ++i) {
    if (!m.replicas[i]->serves(now)) {
      views.push_back({.up = false});
      continue;
    }
    views.push_back(m.replicas[i]->entry->view(r));
    views.back().outstanding = m.outstanding[i];
  }
  const uint64_t prefix = m.router.prefix_hash(r.prompt_tokens);
  // What the prefix a replica has cached saves: its prefill, by replica 0's step model (the same device everywhere).
  const int32_t prefix_tokens = std::min<int32_t>(static_cast<int32_t>(r.prompt_tokens.size()), router_options{}.affinity_prefix_tokens);
  const double saving = prefix != 0 ? m.replicas[0]->entry->idle_prefill_s(prefix_tokens) : 0.0;
  const int32_t at = m.router.pick(views, prefix, saving).value_or(0);
  m.router.served(prefix, at);
  ++m.routed[static_cast<size_t>(at)];
  ++m.outstanding[static_cast<size_t>(at)];
  const uint64_t id = m.next_id++;
  auto tokens = on_token ? runtime::token_callback([id, f = std::move(on_token)](const token_event& e) {
    token_event copy = e;
    copy.request_id = id;
    f(copy);
  })
                         : runtime::token_callback{};
  auto done = [&m, id, at, f = std::move(on_outcome)](const outcome& o) {
    m.placed.erase(id);
    --m.outstanding[static_cast<size_t>(at)];
    if (!f) return;
    outcome copy = o;
    copy.request_id = id;
    f(copy);
  };
  m.placed[id] = {at, 0};
  const uint64_t local = m.replicas[static_cast<size_t>(at)]->entry->submit(std::move(r), std::move(tokens), std::move(done));
  if (auto it = m.placed.find(id); it != m.placed.end()) it->second.second = local;
  return id;
}

bool virtual_runtime::cancel(uint64_t id) {
  impl& m = *impl_;
  if (!m.fleet) return m.replicas[0]->entry->cancel(id);
  auto it = m.placed.find(id);
  if (it == m.placed.end()) return false;
  return m.replicas[static_cast<size_t>(it->second.first)]->entry->cancel(it->second.second);
}

int32_t virtual_runtime::replicas() const { return static_cast<int32_t>(impl_->replicas.size()); }
int32_t virtual_runtime::serving() const {
  int32_t n = 0;
  for (const auto& r : impl_->replicas) n += r->serves(impl_->now());
  return n;
}
int32_t virtual_runtime::starting() const {
  int32_t n = 0;
  for (const auto& r : impl_->replicas) n += r->paid() && !r->serves(impl_->now());
  return n;
}
std::vector<fleet_sample> virtual_runtime::fleet_timeline() const { return impl_->timeline; }
double virtual_runtime::replica_seconds() const {
  return impl_->paid_seconds + impl_->paid_count() * (impl_->now() - impl_->paid_since);
}
std::vector<int64_t> virtual_runtime::routed() const { return impl_->routed; }
int64_t virtual_runtime::affinity_hits() const { return impl_->router.affinity_hits(); }

double virtual_runtime::now() const { return impl_->now(); }

void virtual_runtime::run_until(double t) {
  impl& m = *impl_;
  if (m.scaler) {
    for (; m.next_sync <= t; m.next_sync += m.scaler->options().period_s) {
      m.advance_to(m.next_sync);
      m.sync();
    }
  }
  m.advance_to(t);
}

void virtual_runtime::impl::advance_to(double t) {
  impl& m = *this;
  const auto until = m.start + std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(t));
  for (;;) {
    m.sched->run();
    const auto& schedule = m.sched->clock().schedule();
    if (schedule.empty() || schedule.begin()->first > until) break;
    m.sched->trigger_timeout();
  }
  if (m.sched->clock().now() < until) m.sched->clock().advance_time(until - m.sched->clock().now());
  m.sched->run();
}

void virtual_runtime::run() {
  impl& m = *impl_;
  do {
    m.sched->run();
  } while (m.sched->trigger_timeout());
  m.sched->run();
}

// One autoscaler sync: read the serving replicas' metrics, decide, then start replicas (they
// serve after startup_s) or retire some (the ones still starting first, then those with the
// fewest requests in flight).
void virtual_runtime::impl::sync() {
  const double t = now();
  const autoscale_options& o = scaler->options();
  fleet_reading reading;
  reading.totals.assign(o.metrics.size(), 0.0);
  for (auto& r : replicas) {
    if (!r->paid()) continue;
    if (!r->serves(t)) {
      ++reading.starting;
      continue;
    }
    ++reading.serving;
    runtime_stats s;
    ask(r->actors.engine, [&](const engine_stats& e) { add_to(s, e); });
    ask(r->actors.admission, [&](const admission_stats& a) { add_to(s, a); });
    const int64_t rejected = r->entry->counts().rejected;
    for (size_t k = 0; k < o.metrics.size(); ++k) {
      const autoscale_metric& metric = o.metrics[k];
      switch (metric.what) {
        case autoscale_metric::kind::queue_depth:
          for (const auto& [tier, n] : s.queued_by_tier) {
            if (metric.tier.empty() || metric.tier == tier) reading.totals[k] += n;
          }
          break;
        case autoscale_metric::kind::waiting: reading.totals[k] += s.queued_in_admission + s.waiting_in_engine; break;
        case autoscale_metric::kind::refused_per_s: reading.totals[k] += (rejected - r->rejected_seen) / o.period_s; break;
      }
    }
    r->rejected_seen = rejected;
  }
  const int32_t current = reading.serving + reading.starting;
  const int32_t want = scaler->desired(t, reading);
  account(t);
  for (int32_t i = current; i < want; ++i) add_replica(t + o.startup_s);
  for (int32_t i = want; i < current; ++i) {
    // The retiree: a replica still starting (the latest asked for), else the least busy.
    int32_t pick = -1;
    auto before = [&](size_t k, size_t p) {
      const bool ks = !replicas[k]->serves(t), ps = !replicas[p]->serves(t);
      if (ks != ps) return ks;
      return ks ? replicas[k]->ready_at > replicas[p]->ready_at : outstanding[k] < outstanding[p];
    };
    for (size_t k = 0; k < replicas.size(); ++k) {
      if (replicas[k]->paid() && (pick < 0 || before(k, static_cast<size_t>(pick)))) pick = static_cast<int32_t>(k);
    }
    if (pick >= 0) {
      replicas[static_cast<size_t>(pick)]->retired_at = t;
      router.forget(pick);  // its cached prefixes go with it
    }
  }
  fleet_sample sample{t, 0, 0, want, scaler->last_proposal(), reading.totals};
  for (const auto& r : replicas) {
    sample.serving += r->serves(t);
    sample.starting += r->paid() && !r->serves(t);
  }
  timeline.push_back(std::move(sample));
}

// The fleet's: counts, queues and KV summed over the replicas; mailboxes their largest.
runtime_stats virtual_runtime::stats() {
  impl& m = *impl_;
  runtime_stats total;
  for (auto& r : m.replicas) {
    runtime_stats s;
    m.ask(r->actors.engine, [&](const engine_stats& e) { add_to(s, e); });
    m.ask(r->actors.admission, [&](const admission_stats& a) { add_to(s, a); });
    m.ask(r->actors.kv, [&](const kv_stats& k) { add_to(s, k); });
    m.ask(r->actors.shard, [&](int restarts) { s.shard_restarts = restarts; });
    const intake_counts c = r->entry->counts();
    s.live_requests = c.live;
    s.completed = c.completed;
    s.rejected = c.rejected;
    s.cancelled = c.cancelled;
    s.failed = c.failed;
    if (!m.fleet) return s;
    add_replica(total, s);
  }
  return total;
}

std::string virtual_runtime::describe() const {
  const replica& r = *impl_->replicas.front();
  const std::string one =
      fmt::format("{} (virtual time), {} KV blocks of {} tokens", r.be->describe(), r.be->kv().n_blocks, r.be->kv().block_size);
  return impl_->replicas.size() == 1 ? one : fmt::format("{} replicas behind a router, each {}", impl_->replicas.size(), one);
}

}  // namespace tireless
