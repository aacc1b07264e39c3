#pragma once
// Admission's decisions, shared by the admission actor and the threads requests arrive on.
// The actor decides holding the lock. A request's own thread (the server's kj loop) may try
// the lock, never wait for it: when it gets the lock and the policy refuses the request, the
// request is refused there and then, without a session or a message to any actor. An
// overloaded server refuses most of what it is sent, so refusing must cost no more than
// answering an unknown key (issue 4: 20,000 refusals a second on 2 cores).

#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "scheduler/admission_control.hpp"

namespace tireless {

class admission_gate {
 public:
  admission_gate(admission_policy kind, const admission_settings& settings, std::vector<tier_settings> tiers,
                 std::vector<tenant_settings> tenants, std::shared_ptr<retry_book> book = nullptr)
      : control_(kind, settings, std::move(tiers), std::move(tenants), std::move(book)) {}

  // For the admission actor, which waits for the lock: hold it while using control().
  std::unique_lock<std::mutex> lock() { return std::unique_lock(mu_); }
  admission_control& control() { return control_; }

  // The policy's refusal of `a` now, decided on the calling thread; nothing when the policy
  // would take the request in, or when the admission actor holds the lock (the request then
  // goes the whole way and the actor decides). `a.prompt_tokens` must be the exact count.
  std::optional<admission_decision> try_refuse(const arrival& a) {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return std::nullopt;
    return control_.refusal(a);
  }
  // Whether the policy would refuse `a` now (nothing promised), if the lock is free; for
  // deciding whether the work of counting a prompt's tokens on this thread is likely to pay.
  bool would_refuse(const arrival& a) {
    std::unique_lock lock(mu_, std::try_to_lock);
    return lock.owns_lock() && control_.would_refuse(a);
  }

 private:
  std::mutex mu_;
  admission_control control_;
};

}  // namespace tireless
