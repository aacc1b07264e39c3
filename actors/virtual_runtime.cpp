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

  template <class F>
  void ask(const caf::actor& a, F f) {
    caf::scoped_actor self{*sys};
    auto reply = self->request(a, caf::infinite, stats_atom::value);
    sched->run();
    reply.receive(f, [](caf::error&) {});
  }
};

virtual_runtime::virtual_runtime(const runtime_config& config, int32_t replicas) : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  m.cfg = config;
  if (m.cfg.backend.kind != backend_kind::sim) {
    throw std::runtime_error("the virtual-time runtime runs the sim backend only: set backend.kind = \"sim\"");
  }
  if (replicas < 1) throw std::invalid_argument(fmt::format("a fleet of {} replicas: at least one is needed", replicas));
  m.sys_cfg.set("scheduler.policy", caf::atom("testing"));
  m.sys = std::make_unique<caf::actor_system>(m.sys_cfg);
  m.sched = &dynamic_cast<caf::scheduler::test_coordinator&>(m.sys->scheduler());
  m.start = m.sched->clock().now();
  for (int32_t i = 0; i < replicas; ++i) {
    auto r = std::make_unique<replica>();
    r->cfg = m.cfg;
    share_quotas(r->cfg, replicas);
    r->be = make_configured_sim(r->cfg, r->lim, true);
    const pipeline_options po = make_pipeline_options(r->cfg, r->lim, r->be);
    r->actors = spawn_pipeline(*m.sys, po);
    r->entry = std::make_unique<intake>(*m.sys, r->cfg, r->lim, nullptr, r->actors, door_capacity(r->cfg, po));
    m.replicas.push_back(std::move(r));
  }
  m.routed.assign(static_cast<size_t>(replicas), 0);
  m.outstanding.assign(static_cast<size_t>(replicas), 0);
  m.sched->run();
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
  if (m.replicas.size() == 1) {
    ++m.routed[0];
    return m.replicas[0]->entry->submit(std::move(r), std::move(on_token), std::move(on_outcome));
  }
  // The router picks from what each replica publishes; the request's id is the fleet's.
  std::vector<replica_view> views;
  views.reserve(m.replicas.size());
  for (size_t i = 0; i < m.replicas.size(); ++i) {
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
  if (m.replicas.size() == 1) return m.replicas[0]->entry->cancel(id);
  auto it = m.placed.find(id);
  if (it == m.placed.end()) return false;
  return m.replicas[static_cast<size_t>(it->second.first)]->entry->cancel(it->second.second);
}

int32_t virtual_runtime::replicas() const { return static_cast<int32_t>(impl_->replicas.size()); }
std::vector<int64_t> virtual_runtime::routed() const { return impl_->routed; }
int64_t virtual_runtime::affinity_hits() const { return impl_->router.affinity_hits(); }

double virtual_runtime::now() const {
  return std::chrono::duration<double>(impl_->sched->clock().now() - impl_->start).count();
}

void virtual_runtime::run_until(double t) {
  impl& m = *impl_;
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
    if (m.replicas.size() == 1) return s;
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
