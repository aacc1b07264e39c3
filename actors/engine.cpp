#include "actors/engine.hpp"

#include <chrono>
#include <unordered_map>

#include "actors/actor_stats.hpp"
#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "protocol/outcome_wire.hpp"

namespace tireless {

namespace {

int64_t now_ns(caf::local_actor* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

struct engine_state {
  std::unique_ptr<engine_core> core;
  caf::actor kv, shard, admission;
  std::unordered_map<seq_id, caf::actor> sessions;
  uint64_t step_id = 0;
  int64_t wake_at = 0;  // a wake-up is due then (0: none)
  mailbox_stats mailbox{"engine"};
};

using self_ptr = caf::stateful_actor<engine_state>*;

// Tokens and outcomes to their sessions; an ended request's used tokens back to admission.
void deliver(self_ptr self) {
  auto& st = self->state;
  for (engine_delivery& d : st.core->take_deliveries()) {
    auto it = st.sessions.find(d.seq);
    if (it == st.sessions.end()) continue;
    if (!d.ended) {
      self->send(it->second, to_wire(d.seq, d.tokens, d.first_token_ns, d.logprobs));
      continue;
    }
    outcome_msg m(64);
    to_wire(d.result, m.init());
    self->send(it->second, std::move(m));
    self->send(st.admission, finished_atom::value, static_cast<uint64_t>(d.seq), d.used_tokens);
    st.sessions.erase(it);
  }
}

void send_credits(self_ptr self) { self->send(self->state.admission, to_wire(self->state.core->credits())); }

void kick(self_ptr self);

void run_step(self_ptr self, step_request_msg msg, int attempt) {
  self->request(self->state.shard, caf::infinite, msg)
      .then(
          [=](const step_reply_msg& reply) {
            step_result result;
            unpack(reply.get(), result);
            self->state.core->commit(result, reply.get().getSeconds(), now_ns(self));
            deliver(self);
            send_credits(self);
            kick(self);
          },
          [=](caf::error&) {
            if (attempt < self->state.core->options().step_retries) return run_step(self, msg, attempt + 1);
            self->state.core->abort("the model shard failed repeatedly while running this request");
            deliver(self);
            kick(self);
          });
}

// Nothing can run until an event or until `at` (the core's clock): a step is proposed then,
// unless an earlier wake-up is due already.
void wake_at(self_ptr self, int64_t at) {
  auto& st = self->state;
  const int64_t now = now_ns(self);
  if (st.wake_at > now && st.wake_at <= at) return;
  st.wake_at = at;
  self->delayed_send(self, std::chrono::nanoseconds(std::max<int64_t>(at - now, 0)), wake_atom::value);
}

void kick(self_ptr self) {
  auto& st = self->state;
  auto req = st.core->propose(now_ns(self));
  deliver(self);  // late refusals
  if (!req) return;
  self->request(st.kv, caf::infinite, to_wire(*req))
      .then(
          [=](const kv_reply_msg& reply) {
            auto step = self->state.core->granted(from_wire(reply.get()), now_ns(self));
            if (step.batch.seqs.empty()) {
              deliver(self);
              send_credits(self);
              if (step.propose_again) {
                kick(self);
              } else if (step.wake_at) {
                wake_at(self, *step.wake_at);
              }
              return;
            }
            // The batch's spans point into the core's sequences until commit; the message copies.
            run_step(self, to_wire(++self->state.step_id, step.batch, step.copies, step.forget), 0);
          },
          [=](caf::error&) { self->quit(caf::sec::runtime_error); });
}

caf::behavior engine(self_ptr self, engine_options o, caf::actor kv, caf::actor shard, caf::actor admission) {
  auto& st = self->state;
  st.core = std::make_unique<engine_core>(std::move(o));
  st.kv = kv;
  st.shard = shard;
  st.admission = admission;
  self->monitor(shard);
  self->set_down_handler([=](caf::down_msg& dm) {
    const bool stopping = dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal;
    if (dm.source != self->state.shard.address() || stopping) return;
    // The shard supervisor quit: the model crashed more often than its restart budget allows.
    self->state.core->lose_backend("the model shard crashed more often than backend.max_shard_restarts allows and "
                                   "was not restarted again (" + caf::to_string(dm.reason) + "); restart the server");
    deliver(self);
    send_credits(self);
  });
  send_credits(self);
  return {
      [=](generate_atom, const generate_msg& msg, const caf::actor& session) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        auto [spec, degradations] = sequence_of(msg.get());
        self->state.sessions[spec.id] = session;
        self->state.core->add(std::move(spec), std::move(degradations));
        deliver(self);
        kick(self);
      },
      [=](cancel_atom, uint64_t id) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        self->state.sessions.erase(id);
        if (auto used = self->state.core->cancel(id)) self->send(self->state.admission, finished_atom::value, id, *used);
        send_credits(self);
        kick(self);
      },
      [=](ack_atom, uint64_t id, int32_t n) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        self->state.core->acknowledge(id, n);
        kick(self);
      },
      [=](wake_atom) {
        self->state.wake_at = 0;
        kick(self);
      },
      [=](stats_atom) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        engine_stats s = self->state.core->stats();
        s.max_mailbox = self->state.mailbox.max_mailbox;
        return s;
      },
  };
}

}  // namespace

caf::actor spawn_engine(caf::actor_system& sys, engine_options options, caf::actor kv_manager,
                        caf::actor shard, caf::actor admission) {
  return sys.spawn(engine, std::move(options), std::move(kv_manager), std::move(shard), std::move(admission));
}

}  // namespace tireless
