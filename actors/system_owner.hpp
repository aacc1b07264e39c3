#pragma once
// A CAF actor system that lives on a thread of its own. CAF 0.17 hangs in ~actor_system()
// when the system is destroyed on a thread other than the one that created it, or after a
// thread that is not CAF's spawned actors or made scoped actors (measured here: a minimal
// program reproduces it). So the system is created, set up, torn down and destroyed on one
// owner thread; other threads only send messages (anon_send), which is safe.

#include <caf/fwd.hpp>

#include <functional>
#include <memory>
#include <thread>

namespace tireless {

class system_owner {
 public:
  // Starts the owner thread, creates the system there and runs `setup` on it; returns when
  // setup returned (rethrowing what it threw).
  system_owner(std::function<void(caf::actor_system_config&)> configure,
               std::function<void(caf::actor_system&)> setup);
  // stop() if not done yet.
  ~system_owner();

  caf::actor_system& system() { return *system_; }

  // Runs `teardown` on the owner thread, destroys the system there (waiting for every actor to
  // finish) and joins the thread. Safe to call from any thread, once.
  void stop(std::function<void(caf::actor_system&)> teardown);

 private:
  struct control;
  std::shared_ptr<control> control_;
  caf::actor_system* system_ = nullptr;
  std::thread thread_;
};

}  // namespace tireless
