#pragma once
// The sim backend a configuration describes, in one place for the runtime, the virtual-time
// runtime and the load driver: the named profile with [backend.expert_parallel] applied, and
// the expert group's conditions over time from [[faults.expert_group]]. CAF-free.

#include <memory>

#include "config/resolved_limits.hpp"
#include "config/runtime_config.hpp"
#include "gpu/sim/sim_backend.hpp"

namespace tireless {

// Throws std::invalid_argument for an unknown profile or overrides it cannot take.
sim::sim_profile configured_sim_profile(const runtime_config& c);
std::vector<sim::expert_event> expert_events(const std::vector<fault_settings::expert_group_event>& faults);

// The backend, its KV pool and context from the configuration (resolved into `limits`);
// widen_step_limits raises the profile's step limits to the engine's (the virtual runtime).
std::shared_ptr<sim::sim_backend> make_configured_sim(const runtime_config& c, resolved_limits& limits,
                                                      bool widen_step_limits);

}  // namespace tireless
