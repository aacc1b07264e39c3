#include "actors/virtual_runtime.hpp"

#include <caf/all.hpp>

#include <fmt/format.h>

#include "actors/intake.hpp"
#include "actors/messages.hpp"
#include "actors/pipeline.hpp"
#include "actors/sim_config.hpp"

namespace tireless {

struct virtual_runtime::impl {
  runtime_config cfg;
  resolved_limits lim;
  std::shared_ptr<sim::sim_backend> be;
  caf::actor_system_config sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  pipeline actors;
  std::unique_ptr<intake> entry;
  caf::actor_clock::time_point start;

  template <class F>
  void ask(const caf::actor& a, F f) {
    caf::scoped_actor self{*sys};
    auto reply = self->request(a, caf::infinite, stats_atom::value);
    sched->run();
    reply.receive(f, [](caf::error&) {});
  }
};

virtual_runtime::virtual_runtime(const runtime_config& config) : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  m.cfg = config;
  if (m.cfg.backend.kind != backend_kind::sim) {
    throw std::runtime_error("the virtual-time runtime runs the sim backend only: set backend.kind = \"sim\"");
  }
  m.be = make_configured_sim(m.cfg, m.lim, true);
  m.sys_cfg.set("scheduler.policy", caf::atom("testing"));
  m.sys = std::make_unique<caf::actor_system>(m.sys_cfg);
  m.sched = &dynamic_cast<caf::scheduler::test_coordinator&>(m.sys->scheduler());
  m.start = m.sched->clock().now();
  const pipeline_options po = make_pipeline_options(m.cfg, m.lim, m.be);
  m.actors = spawn_pipeline(*m.sys, po);
  m.entry = std::make_unique<intake>(*m.sys, m.cfg, m.lim, nullptr, m.actors, door_capacity(m.cfg, po));
  m.sched->run();
}

virtual_runtime::~virtual_runtime() {
  impl& m = *impl_;
  m.entry->close();
  m.entry->cancel_all();
  run();
  stop_pipeline(m.actors);
  m.entry->detach();
  m.actors = pipeline{};
  m.sched->run();
}

uint64_t virtual_runtime::submit(request r, runtime::token_callback on_token, runtime::outcome_callback on_outcome) {
  return impl_->entry->submit(std::move(r), std::move(on_token), std::move(on_outcome));
}

bool virtual_runtime::cancel(uint64_t id) { return impl_->entry->cancel(id); }

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

runtime_stats virtual_runtime::stats() {
  impl& m = *impl_;
  runtime_stats s;
  m.ask(m.actors.engine, [&](const engine_stats& e) { add_to(s, e); });
  m.ask(m.actors.admission, [&](const admission_stats& a) { add_to(s, a); });
  m.ask(m.actors.kv, [&](const kv_stats& k) { add_to(s, k); });
  m.ask(m.actors.shard, [&](int restarts) { s.shard_restarts = restarts; });
  const intake_counts c = m.entry->counts();
  s.live_requests = c.live;
  s.completed = c.completed;
  s.rejected = c.rejected;
  s.cancelled = c.cancelled;
  s.failed = c.failed;
  return s;
}

std::string virtual_runtime::describe() const {
  return fmt::format("{} (virtual time), {} KV blocks of {} tokens", impl_->be->describe(), impl_->be->kv().n_blocks,
                     impl_->be->kv().block_size);
}

}  // namespace tireless
