#include "actors/kv_manager.hpp"

#include "actors/actor_stats.hpp"
#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "scheduler/kv_plan.hpp"

namespace tireless {

namespace {

struct kv_state {
  std::unique_ptr<block_manager> blocks;
  bool check = false;
  mailbox_stats mailbox{"kv_manager"};
};

caf::behavior kv_manager(caf::stateful_actor<kv_state>* self, kv_manager_options o) {
  self->state.blocks = std::make_unique<block_manager>(o.blocks);
  self->state.check = o.check_invariants;
  return {
      [=](const kv_request_msg& req) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        kv_reply reply = plan_kv(*self->state.blocks, from_wire(req.get()));
        if (self->state.check) self->state.blocks->check_invariants();
        return to_wire(reply);
      },
      [=](stats_atom) {
        note_mailbox(self->state.mailbox, self->mailbox().size());
        if (self->state.check) self->state.blocks->check_invariants();
        return kv_stats{self->state.blocks->stats(), self->state.mailbox.max_mailbox};
      },
  };
}

}  // namespace

caf::actor spawn_kv_manager(caf::actor_system& sys, kv_manager_options options) {
  return sys.spawn(kv_manager, std::move(options));
}

}  // namespace tireless
