#include "tireless/runtime.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/expert_shard.hpp"
#include "actors/messages.hpp"
#include "actors/pipeline.hpp"
#include "actors/request_door.hpp"
#include "actors/session.hpp"
#include "config/resolved_limits.hpp"
#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/sim/sim_backend.hpp"
#include "model/model.hpp"

namespace tireless {

struct runtime::impl {
  runtime_config cfg;
  resolved_limits lim;
  std::shared_ptr<const model> lm;
  std::shared_ptr<backend> be;
  std::unique_ptr<caf::actor_system_config> sys_cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<remote_experts> experts;  // MoE experts on expert shards, when configured
  pipeline actors;
  std::unordered_map<std::string, const tenant_settings*> tenant_by_key;
  std::unique_ptr<request_door> door;

  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> accepting{true};
  std::mutex mu;
  std::condition_variable idle;
  std::unordered_map<uint64_t, caf::actor> live;  // sessions of unfinished requests
  int64_t completed = 0, rejected = 0, cancelled = 0, failed = 0;
  bool stopped = false;

  void done(const outcome& o, bool entered) {
    if (entered) door->leave();
    std::lock_guard lock(mu);
    live.erase(o.request_id);
    switch (o.kind) {
      case outcome_kind::completed: ++completed; break;
      case outcome_kind::rejected: ++rejected; break;
      case outcome_kind::cancelled: ++cancelled; break;
      case outcome_kind::failed: ++failed; break;
    }
    idle.notify_all();
  }
};

namespace {

template <class Impl>
std::shared_ptr<backend> make_backend(Impl& r) {
  const runtime_config& c = r.cfg;
  if (c.backend.kind == backend_kind::sim) {
    sim::sim_profile profile = sim::named_profile(c.backend.sim_profile);
    r.lim = resolve_limits(c, {profile.limits.max_context, profile.kv.bytes_per_block / profile.kv.block_size});
    profile.kv.block_size = c.kv.block_size;
    profile.kv.n_blocks = r.lim.kv_blocks;
    profile.limits.max_context = r.lim.max_context;
    auto sim = std::make_shared<sim::sim_backend>(profile);
    return sim;
  }
  if (c.backend.kind == backend_kind::cuda) {
    throw std::runtime_error("backend.kind = \"cuda\": this build runs the cpu and sim backends only "
                             "(no GPU here); use kind = \"cpu\"");
  }
  r.lm = model::load(c.model.path);
  const model_config& mc = r.lm->config();
  const int64_t kv_bytes_per_token = int64_t{mc.n_layer} * mc.kv_dim() * 2 * 2;
  r.lim = resolve_limits(c, {mc.n_ctx_train, kv_bytes_per_token});
  cpu::cpu_backend_options o;
  if (mc.is_moe() && c.backend.expert_shards > 0) {
    r.experts = std::make_unique<remote_experts>(*r.sys, r.lm, c.backend.expert_shards, c.engine.max_step_tokens);
    o.experts = r.experts.get();
  }
  o.threads = c.backend.threads;
  o.block_size = c.kv.block_size;
  o.kv_blocks = r.lim.kv_blocks;
  o.max_step_tokens = c.engine.max_step_tokens;
  o.max_step_seqs = c.engine.max_step_seqs;
  o.max_context = r.lim.max_context;
  return std::shared_ptr<backend>(cpu::make_cpu_backend(r.lm, o));
}

}  // namespace

runtime::runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

std::unique_ptr<runtime> runtime::start(const runtime_config& config) {
  auto r = std::make_unique<impl>();
  r->cfg = config;
  r->sys_cfg = std::make_unique<caf::actor_system_config>();
  r->sys_cfg->set("scheduler.max-threads", static_cast<size_t>(std::max(2u, std::thread::hardware_concurrency())));
  r->sys = std::make_unique<caf::actor_system>(*r->sys_cfg);
  r->be = make_backend(*r);
  for (const tenant_settings& t : r->cfg.tenants) {
    for (const std::string& k : t.keys) r->tenant_by_key[k] = &t;
  }

  const kv_geometry geo = r->be->kv();
  pipeline_options po;
  po.kv.blocks.n_blocks = geo.n_blocks;
  po.kv.blocks.block_size = geo.block_size;
  po.kv.blocks.prefix_caching = r->cfg.kv.prefix_caching;
  po.kv.blocks.watermark_blocks = r->lim.kv_watermark_blocks;
  po.shard.model = r->be;
  po.shard.simulated = r->cfg.backend.kind == backend_kind::sim;
  int32_t queued_capacity = 0;
  for (const tier_settings& t : r->cfg.tiers) {
    po.admission.tiers.push_back({t.name, t.priority, t.queue_bound});
    queued_capacity += t.queue_bound;
  }
  engine_options& eo = po.engine;
  eo.limits.max_step_tokens = r->cfg.engine.max_step_tokens;
  eo.limits.max_step_seqs = r->cfg.engine.max_step_seqs;
  eo.limits.max_preemptions = r->cfg.engine.max_preemptions;
  eo.limits.max_context = r->lim.max_context;
  eo.limits.block_size = geo.block_size;
  eo.max_waiting = r->cfg.engine.max_step_seqs;
  eo.max_waiting_tokens = 2 * r->cfg.engine.max_step_tokens;
  eo.rate_window_seconds = std::chrono::duration<double>(r->cfg.admission.pressure_window).count();
  r->actors = spawn_pipeline(*r->sys, po);
  // Requests in the runtime at once: every queue full, the engine's waiting room, and one
  // running sequence per KV block at most. More are refused at the door.
  r->door = std::make_unique<request_door>(queued_capacity + eo.max_waiting + geo.n_blocks);
  return std::unique_ptr<runtime>(new runtime(std::move(r)));
}

runtime::~runtime() {
  if (impl_ && !impl_->stopped) shutdown(impl_->cfg.server.shutdown_grace);
}

std::string runtime::describe() const {
  return fmt::format("{} on {}, {} KV blocks of {} tokens", impl_->lm ? impl_->lm->config().name : "sim model",
                     impl_->be->describe(), impl_->be->kv().n_blocks, impl_->be->kv().block_size);
}

uint64_t runtime::submit(request r, token_callback on_token, outcome_callback on_outcome) {
  impl& m = *impl_;
  const uint64_t id = m.next_id++;
  auto refuse = [&](const char* reason, std::string message, int64_t retry_after) {
    outcome o;
    o.request_id = id;
    o.kind = outcome_kind::rejected;
    o.reason = reason;
    o.message = std::move(message);
    o.retry_after_ms = retry_after;
    if (on_outcome) on_outcome(o);
    m.done(o, false);
    return id;
  };
  if (!m.accepting.load()) return refuse("shutting_down", "the runtime is shutting down", -1);
  const tier_settings* tier = &m.cfg.tiers.front();
  std::string tenant = "default";
  if (!m.cfg.tenants.empty()) {
    auto t = m.tenant_by_key.find(r.api_key);
    if (t == m.tenant_by_key.end()) {
      return refuse("unauthenticated", r.api_key.empty() ? "no API key given" : "unknown API key", -1);
    }
    tenant = t->second->name;
    tier = m.cfg.find_tier(t->second->tier);
  }
  if (!m.door->enter()) {
    return refuse("overloaded", fmt::format("{} requests are already in the runtime", m.door->capacity()), 1000);
  }
  auto reporter = std::make_shared<request_reporter>(id, std::move(on_token), std::move(on_outcome),
                                                     [&m](const outcome& o) { m.done(o, true); });
  {
    std::lock_guard lock(m.mu);
    m.live.emplace(id, caf::actor{});
  }
  session_options so;
  so.reporter = reporter;
  so.req = std::move(r);
  so.lm = m.lm;
  so.tenant = tenant;
  so.tier = tier->name;
  so.tier_priority = tier->priority;
  so.max_context = m.lim.max_context;
  so.max_prompt_tokens = m.lim.max_prompt_tokens;
  so.default_max_tokens = m.cfg.admission.default_max_tokens;
  so.admission = m.actors.admission;
  caf::actor s = spawn_session(*m.sys, std::move(so));
  std::lock_guard lock(m.mu);
  if (auto it = m.live.find(id); it != m.live.end()) it->second = s;
  return id;
}

std::future<outcome> runtime::generate(request r) {
  auto p = std::make_shared<std::promise<outcome>>();
  auto f = p->get_future();
  submit(std::move(r), nullptr, [p](const outcome& o) { p->set_value(o); });
  return f;
}

bool runtime::cancel(uint64_t id) {
  caf::actor s;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->live.find(id);
    if (it == impl_->live.end() || !it->second) return false;
    s = it->second;
  }
  caf::anon_send(s, cancel_atom::value, int32_t{0});
  return true;
}

