#pragma once
// A session: one per request. Tokenizes (chat template), forwards the request to admission,
// streams tokens to its caller under flow control, enforces the deadline, turns a cancel
// into a cancel downstream, and reports the request's one terminal outcome.

#include <caf/actor.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "actors/request_checks.hpp"
#include "tireless/runtime.hpp"

namespace tireless {

class model;

// Delivers a request's events to its caller; the outcome exactly once, whoever calls first.
class request_reporter {
 public:
  request_reporter(uint64_t id, runtime::token_callback on_token, runtime::outcome_callback on_outcome,
                   std::function<void(const outcome&)> on_done)
      : id_(id), on_token_(std::move(on_token)), on_outcome_(std::move(on_outcome)), on_done_(std::move(on_done)) {}

  uint64_t id() const { return id_; }
  bool reported() const { return reported_.load(); }
  void tokens(const token_event& e) {
    if (!reported_.load() && on_token_) on_token_(e);
  }
  // Returns false when an outcome was already reported (this one is dropped).
  bool report(outcome o) {
    if (reported_.exchange(true)) return false;
    o.request_id = id_;
    if (on_done_) on_done_(o);  // first: once the caller hears of the outcome, the request is gone
    if (on_outcome_) on_outcome_(o);
    return true;
  }

 private:
  uint64_t id_;
  runtime::token_callback on_token_;
  runtime::outcome_callback on_outcome_;
  std::function<void(const outcome&)> on_done_;
  std::atomic<bool> reported_{false};
};

struct session_options {
  std::shared_ptr<request_reporter> reporter;
  request req;
  std::shared_ptr<const model> lm;  // null on the sim backend: token ids only
  std::string tenant, tier;
  int32_t tier_priority = 0;
  request_limits limits;
  std::optional<prepared_prompt> prepared;  // the prompt, if the intake tokenized it already
  caf::actor admission;
  caf::actor engine;  // watched: if it or admission stops, the request fails instead of hanging
};

// Spawns the session; it starts at once. Messages: (cancel_atom, int32_t why) with why 0 for
// the client and 1 for a shutdown.
caf::actor spawn_session(caf::actor_system& sys, session_options options);


}  // namespace tireless
