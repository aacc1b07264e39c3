#include "actors/shard.hpp"

#include <chrono>
#include <deque>
#include <random>
#include <stdexcept>
#include <thread>

#include "actors/messages.hpp"
#include "actors/wire.hpp"
#include "gpu/sim/sim_backend.hpp"

namespace tireless {

namespace {

using deliver_atom = caf::atom_constant<caf::atom("deliver")>;

struct shard_state {
  shard_options o;
  std::mt19937_64 rng;
  caf::actor_clock::time_point slow_until{};  // in a slow spell until then
  caf::actor_clock::time_point started{};     // the sim's conditions over time count from here
  step_result result;
  uint64_t steps = 0;
  // simulated: replies waiting for their virtual step time to pass
  std::map<uint64_t, std::pair<caf::response_promise, step_reply_msg>> pending;
  uint64_t next_pending = 0;
};

bool chance(shard_state& st, double p) {
  return p > 0 && std::uniform_real_distribution<double>(0, 1)(st.rng) < p;
}

// Runs one step on the backend. Returns the reply and the seconds the step took.
step_reply_msg run_step(shard_state& st, const step_request_msg& req, double& seconds,
                        caf::actor_clock::time_point now) {
  const auto r = req.get();
  step_storage& storage = *st.o.storage;
  unpack(r, storage);
  if (!storage.copies.empty()) st.o.model->copy_blocks(storage.copies);
  auto* sim = dynamic_cast<sim::sim_backend*>(st.o.model.get());
  if (sim) sim->set_time(std::chrono::duration<double>(now - st.started).count());
  const auto t0 = std::chrono::steady_clock::now();
  st.o.model->execute(storage.batch, st.result);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sim) seconds = sim->last_step_seconds();
  // Injected faults: the step ran (its KV is written) but its answer is lost with the shard.
  if (chance(st, st.o.crash_probability)) throw std::runtime_error("injected shard crash");
  if (st.o.crash_every > 0 && static_cast<int64_t>(st.steps + 1) % st.o.crash_every == 0) {
    throw std::runtime_error("injected shard crash (every " + std::to_string(st.o.crash_every) + " steps)");
  }
  if (now >= st.slow_until && chance(st, st.o.slow_probability)) {
    st.slow_until = now + std::chrono::duration_cast<caf::actor_clock::duration_type>(
                              std::chrono::duration<double>(st.o.slow_seconds));
  }
  if (now < st.slow_until && st.o.slow_factor > 1) {
    const double extra = seconds * (st.o.slow_factor - 1);
    if (!sim) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    seconds += extra;
  }
  ++st.steps;
  return to_wire(r.getStepId(), st.result, seconds);
}

caf::behavior step_shard(caf::stateful_actor<shard_state>* self, shard_options o) {
  self->state.o = std::move(o);
  if (!self->state.o.storage) self->state.o.storage = std::make_shared<step_storage>();
  self->state.rng.seed(self->state.o.seed);
  self->state.started = self->clock().now();
  return {
      [=](const step_request_msg& req) -> caf::result<step_reply_msg> {
        double seconds = 0;
        step_reply_msg reply = run_step(self->state, req, seconds, self->clock().now());
        if (!self->state.o.simulated || seconds <= 0) return reply;
        auto rp = self->make_response_promise<step_reply_msg>();
        const uint64_t id = self->state.next_pending++;
        self->state.pending.emplace(id, std::make_pair(rp, reply));
        self->delayed_send(self, std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)), deliver_atom::value, id);
        return rp;
      },
      [=](deliver_atom, uint64_t id) {
        auto it = self->state.pending.find(id);
        if (it == self->state.pending.end()) return;
        it->second.first.deliver(it->second.second);
        self->state.pending.erase(it);
      },
      [=](crash_atom) { throw std::runtime_error("shard crash requested"); },
  };
}

