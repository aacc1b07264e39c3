#include "tireless/runtime.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/expert_shard.hpp"
#include "experts/rpc.hpp"
#include "actors/messages.hpp"
#include "actors/pipeline.hpp"
#include "actors/spawner.hpp"
#include "actors/system_owner.hpp"
#include "actors/intake.hpp"
#include "actors/session.hpp"
#include "config/resolved_limits.hpp"
#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/step_probe.hpp"
#include "actors/sim_config.hpp"
#include "model/model.hpp"

namespace tireless {

struct runtime::impl {
  runtime_config cfg;
  resolved_limits lim;
  std::shared_ptr<const model> lm;
  std::shared_ptr<backend> be;
  std::unique_ptr<expert_exchange> experts;  // MoE experts on expert shards, when configured
  std::string probed;                       // how the step-cost probe scaled the prior ("": not probed)
  caf::actor_system* sys = nullptr;         // owned by `owner`, on its thread
  std::unique_ptr<system_owner> owner;
  pipeline actors;
  std::unique_ptr<intake> entry;  // where requests come in
  bool stopped = false;
};

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized_build = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized_build = true;
#else
constexpr bool sanitized_build = false;
#endif
#else
constexpr bool sanitized_build = false;
#endif

template <class Impl>
std::unique_ptr<expert_exchange> make_expert_exchange(Impl& r, const model_config& mc) {
  const backend_settings& b = r.cfg.backend;
  expert_exchange_options o;
  using wire = backend_settings::wire_activations;
  o.activations = b.expert_activations == wire::f16    ? proto::Activations::F16
                  : b.expert_activations == wire::int8 ? proto::Activations::INT8
                                                       : proto::Activations::F32;
  o.max_restarts = b.max_shard_restarts;
  o.restart_window = b.shard_restart_window;
  o.replicas_per_shard = b.expert_replicas_per_shard;
  o.rebalance_every = b.expert_rebalance_every_steps * mc.n_layer;
  if (b.expert_shard_addresses.empty()) {
    return make_actor_expert_exchange(*r.sys, r.lm, b.expert_shards, r.cfg.engine.max_step_tokens, o);
  }
  o.revive_wait = b.expert_call_timeout;
  return make_rpc_expert_exchange(r.lm, b.expert_shard_addresses, b.expert_call_timeout, o);
}

// "auto": the GPU where one can be used (and no CPU expert shards are configured), else the CPU.
backend_kind chosen_kind(const backend_settings& b) {
  if (b.kind != backend_kind::automatic) return b.kind;
  const bool cpu_shards = b.expert_shards > 0 || !b.expert_shard_addresses.empty();
  return !cpu_shards && cuda::cuda_available() ? backend_kind::cuda : backend_kind::cpu;
}

template <class Impl>
std::shared_ptr<backend> make_backend(Impl& r) {
  const runtime_config& c = r.cfg;
  const backend_kind kind = chosen_kind(c.backend);
  if (kind == backend_kind::sim) {
    return make_configured_sim(c, r.lim, false);
  }
  if (std::string why; kind == backend_kind::cuda && !cuda::cuda_available(&why)) {
    throw std::runtime_error(fmt::format("backend.kind = \"cuda\": {}; use kind = \"cpu\", or \"auto\" to take a GPU "
                                         "only where there is one",
                                         cuda::cuda_built() ? "no usable CUDA device here (" + why + ")" : why));
  }
  r.lm = model::load(c.model.path);
  const model_config& mc = r.lm->config();
  const int64_t kv_bytes_per_token = int64_t{mc.n_layer} * mc.kv_dim() * 2 * 2;
  r.lim = resolve_limits(c, {mc.n_ctx_train, kv_bytes_per_token, kind == backend_kind::cuda});
  if (kind == backend_kind::cuda) {
    cuda::cuda_backend_options o;
    o.devices = c.backend.cuda_devices;
    o.block_size = c.kv.block_size;
    o.kv_blocks = r.lim.kv_blocks;  // 0: as many as the device's free memory holds
    o.max_step_tokens = c.engine.max_step_tokens;
    o.max_step_seqs = c.engine.max_step_seqs;
    o.max_context = r.lim.max_context;
    o.sampling_threads = c.backend.threads;
    return std::shared_ptr<backend>(cuda::make_cuda_backend(r.lm, o));
  }
  cpu::cpu_backend_options o;
  if (mc.is_moe() && (c.backend.expert_shards > 0 || !c.backend.expert_shard_addresses.empty())) {
    r.experts = make_expert_exchange(r, mc);
    o.experts = r.experts.get();
    o.overlap = c.backend.expert_overlap;
  }
  o.threads = c.backend.threads;
  o.block_size = c.kv.block_size;
  o.kv_blocks = r.lim.kv_blocks;
  o.max_step_tokens = c.engine.max_step_tokens;
  o.max_step_seqs = c.engine.max_step_seqs;
  o.max_context = r.lim.max_context;
  return std::shared_ptr<backend>(cpu::make_cpu_backend(r.lm, o));
}

void add_expert_stats(runtime_stats& s, const expert_exchange_stats& x, int32_t n_expert) {
  auto& e = s.experts;
  e.shards = x.shards;
  e.live = x.live;
  e.fenced = x.fenced;
  e.calls = x.calls;
  e.tokens = x.tokens;
  e.bytes_out = x.bytes_out;
  e.bytes_in = x.bytes_in;
  e.failures = x.failures;
  e.revivals = x.revivals;
  e.rebalances = x.rebalances;
  e.replicas = x.replicas;
  e.dispatch_seconds = x.dispatch_seconds;
  e.last_recovery_seconds = x.last_recovery_seconds;
  e.shard_imbalance = x.shard_imbalance();
  e.pairs_per_shard = x.per_shard_pairs;
  e.pairs_per_expert.assign(static_cast<size_t>(n_expert), 0);
  for (size_t k = 0; k < x.per_expert_pairs.size(); ++k) e.pairs_per_expert[k % n_expert] += x.per_expert_pairs[k];
}

}  // namespace

