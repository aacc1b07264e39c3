#include "actors/intake.hpp"

#include <caf/actor_clock.hpp>
#include <caf/actor_system.hpp>

#include <fmt/format.h>

#include "actors/messages.hpp"
#include "actors/session.hpp"
#include "actors/spawner.hpp"
#include "actors/wire.hpp"
#include "protocol/reason_names.hpp"
#include "scheduler/admission_gate.hpp"

namespace tireless {

intake::intake(caf::actor_system& sys, const runtime_config& config, const resolved_limits& limits,
               std::shared_ptr<const model> lm, const pipeline& actors, int64_t door_capacity)
    : spawner_(spawn_spawner(sys)),
      config_(config),
      limits_(limits),
      lm_(std::move(lm)),
      admission_(actors.admission),
      engine_(actors.engine),
      gate_(actors.gate),
      sys_(sys),
      request_limits_{limits.max_context, limits.max_prompt_tokens, config.admission.default_max_tokens},
      door_(door_capacity) {
  for (const tenant_settings& t : config_.tenants) {
    for (const std::string& k : t.keys) tenant_by_key_[k] = &t;
  }
}

void intake::done(const outcome& o, bool entered) {
  if (entered) door_.leave();
  std::lock_guard lock(mu_);
  live_.erase(o.request_id);
  switch (o.kind) {
    case outcome_kind::completed: ++counts_.completed; break;
    case outcome_kind::rejected: ++counts_.rejected; break;
    case outcome_kind::cancelled: ++counts_.cancelled; break;
    case outcome_kind::failed: ++counts_.failed; break;
  }
  idle_.notify_all();
}

namespace {

// A text prompt up to this size is tokenized on the caller's thread when its tier is refusing
// (SmolLM2's tokenizer: ~30 us for 400 bytes, ~100 us for 2 KB); a longer one goes to its
// session, whose thread tokenizes it.
constexpr size_t max_text_bytes_tokenized_here = 4096;

}  // namespace

std::optional<admission_decision> intake::refuse_at_once(uint64_t id, const request& r, const std::string& tenant,
                                                         const tier_settings& tier,
                                                         std::optional<prepared_prompt>& prepared) {
  if (!gate_) return std::nullopt;
  arrival a;
  a.id = id;
  a.tenant = tenant;
  a.tier = tier.name;
  a.max_tokens = effective_max_tokens(r, request_limits_);
  a.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(sys_.clock().now().time_since_epoch()).count();
  a.retry_token = r.retry_token;
  if (!r.prompt_tokens.empty() && r.messages.empty() && r.prompt.empty()) {
    a.prompt_tokens = static_cast<int32_t>(r.prompt_tokens.size());
    a.prompt = r.prompt_tokens;
  } else {
    // Text: its length in tokens is known only once tokenized. That work is done here only
    // when the policy refuses even the shortest prompt of this tier now (nothing promised).
    if (!lm_ || prompt_text_bytes(r) > max_text_bytes_tokenized_here) return std::nullopt;
    a.prompt_tokens = 1;
    if (!gate_->would_refuse(a)) return std::nullopt;
    prepared_prompt p;
    if (prepare_prompt(r, lm_.get(), request_limits_, p)) return std::nullopt;  // its session says what is wrong
    a.prompt_tokens = static_cast<int32_t>(p.ids.size());
    prepared = std::move(p);  // if it is let in, its session need not tokenize it again
    a.prompt = prepared->ids;
  }
  // A request with a problem goes on to its session, which reports the problem, not the load.
  if (check_request(r, lm_.get(), a.prompt_tokens, request_limits_)) return std::nullopt;
  return gate_->try_refuse(a);
}

replica_view intake::view(const request& r) {
  replica_view v;
  v.up = accepting_.load() && gate_ != nullptr;
  if (!v.up) return v;
  const tier_settings* tier = &config_.tiers.front();
  arrival a;
  if (!config_.tenants.empty()) {
    auto t = tenant_by_key_.find(r.api_key);
    if (t == tenant_by_key_.end()) {
      v.would_refuse = true;  // every replica refuses an unknown key
      return v;
    }
    a.tenant = t->second->name;
    tier = config_.find_tier(t->second->tier);
  }
  a.tier = tier->name;
  a.max_tokens = effective_max_tokens(r, request_limits_);
  a.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(sys_.clock().now().time_since_epoch()).count();
  a.retry_token = r.retry_token;
  // A text prompt's tokens are not counted here: about four bytes a token.
  a.prompt_tokens = !r.prompt_tokens.empty() ? static_cast<int32_t>(r.prompt_tokens.size())
                                             : std::max<int32_t>(1, static_cast<int32_t>(prompt_text_bytes(r) / 4));
  a.prompt = r.prompt_tokens;
  auto lock = gate_->lock();
  admission_control& c = gate_->control();
  v.would_refuse = c.would_refuse(a);
  v.predicted_ttft_s = c.predicted_ttft(a.tier, a.prompt_tokens);
  v.ttft_target_s = std::chrono::duration<double>(tier->ttft).count();
  v.queued = c.queued();
  return v;
}

double intake::idle_prefill_s(int32_t tokens) {
  if (!gate_) return 0;
  auto lock = gate_->lock();
  return gate_->control().idle_prefill(tokens);
}

uint64_t intake::submit(request r, runtime::token_callback on_token, runtime::outcome_callback on_outcome) {
  const uint64_t id = next_id_++;
  auto refuse = [&](std::string_view reason, std::string message, int64_t retry_after, uint64_t token = 0) {
    outcome o = rejected_outcome(id, reason, std::move(message), retry_after);
    o.retry_token = token;
    done(o, false);
    if (on_outcome) on_outcome(o);
    return id;
  };
  if (!accepting_.load()) return refuse(reason::shutting_down, "the runtime is shutting down", -1);
  // Without tenants in the config every request is the first tier's (an embedding host that
  // authenticates its own users); with tenants, the key decides.
  const tier_settings* tier = &config_.tiers.front();
  std::string tenant;
  if (!config_.tenants.empty()) {
    auto t = tenant_by_key_.find(r.api_key);
    if (t == tenant_by_key_.end()) {
      return refuse(reason::unauthenticated, r.api_key.empty() ? "no API key given" : "unknown API key", -1);
    }
    tenant = t->second->name;
    tier = config_.find_tier(t->second->tier);
  }
  std::optional<prepared_prompt> prepared;
  if (auto d = refuse_at_once(id, r, tenant, *tier, prepared)) {
    return refuse(proto::reason_name(to_wire(d->reason)), std::move(d->message), d->retry_after_ms, d->retry_token);
  }
  if (!door_.enter()) {
    return refuse(reason::overloaded, fmt::format("{} requests are already inside the runtime", door_.capacity()), 1000);
  }
  auto reporter = std::make_shared<request_reporter>(id, std::move(on_token), std::move(on_outcome),
                                                     [this](const outcome& o) { done(o, true); });
  {
    std::lock_guard lock(mu_);
    live_.emplace(id, caf::actor{});
  }
  session_options so;
  so.reporter = reporter;
  so.req = std::move(r);
  so.lm = lm_;
  so.tenant = tenant;
  so.tier = tier->name;
  so.tier_priority = tier->priority;
  so.limits = request_limits_;
  so.prepared = std::move(prepared);
  so.admission = admission_;
  so.engine = engine_;
  auto options = std::make_shared<session_options>(std::move(so));
  run_on_actor_thread(spawner_, [this, id, options](caf::actor_system& sys) {
    caf::actor s = spawn_session(sys, std::move(*options));
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;  // it already ended (refused at once)
    it->second = s;
    if (auto e = early_.find(id); e != early_.end()) {
      if (e->second < 0) caf::anon_send(s, cancel_atom::value, int32_t{-1 - e->second});
      early_.erase(e);
    }
  });
  return id;
}

bool intake::cancel(uint64_t id) {
  caf::actor s;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return false;
    if (!it->second) {  // its session is being spawned: cancel it as soon as it exists
      early_[id] = -1;
      return true;
    }
    s = it->second;
  }
  caf::anon_send(s, cancel_atom::value, int32_t{0});
  return true;
}

void intake::acknowledge(uint64_t id, int32_t n) {
  caf::actor s;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end() || !it->second) return;
    s = it->second;
  }
  caf::anon_send(s, ack_atom::value, n);
}

bool intake::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return idle_.wait_for(lock, timeout, [&] { return live_.empty(); });
}

void intake::cancel_all() {
  std::lock_guard lock(mu_);
  for (auto& [id, s] : live_) {
    if (s) {
      caf::anon_send(s, cancel_atom::value, int32_t{1});
    } else {
      early_[id] = -2;  // cancel (shutdown) once spawned
    }
  }
}

intake_counts intake::counts() const {
  std::lock_guard lock(mu_);
  intake_counts c = counts_;
  c.live = static_cast<int32_t>(live_.size());
  return c;
}

}  // namespace tireless

namespace tireless {

void intake::detach() {
  accepting_ = false;
  if (spawner_) caf::anon_send_exit(spawner_, caf::exit_reason::user_shutdown);
  std::lock_guard lock(mu_);
  live_.clear();
  early_.clear();
  admission_ = caf::actor{};
  engine_ = caf::actor{};
  spawner_ = caf::actor{};
}

}  // namespace tireless
