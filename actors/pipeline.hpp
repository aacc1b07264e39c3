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

namespace tireless {

struct pipeline_options {
  admission_options admission;
  engine_options engine;
  kv_manager_options kv;
  shard_options shard;
  int max_shard_restarts = 5;
};

struct pipeline {
  caf::actor kv, shard, admission, engine;
};

pipeline spawn_pipeline(caf::actor_system& sys, const pipeline_options& options);

// Stops the pipeline's actors (sessions end on their own).
void stop_pipeline(const pipeline& p);

}  // namespace tireless
