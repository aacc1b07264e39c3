#pragma once
// Shards run model steps. A step shard owns a backend (its weights and KV bytes) and answers
// step requests; a supervisor gives the engine one stable address for it and restarts it
// when it crashes, keeping the backend (so the KV cache survives an in-process crash).

#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>

#include "gpu/backend.hpp"

namespace tireless {

struct shard_options {
  std::shared_ptr<backend> model;
  // The backend's step time is virtual (the sim backend): reply after that much time on the
  // actor clock instead of computing for real. Real backends run on a detached thread.
  bool simulated = false;
  // Fault injection for tests: each step crashes the shard with this probability.
  double crash_probability = 0.0;
  uint64_t seed = 1;
};

// Spawns the supervisor; it spawns and watches the shard. Messages:
//   step_request_msg → step_reply_msg (forwarded to the shard)
//   crash_atom (tests) → the shard crashes on purpose
//   stats_atom → (restarts, steps)
caf::actor spawn_shard_supervisor(caf::actor_system& sys, shard_options options, int max_restarts);

}  // namespace tireless
