#include "scheduler/engine_core.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tireless {

namespace {

std::string_view name_of(finish_reason r) {
  switch (r) {
    case finish_reason::stop_token: return reason::stop_token;
    case finish_reason::max_tokens: return reason::max_tokens;
    case finish_reason::context_full: return reason::context_full;
    case finish_reason::cancelled: return reason::client;
  }
  return reason::stop_token;
}

}  // namespace

engine_core::engine_core(engine_options o) : o_(std::move(o)), core_(o_.limits) {
  const step_cost_prior& p = o_.step_prior;
  step_model_.seed({p.c0, p.per_prefill_token, p.per_decode_seq, p.per_thousand_context}, 8);
}

void engine_core::add(sequence_spec spec, std::vector<std::string> degradations) {
  ++received_by_priority_[spec.priority];
  const seq_id id = spec.id;
  request_info info;
  info.degradations = std::move(degradations);
  info.priority = spec.priority;
  info.prompt_tokens = static_cast<int32_t>(spec.prompt.size());
  info.expected_cached = spec.expected_cached;
  info.arrival_ns = static_cast<int64_t>(spec.arrival);
  info.ttft_target_ms = spec.ttft_target_ns / 1'000'000;
  requests_[id] = std::move(info);
  core_.add(std::move(spec));
  changed_ = true;
  if (!backend_problem_.empty()) fail(id, backend_problem_);
}

std::optional<int32_t> engine_core::cancel(seq_id id) {
  std::optional<int32_t> used;
  if (requests_.erase(id)) used = core_.tokens_of(id);
  core_.cancel(id);
  changed_ = true;
  return used;
}

void engine_core::acknowledge(seq_id id, int32_t tokens) {
  core_.acknowledge(id, tokens);
  changed_ = true;
}

void engine_core::lose_backend(std::string why) {
  backend_problem_ = std::move(why);
  std::vector<seq_id> held;
  for (const auto& [id, info] : requests_) held.push_back(id);
  for (seq_id id : held) fail(id, backend_problem_);
}

void engine_core::end(seq_id id, outcome o, int32_t used_tokens) {
  o.request_id = id;
  engine_delivery d;
  d.seq = id;
  d.ended = true;
  d.result = std::move(o);
  d.used_tokens = used_tokens;
  deliveries_.push_back(std::move(d));
  requests_.erase(id);
}

void engine_core::fail(seq_id id, const std::string& why) {
  if (!requests_.count(id)) return;
  end(id, failed_outcome(id, why), core_.tokens_of(id));
  core_.cancel(id);
}

// Requests that waited past their start bound without starting: refused now, before any
// prefill is spent on them. The retry hint and reservation are admission's (retry_after_late:
// its forecast, staggered by the returns reserved before); without one, the wait they had
// beyond their target (the CPU e2e under a free flood: ~8 s for every one refused together,
// all of them back at once to be refused again).
void engine_core::refuse_late(int64_t now) {
  for (seq_id id : core_.take_late(now, budget())) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    const int64_t waited_ms = (now - it->second.arrival_ns) / 1'000'000;
    std::optional<retry_promise> retry;
    if (o_.retry_after_late) retry = o_.retry_after_late(id, now);
    if (!retry) retry = retry_promise{std::max<int64_t>(100, waited_ms - it->second.ttft_target_ms), 0};
    outcome o = rejected_outcome(id, reason::overloaded,
                                 fmt::format("admitted, but it waited {} ms for the engine and cannot start within its "
                                             "tier's bound (start_within_ms): refused before any work was spent on it; "
                                             "retry in {} ms",
                                             waited_ms, retry->retry_after_ms),
                                 retry->retry_after_ms);
    o.retry_token = retry->retry_token;
    end(id, std::move(o), 0);
    ++late_refusals_;
  }
}

std::optional<kv_request> engine_core::propose(int64_t now) {
  if (stepping_) return std::nullopt;
  refuse_late(now);
  if (!core_.has_work()) return std::nullopt;
  stepping_ = true;
  changed_ = false;
  proposed_ = core_.propose(budget(), now);
  return proposed_;
}

