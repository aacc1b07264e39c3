#pragma once
// The owner of a KV pool's accounting: answers the engine's per-step kv_request with a
// kv_reply (plan_kv over a block_manager).

#include <caf/fwd.hpp>

#include "scheduler/block_manager.hpp"

namespace tireless {

// What the kv_manager answers to stats_atom.
struct kv_stats {
  block_stats blocks;
  int64_t max_mailbox = 0;
};

}  // namespace tireless

namespace tireless {

struct kv_manager_options {
  block_manager_config blocks;
  bool check_invariants = false;  // after every request (tests)
};

//   kv_request_msg → kv_reply_msg
//   stats_atom → kv_stats
caf::actor spawn_kv_manager(caf::actor_system& sys, kv_manager_options options);

}  // namespace tireless
