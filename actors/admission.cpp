#include "actors/admission.hpp"

#include <chrono>
#include <functional>
#include <limits>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

#include "actors/actor_stats.hpp"
#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "protocol/outcome_wire.hpp"
#include "protocol/reason_names.hpp"
#include "scheduler/admission_gate.hpp"

namespace tireless {

namespace {

// How often queued requests are checked against max_queue_wait.
constexpr auto expiry_period = std::chrono::milliseconds(100);

struct pending {
  generate_msg request;
  caf::actor session;
};

// The timeouts of admitted requests: the session is told when its request's timeout passes.
// One timer, for the earliest; an entry goes as soon as its request ends (finished in the
// engine, refused or cancelled here), so an ended request's session is not held until its
// timeout would have passed (a delayed message per request held it, up to 300 s by default).
struct deadline_book {
  struct entry {
    caf::actor session;
    int64_t deadline_ns;
  };
  using due_item = std::pair<int64_t, uint64_t>;  // deadline, request id
  std::unordered_map<uint64_t, entry> held;
  std::priority_queue<due_item, std::vector<due_item>, std::greater<>> due;  // may name ended ones
  int64_t armed_for = std::numeric_limits<int64_t>::max();                   // the timer's deadline

  void forget(uint64_t id) {
    held.erase(id);
    if (due.size() > 2 * held.size() + 1024) {  // mostly ended requests: rebuild from what is held
      decltype(due) kept;
      for (const auto& [rid, e] : held) kept.emplace(e.deadline_ns, rid);
      due.swap(kept);
    }
  }
};

struct admission_state {
  std::shared_ptr<admission_gate> gate;  // every use of it holds its lock
  admission_control& control() { return gate->control(); }
  caf::actor engine;
  std::unordered_map<uint64_t, pending> queued;
  credit_ledger engine_room;  // the engine's waiting room: its last credits, and what was sent since
  deadline_book deadlines;
  bool ticking = false;
  mailbox_stats mailbox{"admission"};
};

using self_ptr = caf::stateful_actor<admission_state>*;

int64_t now_ns(caf::local_actor* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

void reject(self_ptr self, const caf::actor& session, uint64_t id, const admission_decision& d) {
  outcome_msg m(64);
  outcome o = rejected_outcome(id, proto::reason_name(to_wire(d.reason)), d.message, d.retry_after_ms);
  o.retry_token = d.retry_token;
  to_wire(o, m.init());
  self->send(session, std::move(m));
}

void reject(self_ptr self, const caf::actor& session, uint64_t id, refusal why, std::string message,
            int64_t retry_after_ms) {
  admission_decision d;
  d.reason = why;
  d.message = std::move(message);
  d.retry_after_ms = retry_after_ms;
  reject(self, session, id, d);
}

void release(self_ptr self) {
  auto& st = self->state;
  if (!st.engine) return;
  while (auto q = st.control().peek_priority()) {
    if (!st.engine_room.has_credit(*q)) return;
    auto next = st.control().next(now_ns(self));
    auto it = st.queued.find(next->id);
    if (it == st.queued.end()) continue;
    const int32_t priority = it->second.request.get().getTierPriority();
    self->send(st.engine, generate_atom::value, std::move(it->second.request), std::move(it->second.session));
    st.queued.erase(it);
    st.engine_room.sent(priority);
  }
}

void tick(self_ptr self) {
  auto& st = self->state;
  if (st.ticking || st.queued.empty()) return;
  st.ticking = true;
  self->delayed_send(self, expiry_period, tick_atom::value);
}

void arm(self_ptr self, int64_t now) {
  deadline_book& book = self->state.deadlines;
  while (!book.due.empty() && !book.held.count(book.due.top().second)) book.due.pop();
  if (book.due.empty() || book.due.top().first >= book.armed_for) return;
  book.armed_for = book.due.top().first;
  self->delayed_send(self, std::chrono::nanoseconds(std::max<int64_t>(book.armed_for - now, 0)), deadline_atom::value);
}

void hold_until(self_ptr self, uint64_t id, const caf::actor& session, int64_t deadline, int64_t now) {
  deadline_book& book = self->state.deadlines;
  book.held[id] = {session, deadline};
  book.due.emplace(deadline, id);
  arm(self, now);
}

// The timer: every held session whose deadline passed is told so.
void deadlines_due(self_ptr self) {
  deadline_book& book = self->state.deadlines;
  const int64_t now = now_ns(self);
  book.armed_for = std::numeric_limits<int64_t>::max();
  while (!book.due.empty() && book.due.top().first <= now) {
    const uint64_t id = book.due.top().second;
    book.due.pop();
    auto it = book.held.find(id);
    if (it == book.held.end()) continue;  // it ended before its deadline
    self->send(it->second.session, deadline_atom::value);
    book.held.erase(it);
  }
  arm(self, now);
}

void arrive(self_ptr self, generate_msg& msg, const caf::actor& session) {
  auto& st = self->state;
  auto b = msg.builder();
  arrival a;
  a.id = b.getRequestId();
  a.tenant = b.getTenant().cStr();
  a.tier = b.getTier().cStr();
  auto prompt = b.getPrompt();
  std::vector<token_id> tokens;  // for its cached prefix (prefix_index)
  tokens.reserve(prompt.size());
  for (token_id t : prompt) tokens.push_back(t);
  a.prompt_tokens = static_cast<int32_t>(tokens.size());
  a.prompt = tokens;
  a.max_tokens = b.getMaxTokens();
  a.now_ns = now_ns(self);
  a.retry_token = b.getRetryToken();
  const admission_decision d = st.control().arrive(a);
  if (!d.admitted) {
    reject(self, session, a.id, d);
    return;
  }
  // The engine runs what admission decided: the capped max_tokens, the policy's priority,
  // and the degradations the outcome must report.
  b.setMaxTokens(d.max_tokens);
  b.setTierPriority(d.priority);
  b.setTtftTargetNs(d.ttft_target.count());
  b.setTpotTargetNs(d.tpot_target.count());
  b.setExpectedCachedTokens(d.cached_tokens);
  if (d.start_within.count() > 0) b.setStartByNs(b.getArrivalNs() + d.start_within.count());
  // The session's deadline, kept here rather than by the session so that requests refused
  // above cost no timer.
  if (const int64_t deadline = b.getDeadlineNs(); deadline > 0) hold_until(self, a.id, session, deadline, a.now_ns);
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
          st.deadlines.forget(id);
        } else if (st.engine) {
          self->send(st.engine, cancel_atom::value, id);
        }
      },
      [=](finished_atom, uint64_t id, int32_t used_tokens) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto lock = self->state.gate->lock();
        self->state.control().finished(id, used_tokens, now_ns(self));
        self->state.deadlines.forget(id);
      },
      [=](deadline_atom) { deadlines_due(self); },
      [=](const credits_msg& m) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto& st = self->state;
        const engine_credits c = from_wire(m.get());
        st.engine_room.update(c);
        auto lock = st.gate->lock();
        st.control().observe(c);
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
          st.deadlines.forget(q.id);
        }
        for (const admission_control::late_request& l : st.control().too_late_to_start(now)) {
          auto it = st.queued.find(l.q.id);
          if (it == st.queued.end()) continue;
          admission_decision d;
          d.reason = refusal::overloaded;
          d.message = fmt::format("admitted, but it waited {} ms in tier '{}''s queue and cannot start within {} ms "
                                  "(start_within_ms): refused before any work was spent on it; retry in {} ms",
                                  (now - l.q.arrival_ns) / 1'000'000, l.q.tier, l.bound_ms, l.retry_after_ms);
          d.retry_after_ms = l.retry_after_ms;
          d.retry_token = l.retry_token;
          reject(self, it->second.session, l.q.id, d);
          st.queued.erase(it);
          st.deadlines.forget(l.q.id);
        }
        tick(self);
      },
      [=](stats_atom) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto lock = self->state.gate->lock();
        return admission_stats{self->state.control().queued(), self->state.mailbox.max_mailbox,
                               self->state.control().queued_by_tier(),
                               static_cast<int32_t>(self->state.deadlines.held.size())};
      },
  };
}

}  // namespace

std::shared_ptr<admission_gate> make_admission_gate(const admission_options& o) {
  auto gate = std::make_shared<admission_gate>(o.policy, o.settings, o.tiers, o.tenants);
  gate->control().index_prefixes(o.prefix_block_size, o.prefix_index_blocks);
  return gate;
}

caf::actor spawn_admission(caf::actor_system& sys, std::shared_ptr<admission_gate> gate) {
  return sys.spawn(admission, std::move(gate));
}

}  // namespace tireless
