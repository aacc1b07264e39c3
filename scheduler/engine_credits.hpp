#pragma once
// The engine → admission signal, one credit protocol (DESIGN.md, "Backpressure"):
//   - a waiting room: the engine holds at most max_waiting requests beyond those running,
//     counted at a request's priority and above (so a higher tier always finds room);
//     admission's credit for priority p is max_waiting less the requests of priority >= p
//     waiting there or on their way (sent, not yet received);
//   - the engine's load, which admission's time-to-first-token predictions read.
// engine_core makes it; wire.cpp carries it as Credits; credit_ledger is admission's side.

#include <cstdint>
#include <map>

#include "scheduler/engine_load.hpp"

namespace tireless {

struct engine_credits {
  int32_t max_waiting = 0;
  std::map<int32_t, int64_t> received_by_priority;  // generate messages received, ever
  engine_load load;                                 // its tiers' waiting requests are the room's use
};

// Admission's side of the waiting room: what the engine last said, and what was sent since.
class credit_ledger {
 public:
  void update(const engine_credits& c) {
    max_waiting_ = c.max_waiting;
    waiting_.clear();
    for (const tier_load& t : c.load.tiers) waiting_[t.priority] = t.waiting;
    received_ = c.received_by_priority;
  }
  // Whether one more request of this priority may be sent now.
  bool has_credit(int32_t priority) const {
    int64_t ahead = 0;
    for (const auto& [p, n] : waiting_) {
      if (p >= priority) ahead += n;
    }
    for (const auto& [p, n] : sent_) {
      if (p < priority) continue;
      auto r = received_.find(p);
      ahead += n - (r == received_.end() ? 0 : r->second);
    }
    return ahead < max_waiting_;
  }
  void sent(int32_t priority) { ++sent_[priority]; }

 private:
  int32_t max_waiting_ = 0;
  std::map<int32_t, int64_t> waiting_, received_, sent_;
};

}  // namespace tireless
