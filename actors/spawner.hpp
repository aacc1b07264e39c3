#pragma once
// Runs jobs that spawn actors on an actor's thread. A thread that is not CAF's must not spawn
// (see system_owner.hpp); it sends the job to the spawner instead, which is always safe.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <functional>

namespace tireless {

caf::actor spawn_spawner(caf::actor_system& sys);

// Runs job(system) on the spawner's thread, soon. Callable from any thread.
void run_on_actor_thread(const caf::actor& spawner, std::function<void(caf::actor_system&)> job);

}  // namespace tireless
