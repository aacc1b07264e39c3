#include "actors/admission.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>

#include <fmt/format.h>

#include "actors/actor_stats.hpp"
#include "actors/messages.hpp"

namespace tireless {

namespace {

struct queued {
  generate_msg request;
  caf::actor session;
  uint64_t id;
};

struct admission_state {
  admission_options o;
  caf::actor engine;
  std::map<int32_t, std::deque<queued>, std::greater<>> queues;  // by priority, highest first
  std::map<int32_t, int32_t> bounds;
  std::map<uint64_t, int32_t> where;  // queued request → its tier's priority
  int32_t credit_sequences = 0;
  int64_t engine_received = 0;  // as of the last credits
  int64_t sent = 0;             // requests released to the engine
  double drain_per_second = 0;  // requests the engine finishes per second, estimated
  mailbox_stats mailbox{"admission"};
};

using self_ptr = caf::stateful_actor<admission_state>*;

void reject(self_ptr self, const caf::actor& session, uint64_t id, proto::Rejection::Reason reason,
            const std::string& why, int64_t retry_after_ms) {
  outcome_msg m(64);
  auto b = m.init();
  b.setRequestId(id);
  auto r = b.initRejected();
  r.setReason(reason);
  r.setMessage(why);
  r.setRetryAfterMs(retry_after_ms);
  self->send(session, std::move(m));
}

void release(self_ptr self) {
  auto& st = self->state;
  if (!st.engine) return;
  for (auto& [priority, q] : st.queues) {
    while (!q.empty()) {
      const int64_t in_flight = st.sent - st.engine_received;
      if (st.credit_sequences - in_flight <= 0) return;
      queued item = std::move(q.front());
      q.pop_front();
      st.where.erase(item.id);
      self->send(st.engine, generate_atom::value, std::move(item.request), std::move(item.session));
      ++st.sent;
    }
  }
}

caf::behavior admission(self_ptr self, admission_options o) {
  for (const admission_tier& t : o.tiers) {
    self->state.queues[t.priority];
    self->state.bounds[t.priority] = t.queue_bound;
  }
  self->state.o = std::move(o);
  return {
      [=](attach_atom, const caf::actor& engine) {
        self->state.engine = engine;
        release(self);
      },
      [=](generate_atom, generate_msg& msg, const caf::actor& session) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        const auto r = msg.get();
        const uint64_t id = r.getRequestId();
        const int32_t priority = r.getTierPriority();
        auto q = st.queues.find(priority);
        if (q == st.queues.end()) {
          reject(self, session, id, proto::Rejection::Reason::INVALID,
                 fmt::format("tier '{}' is not configured", r.getTier().cStr()), -1);
          return;
        }
        if (static_cast<int32_t>(q->second.size()) >= st.bounds[priority]) {
          // Retry once the queue ahead of it could have drained at the engine's pace.
          const double per_second = std::max(st.drain_per_second, 1.0);
          const int64_t retry = static_cast<int64_t>(std::ceil(1000.0 * q->second.size() / per_second));
          reject(self, session, id, proto::Rejection::Reason::OVERLOADED,
                 fmt::format("tier '{}' has {} requests waiting, its limit", r.getTier().cStr(),
                             q->second.size()),
                 retry);
          return;
        }
        q->second.push_back({std::move(msg), session, id});
        st.where[id] = priority;
        release(self);
      },
      [=](cancel_atom, uint64_t id) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        auto w = st.where.find(id);
        if (w == st.where.end()) {
          if (st.engine) self->send(st.engine, cancel_atom::value, id);
          return;
        }
        auto& q = st.queues[w->second];
        q.erase(std::remove_if(q.begin(), q.end(), [&](const queued& x) { return x.id == id; }), q.end());
        st.where.erase(w);
      },
      [=](const credits_msg& m, int64_t engine_received) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        const auto c = m.get();
        st.credit_sequences = c.getSequences();
        st.engine_received = engine_received;
        st.drain_per_second = c.getFinishedPerSecond();
        release(self);
      },
      [=](stats_atom) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        int32_t queued_total = 0;
        for (const auto& [p, q] : self->state.queues) queued_total += static_cast<int32_t>(q.size());
        return caf::make_message(queued_total, self->state.mailbox.max_mailbox);
      },
  };
}

}  // namespace

caf::actor spawn_admission(caf::actor_system& sys, admission_options options) {
  return sys.spawn(admission, std::move(options));
}

}  // namespace tireless
