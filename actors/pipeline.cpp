#include "actors/pipeline.hpp"

#include "actors/messages.hpp"

namespace tireless {

pipeline spawn_pipeline(caf::actor_system& sys, const pipeline_options& o) {
  pipeline p;
  p.kv = spawn_kv_manager(sys, o.kv);
  p.shard = spawn_shard_supervisor(sys, o.shard, o.max_shard_restarts);
  p.admission = spawn_admission(sys, o.admission);
  p.engine = spawn_engine(sys, o.engine, p.kv, p.shard, p.admission);
  caf::anon_send(p.admission, attach_atom::value, p.engine);
  return p;
}

void stop_pipeline(const pipeline& p) {
  for (const caf::actor& a : {p.engine, p.admission, p.kv, p.shard}) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
}

}  // namespace tireless
