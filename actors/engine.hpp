#pragma once
// The engine: one per model replica. Glue around engine_core's step loop
//   propose → kv_manager grants → shard runs the step → commit → deliveries → credits
// (scheduler/engine_core.hpp decides and measures; this actor only moves messages).

#include <caf/fwd.hpp>

#include "scheduler/engine_core.hpp"

namespace tireless {

// Messages:
//   (generate_atom, generate_msg, session actor)   a request released by admission
//   (cancel_atom, uint64_t request_id)            the session ended it
//   (ack_atom, uint64_t request_id, int32_t n)    the session's client took n tokens
//   stats_atom → engine_stats
// Sends: tokens_msg and outcome_msg to sessions; credits_msg and (finished_atom, id, used
// tokens) to admission.
caf::actor spawn_engine(caf::actor_system& sys, engine_options options, caf::actor kv_manager,
                        caf::actor shard, caf::actor admission);

}  // namespace tireless
