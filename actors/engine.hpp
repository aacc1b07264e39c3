#pragma once
// The engine: one per model replica. Runs the continuous-batching step loop
//   propose → kv_manager grants → shard runs the step → commit → tokens to sessions
// and grants the admission credits derived from the KV level and the measured drain rate.

#include <caf/fwd.hpp>

#include <cstdint>

#include "gpu/backend.hpp"
#include "scheduler/batch_scheduler.hpp"

namespace tireless {

struct engine_options {
  scheduler_limits limits;
  int32_t max_waiting = 64;          // requests held in the engine beyond those running
  int32_t max_waiting_tokens = 4096; // prompt tokens held waiting
  int32_t step_retries = 3;          // a failed step (shard crash) is re-run this often
  double rate_window_seconds = 2.0;  // moving-average window of the drain rates
  step_cost_prior step_prior;        // the backend's rough step cost, until measured
  // A step should take at most this long (the tightest tier's time per output token), so
  // prefill chunks are sized to fit beside the decodes; 0: only max_step_tokens limits them.
  double step_time_target_seconds = 0;
};

// Messages:
//   (generate_atom, generate_msg, session actor)   a request released by admission
//   (cancel_atom, uint64_t request_id)            the session ended it
//   (ack_atom, uint64_t request_id, int32_t n)    the session's client took n tokens
//   stats_atom → (running, waiting, steps, max mailbox)
// Sends: tokens_msg and outcome_msg to sessions; credits_msg to admission.
caf::actor spawn_engine(caf::actor_system& sys, engine_options options, caf::actor kv_manager,
                        caf::actor shard, caf::actor admission);

}  // namespace tireless
