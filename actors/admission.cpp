#include "actors/admission.hpp"

#include <chrono>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/actor_stats.hpp"
#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "scheduler/admission_gate.hpp"

namespace tireless {

namespace {

// How often queued requests are checked against max_queue_wait.
constexpr auto expiry_period = std::chrono::milliseconds(100);

struct pending {
  generate_msg request;
  caf::actor session;
};

struct admission_state {
  std::shared_ptr<admission_gate> gate;  // every use of it holds its lock
  admission_control& control() { return gate->control(); }
  caf::actor engine;
  std::unordered_map<uint64_t, pending> queued;
  // The engine's waiting room, as of its last credits, and what was sent since.
  int32_t max_waiting = 0;
  std::map<int32_t, int64_t> engine_waiting, engine_received, sent;
  bool ticking = false;
  mailbox_stats mailbox{"admission"};
};

using self_ptr = caf::stateful_actor<admission_state>*;

int64_t now_ns(caf::local_actor* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

void reject(self_ptr self, const caf::actor& session, uint64_t id, refusal why, const std::string& message,
            int64_t retry_after_ms) {
  outcome_msg m(64);
  auto b = m.init();
  b.setRequestId(id);
  auto r = b.initRejected();
  r.setReason(to_wire(why));
  r.setMessage(message);
  r.setRetryAfterMs(retry_after_ms);
  self->send(session, std::move(m));
}

// Whether the engine has room for one more request of this priority: the requests waiting
// there or on their way, of this priority and above, are fewer than its waiting room.
bool room_for(const admission_state& st, int32_t priority) {
  int64_t ahead = 0;
  for (const auto& [p, n] : st.engine_waiting) {
    if (p >= priority) ahead += n;
  }
  for (const auto& [p, n] : st.sent) {
    if (p < priority) continue;
    auto r = st.engine_received.find(p);
    ahead += n - (r == st.engine_received.end() ? 0 : r->second);
  }
  return ahead < st.max_waiting;
}

void release(self_ptr self) {
  auto& st = self->state;
  if (!st.engine) return;
  while (auto q = st.control().peek_priority()) {
    if (!room_for(st, *q)) return;
    auto next = st.control().next(now_ns(self));
    auto it = st.queued.find(next->id);
    if (it == st.queued.end()) continue;
    const int32_t priority = it->second.request.get().getTierPriority();
    self->send(st.engine, generate_atom::value, std::move(it->second.request), std::move(it->second.session));
    st.queued.erase(it);
    ++st.sent[priority];
  }
}

void tick(self_ptr self) {
  auto& st = self->state;
  if (st.ticking || st.queued.empty()) return;
  st.ticking = true;
  self->delayed_send(self, expiry_period, tick_atom::value);
}

void arrive(self_ptr self, generate_msg& msg, const caf::actor& session) {
  auto& st = self->state;
  auto b = msg.builder();
  arrival a;
  a.id = b.getRequestId();
  a.tenant = b.getTenant().cStr();
  a.tier = b.getTier().cStr();
  a.prompt_tokens = static_cast<int32_t>(b.getPrompt().size());
  a.max_tokens = b.getMaxTokens();
  a.now_ns = now_ns(self);
  const admission_decision d = st.control().arrive(a);
  if (!d.admitted) {
    reject(self, session, a.id, d.reason, d.message, d.retry_after_ms);
    return;
  }
  // The engine runs what admission decided: the capped max_tokens, the policy's priority,
  // and the degradations the outcome must report.
  b.setMaxTokens(d.max_tokens);
  b.setTierPriority(d.priority);
  b.setTtftTargetNs(d.ttft_target.count());
  b.setTpotTargetNs(d.tpot_target.count());
  if (d.start_within.count() > 0) b.setStartByNs(b.getArrivalNs() + d.start_within.count());
  // The session's deadline, armed here rather than by the session so that requests refused
  // above cost no timer.
  if (const int64_t deadline = b.getDeadlineNs(); deadline > 0) {
    self->delayed_send(session, std::chrono::nanoseconds(std::max<int64_t>(deadline - a.now_ns, 0)),
                       deadline_atom::value);
  }
  if (!d.degradations.empty()) {
    auto list = b.initDegradations(static_cast<unsigned>(d.degradations.size()));
    for (unsigned i = 0; i < d.degradations.size(); ++i) list.set(i, d.degradations[i]);
  }
  st.queued.emplace(a.id, pending{std::move(msg), session});
  release(self);
  tick(self);
}

caf::behavior admission(self_ptr self, std::shared_ptr<admission_gate> gate) {
  self->state.gate = std::move(gate);
  return {
      [=](attach_atom, const caf::actor& engine) {
        auto lock = self->state.gate->lock();
        self->state.engine = engine;
        release(self);
      },
      [=](generate_atom, generate_msg& msg, const caf::actor& session) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto lock = self->state.gate->lock();
        arrive(self, msg, session);
      },
      [=](cancel_atom, uint64_t id) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        auto lock = st.gate->lock();
        if (st.control().cancel(id, now_ns(self))) {
          st.queued.erase(id);
        } else if (st.engine) {
          self->send(st.engine, cancel_atom::value, id);
        }
      },
      [=](finished_atom, uint64_t id, int32_t used_tokens) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto lock = self->state.gate->lock();
        self->state.control().finished(id, used_tokens, now_ns(self));
      },
      [=](const credits_msg& m, int64_t engine_received) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        const auto c = m.get();
        (void)engine_received;
        st.max_waiting = c.getMaxWaiting();
        st.engine_waiting.clear();
        for (auto w : c.getWaitingByPriority()) st.engine_waiting[w.getPriority()] = w.getCount();
        for (auto r : c.getReceivedByPriority()) st.engine_received[r.getPriority()] = r.getCount();
        engine_load load;
        const auto model = c.getStepModel();
        for (unsigned i = 0; i < model.size() && i < load.step_model.size(); ++i) load.step_model[i] = model[i];
        load.step_observations = c.getStepObservations();
        load.max_step_tokens = c.getMaxStepTokens();
        load.max_step_seqs = c.getMaxStepSeqs();
        load.running = c.getRunning();
        load.waiting = c.getWaiting();
        load.waiting_prompt_tokens = c.getWaitingPromptTokens();
        for (auto w : c.getWaitingByPriority()) {
          load.waiting_by_priority.push_back({w.getPriority(), static_cast<int32_t>(w.getCount()), w.getPromptTokens()});
        }
        load.decode_context = c.getRunningContext();
        load.finished_per_second = c.getFinishedPerSecond();
        auto lock = st.gate->lock();
        st.control().observe(load);
        release(self);
      },
      [=](tick_atom) {
        auto& st = self->state;
        st.ticking = false;
        const int64_t now = now_ns(self);
        auto lock = st.gate->lock();
        for (const queued_request& q : st.control().expire(now)) {
          auto it = st.queued.find(q.id);
          if (it == st.queued.end()) continue;
          reject(self, it->second.session, q.id, refusal::overloaded,
                 fmt::format("waited longer than {} ms in tier '{}''s queue (admission.max_queue_wait_ms)",
                             (now - q.arrival_ns) / 1'000'000, q.tier),
                 std::max<int64_t>(100, static_cast<int64_t>(1000 * st.control().predicted_ttft(q.tier, q.prompt_tokens))));
          st.queued.erase(it);
        }
        for (const admission_control::late_request& l : st.control().too_late_to_start(now)) {
          auto it = st.queued.find(l.q.id);
          if (it == st.queued.end()) continue;
          reject(self, it->second.session, l.q.id, refusal::overloaded,
                 fmt::format("admitted, but it waited {} ms in tier '{}''s queue and cannot start within {} ms "
                             "(start_within_ms): refused before any work was spent on it; retry in {} ms",
                             (now - l.q.arrival_ns) / 1'000'000, l.q.tier, l.bound_ms, l.retry_after_ms),
                 l.retry_after_ms);
          st.queued.erase(it);
        }
        tick(self);
      },
      [=](stats_atom) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        std::vector<std::string> names;
        std::vector<int32_t> depths;
        auto lock = self->state.gate->lock();
        for (const auto& [name, n] : self->state.control().queued_by_tier()) {
          names.push_back(name);
          depths.push_back(n);
        }
        return caf::make_message(self->state.control().queued(), self->state.mailbox.max_mailbox, names, depths);
      },
  };
}

}  // namespace

std::shared_ptr<admission_gate> make_admission_gate(const admission_options& o) {
  return std::make_shared<admission_gate>(o.policy, o.settings, o.tiers, o.tenants);
}

caf::actor spawn_admission(caf::actor_system& sys, std::shared_ptr<admission_gate> gate) {
  return sys.spawn(admission, std::move(gate));
}

}  // namespace tireless
