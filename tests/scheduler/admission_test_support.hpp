#pragma once
// Settings, engine loads and arrivals the admission_control tests share.

#include <chrono>
#include <string>
#include <vector>

#include "scheduler/admission_control.hpp"

namespace tireless::admission_test {

using namespace std::chrono_literals;
using namespace std::chrono_literals;

inline tier_settings tier(std::string name, int32_t priority, std::chrono::milliseconds ttft, bool sheddable = true,
                   std::vector<degrade_step> ladder = {}) {
  tier_settings t;
  t.name = std::move(name);
  t.priority = priority;
  t.ttft = ttft;
  t.tpot = 1000ms;
  t.queue_bound = 1000;
  t.sheddable = sheddable;
  t.degrade = std::move(ladder);
  return t;
}

inline tenant_settings tenant(std::string name, std::string tier, double weight = 1.0) {
  tenant_settings t;
  t.name = std::move(name);
  t.keys = {"key-" + t.name};
  t.tier = std::move(tier);
  t.weight = weight;
  return t;
}

constexpr int64_t second = 1'000'000'000;

// Work waiting in the engine at a priority: `requests` prompts of `tokens` in all.
inline tier_load waiting_at(int32_t priority, int32_t requests, int64_t tokens) {
  tier_load t;
  t.priority = priority;
  t.waiting = requests;
  t.prompt_tokens = tokens;
  return t;
}

// An engine whose steps take 10 ms + 1 ms per prefill token, 512 tokens a step (no time
// budget), with `waiting_prompt_tokens` waiting above every tier's priority (ahead of all).
inline engine_load busy_engine(int64_t waiting_prompt_tokens) {
  engine_load l;
  l.step_model = {0.010, 0.001, 0.0, 0.0};
  l.step_observations = 100;
  l.max_step_tokens = 512;
  l.max_step_seqs = 64;
  if (waiting_prompt_tokens > 0) l.tiers = {waiting_at(1000, 0, waiting_prompt_tokens)};
  l.finished_per_second = 10;
  return l;
}

inline admission_decision arrive(admission_control& c, uint64_t id, const std::string& tenant_name, const std::string& tier_name,
                          int64_t now, int32_t prompt = 100, int32_t max_tokens = 100) {
  return c.arrive({id, tenant_name, tier_name, prompt, max_tokens, now});
}

}  // namespace tireless::admission_test
