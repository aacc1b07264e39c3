#include "scheduler/admission_control.hpp"

#include <algorithm>
#include <random>
#include <cassert>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace tireless {

namespace {

// Deficit round robin: a tenant of weight 1 earns this many tokens of work per turn.
constexpr double drr_quantum_tokens = 1024;
// A finished request's weight in its tier's mean of generated tokens.
constexpr double generated_mean_weight = 1.0 / 16;

// The prompt tokens of `a` its prefill computes, expected: those not in the prefix cache.
int32_t uncached_tokens(const arrival& a) { return a.prompt_tokens - std::max(a.cached_tokens, 0); }

int64_t ms_ceil(double seconds) { return static_cast<int64_t>(std::ceil(std::max(seconds, 0.0) * 1000.0)); }

// The lowest pressure at which a tier's ladder sheds (above any pressure when it never does).
double shed_pressure(const tier_settings& t) {
  for (const degrade_step& s : t.degrade) {
    if (s.action == degrade_action::shed) return s.pressure;
  }
  return 1e9;
}


admission_decision refuse(refusal why, std::string message, int64_t retry_after_ms) {
  admission_decision d;
  d.reason = why;
  d.message = std::move(message);
  d.retry_after_ms = retry_after_ms;
  return d;
}

}  // namespace

admission_control::admission_control(admission_policy kind, const admission_settings& settings,
                                     std::vector<tier_settings> tiers, std::vector<tenant_settings> tenants,
                                     std::shared_ptr<retry_book> book)
    : kind_(kind),
      settings_(settings),
      tiers_(std::move(tiers)),
      tenants_(std::move(tenants)),
      book_(book ? std::move(book) : std::make_shared<retry_book>()) {
  std::sort(tiers_.begin(), tiers_.end(), [](const auto& a, const auto& b) { return a.priority > b.priority; });
  for (const tier_settings& t : tiers_) {
    tier_state s;
    s.settings = &t;
    tier_states_.push_back(s);
  }
  for (const tenant_settings& t : tenants_) {
    tenant_state s;
    s.settings = &t;
    s.requests = token_bucket(t.requests_per_minute, t.requests_per_minute / 60.0);
    s.tokens = token_bucket(static_cast<double>(t.tokens_per_minute), t.tokens_per_minute / 60.0);
    tenant_states_.emplace(t.name, std::move(s));
  }
}

// A request whose tenant the configuration does not name (a runtime without tenants) is
// scheduled as one anonymous tenant without quotas.
admission_control::tenant_state& admission_control::tenant_of(const std::string& name) {
  auto it = tenant_states_.find(name);
  if (it != tenant_states_.end()) return it->second;
  tenant_state s;
  s.settings = &anonymous_;
  return tenant_states_.emplace(name, std::move(s)).first->second;
}

admission_control::tier_state& admission_control::tier_of(const std::string& name) {
  return const_cast<tier_state&>(std::as_const(*this).tier_of(name));
}

const admission_control::tier_state& admission_control::tier_of(const std::string& name) const {
  for (const tier_state& t : tier_states_) {
    if (t.settings->name == name) return t;
  }
  return tier_states_.back();
}

// Seconds a request takes from release to its end, on average: running requests divided by
// completions per second (Little's law).
double admission_control::service_seconds() const {
  return load_.finished_per_second > 0 ? std::max(load_.running(), 1) / load_.finished_per_second : 1.0;
}

double admission_control::predicted_ttft(const std::string& tier, int32_t prompt_tokens, double extra_tokens,
                                         bool own_work_only) const {
  return forecast(tier, prompt_tokens, extra_tokens, own_work_only).seconds;
}