struct supervisor_state {
  shard_options o;
  caf::actor child;
  uint64_t generation = 0;  // of the child: one more at each restart
  int restarts = 0;
  restart_policy policy;
  std::deque<caf::actor_clock::time_point> recent;  // restarts within the policy's window
  // Steps not answered yet: the request (to re-run it) and its promise. A crashed child
  // answers none of its steps; the supervisor re-runs them on the child it starts instead,
  // so a crash costs the engine time, not its step.
  struct step {
    step_request_msg req;
    caf::response_promise rp;
    uint64_t generation = 0;  // of the child running it
  };
  std::map<uint64_t, step> in_flight;
  uint64_t next = 0;
};

using supervisor_ptr = caf::stateful_actor<supervisor_state>*;

void start_child(supervisor_ptr self) {
  shard_options child_options = self->state.o;
  child_options.seed = self->state.o.seed + static_cast<uint64_t>(self->state.restarts) * 7919;
  self->state.child = self->state.o.simulated
                          ? self->spawn(step_shard, child_options)
                          : self->spawn<caf::detached>(step_shard, child_options);
  self->monitor(self->state.child);
}

// Sends step `id` to the current child.
void forward(supervisor_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.in_flight.find(id);
  if (it == st.in_flight.end()) return;
  it->second.generation = st.generation;
  const uint64_t generation = st.generation;
  self->request(st.child, caf::infinite, it->second.req)
      .then(
          [=](const step_reply_msg& reply) {
            auto done = self->state.in_flight.find(id);
            if (done == self->state.in_flight.end()) return;
            done->second.rp.deliver(reply);
            self->state.in_flight.erase(done);
          },
          [=](caf::error&) {
            // The child died with this step. Its down_msg starts another and re-runs the
            // step there; if that happened already (and the step is still on the dead
            // child), re-run it now.
            auto failed = self->state.in_flight.find(id);
            if (failed == self->state.in_flight.end()) return;
            if (failed->second.generation == generation && generation < self->state.generation) forward(self, id);
          });
}

caf::behavior shard_supervisor(supervisor_ptr self, shard_options o, restart_policy policy) {
  self->state.o = std::move(o);
  if (!self->state.o.storage) self->state.o.storage = std::make_shared<step_storage>();
  self->state.policy = policy;
  start_child(self);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.child.address()) return;
    if (dm.reason == caf::exit_reason::normal || dm.reason == caf::exit_reason::user_shutdown) return;
    const auto now = self->clock().now();
    while (!st.recent.empty() && now - st.recent.front() > st.policy.window) st.recent.pop_front();
    if (static_cast<int>(st.recent.size()) >= st.policy.max_restarts) {
      for (auto& [id, step] : st.in_flight) step.rp.deliver(caf::make_error(caf::sec::request_receiver_down));
      st.in_flight.clear();
      self->quit(dm.reason);
      return;
    }
    st.recent.push_back(now);
    ++st.restarts;
    ++st.generation;
    start_child(self);
    std::vector<uint64_t> rerun;
    for (const auto& [id, step] : st.in_flight) rerun.push_back(id);
    for (uint64_t id : rerun) forward(self, id);
  });
  self->set_exit_handler([=](caf::exit_msg& em) {
    self->send_exit(self->state.child, em.reason);
    self->quit(em.reason);
  });
  return {
      [=](const step_request_msg& req) -> caf::result<step_reply_msg> {
        auto rp = self->make_response_promise<step_reply_msg>();
        const uint64_t id = self->state.next++;
        self->state.in_flight.emplace(id, supervisor_state::step{req, rp, 0});
        forward(self, id);
        return rp;
      },
      [=](crash_atom a) { self->send(self->state.child, a); },
      [=](stats_atom) { return self->state.restarts; },
  };
}

}  // namespace

caf::actor spawn_shard_supervisor(caf::actor_system& sys, shard_options options, restart_policy restarts) {
  return sys.spawn(shard_supervisor, std::move(options), restarts);
}

}  // namespace tireless