// When nothing can run while requests wait and none runs, the pool cannot hold the first
// waiting request at all: fail it rather than wait forever.
void engine_core::fail_unplaceable(const kv_reply& reply) {
  if (core_.counts().running > 0) return;
  for (size_t i = 0; i < proposed_.entries.size(); ++i) {
    if (!proposed_.entries[i].admit || reply.grants[i].granted) continue;
    fail(proposed_.entries[i].seq,
         "the request needs more KV cache than the pool holds; use a shorter prompt or max_tokens, or "
         "configure more KV memory");
    return;
  }
}

engine_core::granted_step engine_core::granted(const kv_reply& reply, int64_t now) {
  granted_step g;
  g.batch = core_.finalize(reply);
  g.copies = reply.copies;
  batch_.clear();
  shape_ = {};
  for (const sequence_step& s : g.batch.seqs) {
    batch_.push_back(s.seq_id);
    auto it = requests_.find(s.seq_id);
    if (it != requests_.end() && it->second.scheduled_ns < 0) started(s.seq_id, it->second, now);
    if (s.tokens.size() == 1) {
      ++shape_.decode_seqs;
      shape_.decode_context += s.start_pos + 1;
    } else {
      shape_.prefill_tokens += static_cast<double>(s.tokens.size());
    }
  }
  if (!g.batch.seqs.empty()) {
    g.forget = core_.take_forgotten();  // they go with a step; a step that did not run keeps them
    return g;
  }
  deliver(core_.commit(step_result{}, now), now);
  stepping_ = false;
  fail_unplaceable(reply);
  // Nothing ran. Propose again if something changed meanwhile (an ack or a cancel that
  // arrived while the KV request was out), if this grant started a request (its cached
  // prefix may already cover what the step's budget planned for it, and the rest needs
  // another grant), or if the pool's answer changes the plan (a prompt it refused no longer
  // takes the step from the streams that yielded to it; blocks came back). Otherwise
  // proposing now would spin: propose again when time alone changes the plan.
  bool started = false;
  for (size_t i = 0; i < proposed_.entries.size(); ++i) started |= proposed_.entries[i].admit && reply.grants[i].granted;
  const bool replan = core_.take_replan();
  g.propose_again = changed_ || started || replan;
  if (!g.propose_again && core_.has_work()) g.wake_at = core_.wake_at(now, budget());
  return g;
}

// Its first placement. Admission judged it by the prefix it expected cached; when the pool held
// less (evicted meanwhile) and the rest cannot meet its target, its outcome says so.
void engine_core::started(seq_id id, request_info& info, int64_t now) {
  info.scheduled_ns = now;
  const int32_t found = core_.cached_tokens(id);
  if (found >= info.expected_cached || !core_.infeasible(id, budget())) return;
  info.degradations.push_back(fmt::format("{} of its {} prompt tokens were expected in the prefix cache and {} were "
                                          "found: it cannot start within its tier's {} ms",
                                          info.expected_cached, info.prompt_tokens, found, info.ttft_target_ms));
}

void engine_core::observe_step(double seconds) {
  if (step_model_.observations() >= 8) {
    const double predicted = step_model_.predict(shape_);
    residuals_.add(predicted, seconds);
    if (predicted > stretched_step_targets * o_.step_time_target_seconds) {
      stretched_residuals_.add(predicted, seconds);
      stretched_p95_ = stretched_residuals_.quantile(0.95);
    }
  }
  residual_p95_ = residuals_.quantile(0.95);
  residual_p50_ = residuals_.quantile(0.5);
  step_model_.observe(shape_, seconds);
  ++steps_;
  prefill_tokens_ += static_cast<int64_t>(shape_.prefill_tokens);
  decode_tokens_ += shape_.decode_seqs;
  step_seconds_ += seconds;
  const auto& bounds = o_.step_time_buckets_seconds;
  step_time_counts_.resize(bounds.size() + 1);
  ++step_time_counts_[static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin())];
}

void engine_core::commit(const step_result& result, double seconds, int64_t now) {
  observe_step(seconds);
  auto events = core_.commit(result, now);
  const auto finished = std::count_if(events.begin(), events.end(), [](const scheduler_event& e) {
    return e.what == scheduler_event::kind::finished;
  });
  const double dt = std::max(seconds, 1e-9);
  const double w = finish_rate_seeded_ ? 1.0 - std::exp(-dt / o_.rate_window_seconds) : 1.0;
  finished_per_second_ += w * (static_cast<double>(finished) / dt - finished_per_second_);
  finish_rate_seeded_ = true;
  deliver(std::move(events), now);
  stepping_ = false;
}

