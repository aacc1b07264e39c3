#include "actors/expert_shard.hpp"

#include <stdexcept>

#include "actors/messages.hpp"
#include "experts/expert_service.hpp"
#include "model/model.hpp"
#include "scheduler/expert_load.hpp"

namespace tireless {

namespace {

struct expert_shard_state {
  std::shared_ptr<expert_service> service;
};

caf::behavior expert_shard(caf::stateful_actor<expert_shard_state>* self, std::shared_ptr<expert_service> service) {
  self->state.service = std::move(service);
  return {
      [=](const expert_request_msg& msg) {
        expert_reply_msg reply(static_cast<unsigned>(16 + msg.get().getSlotRow().size() * msg.get().getWidth() / 2));
        self->state.service->serve(msg.get(), reply.init());
        return reply;
      },
      [=](hold_atom, const std::vector<int32_t>& keys) { self->state.service->hold(keys); },
      [=](crash_atom) { throw std::runtime_error("expert shard crash requested"); },
  };
}

}  // namespace

struct actor_expert_transport::impl {
  caf::actor_system& sys;
  std::shared_ptr<const model> lm;
  int64_t max_pairs;
  std::vector<std::vector<int32_t>> homes;  // per shard: the experts it starts with
  std::vector<caf::actor> shards;

  caf::actor spawn(size_t i) {
    // A restarted shard loads its experts afresh, as a restarted process would.
    auto service = std::make_shared<expert_service>(lm, 1, max_pairs, homes[i]);
    return sys.spawn<caf::detached>(expert_shard, std::move(service));
  }
};

actor_expert_transport::actor_expert_transport(caf::actor_system& sys, std::shared_ptr<const model> m, int shards,
                                               int64_t max_pairs)
    : impl_(std::make_unique<impl>(impl{sys, std::move(m), max_pairs, {}, {}})) {
  const int32_t n_expert = impl_->lm->config().n_expert;
  if (shards < 1 || n_expert < 1) throw std::invalid_argument("expert shards need a MoE model and a shard");
  impl_->homes.resize(static_cast<size_t>(shards));
  for (int32_t e = 0; e < n_expert; ++e) impl_->homes[e % shards].push_back(e);
  for (int i = 0; i < shards; ++i) impl_->shards.push_back(impl_->spawn(static_cast<size_t>(i)));
}

actor_expert_transport::~actor_expert_transport() {
  for (auto& s : impl_->shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
}

int32_t actor_expert_transport::shards() const { return static_cast<int32_t>(impl_->shards.size()); }

void actor_expert_transport::crash_shard_for_test(int shard) { caf::anon_send(impl_->shards.at(shard), crash_atom::value); }

std::vector<expert_transport::reply> actor_expert_transport::exchange(
    const std::vector<const owned<proto::ExpertRequest>*>& requests) {
  std::vector<reply> out(requests.size());
  caf::scoped_actor self{impl_->sys};
  const auto timeout = std::chrono::seconds(30);
  // Dispatch to every shard first, then gather: the shards work in parallel.
  std::vector<std::pair<size_t, decltype(self->request(impl_->shards[0], timeout, *requests[0]))>> pending;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i]) pending.emplace_back(i, self->request(impl_->shards[i], timeout, *requests[i]));
  }
  for (auto& [i, p] : pending) {
    p.receive([&, i = i](const expert_reply_msg& r) { out[i].msg = r; },
              [&, i = i](caf::error& e) { out[i].error = to_string(e); });
    out[i].at = clock::now();
  }
  return out;
}

bool actor_expert_transport::revive(int32_t shard, std::chrono::milliseconds) {
  caf::anon_send_exit(impl_->shards.at(shard), caf::exit_reason::user_shutdown);
  impl_->shards[shard] = impl_->spawn(static_cast<size_t>(shard));
  return true;
}

void actor_expert_transport::hold(int32_t shard, const std::vector<int32_t>& keys) {
  caf::scoped_actor self{impl_->sys};
  std::string error;
  self->request(impl_->shards.at(shard), std::chrono::seconds(30), hold_atom::value, keys)
      .receive([] {}, [&](caf::error& e) { error = to_string(e); });
  if (!error.empty()) throw std::runtime_error("expert shard " + std::to_string(shard) + " cannot hold experts: " + error);
}

std::unique_ptr<expert_exchange> make_actor_expert_exchange(caf::actor_system& sys, std::shared_ptr<const model> m,
                                                            int shards, int64_t max_tokens, expert_exchange_options o) {
  const model_config& c = m->config();
  auto t = std::make_unique<actor_expert_transport>(sys, m, shards, max_tokens * std::max(c.n_expert_used, 1));
  return std::make_unique<expert_exchange>(m, std::move(t), expert_placement::round_robin(c.n_layer, c.n_expert, shards), o);
}

}  // namespace tireless
