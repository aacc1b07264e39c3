#pragma once
// The sim backend: no arithmetic. A step is validated as a real backend would, each sampling
// sequence gets a deterministic pseudo-random token, and the step's duration comes from the
// profile's cost model. execute() does not wait for that duration (unless real time is on):
// the caller advances its own clock by last_step_seconds(), so hours of traffic replay in
// seconds.

#include <memory>

#include "gpu/backend.hpp"
#include "gpu/sim/sim_profile.hpp"

namespace tireless::sim {

class sim_backend final : public backend {
 public:
  // Throws std::invalid_argument (from validate) when the profile is not usable.
  explicit sim_backend(sim_profile profile);

  std::string describe() const override;
  kv_geometry kv() const override { return profile_.kv; }
  backend_limits limits() const override { return profile_.limits; }
  int32_t n_vocab() const override { return profile_.n_vocab; }
  step_cost_prior cost_prior() const override {
    return {profile_.cost.c0, profile_.cost.c_prefill, profile_.cost.c_decode, profile_.cost.c_context * 1000.0};
  }

  // Throws std::invalid_argument, with the cpu backend's messages, for a batch past the
  // limits, positions outside the context, a short block table, a block outside the pool or
  // a token outside the vocabulary. The token for a sampling sequence is a hash of (seq_id,
  // the position it will take, sampling seed) in the profile's sampled range, whatever the
  // temperature. Requested logits are zero except for that token, which gets 1.
  void execute(const step_batch& batch, step_result& result) override;

  // Validates the block ids; there is nothing to copy.
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override;

  double last_step_seconds() const { return last_step_seconds_; }  // of the latest execute()
  double virtual_seconds() const { return virtual_seconds_; }      // sum over all steps
  step_shape last_step_shape() const { return last_shape_; }
  // On: execute() sleeps until its step's modelled duration has passed since it began, for a
  // real server running on the sim backend. Off by default.
  void set_real_time(bool on) { real_time_ = on; }
  const sim_profile& profile() const { return profile_; }

  // The expert-parallel group's conditions over time (a device down, a hot expert), applied
  // by the clock set_time() gives. Throws std::invalid_argument for an event the profile's
  // group cannot have (no expert parallelism, every device down).
  void set_expert_events(std::vector<expert_event> events);
  void set_time(double seconds_since_start) { now_ = seconds_since_start; }
  expert_condition condition() const;  // at the time last set

  // The token the sim samples for a sequence at `position` (the position the token will take).
  token_id token_for(uint64_t seq_id, int64_t position, uint64_t seed) const;
  token_logprob one_hot_logprob(token_id t, int32_t top) const;

 private:
  void check(const step_batch& batch) const;

  sim_profile profile_;
  step_shape last_shape_;
  double last_step_seconds_ = 0.0;
  double virtual_seconds_ = 0.0;
  bool real_time_ = false;
  std::vector<expert_event> events_;
  std::vector<char> stalled_;  // per event: its one stall taken
  double now_ = 0.0;
};

// Throws std::invalid_argument (from validate) when the profile is not usable.
std::unique_ptr<backend> make_sim_backend(const sim_profile& profile);

}  // namespace tireless::sim
