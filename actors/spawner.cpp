#include "actors/spawner.hpp"

#include <memory>

#include "actors/messages.hpp"

namespace tireless {

namespace {

struct spawn_job {
  std::function<void(caf::actor_system&)> run;
};

using spawn_atom = caf::atom_constant<caf::atom("spawn")>;

}  // namespace
}  // namespace tireless

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<tireless::spawn_job>)

namespace tireless {

caf::actor spawn_spawner(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {[=](spawn_atom, const std::shared_ptr<spawn_job>& job) { job->run(self->system()); }};
  });
}

void run_on_actor_thread(const caf::actor& spawner, std::function<void(caf::actor_system&)> job) {
  caf::anon_send(spawner, spawn_atom::value, std::make_shared<spawn_job>(spawn_job{std::move(job)}));
}

}  // namespace tireless