first_token_forecast admission_control::forecast(const std::string& tier, int32_t prompt_tokens, double extra_tokens,
                                                 bool own_work_only, double returns, int32_t cached) const {
  if (!load_.measured()) return {};  // nothing measured yet: optimistic
  // Work ahead of the request: prompts waiting in the engine and those queued here, at its
  // tier or above (the engine places waiting requests in priority order, so a lower tier's
  // waiting prompts are not ahead of it), less its own tier's infeasible prompts that are
  // due after it (unless it is infeasible itself).
  const tier_state& own = tier_of(tier);
  const int32_t priority = own.settings->priority;
  const bool one_queue = kind_ == admission_policy::fcfs || kind_ == admission_policy::least_slack;
  const double target = std::chrono::duration<double>(own.settings->ttft).count();
  const bool infeasible = target > 0 && idle_prefill(prompt_tokens - std::max(cached, 0)) > target;
  // Prompts not started yet (its own, those queued here) compute what the prefix cache does not
  // hold: their tier's share of it lately (its own: what the prefix index expects, if known).
  auto uncached = [&](int32_t p) { return uncached_share(p); };
  work_ahead w;
  w.priority = engine_priority(*own.settings);
  w.prompt_tokens = extra_tokens * uncached(w.priority) +
                    (cached >= 0 ? prompt_tokens - cached : prompt_tokens * uncached(w.priority));
  w.lower_tiers_yield = own_work_only;
  w.returns = returns;
  for (const tier_load& t : load_.tiers) {
    if (t.priority < w.priority) continue;
    w.prompt_tokens += static_cast<double>(t.prompt_tokens);
    if (t.priority > w.priority || infeasible) w.prompt_tokens += static_cast<double>(t.later_tokens);
    w.requests += t.waiting;
    if (t.priority > w.priority) w.seats_above += t.running + t.waiting;
  }
  for (const tier_state& t : tier_states_) {
    if (!one_queue && t.settings->priority < priority) continue;
    double queued = static_cast<double>(t.queued_prompt_tokens);
    if (!one_queue && t.settings->priority == priority && !infeasible) queued -= static_cast<double>(t.queued_later_tokens);
    w.prompt_tokens += queued * uncached(one_queue ? 0 : t.settings->priority);
    w.requests += t.queued;
    if (engine_priority(*t.settings) > w.priority) w.seats_above += t.queued;
  }
  // Requests released to the engine and not received there yet (its load does not show them,
  // as under a flood during a fresh engine's first step) take seats ahead too.
  if (counts_received_) {
    for (const auto& [p, n] : sent_) {
      if (p < w.priority) continue;
      auto r = received_.find(p);
      const auto on_their_way = static_cast<double>(std::max<int64_t>(0, n - (r == received_.end() ? 0 : r->second)));
      w.requests += on_their_way;
      if (p > w.priority) w.seats_above += on_their_way;
    }
  }
  w.seat_seconds = seat_seconds();
  first_token_forecast f = forecast_first_token(load_, w);
  // Higher tiers' work that arrives during the wait goes ahead of it too (and, for an
  // infeasible prompt, its own tier's, which is prefilled before it): with ρ the share of the
  // prefill capacity they take, the wait stretches by 1 / (1 - ρ) (tireless only).
  // The decodes those requests bring count as far as they exceed the decodes already charged to
  // every step of the wait (at 3x on the CPU, premium's decodes took most of the engine while its
  // prompts alone read as a fifth of it, and free requests were admitted to wait 16 s).
  if (kind_ == admission_policy::tireless) {
    double rho = 0, decodes = 0;
    for (const tier_state& t : tier_states_) {
      if (t.settings->priority > priority || (infeasible && &t == &own)) {
        rho += t.arriving.at(now_ns_, observing_since_ns_) * f.seconds_per_token;
        decodes += t.arriving_decodes.at(now_ns_, observing_since_ns_);
      }
    }
    rho += std::max(0.0, decodes * decode_token_seconds(load_) - f.decode_share);
    f.seconds /= std::max(1.0 - rho, 0.05);
  }
  return f;
}

// Before the first completion there is no rate of seats freeing to read (a fresh engine whose
// batch filled at once): a request is expected to hold its seat for the tokens the requests
// held here may generate, at the pace of a full batch's decode steps.
double admission_control::seat_seconds() const {
  if (load_.finished_per_second > 0 || !load_.measured()) return 0;
  if (held_.empty()) return 0;
  const double requests = static_cast<double>(held_.size());
  const auto& k = load_.step_model;
  const double seats = std::max(load_.max_step_seqs, 1), generated = static_cast<double>(held_max_tokens_) / requests;
  const double context = static_cast<double>(held_prompt_tokens_) / requests + generated / 2;
  const double step = std::max(k[0], 0.0) + seats * (std::max(k[2], 0.0) + context * std::max(k[3], 0.0) / 1000.0);
  return generated * step * std::clamp(load_.step_residual, 0.25, 4.0);
}

