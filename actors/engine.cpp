#include "actors/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <unordered_map>

#include "actors/actor_stats.hpp"
#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "scheduler/step_time_model.hpp"

namespace tireless {

namespace {

int64_t now_ns(caf::local_actor* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

// An exponentially weighted average over a time window.
struct rate {
  double value = 0;
  bool seeded = false;
  void add(double sample, double dt, double window) {
    const double w = seeded ? 1.0 - std::exp(-dt / window) : 1.0;
    value += w * (sample - value);
    seeded = true;
  }
};

struct request_info {
  caf::actor session;
  std::vector<std::string> degradations;
  int64_t arrival_ns = 0;
  int64_t ttft_target_ms = 0;
  int64_t scheduled_ns = -1;
  int64_t first_token_ns = -1;
};

struct engine_state {
  engine_options o;
  std::unique_ptr<batch_scheduler> core;
  caf::actor kv, shard, admission;
  std::unordered_map<seq_id, request_info> requests;
  bool stepping = false;
  bool changed = false;  // an event arrived since the current step was proposed
  uint64_t step_id = 0;
  uint64_t steps = 0;
  int64_t received = 0;  // generate messages received, for admission's credit arithmetic
  std::map<int32_t, int64_t> received_by_priority;
  int32_t free_blocks = 0, total_blocks = 0;
  rate step_seconds, prefill_rate, decode_rate, finish_rate;
  step_time_model step_model;
  step_residuals residuals;        // of step_model's predictions
  double residual_p95 = 1.0;       // residuals.quantile(0.95), after each step
  int32_t last_sequences_credit = -1, last_tokens_credit = -1;
  mailbox_stats mailbox{"engine"};
  // Set when the shard supervisor gave up (its restart budget spent): every request held
  // fails with this, and so does every one that arrives after.
  std::string backend_problem;
  int64_t late_refusals = 0;  // refused unstarted past their start bound
};

using self_ptr = caf::stateful_actor<engine_state>*;

void kick(self_ptr self);

void send_outcome(self_ptr self, seq_id id, const scheduler_event& e) {
  auto it = self->state.requests.find(id);
  if (it == self->state.requests.end()) return;
  const request_info& info = it->second;
  outcome_msg m(64);
  auto b = m.init();
  b.setRequestId(id);
  auto c = b.initCompleted();
  switch (e.reason) {
    case finish_reason::stop_token: c.setReason(proto::Completion::Reason::STOP_TOKEN); break;
    case finish_reason::max_tokens: c.setReason(proto::Completion::Reason::MAX_TOKENS); break;
    case finish_reason::context_full: c.setReason(proto::Completion::Reason::CONTEXT_FULL); break;
    case finish_reason::cancelled: break;
  }
  auto d = b.initDegradations(static_cast<unsigned>(info.degradations.size()));
  for (unsigned i = 0; i < info.degradations.size(); ++i) d.set(i, info.degradations[i]);
  auto u = b.initUsage();
  u.setPromptTokens(e.prompt_tokens);
  u.setCompletionTokens(e.generated);
  u.setCachedPromptTokens(e.cached_tokens);
  u.setPreemptions(e.preemptions);
  auto t = b.initTimings();
  const int64_t end = now_ns(self);
  t.setQueuedMs(info.scheduled_ns >= 0 ? (info.scheduled_ns - info.arrival_ns) / 1e6 : 0.0);
  t.setTimeToFirstTokenMs(info.first_token_ns >= 0 ? (info.first_token_ns - info.arrival_ns) / 1e6 : -1.0);
  t.setTotalMs((end - info.arrival_ns) / 1e6);
  self->send(info.session, std::move(m));
  self->send(self->state.admission, finished_atom::value, static_cast<uint64_t>(id), e.prompt_tokens + e.generated);
  self->state.requests.erase(it);
}

void dispatch(self_ptr self, const std::vector<scheduler_event>& events) {
  const int64_t now = now_ns(self);
  for (const scheduler_event& e : events) {
    auto it = self->state.requests.find(e.seq);
    if (it == self->state.requests.end()) continue;
    if (e.what == scheduler_event::kind::tokens) {
      tokens_msg m(32);
      auto b = m.init();
      b.setRequestId(e.seq);
      auto list = b.initTokens(static_cast<unsigned>(e.tokens.size()));
      for (unsigned i = 0; i < e.tokens.size(); ++i) list.set(i, e.tokens[i]);
      if (it->second.first_token_ns < 0) {
        it->second.first_token_ns = now;
        b.setFirstTokenNs(now);
      }
      self->send(it->second.session, std::move(m));
    } else if (e.what == scheduler_event::kind::finished) {
      send_outcome(self, e.seq, e);
    }
  }
}

// Packed steps aim this far below the target: the fitted model's error and the machine's
// jitter (a shared host, the server's own threads) would otherwise put the tightest tier's
// p99 time per output token right at its target (cpu-smollm2 at 3x: p99 150 ms of 150).
// Less headroom costs throughput and prefill per step, so TTFT: at 0.8, h200-k2-fleet's
// premium (a 500 ms TTFT target) fell to 98.9% at 3x; at 0.9 it keeps 99.2%. So 0.9 at
// most, and less when the model has been wrong lately: the target divided by the 95th
// percentile of actual / predicted step time (a host slower by 20% for a while leaves its
// steps ~80% of the target), never below half of it.
constexpr double step_time_headroom = 0.9;
constexpr double least_step_headroom = 0.5;

// This step's time budget: the tightest tier's time per output token (less the headroom),
// with the fitted step model to price each decode and prefill token.
step_time_budget step_budget(const engine_state& st) {
  step_time_budget b;
  const auto& k = st.step_model.coefficients();
  if (st.o.step_time_target_seconds <= 0 || k[1] <= 0) return b;
  b.headroom = std::clamp(1.0 / std::max(st.residual_p95, 1e-6), least_step_headroom, step_time_headroom);
  b.seconds = st.o.step_time_target_seconds * b.headroom;
  b.c0 = std::max(k[0], 0.0);
  b.per_prefill_token = k[1];
  b.per_decode = std::max(k[2], 0.0);
  b.per_context_position = std::max(k[3], 0.0) / 1000.0;
  return b;
}

// Prompt tokens a step takes beside the running decodes, as the budget allows (for
// admission's predictions).
int32_t token_budget(const engine_state& st) {
  const int32_t max_tokens = st.o.limits.max_step_tokens;
  const step_time_budget b = step_budget(st);
  if (b.seconds <= 0) return max_tokens;
  const sequence_counts c = st.core->counts();
  const double decodes = std::min(c.running, st.o.limits.max_step_seqs);
  const double spare = b.seconds - b.c0 - b.per_decode * decodes - b.per_context_position * c.running_context;
  const int32_t floor = static_cast<int32_t>(decodes) + min_step_prefill_tokens;
  return std::clamp(static_cast<int32_t>(decodes + std::max(spare / b.per_prefill_token, 0.0)),
                    std::min(floor, max_tokens), max_tokens);
}

void send_credits(self_ptr self) {
  auto& st = self->state;
  const sequence_counts c = st.core->counts();
  const int32_t seqs = std::max(0, st.o.max_waiting - c.waiting);
  const int32_t tokens = static_cast<int32_t>(std::max<int64_t>(0, st.o.max_waiting_tokens - c.waiting_prompt_tokens));
  credits_msg m(32);
  auto b = m.init();
  b.setSequences(seqs);
  b.setPrefillTokens(tokens);
  b.setFreeBlocks(st.free_blocks);
  b.setTotalBlocks(st.total_blocks);
  b.setPrefillTokensPerSecond(st.prefill_rate.value);
  b.setDecodeTokensPerSecond(st.decode_rate.value);
  b.setStepSeconds(st.step_seconds.value);
  b.setRunning(c.running);
  b.setWaiting(c.waiting);
  b.setFinishedPerSecond(st.finish_rate.value);
  auto coefficients = b.initStepModel(step_time_model::n);
  for (unsigned i = 0; i < step_time_model::n; ++i) coefficients.set(i, st.step_model.coefficients()[i]);
  b.setStepObservations(st.step_model.observations());
  b.setMaxStepTokens(token_budget(st));  // what a step takes now, for admission's predictions
  b.setMaxStepSeqs(st.o.limits.max_step_seqs);
  b.setWaitingPromptTokens(c.waiting_prompt_tokens);
  b.setRunningContext(static_cast<double>(c.running_context));
  b.setMaxWaiting(st.o.max_waiting);
  auto waiting = b.initWaitingByPriority(static_cast<unsigned>(c.waiting_by_priority.size()));
  unsigned i = 0;
  for (const auto& [priority, n] : c.waiting_by_priority) {
    waiting[i].setPriority(priority);
    waiting[i].setCount(n);
    waiting[i++].setPromptTokens(c.waiting_prompt_tokens_by_priority.at(priority));
  }
  auto received = b.initReceivedByPriority(static_cast<unsigned>(st.received_by_priority.size()));
  i = 0;
  for (const auto& [priority, n] : st.received_by_priority) {
    received[i].setPriority(priority);
    received[i++].setCount(n);
  }
  self->send(st.admission, std::move(m), st.received);
}

// Ends request `id` as failed with `why`: its session hears it, admission gets its tokens
// back, the scheduler lets go of its blocks.
void fail_request(self_ptr self, seq_id id, const std::string& why) {
  auto it = self->state.requests.find(id);
  if (it == self->state.requests.end()) return;
  outcome_msg m(64);
  auto b = m.init();
  b.setRequestId(id);
  b.initFailed().setMessage(why);
  self->send(it->second.session, std::move(m));
  self->send(self->state.admission, finished_atom::value, static_cast<uint64_t>(id), self->state.core->tokens_of(id));
  self->state.requests.erase(it);
  self->state.core->cancel(id);
}

void fail_batch(self_ptr self, const step_batch& batch, const std::string& why) {
  for (const sequence_step& s : batch.seqs) fail_request(self, s.seq_id, why);
}

// The shard supervisor quit: the model crashed more often than its restart budget allows.
// Nothing can be served any more; every request held ends now, none waits for a step that
// cannot come.
void lose_backend(self_ptr self, const caf::error& reason) {
  auto& st = self->state;
  st.backend_problem = "the model shard crashed more often than backend.max_shard_restarts allows and was not "
                       "restarted again (" + caf::to_string(reason) + "); restart the server";
  std::vector<seq_id> held;
  for (const auto& [id, info] : st.requests) held.push_back(id);
  for (seq_id id : held) fail_request(self, id, st.backend_problem);
  send_credits(self);
}

void run_step(self_ptr self, step_request_msg msg, step_batch batch, int attempt) {
  const int64_t t0 = now_ns(self);
  self->request(self->state.shard, caf::infinite, msg)
      .then(
          [=](const step_reply_msg& reply) {
            auto& st = self->state;
            step_result result;
            unpack(reply.get(), result);
            const double seconds = reply.get().getSeconds();
            int64_t prefill = 0, decode = 0;
            step_shape_counts shape;
            for (const sequence_step& s : batch.seqs) {
              if (s.tokens.size() == 1) {
                ++decode;
                shape.decode_context += s.start_pos + 1;
              } else {
                prefill += static_cast<int64_t>(s.tokens.size());
              }
            }
            shape.prefill_tokens = static_cast<double>(prefill);
            shape.decode_seqs = static_cast<double>(decode);
            if (st.step_model.observations() >= 8) st.residuals.add(st.step_model.predict(shape), seconds);
            st.residual_p95 = st.residuals.quantile(0.95);
            st.step_model.observe(shape, seconds);
            const double dt = std::max(seconds, 1e-9);
            st.step_seconds.add(seconds, dt, st.o.rate_window_seconds);
            if (prefill > 0) st.prefill_rate.add(prefill / dt, dt, st.o.rate_window_seconds);
            if (decode > 0) st.decode_rate.add(decode / dt, dt, st.o.rate_window_seconds);
            ++st.steps;
            (void)t0;
            const auto events = st.core->commit(result, now_ns(self));
            const auto finished = std::count_if(events.begin(), events.end(), [](const scheduler_event& e) {
              return e.what == scheduler_event::kind::finished;
            });
            st.finish_rate.add(finished / dt, dt, st.o.rate_window_seconds);
            dispatch(self, events);
            st.stepping = false;
            send_credits(self);
            kick(self);
          },
          [=](caf::error&) {
            if (attempt < self->state.o.step_retries) {
              run_step(self, msg, batch, attempt + 1);
              return;
            }
            fail_batch(self, batch, "the model shard failed repeatedly while running this request");
            self->state.core->commit(step_result{std::vector<token_id>(batch.seqs.size(), -1), {}});
            self->state.stepping = false;
            kick(self);
          });
}

// When nothing can run while requests wait and none runs, the pool cannot hold the first
// waiting request at all: fail it rather than wait forever.
void fail_unplaceable(self_ptr self, const kv_request& req, const kv_reply& reply) {
  if (self->state.core->counts().running > 0) return;
  for (size_t i = 0; i < req.entries.size(); ++i) {
    if (!req.entries[i].admit || reply.grants[i].granted) continue;
    fail_request(self, req.entries[i].seq,
                 "the request needs more KV cache than the pool holds; use a shorter prompt or max_tokens, or "
                 "configure more KV memory");
    return;
  }
}

// Requests that waited past their start bound without starting: refused now, before any
// prefill is spent on them, with the wait they had beyond their target as the retry hint.
void refuse_late(self_ptr self) {
  auto& st = self->state;
  const int64_t now = now_ns(self);
  for (seq_id id : st.core->take_late(now)) {
    auto it = st.requests.find(id);
    if (it == st.requests.end()) continue;
    const int64_t waited_ms = (now - it->second.arrival_ns) / 1'000'000;
    const int64_t retry_ms = std::max<int64_t>(100, waited_ms - it->second.ttft_target_ms);
    outcome_msg m(64);
    auto b = m.init();
    b.setRequestId(id);
    auto r = b.initRejected();
    r.setReason(to_wire(refusal::overloaded));
    r.setMessage(fmt::format("admitted, but it waited {} ms for the engine and cannot start within its tier's bound "
                             "(start_within_ms): refused before any work was spent on it; retry in {} ms",
                             waited_ms, retry_ms));
    r.setRetryAfterMs(retry_ms);
    self->send(it->second.session, std::move(m));
    self->send(st.admission, finished_atom::value, static_cast<uint64_t>(id), int32_t{0});
    st.requests.erase(it);
    ++st.late_refusals;
  }
}

void kick(self_ptr self) {
  auto& st = self->state;
  if (st.stepping) {
    st.changed = true;
    return;
  }
  refuse_late(self);
  if (!st.core->has_work()) return;
  st.stepping = true;
  st.changed = false;
  kv_request req = st.core->propose(step_budget(st), now_ns(self));
  self->request(st.kv, caf::infinite, to_wire(req))
      .then(
          [=](const kv_reply_msg& reply_msg) {
            auto& st = self->state;
            kv_reply reply = from_wire(reply_msg.get());
            st.free_blocks = reply.stats.free;
            st.total_blocks = reply.stats.total;
            step_batch batch = st.core->finalize(reply);
            const int64_t now = now_ns(self);
            for (const sequence_step& s : batch.seqs) {
              auto it = st.requests.find(s.seq_id);
              if (it != st.requests.end() && it->second.scheduled_ns < 0) it->second.scheduled_ns = now;
            }
            if (batch.seqs.empty()) {
              dispatch(self, st.core->commit(step_result{}));
              st.stepping = false;
              fail_unplaceable(self, req, reply);
              send_credits(self);
              // Nothing ran. Propose again if something changed meanwhile (an ack or a cancel
              // that arrived while the KV request was out), or if this grant started a request:
              // its cached prefix may already cover what the step's budget planned for it,
              // and the rest needs another grant. Otherwise nothing can run, and we would spin.
              bool started = false;
              for (size_t i = 0; i < req.entries.size(); ++i) started |= req.entries[i].admit && reply.grants[i].granted;
              if (st.changed || started) kick(self);
              return;
            }
            // Spans in `batch` point into the scheduler's sequences, which stay put until
            // commit; the message carries copies.
            run_step(self, to_wire(++st.step_id, batch, reply.copies), batch, 0);
          },
          [=](caf::error&) {
            self->state.stepping = false;
            self->quit(caf::sec::runtime_error);
          });
}

caf::behavior engine(self_ptr self, engine_options o, caf::actor kv, caf::actor shard,
                     caf::actor admission) {
  auto& st = self->state;
  st.o = o;
  st.core = std::make_unique<batch_scheduler>(o.limits);
  const step_cost_prior& prior = o.step_prior;
  st.step_model.seed({prior.c0, prior.per_prefill_token, prior.per_decode_seq, prior.per_thousand_context}, 8);
  st.kv = kv;
  st.shard = shard;
  st.admission = admission;
  self->monitor(shard);
  self->set_down_handler([=](caf::down_msg& dm) {
    const bool stopping = dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal;
    if (dm.source == self->state.shard.address() && !stopping) lose_backend(self, dm.reason);
  });
  send_credits(self);
  return {
      [=](generate_atom, const generate_msg& msg, const caf::actor& session) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        ++st.received;
        const auto r = msg.get();
        ++st.received_by_priority[r.getTierPriority()];
        sequence_spec spec;
        spec.id = r.getRequestId();
        spec.priority = r.getTierPriority();
        spec.arrival = static_cast<uint64_t>(r.getArrivalNs());
        for (auto t : r.getPrompt()) spec.prompt.push_back(t);
        spec.sampling = sampling_of(r.getSampling());
        spec.max_tokens = r.getMaxTokens();
        for (auto t : r.getStopTokens()) spec.stop_tokens.push_back(t);
        spec.token_window = r.getTokenWindow();
        spec.ttft_target_ns = r.getTtftTargetNs();
        spec.tpot_target_ns = r.getTpotTargetNs();
        spec.start_by = r.getStartByNs();
        request_info info{session, {}, r.getArrivalNs(), r.getTtftTargetNs() / 1'000'000, -1, -1};
        for (auto d : r.getDegradations()) info.degradations.emplace_back(d.cStr());
        st.requests[spec.id] = std::move(info);
        st.core->add(std::move(spec));
        if (!st.backend_problem.empty()) {
          fail_request(self, r.getRequestId(), st.backend_problem);
          return;
        }
        kick(self);
      },
      [=](cancel_atom, uint64_t id) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        if (self->state.requests.count(id)) {
          self->send(self->state.admission, finished_atom::value, id, self->state.core->tokens_of(id));
        }
        self->state.core->cancel(id);
        self->state.requests.erase(id);
        send_credits(self);
        kick(self);
      },
      [=](ack_atom, uint64_t id, int32_t n) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        self->state.core->acknowledge(id, n);
        kick(self);
      },
      [=](stats_atom) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        const sequence_counts c = self->state.core->counts();
        return engine_stats{c.running, c.waiting, static_cast<int64_t>(self->state.steps),
                            self->state.mailbox.max_mailbox, self->state.backend_problem,
                            self->state.late_refusals};
      },
  };
}

}  // namespace

caf::actor spawn_engine(caf::actor_system& sys, engine_options options, caf::actor kv_manager,
                        caf::actor shard, caf::actor admission) {
  return sys.spawn(engine, std::move(options), std::move(kv_manager), std::move(shard),
                   std::move(admission));
}

}  // namespace tireless
