#pragma once
// Where requests enter: authentication (API key → tenant → tier), the door that bounds how
// many are inside, one session per request, and the registry of live requests (for cancel,
// acknowledge and shutdown). Shared by the threaded runtime and the virtual-time runtime.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "actors/pipeline.hpp"
#include "actors/request_checks.hpp"
#include "actors/request_door.hpp"
#include "config/resolved_limits.hpp"
#include "config/runtime_config.hpp"
#include "scheduler/admission_control.hpp"
#include "scheduler/router.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

class model;

struct intake_counts {
  int32_t live = 0;
  int64_t completed = 0, rejected = 0, cancelled = 0, failed = 0;
};

class intake {
 public:
  // Construct on an actor-system thread (it spawns its spawner); use from any thread.
  intake(caf::actor_system& sys, const runtime_config& config, const resolved_limits& limits,
         std::shared_ptr<const model> lm, const pipeline& actors, int64_t door_capacity);

  uint64_t submit(request r, runtime::token_callback on_token, runtime::outcome_callback on_outcome);
  bool cancel(uint64_t id);
  void acknowledge(uint64_t id, int32_t n);
  // Refuses new requests from now on (rejected, shutting_down).
  void close() { accepting_ = false; }
  bool accepting() const { return accepting_; }
  // Waits (real time) until no request is live or `timeout` passed; true when none is.
  bool wait_idle(std::chrono::milliseconds timeout);
  // Cancels every live request (cancelled, shutdown).
  void cancel_all();
  intake_counts counts() const;
  // What a fleet's router needs to place `r` on this replica now (scheduler/router.hpp):
  // whether its admission would refuse it, its predicted first token, its queue.
  replica_view view(const request& r);
  // Seconds this replica's prefill of `tokens` prompt tokens takes idle (its admission's step model).
  double idle_prefill_s(int32_t tokens);
  // Stops the spawner and lets go of every actor handle (requests are refused from now on).
  void detach();
  const request_limits& limits() const { return request_limits_; }
  int64_t door_capacity() const { return door_.capacity(); }
  // The actor that spawns for this intake (see spawner.hpp), for other spawning jobs.
  const caf::actor& spawner() const { return spawner_; }

 private:
  void done(const outcome& o, bool entered);
  // The policy's refusal of a request, decided on the caller's thread (see admission_gate);
  // nothing when the policy takes it in, or leaves the decision to the admission actor. A text
  // prompt it tokenized on the way is left in `prepared`.
  std::optional<admission_decision> refuse_at_once(uint64_t id, const request& r, const std::string& tenant,
                                                   const tier_settings& tier, std::optional<prepared_prompt>& prepared);

  caf::actor spawner_;  // sessions are spawned on its thread
  const runtime_config& config_;
  resolved_limits limits_;
  std::shared_ptr<const model> lm_;
  caf::actor admission_, engine_;
  std::shared_ptr<admission_gate> gate_;
  caf::actor_system& sys_;  // its clock is admission's
  request_limits request_limits_;
  request_door door_;
  std::unordered_map<std::string, const tenant_settings*> tenant_by_key_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> accepting_{true};
  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::unordered_map<uint64_t, caf::actor> live_;  // sessions of unfinished requests
  std::unordered_map<uint64_t, int32_t> early_;   // cancels/acks sent before the session existed
  intake_counts counts_;
};

}  // namespace tireless