// fcfs and least-slack keep one queue in the engine: every request at priority 0.
int32_t admission_control::engine_priority(const tier_settings& tier) const {
  return kind_ == admission_policy::fcfs || kind_ == admission_policy::least_slack ? 0 : tier.priority;
}

double admission_control::uncached_share(int32_t engine_priority) const {
  for (const tier_load& t : load_.tiers) {
    if (t.priority == engine_priority) return 1.0 - std::clamp(t.cached_share, 0.0, 1.0);
  }
  return 1.0;
}

double admission_control::idle_prefill(int32_t prompt_tokens) const {
  if (!load_.measured() || prompt_tokens <= 0) return 0.0;
  step_time_model model;
  model.set_coefficients(load_.step_model, load_.step_observations);
  const int32_t chunk = load_.max_step_tokens;
  const double full = model.predict({static_cast<double>(chunk), 0, 0});
  const int32_t rest = prompt_tokens % chunk;
  return (prompt_tokens / chunk) * full + (rest > 0 ? model.predict({static_cast<double>(rest), 0, 0}) : 0.0);
}

int32_t admission_control::longest_prompt_within(double seconds) const {
  int32_t lo = 0, hi = 1 << 24;  // idle_prefill grows with the prompt
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (idle_prefill(mid) <= seconds) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Half of each lower tier's target is kept as headroom: the prediction counts the work
// queued, not what arrives while the long prompt is prefilled (h200-k2-fleet at 1x with the
// whole target: free's SLO 96.5% -> 88.2%, a standard document served now and then).
bool admission_control::displaces_lower_tiers(const tier_settings& tier, int32_t prompt_tokens) const {
  for (const tier_settings& t : tiers_) {
    if (t.priority >= tier.priority || t.ttft.count() <= 0) continue;
    if (predicted_ttft(t.name, 1, prompt_tokens) > 0.5 * std::chrono::duration<double>(t.ttft).count()) return true;
  }
  return false;
}

bool admission_control::holds_reservation(const arrival& a) const {
  return a.retry_token != 0 && book_->held(a.retry_token, a.tenant, a.now_ns);
}

// How long a refused request should wait: until the work ahead of it, including the work
// reserved for clients refused before it, would leave it within target. Its own work is
// reserved too, until it comes back or its window passes. A reservation counts as its prompt
// and as a seat in the batch (work_ahead::returns): where seats are the bottleneck, prompt
// tokens alone spread nothing (the CPU server with 8 seats under a free flood told its clients
// ~8 s each and they came back together, to wait 16 s and be refused again). Counted also as
// requests that join the decodes, returns made hints minutes long on the H200 sims and fewer
// retries were served on time (bench/results/retry_seats_session14.txt).
int64_t admission_control::retry_hint_ms(const tier_settings& tier, const arrival& a, double target_seconds,
                                         bool promise, uint64_t* token) {
  if (!promise) return 0;  // would_refuse asks: no hint is given, nothing promised
  const retry_book::reserved_work returns = book_->reserved(tier.priority, a.now_ns);
  const double ttft =
      forecast(tier.name, a.prompt_tokens, returns.prompt_tokens, false, returns.requests, a.cached_tokens).seconds;
  const int64_t hint = std::max<int64_t>(ms_ceil(ttft - target_seconds), 100);
  if (token) *token = book_->reserve(a.tenant, tier.priority, a.prompt_tokens, a.now_ns, hint * 1'000'000);
  return hint;
}

std::optional<admission_decision> admission_control::check_quotas(tenant_state& t, const arrival& a,
                                                                 int32_t max_tokens) {
  const tenant_settings& s = *t.settings;
  if (s.max_concurrent > 0 && t.concurrent >= s.max_concurrent) {
    // No exact wait exists for a concurrency slot: the average time a request takes.
    return refuse(refusal::quota_exceeded,
                  fmt::format("tenant '{}' has {} requests in progress, its limit", s.name, t.concurrent),
                  ms_ceil(service_seconds() / std::max(1, t.concurrent)));
  }
  if (const int64_t w = t.requests.wait_ns(1, a.now_ns); w > 0) {
    return refuse(refusal::quota_exceeded,
                  fmt::format("tenant '{}' is over its {} requests per minute", s.name, s.requests_per_minute),
                  (w + 999'999) / 1'000'000);
  }
  const double need = static_cast<double>(a.prompt_tokens) + max_tokens;
  if (const int64_t w = t.tokens.wait_ns(need, a.now_ns); w != 0) {
    if (w < 0) {
      return refuse(refusal::quota_exceeded,
                    fmt::format("the request needs {} tokens (prompt + max_tokens) but tenant '{}' may use {} "
                                "a minute; lower max_tokens or split the prompt",
                                need, s.name, s.tokens_per_minute),
                    -1);
    }
    return refuse(refusal::quota_exceeded,
                  fmt::format("tenant '{}' is over its {} tokens per minute", s.name, s.tokens_per_minute),
                  (w + 999'999) / 1'000'000);
  }
  return std::nullopt;
}

template <class Message>
admission_decision admission_control::refuse_overloaded(const tier_settings& ts, const arrival& a, double within_seconds,
                                                        bool promise, bool reserve, Message&& message) {
  uint64_t token = 0;
  const int64_t hint = retry_hint_ms(ts, a, within_seconds, promise, reserve ? &token : nullptr);
  admission_decision r = refuse(refusal::overloaded, message(hint), hint);
  r.retry_token = token;
  return r;
}

// The policy's decision for a request arriving now; nothing is queued. A refusal's retry hint
// is promised (see promised_) when `promise`, else not even computed.
admission_decision admission_control::decide(const arrival& a, bool promise) {
  now_ns_ = std::max(now_ns_, a.now_ns);
  if (observing_since_ns_ < 0) observing_since_ns_ = a.now_ns;
  tier_state& tier = tier_of(a.tier);
  const tier_settings& ts = *tier.settings;
  admission_decision d;
  d.admitted = true;
  d.max_tokens = a.max_tokens;
  d.priority = engine_priority(ts);
  tenant_state& tenant = tenant_of(a.tenant);
  if (kind_ == admission_policy::least_slack) {  // deadlines, and nothing refused
    d.ttft_target = ts.ttft;
    d.tpot_target = ts.tpot;
    return d;
  }
  if (kind_ == admission_policy::tireless) {
    if (auto r = judge_by_forecast(a, tier, d, promise)) return *r;
    if (auto q = check_quotas(tenant, a, d.max_tokens)) return *q;
  }
  // A client back with its token was promised room: the bound (against a flood) does not turn
  // it away again.
  if (kind_ != admission_policy::fcfs && tier.queued >= ts.queue_bound && !holds_reservation(a)) {
    return refuse_overloaded(ts, a, 0.0, promise, kind_ == admission_policy::tireless, [&](int64_t) {
      return fmt::format("tier '{}' has {} requests waiting, its limit", ts.name, tier.queued);
    });
  }
  return d;
}

// tireless: the arrival against its tier's forecast and degradation ladder. A refusal, or
// nothing with d filled in (targets, start bound, degradations, max_tokens).
std::optional<admission_decision> admission_control::judge_by_forecast(const arrival& a, tier_state& tier,
                                                                       admission_decision& d, bool promise) {
  const tier_settings& ts = *tier.settings;
  d.ttft_target = ts.ttft;
  d.tpot_target = ts.tpot;
  const double target = std::chrono::duration<double>(ts.ttft).count();
  // A client back with its reservation is not shed now: its hint was a promise. (Newcomers
  // are judged by the work queued, not by reservations: clients that retry without their
  // token, or never, would otherwise hold phantom room; in the sim suite that cost 30-40% of
  // the goodput at 2-3x.)
  const bool reserved = holds_reservation(a);
  const double ttft = forecast(ts.name, a.prompt_tokens, 0, false, 0, a.cached_tokens).seconds;
  // Infeasible: its own prefill (of what the prefix cache is not expected to hold), on an idle
  // engine, takes longer than the target. It is judged by the wait ahead of it (the target is
  // out of reach whatever the load) and by what it costs the tiers below it (their requests
  // wait behind it), served after the feasible requests of its tier, and its outcome says so.
  const double idle = idle_prefill(uncached_tokens(a));
  const bool infeasible = target > 0 && idle > target;
  if (promise && !infeasible) {  // an arrival (not a question about one) that can be on time: the tier's load
    tier.offered.add(a.prompt_tokens, a.now_ns);
  }
  // A sheddable request's start bound is its tier's, stretched for an infeasible prompt as
  // far as its own prefill exceeds the target (its promise is relative to that prefill).
  if (ts.sheddable) {
    d.start_within = std::chrono::duration_cast<std::chrono::nanoseconds>(ts.start_bound() *
                                                                          (infeasible ? idle / target : 1.0));
  }
  const double pressure = target > 0 ? (infeasible ? (ttft - idle) / target : ttft / target) : 0.0;
  if (!reserved && infeasible && ts.sheddable && (ttft - idle > target || displaces_lower_tiers(ts, a.prompt_tokens))) {
    const int32_t fits = longest_prompt_within(target);
    return refuse(refusal::prompt_too_long,
                  fmt::format("a {}-token prompt cannot start within tier '{}''s {:.0f} ms even on an idle engine "
                              "(~{:.1f} s), and the engine is busy: split it into parts of at most {} tokens, or "
                              "retry later",
                              a.prompt_tokens, ts.name, target * 1e3, idle, fits),
                  retry_hint_ms(ts, a, target + idle, promise));
  }
  if (infeasible) {
    d.degradations.push_back(fmt::format("a {}-token prompt{} cannot start within tier '{}''s {:.0f} ms; expect ~{:.1f} s",
                                         a.prompt_tokens,
                                         a.cached_tokens > 0 ? fmt::format(" ({} of them expected cached)", a.cached_tokens)
                                                             : std::string(),
                                         ts.name, target * 1e3, ttft));
  }
  const degradation deg = ts.degradation_at(pressure);
  if (deg.shed && !reserved) {
    // Back when the pressure is under the rung that sheds, not merely under the target.
    return refuse_overloaded(ts, a, target * shed_pressure(ts), promise, true, [&](int64_t) {
      return fmt::format("tier '{}' is shedding load (pressure {:.2f}): the predicted time to first token is {:.1f} s "
                         "against a target of {:.1f} s",
                         ts.name, pressure, ttft, target);
    });
  }
  if (deg.max_prompt_tokens && a.prompt_tokens > *deg.max_prompt_tokens && !reserved) {
    return refuse(refusal::prompt_too_long,
                  fmt::format("under the current load tier '{}' accepts prompts of at most {} tokens; this "
                              "one has {}: split it into parts of at most {} tokens, or retry later",
                              ts.name, *deg.max_prompt_tokens, a.prompt_tokens, *deg.max_prompt_tokens),
                  retry_hint_ms(ts, a, target, promise));
  }
  if (deg.max_tokens && d.max_tokens > *deg.max_tokens) {
    d.degradations.push_back(fmt::format("max_tokens capped from {} to {} (tier {}, pressure {:.2f})",
                                         d.max_tokens, *deg.max_tokens, ts.name, pressure));
    d.max_tokens = *deg.max_tokens;
  }
  if (ts.sheddable && !infeasible && ttft > target && !reserved) {
    return refuse_overloaded(ts, a, target * std::min(1.0, shed_pressure(ts)), promise, true, [&](int64_t hint) {
      return fmt::format("the predicted time to first token, {:.1f} s, misses tier '{}''s target of {:.1f} s; retry in {} ms",
                         ttft, ts.name, target, hint);
    });
  }
  if (!ts.sheddable && !reserved) return hold_start_bound(a, tier, infeasible ? idle : 0.0, promise);
  return std::nullopt;
}

// A tier that is not sheddable is not refused for the lower tiers' load (its forecast lets
// their decodes yield, as the engine packs a step), but when the work of its own tier and
// above would hold its first token past its start bound (default 2x its target) or
// max_queue_wait, it is refused now, with a retry hint, rather than served late with the
// others. And when the tier's offered prompts that can be on time (less what the prefix
// cache holds; infeasible ones go after them), at the pace its own work would get on an
// engine of its own and its decodes, would need more than the whole engine (the tier alone is
// over the capacity: some of it must miss), a feasible one is refused once it would miss its
// target, so that those admitted meet theirs (h200-premium-heavy short form at 3x: 42.7% ->
// 55.2% of premium on time). The lower tiers' decodes do not count there: their tiers are
// shed first (priced at the pace left beside them, premium-heavy at 1x read as over: 98.1%
// -> 98.7% of premium on time without them).
// idle: an infeasible prompt's own prefill on an idle engine (0 for a feasible one).
std::optional<admission_decision> admission_control::hold_start_bound(const arrival& a, const tier_state& tier,
                                                                      double idle, bool promise) {
  const tier_settings& ts = *tier.settings;
  const double target = std::chrono::duration<double>(ts.ttft).count();
  const bool infeasible = idle > 0;
  double max_wait = std::min(std::chrono::duration<double>(settings_.max_queue_wait).count(),
                             std::chrono::duration<double>(ts.start_bound()).count());
  const first_token_forecast own = forecast(ts.name, a.prompt_tokens, 0, true, 0, a.cached_tokens);
  const bool over =
      !infeasible && tier.offered.at(a.now_ns, observing_since_ns_) * uncached_share(ts.priority) * own.seconds_per_token_alone > 1.0;
  if (over) max_wait = std::min(max_wait, target);
  if (max_wait <= 0 || own.seconds - idle <= max_wait) return std::nullopt;
  return refuse_overloaded(ts, a, max_wait, promise, true, [&](int64_t hint) {
    return over ? fmt::format("tier '{}' (not shed) offers more than the server's whole capacity at the moment, and the "
                              "predicted time to first token, {:.1f} s, misses its target of {:.1f} s: refused now so that "
                              "those admitted meet theirs; retry in {} ms",
                              ts.name, own.seconds, target, hint)
                : fmt::format("the predicted time to first token, {:.1f} s, is beyond the longest wait "
                              "(start_within_ms or admission.max_queue_wait_ms, {:.1f} s) even for tier '{}', which is not "
                              "shed: the server is over its capacity for this tier alone; retry in {} ms",
                              own.seconds, max_wait, ts.name, hint);
  });
}

arrival admission_control::looked_up(const arrival& a) const {
  arrival b = a;
  b.cached_tokens = prefixes_.enabled() && !a.prompt.empty() ? prefixes_.cached_tokens(a.prompt) : -1;
  return b;
}

std::optional<admission_decision> admission_control::refusal(const arrival& a) {
  admission_decision d = decide(looked_up(a));
  if (d.admitted) return std::nullopt;
  return d;
}

bool admission_control::would_refuse(const arrival& a) { return !decide(looked_up(a), false).admitted; }

admission_decision admission_control::arrive(const arrival& arrived) {
  const arrival a = looked_up(arrived);
  admission_decision d = decide(a);
  if (!d.admitted) return d;
  d.cached_tokens = std::max(a.cached_tokens, 0);
  prefixes_.record(a.prompt);
  if (a.retry_token != 0) book_->take(a.retry_token, a.tenant, a.now_ns);  // the promised work is here now
  tier_state& tier = tier_of(a.tier);
  const tier_settings& ts = *tier.settings;
  tenant_state* tenant = &tenant_of(a.tenant);
  holding h;
  h.q = {a.id, a.tenant, ts.name, a.prompt_tokens, d.max_tokens, a.cached_tokens, a.now_ns, d.start_within.count()};
  const double target = std::chrono::duration<double>(ts.ttft).count();
  h.later = kind_ == admission_policy::tireless && target > 0 && idle_prefill(uncached_tokens(a)) > target;
  ++tenant->concurrent;
  if (kind_ == admission_policy::tireless) {
    h.reserved = static_cast<double>(a.prompt_tokens) + d.max_tokens;
    tenant->requests.take(1, a.now_ns);
    tenant->tokens.take(h.reserved, a.now_ns);
    tenant_queue& q = tier.tenants[a.tenant];
    q.weight = tenant->settings->weight;
    if (q.ids.empty()) tier.rotation.push_back(a.tenant);
    q.ids.push_back(a.id);
    q.arrivals.push_back(a.now_ns);
  } else if (kind_ == admission_policy::fcfs) {
    arrivals_.push_back(a.id);
  } else {
    tier.fifo.push_back(a.id);
  }
  ++tier.queued;
  tier.queued_prompt_tokens += a.prompt_tokens;
  if (h.later) tier.queued_later_tokens += a.prompt_tokens;
  tier.arriving.add(uncached_tokens(a), a.now_ns);
  if (tier.generated_mean >= 0) tier.arriving_decodes.add(std::min<double>(d.max_tokens, tier.generated_mean), a.now_ns);
  held_prompt_tokens_ += a.prompt_tokens;
  held_max_tokens_ += d.max_tokens;
  held_.emplace(a.id, std::move(h));
  return d;
}

queued_request admission_control::release(holding& h) {
  h.queued = false;
  dequeue(h);
  ++sent_[engine_priority(*tier_of(h.q.tier).settings)];
  return h.q;
}

void admission_control::observe(const engine_credits& credits) {
  load_ = credits.load;
  received_ = credits.received_by_priority;
  counts_received_ = true;
}

void admission_control::dequeue(const holding& h) {
  tier_state& tier = tier_of(h.q.tier);
  --tier.queued;
  tier.queued_prompt_tokens -= h.q.prompt_tokens;
  if (h.later) tier.queued_later_tokens -= h.q.prompt_tokens;
}

size_t admission_control::first_on_time(const tenant_queue& q, const tier_settings& ts) const {
  const int64_t ttft = std::chrono::duration_cast<std::chrono::nanoseconds>(ts.ttft).count();
  // Arrivals are in order: the requests still within their deadline are a suffix.
  auto at = std::upper_bound(q.arrivals.begin(), q.arrivals.end(), now_ns_ - ttft);
  for (auto i = static_cast<size_t>(at - q.arrivals.begin()); i < q.ids.size(); ++i) {
    auto it = held_.find(q.ids[i]);
    if (it != held_.end() && it->second.queued) return i;
  }
  return 0;
}

std::optional<queued_request> admission_control::next_in_tier(tier_state& t) {
  if (kind_ != admission_policy::tireless) {
    while (!t.fifo.empty()) {
      const uint64_t id = t.fifo.front();
      t.fifo.pop_front();
      auto it = held_.find(id);
      if (it == held_.end() || !it->second.queued) continue;
      return release(it->second);
    }
    return std::nullopt;
  }
  // Weighted deficit round robin by tokens: the tenant at the front serves while its deficit
  // covers its next request's tokens, else earns a quantum (times its weight) and moves back.
  // A tenant serves its oldest request, except in a tier that is not sheddable once its
  // oldest are past their first-token deadline (the tier alone is over the capacity): then
  // its oldest request that can still meet it, so some meet their deadline rather than none
  // (those past it follow, or end at admission.max_queue_wait).
  while (!t.rotation.empty()) {
    tenant_queue& tq = t.tenants[t.rotation.front()];
    while (!tq.ids.empty()) {
      auto it = held_.find(tq.ids.front());
      if (it != held_.end() && it->second.queued) break;
      tq.ids.pop_front();  // cancelled meanwhile
      tq.arrivals.pop_front();
    }
    if (tq.ids.empty()) {
      tq.deficit = 0;
      t.rotation.pop_front();
      continue;
    }
    const size_t pick = t.settings->sheddable ? 0 : first_on_time(tq, *t.settings);
    holding& h = held_.at(tq.ids[pick]);
    const double cost = static_cast<double>(h.q.prompt_tokens) + h.q.max_tokens;
    if (tq.deficit >= cost) {
      tq.deficit -= cost;
      tq.ids.erase(tq.ids.begin() + static_cast<std::ptrdiff_t>(pick));
      tq.arrivals.erase(tq.arrivals.begin() + static_cast<std::ptrdiff_t>(pick));
      if (tq.ids.empty()) {
        tq.deficit = 0;
        t.rotation.pop_front();
      }
      return release(h);
    }
    tq.deficit += drr_quantum_tokens * tq.weight;
    t.rotation.push_back(t.rotation.front());
    t.rotation.pop_front();
  }
  return std::nullopt;
}

std::optional<queued_request> admission_control::next(int64_t now_ns) {
  now_ns_ = std::max(now_ns_, now_ns);
  if (kind_ == admission_policy::least_slack) {  // earliest first-token deadline across tiers
    tier_state* best = nullptr;
    int64_t best_due = 0;
    for (tier_state& t : tier_states_) {
      while (!t.fifo.empty()) {  // drop the front while it was cancelled meanwhile
        auto it = held_.find(t.fifo.front());
        if (it != held_.end() && it->second.queued) break;
        t.fifo.pop_front();
      }
      if (t.fifo.empty()) continue;
      const int64_t due = held_.at(t.fifo.front()).q.arrival_ns +
                          std::chrono::duration_cast<std::chrono::nanoseconds>(t.settings->ttft).count();
      if (!best || due < best_due) {
        best = &t;
        best_due = due;
      }
    }
    return best ? next_in_tier(*best) : std::nullopt;
  }
  if (kind_ == admission_policy::fcfs) {
    while (!arrivals_.empty()) {
      const uint64_t id = arrivals_.front();
      arrivals_.pop_front();
      auto it = held_.find(id);
      if (it == held_.end() || !it->second.queued) continue;
      return release(it->second);
    }
    return std::nullopt;
  }
  for (tier_state& t : tier_states_) {
    if (t.queued == 0) continue;
    if (auto q = next_in_tier(t)) return q;
  }
  return std::nullopt;
}

std::optional<int32_t> admission_control::peek_priority() const {
  if (kind_ == admission_policy::least_slack) {
    for (const tier_state& t : tier_states_) {
      if (t.queued > 0) return 0;
    }
    return std::nullopt;
  }
  if (kind_ == admission_policy::fcfs) {
    for (uint64_t id : arrivals_) {
      auto it = held_.find(id);
      if (it != held_.end() && it->second.queued) return 0;
    }
    return std::nullopt;
  }
  for (const tier_state& t : tier_states_) {
    if (t.queued > 0) return t.settings->priority;
  }
  return std::nullopt;
}

bool admission_control::cancel(uint64_t id, int64_t now_ns) {
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  const bool was_queued = it->second.queued;
  if (was_queued) dequeue(it->second);
  finished(id, 0, now_ns);
  return was_queued;
}

void admission_control::finished(uint64_t id, int32_t used_tokens, int64_t now_ns) {
  auto it = held_.find(id);
  if (it == held_.end()) return;
  const holding& h = it->second;
  if (auto t = tenant_states_.find(h.q.tenant); t != tenant_states_.end()) {
    --t->second.concurrent;
    if (h.reserved > used_tokens) t->second.tokens.give_back(h.reserved - used_tokens, now_ns);
  }
  held_prompt_tokens_ -= h.q.prompt_tokens;
  held_max_tokens_ -= h.q.max_tokens;
  if (!h.queued && used_tokens > h.q.prompt_tokens) {  // it ran: what it generated
    double& mean = tier_of(h.q.tier).generated_mean;
    const double generated = used_tokens - h.q.prompt_tokens;
    mean = mean < 0 ? generated : mean + generated_mean_weight * (generated - mean);
  }
  held_.erase(it);
}

std::vector<queued_request> admission_control::expire(int64_t now_ns) {
  std::vector<queued_request> out;
  if (kind_ == admission_policy::fcfs || kind_ == admission_policy::least_slack) return out;
  const int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(settings_.max_queue_wait).count();
  for (auto& [id, h] : held_) {
    if (h.queued && now_ns - h.q.arrival_ns > limit) out.push_back(h.q);
  }
  for (const queued_request& q : out) cancel(q.id, now_ns);
  return out;
}

std::vector<std::pair<std::string, int32_t>> admission_control::queued_by_tier() const {
  std::vector<std::pair<std::string, int32_t>> out;
  for (const tier_state& t : tier_states_) out.emplace_back(t.settings->name, t.queued);
  return out;
}

int32_t admission_control::queued() const {
  int32_t n = 0;
  for (const tier_state& t : tier_states_) n += t.queued;
  return n;
}

}  // namespace tireless
