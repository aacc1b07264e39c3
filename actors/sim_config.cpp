#include "actors/sim_config.hpp"

#include <algorithm>

namespace tireless {

sim::sim_profile configured_sim_profile(const runtime_config& c) {
  sim::sim_profile p = sim::named_profile(c.backend.sim_profile);
  const auto& o = c.backend.expert_parallel;
  sim::expert_parallel& ep = p.ep;
  ep.degree = o.degree.value_or(ep.degree);
  ep.moe_layers = o.moe_layers.value_or(ep.moe_layers);
  ep.hidden = o.hidden.value_or(ep.hidden);
  ep.remote_copies = o.remote_copies.value_or(ep.remote_copies);
  ep.dispatch_bytes = o.dispatch_bytes.value_or(ep.dispatch_bytes);
  ep.combine_bytes = o.combine_bytes.value_or(ep.combine_bytes);
  if (o.link_gbytes_per_s) ep.link_bytes_per_s = *o.link_gbytes_per_s * 1e9;
  if (o.link_latency_us) ep.link_latency_s = *o.link_latency_us * 1e-6;
  ep.expert_share = o.expert_share.value_or(ep.expert_share);
  ep.overlap = o.overlap.value_or(ep.overlap);
  sim::validate(p);
  return p;
}

std::vector<sim::expert_event> expert_events(const std::vector<fault_settings::expert_group_event>& faults) {
  std::vector<sim::expert_event> events;
  for (const auto& e : faults) events.push_back({e.at_s, e.for_s, e.down, e.imbalance, e.stall_ms / 1e3});
  return events;
}

std::shared_ptr<sim::sim_backend> make_configured_sim(const runtime_config& c, resolved_limits& limits,
                                                      bool widen_step_limits) {
  sim::sim_profile profile = configured_sim_profile(c);
  limits = resolve_limits(c, {profile.limits.max_context, profile.kv.bytes_per_block / profile.kv.block_size});
  profile.kv.block_size = c.kv.block_size;
  profile.kv.n_blocks = limits.kv_blocks;
  profile.limits.max_context = limits.max_context;
  if (widen_step_limits) {
    profile.limits.max_step_tokens = std::max(profile.limits.max_step_tokens, c.engine.max_step_tokens);
    profile.limits.max_step_seqs = std::max(profile.limits.max_step_seqs, c.engine.max_step_seqs);
  }
  auto sim = std::make_shared<sim::sim_backend>(profile);
  sim->set_expert_events(expert_events(c.faults.expert_group));
  return sim;
}

}  // namespace tireless
