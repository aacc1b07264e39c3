#include "runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <queue>
#include <set>

namespace tireless::load {

namespace {

double wall_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What the outcome callbacks write into; they ignore anything that comes after the run closed.
struct run_state {
  std::vector<request_record> records;
  std::vector<request_record> retries;  // run_result::retries
  // The retries booked and not sent yet, soonest first: (when, its index in retries).
  using due_retry = std::pair<double, size_t>;
  std::priority_queue<due_retry, std::vector<due_retry>, std::greater<>> due;
  int32_t max_retries = 0;
  std::vector<int32_t> in_system;
  int64_t outstanding = 0;
  double last_sent = 0;  // when the last try was sent (the target's clock)
  double retries_until = 0;  // retries due later are not sent: their clients are still waiting at the end
  bool closed = false;

  request_record& at(bool retry, size_t i) { return retry ? retries[i] : records[i]; }
};

void record_outcome(request_record& r, const outcome& o, double at) {
  r.outcome_s = at;
  r.kind = o.kind;
  r.reason = o.reason;
  if (o.kind != outcome_kind::completed) r.message = o.message;
  r.retry_after_ms = o.retry_after_ms;
  r.degradations = o.degradations;
  r.prompt_tokens = o.prompt_tokens;
  r.completion_tokens = o.completion_tokens;
  r.cached_prompt_tokens = o.cached_prompt_tokens;
  r.preemptions = o.preemptions;
  r.ttft_ms = o.time_to_first_token_ms;
  r.total_ms = o.total_ms;
  r.longest_pause_ms = o.longest_pause_ms;
}

// Sends the try (a first try in records, or a retry) and, when its outcome is a refusal for
// load and its client has retries left, books the next try after the hint.
void submit(target_session& session, const std::shared_ptr<run_state>& st, bool retry, size_t i) {
  request_record& r = st->at(retry, i);
  r.submitted_s = st->last_sent = session.now();
  ++st->outstanding;
  ++st->in_system[static_cast<size_t>(r.plan.tier)];
  session.submit(r.plan, [st, retry, i, &session](const outcome& o) {
    if (st->closed) return;
    request_record& rec = st->at(retry, i);
    if (rec.done()) return;  // a second outcome would be a bug of the target; the first counts
    record_outcome(rec, o, session.now());
    --st->outstanding;
    --st->in_system[static_cast<size_t>(rec.plan.tier)];
    if (rec.attempt < st->max_retries && retryable(rec)) {
      const size_t first = retry ? static_cast<size_t>(rec.first_try) : i;
      request_record next;
      next.plan = st->records[first].plan;
      next.plan.arrival_s = session.now() + static_cast<double>(o.retry_after_ms) / 1000.0;
      next.plan.retry_token = o.retry_token;
      next.idle_ttft_s = rec.idle_ttft_s;
      next.idle_work_s = rec.idle_work_s;
      next.first_try = static_cast<int64_t>(first);
      next.attempt = rec.attempt + 1;
      st->retries.push_back(std::move(next));  // `rec` may move: not used after this
      const double when = st->retries.back().plan.arrival_s;
      if (when < st->retries_until) st->due.push({when, st->retries.size() - 1});  // else never sent
    }
  });
}

// The most a retry is sent after its time: outcomes (and the retries they book) come while the
// target runs, so with retries the target runs in steps of at most this.
constexpr double retry_lag_s = 0.05;

// Runs the target to `t`, sending each retry that falls due before it at its time.
void run_to(target_session& session, const std::shared_ptr<run_state>& st, double t) {
  // A target's clock counts nanoseconds, and may stop one short of a time asked: a retry due
  // within a microsecond is due now, and once asked for t, t is reached.
  constexpr double tick_s = 1e-6;
  bool reached = false;
  for (;;) {
    const double now = reached ? t : session.now();
    while (!st->due.empty() && st->due.top().first <= std::min(t, now) + tick_s) {
      const size_t retry = st->due.top().second;
      st->due.pop();
      submit(session, st, true, retry);
    }
    if (reached || now >= t) return;
    double next = t;
    if (st->max_retries > 0) next = std::min(next, now + retry_lag_s);
    if (!st->due.empty()) next = std::min(next, std::max(st->due.top().first, now));
    session.advance_to(next);
    reached = next >= t;
  }
}

load_sample sample(target_session& session, const scenario& s, const run_state& st) {
  load_sample x;
  x.t = session.now();
  x.in_system = st.in_system;
  if (auto p = session.probe()) {
    x.queued = p->queued;
    x.running = p->running;
    x.waiting = p->waiting;
    if (!p->queued_by_tier.empty()) {
      x.queued_by_tier.assign(static_cast<size_t>(s.tier_count()), 0);
      for (const auto& [name, n] : p->queued_by_tier) {
        for (int32_t i = 0; i < s.tier_count(); ++i) {
          if (s.tier(i).name == name) x.queued_by_tier[static_cast<size_t>(i)] = n;
        }
      }
    }
  }
  return x;
}

}  // namespace

bool retryable(const request_record& r) {
  return r.done() && r.kind == outcome_kind::rejected && r.retry_after_ms >= 0 &&
         (r.reason == reason::overloaded || r.reason == reason::quota_exceeded);
}

capacity_result measure_capacity(target& t, const scenario& s, const progress_fn& progress) {
  capacity_result c;
  c.warmup_s = s.calibration_warmup_s;
  c.window_s = s.calibration_s;
  // The whole fleet's: concurrency per replica times the replicas.
  c.concurrency = (s.concurrency > 0 ? s.concurrency : s.config.engine.max_step_seqs) * std::max(1, s.replicas);
  c.method = fmt::format(
      "closed loop: {} requests from the mix in flight (each outcome replaced at once), policy fcfs, tenant quotas "
      "lifted; completed requests per second over {:g} s after a {:g} s warm-up",
      c.concurrency, c.window_s, c.warmup_s);
  const auto wall_start = std::chrono::steady_clock::now();
  auto session = t.open(admission_policy::fcfs, true, "capacity");
  auto st = std::make_shared<run_state>();
  st->in_system.assign(static_cast<size_t>(s.tier_count()), 0);
  request_source source(s, s.seed ^ 0xca11b4a7e5ull);
  const double end = c.warmup_s + c.window_s;
  const double step = t.virtual_time() ? 0.01 : 0.02;
  for (double now = 0; now < end && session->broken().empty(); now = session->now()) {
    while (st->outstanding < c.concurrency) {
      request_record r;
      r.plan = source.next();
      r.plan.arrival_s = session->now();
      st->records.push_back(r);
      submit(*session, st, false, st->records.size() - 1);  // records are reached by index: growing is safe
    }
    session->advance_to(now + step);
    if (progress) progress(std::min(1.0, session->now() / end), "measuring capacity");
  }
  for (const request_record& r : st->records) {
    if (!r.done() || r.outcome_s < c.warmup_s || r.outcome_s >= end) continue;
    if (r.kind == outcome_kind::completed) {
      ++c.completed;
      c.completion_tps += r.completion_tokens;
      c.prompt_tps += r.prompt_tokens;
    } else {
      ++c.other_outcomes;
    }
  }
  if (const std::string why = session->broken(); !why.empty()) throw std::runtime_error("the target went away while measuring: " + why);
  st->closed = true;
  session.reset();
  c.rps = c.completed / c.window_s;
  c.completion_tps /= c.window_s;
  c.prompt_tps /= c.window_s;
  c.wall_s = wall_since(wall_start);
  return c;
}

run_result run_open_loop(target& t, const scenario& s, admission_policy policy, double multiple,
                         double capacity_rps, const progress_fn& progress) {
  run_result out;
  out.policy = policy;
  out.multiple = multiple;
  out.rate_rps = multiple * capacity_rps;
  out.label = fmt::format("{}-x{:g}", to_string(policy), multiple);
  out.measure_from_s = s.warmup_s;
  out.measure_to_s = s.warmup_s + s.duration_s;
  const auto wall_start = std::chrono::steady_clock::now();

  const uint64_t seed = s.seed * 1'000'003ull + static_cast<uint64_t>(multiple * 1000);
  const std::vector<planned_request> plan = plan_open_loop(s, out.rate_rps, out.measure_to_s, seed);
  auto st = std::make_shared<run_state>();
  st->in_system.assign(static_cast<size_t>(s.tier_count()), 0);
  st->records.resize(plan.size());
  st->max_retries = s.retries;
  st->retries_until = out.measure_to_s + s.drain_seconds();
  // The ideal engine's prefix cache holds every prompt sent before: a class's system prompt is
  // computed once, by its first request.
  std::set<int32_t> prefix_sent;
  for (size_t i = 0; i < plan.size(); ++i) {
    const planned_request& p = plan[i];
    st->records[i].plan = p;
    st->records[i].idle_ttft_s = t.idle_first_token_s(p.prompt_tokens, p.arrival_s);
    const bool sent = p.system_tokens > 0 && !prefix_sent.insert(p.cls).second;
    const int32_t cached = sent ? t.cacheable_tokens(p.system_tokens) : 0;
    st->records[i].idle_work_s = t.idle_prefill_work_s(p.prompt_tokens, cached, p.arrival_s);
  }
  out.stalls = t.stalls();

  auto session = t.open(policy, s.lift_quotas, out.label);
  const double horizon = out.measure_to_s, drain_until = horizon + s.drain_seconds();
  double next_sample = 0;
  auto report = [&](const char* phase) {
    if (!progress) return;
    const double now = session->now();
    progress(std::min(1.0, now / horizon),
             fmt::format("{} {:.0f}/{:.0f} s, {} in flight", phase, std::min(now, horizon), horizon, st->outstanding));
  };
  auto sample_until = [&](double t_next) {
    while (next_sample <= t_next) {
      run_to(*session, st, next_sample);
      out.samples.push_back(sample(*session, s, *st));
      next_sample += s.sample_every_s;
    }
  };
  for (size_t i = 0; i < plan.size() && session->broken().empty(); ++i) {
    sample_until(plan[i].arrival_s);
    run_to(*session, st, plan[i].arrival_s);
    submit(*session, st, false, i);
    if (i % 64 == 0) report("load");
  }
  // The rest of the horizon, then the bounded wait for the outcomes still due: the drain after
  // the last try sent. Retries are sent until the drain after the horizon ends; a client whose
  // hint passes later is still waiting when the run ends.
  while (session->broken().empty() &&
         (session->now() < horizon || !st->due.empty() ||
          (st->outstanding > 0 && session->now() < std::max(drain_until, st->last_sent + s.drain_seconds())))) {
    sample_until(session->now() + s.sample_every_s);
    report(session->now() < horizon ? "load" : "drain");
  }
  out.end_s = session->now();
  out.target_broken = session->broken();
  if (auto p = session->probe()) out.shard_restarts = p->shard_restarts;
  out.fleet = session->fleet();
  st->closed = true;
  session.reset();
  out.records = std::move(st->records);
  out.retries = std::move(st->retries);
  out.wall_s = wall_since(wall_start);
  return out;
}

}  // namespace tireless::load
