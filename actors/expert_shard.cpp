#include "actors/expert_shard.hpp"

#include <cstring>
#include <stdexcept>

#include "actors/messages.hpp"
#include "gpu/cpu/isa_kernels.hpp"
#include "gpu/cpu/local_experts.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "model/model.hpp"

namespace tireless {

namespace {

struct expert_shard_state {
  std::unique_ptr<cpu::thread_pool> pool;
  std::unique_ptr<cpu::local_experts> experts;
  std::vector<float> slots;
  int64_t width = 0;
};

caf::behavior expert_shard(caf::stateful_actor<expert_shard_state>* self, std::shared_ptr<const model> m,
                           std::vector<int32_t> owned, int64_t max_tokens) {
  auto& st = self->state;
  st.pool = std::make_unique<cpu::thread_pool>(1);
  st.experts = std::make_unique<cpu::local_experts>(m, *st.pool, cpu::best_kernels(), max_tokens, owned);
  st.width = m->config().n_embd;
  return {
      [=](const expert_request_msg& msg) {
        auto& st = self->state;
        const auto r = msg.get();
        const int64_t n = r.getTokens(), k = r.getK(), width = r.getWidth();
        std::vector<int32_t> experts;
        for (int32_t e : r.getExperts()) experts.push_back(e);
        std::vector<float> gates;
        for (float g : r.getGates()) gates.push_back(g);
        if (width != st.width || static_cast<int64_t>(experts.size()) != n * k ||
            r.getX().size() != static_cast<size_t>(n * width) * sizeof(float)) {
          throw std::invalid_argument("malformed expert request");
        }
        std::vector<float> x(static_cast<size_t>(n * width));
        std::memcpy(x.data(), r.getX().begin(), x.size() * sizeof(float));
        cpu::routed_tokens rt{r.getLayer(), x.data(), n, width, experts.data(), gates.data(), static_cast<int32_t>(k)};
        st.slots.assign(static_cast<size_t>(n * k * width), 0.0f);
        st.experts->compute_slots(rt, st.slots.data());
        expert_reply_msg reply(static_cast<unsigned>(16 + st.slots.size() / 2));
        auto b = reply.init();
        auto data = b.initSlots(static_cast<unsigned>(st.slots.size() * sizeof(float)));
        std::memcpy(data.begin(), st.slots.data(), data.size());
        auto mask = b.initOwned(static_cast<unsigned>(n * k));
        for (unsigned i = 0; i < n * k; ++i) mask.set(i, st.experts->owns(experts[i]));
        return reply;
      },
      [=](crash_atom) { throw std::runtime_error("expert shard crash requested"); },
  };
}

}  // namespace

struct remote_experts::impl {
  caf::actor_system& sys;
  std::shared_ptr<const model> lm;
  int64_t max_tokens;
  std::vector<std::vector<int32_t>> owned;  // per shard
  std::vector<caf::actor> shards;
  std::vector<float> slots;

  caf::actor spawn(size_t i) { return sys.spawn<caf::detached>(expert_shard, lm, owned[i], max_tokens); }
};

remote_experts::remote_experts(caf::actor_system& sys, std::shared_ptr<const model> m, int shards,
                               int64_t max_tokens)
    : impl_(std::make_unique<impl>(impl{sys, std::move(m), max_tokens, {}, {}, {}})) {
  const int32_t n_expert = impl_->lm->config().n_expert;
  if (shards < 1 || n_expert < 1) throw std::invalid_argument("remote experts need a MoE model and a shard");
  impl_->owned.resize(static_cast<size_t>(shards));
  for (int32_t e = 0; e < n_expert; ++e) impl_->owned[e % shards].push_back(e);
  for (int i = 0; i < shards; ++i) impl_->shards.push_back(impl_->spawn(static_cast<size_t>(i)));
}

remote_experts::~remote_experts() {
  for (auto& s : impl_->shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
}

void remote_experts::crash_shard_for_test(int shard) { caf::anon_send(impl_->shards.at(shard), crash_atom::value); }

void remote_experts::run(const cpu::routed_tokens& rt, float* out, int64_t ld_out) {
  impl& m = *impl_;
  const int64_t width = m.lm->config().n_embd, n_slots = rt.n_tokens * rt.k;
  expert_request_msg req(static_cast<unsigned>(64 + (rt.n_tokens * width + 2 * n_slots) / 2));
  auto b = req.init();
  b.setLayer(rt.layer);
  b.setTokens(static_cast<int32_t>(rt.n_tokens));
  b.setWidth(static_cast<int32_t>(width));
  b.setK(rt.k);
  auto x = b.initX(static_cast<unsigned>(rt.n_tokens * width * sizeof(float)));
  for (int64_t t = 0; t < rt.n_tokens; ++t) {
    std::memcpy(x.begin() + t * width * sizeof(float), rt.x + t * rt.ld, width * sizeof(float));
  }
  auto experts = b.initExperts(static_cast<unsigned>(n_slots));
  auto gates = b.initGates(static_cast<unsigned>(n_slots));
  for (int64_t s = 0; s < n_slots; ++s) {
    experts.set(static_cast<unsigned>(s), rt.experts[s]);
    gates.set(static_cast<unsigned>(s), rt.gates[s]);
  }
  m.slots.assign(static_cast<size_t>(n_slots * width), 0.0f);
  caf::scoped_actor self{m.sys};
  const auto timeout = std::chrono::seconds(30);
  // Dispatch to every shard first, then gather: the shards work in parallel.
  for (int attempt = 0;; ++attempt) {
    std::vector<bool> failed(m.shards.size(), false);
    std::vector<decltype(self->request(m.shards[0], timeout, req))> pending;
    for (const caf::actor& s : m.shards) pending.push_back(self->request(s, timeout, req));
    for (size_t i = 0; i < pending.size(); ++i) {
      pending[i].receive(
          [&](const expert_reply_msg& reply) {
            const auto r = reply.get();
            const auto owned = r.getOwned();
            const auto* data = reinterpret_cast<const float*>(r.getSlots().begin());
            for (int64_t s = 0; s < n_slots; ++s) {
              if (owned[static_cast<unsigned>(s)]) std::memcpy(&m.slots[s * width], data + s * width, width * sizeof(float));
            }
          },
          [&](caf::error&) { failed[i] = true; });
    }
    bool any = false;
    for (size_t i = 0; i < failed.size(); ++i) {
      if (!failed[i]) continue;
      any = true;
      m.shards[i] = m.spawn(i);  // the supervisor's job: a fresh shard in place of the crashed one
      ++restarts_;
    }
    if (!any) break;
    if (attempt >= 3) throw std::runtime_error("expert shards keep failing");
  }
  for (int64_t t = 0; t < rt.n_tokens; ++t) {
    float* o = out + t * ld_out;
    std::fill(o, o + width, 0.0f);
    for (int32_t j = 0; j < rt.k; ++j) {
      const float gate = rt.gates[t * rt.k + j];
      const float* y = &m.slots[(t * rt.k + j) * width];
      for (int64_t c = 0; c < width; ++c) o[c] += gate * y[c];
    }
  }
}

}  // namespace tireless