void runtime::acknowledge(uint64_t id, int32_t n) {
  caf::actor s;
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->live.find(id);
    if (it == impl_->live.end() || !it->second) return;
    s = it->second;
  }
  caf::anon_send(s, ack_atom::value, n);
}

void runtime::stats_async(std::function<void(const runtime_stats&)> done) {
  impl& m = *impl_;
  if (m.stopped) {
    done(runtime_stats{});
    return;
  }
  const pipeline actors = m.actors;
  m.sys->spawn([&m, actors, done](caf::event_based_actor* self) {
    auto s = std::make_shared<runtime_stats>();
    const auto timeout = std::chrono::seconds(10);
    auto finish = [&m, s, done, self] {
      {
        std::lock_guard lock(m.mu);
        s->live_requests = static_cast<int32_t>(m.live.size());
        s->completed = m.completed;
        s->rejected = m.rejected;
        s->cancelled = m.cancelled;
        s->failed = m.failed;
      }
      done(*s);
      self->quit();
    };
    self->request(actors.engine, timeout, stats_atom::value)
        .then([=](int32_t running, int32_t waiting, int64_t steps, int64_t mailbox) {
          s->running = running;
          s->waiting_in_engine = waiting;
          s->steps = steps;
          s->max_mailbox_engine = mailbox;
          self->request(actors.admission, timeout, stats_atom::value).then([=](int32_t queued, int64_t mailbox) {
            s->queued_in_admission = queued;
            s->max_mailbox_admission = mailbox;
            self->request(actors.kv, timeout, stats_atom::value)
                .then([=](int32_t total, int32_t free, int32_t cached_free, int32_t used, int64_t hits, int64_t misses,
                          int64_t evictions, int64_t mailbox) {
                  s->kv_blocks_total = total;
                  s->kv_blocks_free = free;
                  s->kv_blocks_cached_free = cached_free;
                  s->kv_blocks_used = used;
                  s->prefix_hit_blocks = hits;
                  s->prefix_miss_blocks = misses;
                  s->evictions = evictions;
                  s->max_mailbox_kv_manager = mailbox;
                  self->request(actors.shard, timeout, stats_atom::value).then([=](int restarts) {
                    s->shard_restarts = restarts;
                    finish();
                  }, [=](caf::error&) { finish(); });
                }, [=](caf::error&) { finish(); });
          }, [=](caf::error&) { finish(); });
        }, [=](caf::error&) { finish(); });
  });
}

runtime_stats runtime::stats() {
  auto p = std::make_shared<std::promise<runtime_stats>>();
  auto f = p->get_future();
  stats_async([p](const runtime_stats& s) { p->set_value(s); });
  return f.get();
}

void runtime::shutdown(std::chrono::milliseconds grace) {
  impl& m = *impl_;
  if (m.stopped) return;
  m.accepting = false;
  {
    std::unique_lock lock(m.mu);
    m.idle.wait_for(lock, grace, [&] { return m.live.empty(); });
    for (auto& [id, s] : m.live) {
      if (s) caf::anon_send(s, cancel_atom::value, int32_t{1});
    }
    m.idle.wait_for(lock, std::chrono::seconds(10), [&] { return m.live.empty(); });
  }
  stop_pipeline(m.actors);
  m.experts.reset();
  m.sys.reset();  // waits for every actor to finish
  m.stopped = true;
}

}  // namespace tireless