runtime::runtime(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

std::unique_ptr<runtime> runtime::start(const runtime_config& config) {
  auto r = std::make_unique<impl>();
  r->cfg = config;
  impl* m = r.get();
  // Everything that spawns actors runs on the system's owner thread (system_owner.hpp).
  r->owner = std::make_unique<system_owner>(
      configure_actor_system,
      [m](caf::actor_system& sys) {
        m->sys = &sys;
        try {
          m->be = make_backend(*m);
          pipeline_options po = make_pipeline_options(m->cfg, m->lim, m->be);
          // The CPU's step costs measured before serving (gpu/step_probe.hpp). Not where experts
          // are on shards (a step would reach them before they serve) or on a GPU (never run).
          // Nor in a sanitizer's build: its steps run 10-100x slower and unevenly (TSan read 100x
          // beside another build's tests), which made a flood at start wait 60 s by the forecast.
          if (chosen_kind(m->cfg.backend) == backend_kind::cpu && !m->experts && !sanitized_build) {
            const step_cost_prior prior = po.engine.step_prior;
            po.engine.step_prior = probe_step_cost(*m->be, m->cfg.engine.max_step_seqs);
            m->probed = fmt::format("steps {:.2f}x (prefill) and {:.2f}x (decode) the prior's",
                                    po.engine.step_prior.per_prefill_token / prior.per_prefill_token,
                                    po.engine.step_prior.per_decode_seq / prior.per_decode_seq);
          }
          m->actors = spawn_pipeline(sys, po);
          m->entry = std::make_unique<intake>(sys, m->cfg, m->lim, m->lm, m->actors, door_capacity(m->cfg, po));
        } catch (...) {
          m->experts.reset();  // its shards must stop before the system can go
          throw;
        }
      });
  return std::unique_ptr<runtime>(new runtime(std::move(r)));
}

runtime::~runtime() {
  if (impl_ && !impl_->stopped) shutdown(impl_->cfg.server.shutdown_grace);
}

std::string runtime::describe() const {
  return fmt::format("{} on {}, {} KV blocks of {} tokens{}", impl_->lm ? impl_->lm->config().name : "sim model",
                     impl_->be->describe(), impl_->be->kv().n_blocks, impl_->be->kv().block_size,
                     impl_->probed.empty() ? "" : ", " + impl_->probed);
}

runtime::prompt_limit runtime::max_prompt() const {
  const request_limits& lim = impl_->entry->limits();
  return {prompt_token_limit(lim), impl_->lm ? prompt_byte_limit(lim, impl_->lm->tok().max_token_bytes()) : 0};
}

uint64_t runtime::submit(request r, token_callback on_token, outcome_callback on_outcome) {
  return impl_->entry->submit(std::move(r), std::move(on_token), std::move(on_outcome));
}

std::future<outcome> runtime::generate(request r) {
  auto p = std::make_shared<std::promise<outcome>>();
  auto f = p->get_future();
  submit(std::move(r), nullptr, [p](const outcome& o) { p->set_value(o); });
  return f;
}

bool runtime::cancel(uint64_t id) { return impl_->entry->cancel(id); }

void runtime::acknowledge(uint64_t id, int32_t n) { impl_->entry->acknowledge(id, n); }

void runtime::stats_async(std::function<void(const runtime_stats&)> done) {
  impl& m = *impl_;
  if (m.stopped) {
    done(runtime_stats{});
    return;
  }
  const pipeline actors = m.actors;
  run_on_actor_thread(m.entry->spawner(), [&m, actors, done](caf::actor_system& sys) {
  sys.spawn([&m, actors, done](caf::event_based_actor* self) {
    auto s = std::make_shared<runtime_stats>();
    const auto timeout = std::chrono::seconds(10);
    auto finish = [&m, s, done, self] {
      const intake_counts c = m.entry->counts();
      s->live_requests = c.live;
      s->completed = c.completed;
      s->rejected = c.rejected;
      s->cancelled = c.cancelled;
      s->failed = c.failed;
      s->door_capacity = m.entry->door_capacity();
      if (m.experts) add_expert_stats(*s, m.experts->stats(), m.lm->config().n_expert);
      done(*s);
      self->quit();
    };
    self->request(actors.engine, timeout, stats_atom::value)
        .then([=](const engine_stats& e) {
          add_to(*s, e);
          self->request(actors.admission, timeout, stats_atom::value).then([=](const admission_stats& a) {
            add_to(*s, a);
            self->request(actors.kv, timeout, stats_atom::value)
                .then([=](const kv_stats& k) {
                  add_to(*s, k);
                  self->request(actors.shard, timeout, stats_atom::value).then([=](int restarts) {
                    s->shard_restarts = restarts;
                    finish();
                  }, [=](caf::error&) { finish(); });
                }, [=](caf::error&) { finish(); });
          }, [=](caf::error&) { finish(); });
        }, [=](caf::error&) { finish(); });
  });
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
  m.entry->close();
  if (!m.entry->wait_idle(grace)) {
    m.entry->cancel_all();
    m.entry->wait_idle(std::chrono::seconds(10));
  }
  m.owner->stop([&m](caf::actor_system&) {  // on the owner thread, then ~actor_system()
    stop_pipeline(m.actors);
    m.actors = pipeline{};
    m.entry->detach();
    m.experts.reset();
  });
  m.stopped = true;
}

}  // namespace tireless
