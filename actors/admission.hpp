#pragma once
// Admission: one per served model. Keeps one bounded queue per tier, releases requests to
// the engine only against the engine's credits, and refuses early when a tier's queue is
// full, with a retry hint.

#include <caf/fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tireless {

struct admission_tier {
  std::string name;
  int32_t priority = 0;
  int32_t queue_bound = 64;
};

struct admission_options {
  std::vector<admission_tier> tiers;
};

// Messages:
//   (generate_atom, generate_msg, session actor)  queue or refuse (rejected outcome to session)
//   (cancel_atom, uint64_t request_id)           drop a queued request, or pass the cancel on
//   (credits_msg, int64_t engine_received)       from the engine
//   (attach_atom, engine actor)                  where to release requests
//   stats_atom → (queued, max mailbox)
caf::actor spawn_admission(caf::actor_system& sys, admission_options options);

}  // namespace tireless