void engine_core::abort(const std::string& why) {
  for (seq_id id : batch_) fail(id, why);
  step_result nothing;
  nothing.next.assign(batch_.size(), -1);
  core_.commit(nothing);
  batch_.clear();
  stepping_ = false;
}

void engine_core::deliver(std::vector<scheduler_event> events, int64_t now) {
  for (scheduler_event& e : events) {
    auto it = requests_.find(e.seq);
    if (it == requests_.end()) continue;
    request_info& info = it->second;
    if (e.what == scheduler_event::kind::tokens) {
      engine_delivery d;
      d.seq = e.seq;
      d.tokens = std::move(e.tokens);
      d.logprobs = std::move(e.logprobs);
      if (info.first_token_ns < 0) {
        d.first_token_ns = info.first_token_ns = now;
        // The share of its tier's prompts the prefix cache held, lately.
        double& share = cached_share_[info.priority];
        share += cached_share_weight * (static_cast<double>(core_.cached_tokens(e.seq)) / std::max(info.prompt_tokens, 1) - share);
      }
      deliveries_.push_back(std::move(d));
    } else if (e.what == scheduler_event::kind::finished) {
      outcome o;
      o.kind = outcome_kind::completed;
      o.reason = name_of(e.reason);
      o.degradations = std::move(info.degradations);
      o.prompt_tokens = e.prompt_tokens;
      o.completion_tokens = e.generated;
      o.cached_prompt_tokens = e.cached_tokens;
      o.preemptions = e.preemptions;
      o.queued_ms = info.scheduled_ns >= 0 ? (info.scheduled_ns - info.arrival_ns) / 1e6 : 0.0;
      o.time_to_first_token_ms = info.first_token_ns >= 0 ? (info.first_token_ns - info.arrival_ns) / 1e6 : -1.0;
      o.total_ms = (now - info.arrival_ns) / 1e6;
      end(e.seq, std::move(o), e.prompt_tokens + e.generated);
    }
  }
}

step_time_budget engine_core::budget() const {
  step_time_budget b;
  const auto& k = step_model_.coefficients();
  if (o_.step_time_target_seconds <= 0 || k[1] <= 0) return b;
  b.headroom = std::clamp(1.0 / std::max(residual_p95_, 1e-6), least_step_headroom, step_time_headroom);
  b.seconds = o_.step_time_target_seconds * b.headroom;
  b.stretch_headroom = std::clamp(1.0 / std::max(stretched_p95_, 1e-6), least_step_headroom, 1.0);
  b.c0 = std::max(k[0], 0.0);
  b.per_prefill_token = k[1];
  b.per_decode = std::max(k[2], 0.0);
  b.per_context_position = std::max(k[3], 0.0) / 1000.0;
  return b;
}

engine_credits engine_core::credits() const {
  const step_time_budget b = budget();
  engine_credits out;
  out.max_waiting = o_.max_waiting;
  out.received_by_priority = received_by_priority_;
  engine_load& l = out.load;
  l.step_model = step_model_.coefficients();
  l.step_observations = step_model_.observations();
  l.max_step_tokens = o_.limits.max_step_tokens;
  l.max_step_seqs = o_.limits.max_step_seqs;
  l.step_seconds = b.seconds;
  l.step_residual = residual_p50_;
  l.tiers = core_.counts(b).tiers;
  for (tier_load& t : l.tiers) {
    if (auto it = cached_share_.find(t.priority); it != cached_share_.end()) t.cached_share = it->second;
  }
  l.finished_per_second = finished_per_second_;
  return out;
}

engine_stats engine_core::stats() const {
  const sequence_counts c = core_.counts();
  engine_stats s;
  s.running = c.running;
  s.waiting = c.waiting;
  s.steps = steps_;
  s.backend_problem = backend_problem_;
  s.late_refusals = late_refusals_;
  s.prefill_tokens = prefill_tokens_;
  s.decode_tokens = decode_tokens_;
  s.step_seconds = step_seconds_;
  s.step_time_counts = step_time_counts_;
  s.step_time_counts.resize(o_.step_time_buckets_seconds.size() + 1);
  return s;
}

}  // namespace tireless
