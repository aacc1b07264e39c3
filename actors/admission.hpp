#pragma once
// Admission: one per served model. Decides at arrival (refuse, degrade, queue) by the
// configured policy (scheduler/admission_control.hpp), keeps the queues, and releases requests
// to the engine only against the engine's credits.

#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/runtime_config.hpp"

namespace tireless {

// What admission answers to stats_atom.
struct admission_stats {
  int32_t queued = 0;
  int64_t max_mailbox = 0;
  std::vector<std::pair<std::string, int32_t>> queued_by_tier;  // highest priority first
  int32_t timed_sessions = 0;  // admitted requests with a timeout, not ended: sessions held for it
};

}  // namespace tireless

namespace tireless {

class admission_gate;

struct admission_options {
  admission_policy policy = admission_policy::tireless;
  admission_settings settings;
  std::vector<tier_settings> tiers;
  std::vector<tenant_settings> tenants;
  // The engine's prefix cache, as admission expects it (admission_control::index_prefixes):
  // its block size and pool size in blocks; 0: without prefix caching.
  int32_t prefix_block_size = 0;
  int64_t prefix_index_blocks = 0;
};

// Messages:
//   (generate_atom, generate_msg, session actor)  refuse (outcome to the session) or queue
//   (cancel_atom, uint64_t request_id)           drop a queued request, or pass the cancel on
//   (finished_atom, uint64_t request_id, int32_t used_tokens)  from the engine: it ended
//   deadline_atom                                 its own timer: tell sessions their timeout passed
//   credits_msg                                   from the engine (engine_credits)
//   (attach_atom, engine actor)                  where to release requests
//   stats_atom → admission_stats
// Its decisions live in an admission_gate, shared with the intake so that a request the
// policy refuses can be refused on the thread it arrived on (scheduler/admission_gate.hpp).
std::shared_ptr<admission_gate> make_admission_gate(const admission_options& options);
caf::actor spawn_admission(caf::actor_system& sys, std::shared_ptr<admission_gate> gate);

}  // namespace tireless
