#pragma once
// The runtime's actors for one model replica, wired together: admission → engine ⇄
// kv_manager, engine → shard supervisor → shard. runtime.cpp builds one on a real actor
// system; tests build one on CAF's deterministic test scheduler.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <memory>

#include "actors/admission.hpp"
#include "actors/engine.hpp"
#include "actors/kv_manager.hpp"
#include "actors/shard.hpp"
#include "config/resolved_limits.hpp"
#include "config/runtime_config.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

struct pipeline_options {
  admission_options admission;
  engine_options engine;
  kv_manager_options kv;
  shard_options shard;
  restart_policy shard_restarts;
};

struct pipeline {
  caf::actor kv, shard, admission, engine;
  std::shared_ptr<admission_gate> gate;  // admission's decisions (for the intake's refusals)
};

pipeline spawn_pipeline(caf::actor_system& sys, const pipeline_options& options);

// The actor system's settings for a runtime on real threads (runtime::start and benches).
void configure_actor_system(caf::actor_system_config& cfg);

// The options a configuration gives, for a backend already made (its KV geometry decides the
// pool) and the limits resolved against the model.
pipeline_options make_pipeline_options(const runtime_config& config, const resolved_limits& limits,
                                       std::shared_ptr<backend> model);

// How many requests may be inside the runtime at once (see request_door): every queue full,
// the engine's waiting room, and one running sequence per KV block at most.
int64_t door_capacity(const runtime_config& config, const pipeline_options& options);

// The runtime_stats fields each actor's stats answer gives (runtime and virtual runtime).
void add_to(runtime_stats& s, const engine_stats& e);
void add_to(runtime_stats& s, const admission_stats& a);
void add_to(runtime_stats& s, const kv_stats& k);
// A fleet's stats: one replica's added to the total (counts and queues summed, the largest
// mailboxes kept, the first backend problem).
void add_replica(runtime_stats& total, const runtime_stats& replica);

// Stops the pipeline's actors (sessions end on their own).
void stop_pipeline(const pipeline& p);

}  // namespace tireless
