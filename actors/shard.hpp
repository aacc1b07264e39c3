#pragma once
// Shards run model steps. A step shard owns a backend (its weights and KV bytes) and answers
// step requests; a supervisor gives the engine one stable address for it, restarts it when it
// crashes, keeping the backend (so the KV cache survives an in-process crash), and re-runs on
// the new shard the steps the crashed one never answered.

#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

#include "gpu/backend.hpp"

namespace tireless {

struct step_storage;

struct shard_options {
  std::shared_ptr<backend> model;
  // The block tables the steps' deltas build on (actors/wire.hpp). The supervisor keeps them
  // across a restart of its shard, so a re-run step finds them; made at spawn when null.
  std::shared_ptr<step_storage> storage;
  // The backend's step time is virtual (the sim backend): reply after that much time on the
  // actor clock instead of computing for real. Real backends run on a detached thread.
  bool simulated = false;
  // Fault injection (config [faults]): each step crashes the shard, after the backend ran it
  // and before it answered, with crash_probability; a slow spell (steps slow_factor times as
  // long, for slow_seconds) begins at a step with slow_probability.
  double crash_probability = 0.0;
  int64_t crash_every = 0;  // and every crash_every-th step of a shard (0: none)
  double slow_probability = 0.0;
  double slow_seconds = 0.0;
  double slow_factor = 1.0;
  uint64_t seed = 1;
};

// How often a crashed shard is restarted: at most max_restarts within any `window`.
struct restart_policy {
  int max_restarts = 5;
  std::chrono::nanoseconds window = std::chrono::seconds(60);
};

// Spawns the supervisor; it spawns and watches the shard. Messages:
//   step_request_msg → step_reply_msg (forwarded to the shard)
//   crash_atom (tests) → the shard crashes on purpose
//   stats_atom → restarts so far
caf::actor spawn_shard_supervisor(caf::actor_system& sys, shard_options options, restart_policy restarts);

}  // namespace tireless
