#include "experts/rpc.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "experts/expert_service.hpp"
#include "server/kj_bridge.hpp"
#include "model/model.hpp"

namespace tireless {

namespace {

class shard_server final : public proto::ExpertShard::Server {
 public:
  explicit shard_server(std::shared_ptr<expert_service> s) : service_(std::move(s)) {}

  kj::Promise<void> info(InfoContext c) override {
    const model_config& m = service_->lm().config();
    auto r = c.getResults();
    r.setModel(m.name);
    r.setLayers(m.n_layer);
    r.setExperts(m.n_expert);
    r.setWidth(static_cast<int32_t>(m.n_embd));
    const std::vector<int32_t> held = service_->held();
    auto h = r.initHeld(static_cast<unsigned>(held.size()));
    for (size_t i = 0; i < held.size(); ++i) h.set(static_cast<unsigned>(i), held[i]);
    r.setPid(::getpid());
    return kj::READY_NOW;
  }

  kj::Promise<void> run(RunContext c) override {
    const auto req = c.getParams().getRequest();
    const auto width = static_cast<uint64_t>(service_->lm().config().n_embd);
    auto results = c.getResults(capnp::MessageSize{req.getSlotRow().size() * width / 2 + 64, 0});
    try {
      service_->serve(req, results.initReply());
    } catch (const std::exception& e) {
      KJ_FAIL_REQUIRE("expert shard refused the request", e.what());
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> hold(HoldContext c) override {
    std::vector<int32_t> keys;
    for (int32_t k : c.getParams().getExperts()) keys.push_back(k);
    try {
      service_->hold(keys);
    } catch (const std::exception& e) {
      KJ_FAIL_REQUIRE("expert shard cannot hold those experts", e.what());
    }
    const std::vector<int32_t> held = service_->held();
    auto h = c.getResults().initHeld(static_cast<unsigned>(held.size()));
    for (size_t i = 0; i < held.size(); ++i) h.set(static_cast<unsigned>(i), held[i]);
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<expert_service> service_;
};

}  // namespace

kj::Own<proto::ExpertShard::Server> make_expert_shard_server(std::shared_ptr<expert_service> service) {
  return kj::heap<shard_server>(std::move(service));
}

struct rpc_transport::impl {
  struct connection {
    kj::Own<kj::AsyncIoStream> stream;
    kj::Own<capnp::TwoPartyClient> client;  // after stream: destroyed first
    kj::Maybe<proto::ExpertShard::Client> cap;
    bool broken = false;
    void reset() {
      cap = nullptr;
      client = nullptr;
      stream = nullptr;
      broken = false;
    }
  };

  std::vector<std::string> addresses;
  std::chrono::milliseconds call_timeout;
  std::thread thread;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop;
  // The loop thread's own.
  kj::AsyncIoProvider* io = nullptr;
  std::vector<connection> conns;

  // On the loop: one connection attempt, retried every 50 ms until `deadline`.
  kj::Promise<void> connect(size_t i, kj::TimePoint deadline) {
    conns[i].reset();
    return io->getNetwork()
        .parseAddress(addresses[i])
        .then([](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); })
        .then(
            [this, i](kj::Own<kj::AsyncIoStream> s) -> kj::Promise<void> {
              auto& c = conns[i];
              c.stream = kj::mv(s);
              c.client = kj::heap<capnp::TwoPartyClient>(*c.stream);
              c.cap = c.client->bootstrap().castAs<proto::ExpertShard>();
              return kj::READY_NOW;
            },
            [this, i, deadline](kj::Exception&& e) -> kj::Promise<void> {
              if (io->getTimer().now() >= deadline) return kj::mv(e);
              return io->getTimer().afterDelay(50 * kj::MILLISECONDS).then([this, i, deadline] { return connect(i, deadline); });
            });
  }

  // On the loop: a call's promise, failed after call_timeout.
  template <class T>
  kj::Promise<T> timed(kj::Promise<T> p, size_t i) {
    return p.exclusiveJoin(io->getTimer().afterDelay(call_timeout.count() * kj::MILLISECONDS).then([this, i]() -> kj::Promise<T> {
      return KJ_EXCEPTION(DISCONNECTED, "expert shard did not answer in time", addresses[i]);
    }));
  }

  proto::ExpertShard::Client& cap(size_t i) {
    KJ_IF_MAYBE(c, conns[i].cap) {
      if (!conns[i].broken) return *c;
    }
    KJ_FAIL_REQUIRE("expert shard is not connected", addresses[i]);
  }

  // Runs f (returning a kj::Promise<void>) on the loop and waits for its promise; a kj
  // exception comes back as std::runtime_error. The hand-over is a std::mutex queue and a
  // condition variable (server/kj_bridge.hpp), not kj::Executor: ThreadSanitizer sees pthread's
  // synchronization but not kj's futexes, so every byte the caller and the loop share is
  // ordered where it can check it.
  template <class F>
  void on_loop(F&& f) {
    struct job {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::string error;
      void finish(std::string e) {
        {
          std::lock_guard lock(mu);
          error = std::move(e);
          done = true;
        }
        cv.notify_one();
      }
    };
    auto j = std::make_shared<job>();
    bridge.post([this, j, &f] {
      tasks->add(kj::evalNow([&] { return f(); })
                     .then([j] { j->finish(""); },
                           [j](kj::Exception&& e) { j->finish(e.getDescription().cStr()); }));
    });
    std::unique_lock lock(j->mu);
    j->cv.wait(lock, [&] { return j->done; });
    if (!j->error.empty()) throw std::runtime_error(j->error);
  }

  struct ignore_errors final : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}  // each task reports its own error to its caller
  } task_errors;
  kj_bridge bridge;
  kj::Own<kj::TaskSet> tasks;  // the loop's
};

rpc_transport::rpc_transport(std::vector<std::string> addresses, std::chrono::milliseconds connect_wait,
                             std::chrono::milliseconds call_timeout)
    : impl_(std::make_unique<impl>()) {
  impl& m = *impl_;
  if (addresses.empty()) throw std::invalid_argument("rpc_transport: no expert shard addresses");
  m.addresses = std::move(addresses);
  m.call_timeout = call_timeout;
  // A mutex and condition variable, not std::promise: ThreadSanitizer sees pthread's
  // synchronization but not the futex inside an uninstrumented libstdc++'s future.
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  m.thread = std::thread([&m, &mu, &cv, &ready] {
    auto io = kj::setupAsyncIo();
    m.io = io.provider.get();
    m.conns.resize(m.addresses.size());
    m.tasks = kj::heap<kj::TaskSet>(m.task_errors);
    auto pump = m.bridge.pump().eagerlyEvaluate(nullptr);
    auto pf = kj::newPromiseAndCrossThreadFulfiller<void>();
    m.stop = kj::mv(pf.fulfiller);
    {
      std::lock_guard lock(mu);  // notified under the lock: the constructor's cv goes once it sees ready
      ready = true;
      cv.notify_one();
    }
    pf.promise.wait(io.waitScope);
    m.tasks = nullptr;
    m.conns.clear();
    m.io = nullptr;
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ready; });
  }
  for (size_t i = 0; i < m.addresses.size(); ++i) {
    if (revive(static_cast<int32_t>(i), connect_wait)) continue;
    m.stop->fulfill();  // the destructor does not run for a constructor that throws
    m.thread.join();
    throw std::runtime_error(fmt::format("expert shard at {} cannot be reached (waited {} ms): is tireless-shard running there?",
                                         m.addresses[i], connect_wait.count()));
  }
}

rpc_transport::~rpc_transport() {
  impl_->stop->fulfill();
  impl_->thread.join();
}

int32_t rpc_transport::shards() const { return static_cast<int32_t>(impl_->addresses.size()); }

namespace {

// A call on the loop: the replies it fills in, and a condition variable for the caller.
struct rpc_call {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::vector<expert_transport::reply> out;

  std::vector<expert_transport::reply> wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
    return std::move(out);
  }
};

// The caller waits on the shared state; the in_flight it holds only points at it, so the loop
// may finish a call whose caller has gone.
struct rpc_wait final : expert_transport::in_flight {
  std::shared_ptr<rpc_call> call;
  std::vector<expert_transport::reply> wait() override { return call->wait(); }
};

}  // namespace

std::unique_ptr<expert_transport::in_flight> rpc_transport::send(
    const std::vector<const owned<proto::ExpertRequest>*>& requests) {
  impl& m = *impl_;
  auto call = std::make_shared<rpc_call>();
  call->out.resize(requests.size());
  m.bridge.post([&m, call, requests] {
    kj::Vector<kj::Promise<void>> calls;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!requests[i]) continue;
      proto::ExpertShard::Client* cap = nullptr;
      KJ_IF_MAYBE(c, m.conns[i].cap) {
        if (!m.conns[i].broken) cap = c;
      }
      if (!cap) {
        call->out[i].error = "not connected";
        call->out[i].at = clock::now();
        continue;
      }
      auto r = cap->runRequest(capnp::MessageSize{requests[i]->get().totalSize().wordCount + 16, 0});
      r.setRequest(requests[i]->get());
      calls.add(m.timed(r.send().then([call, i](capnp::Response<proto::ExpertShard::RunResults>&& resp) {
                                         call->out[i].at = clock::now();
                                         call->out[i].msg = owned<proto::ExpertReply>::copy_of(resp.getReply());
                                       }),
                        i)
                    .catch_([&m, call, i](kj::Exception&& e) {
                      call->out[i].at = clock::now();
                      call->out[i].error = e.getDescription().cStr();
                      m.conns[i].broken = true;  // torn down by revive(), not inside its own callback
                    }));
    }
    m.tasks->add(kj::joinPromises(calls.releaseAsArray()).then([call] {
      {
        std::lock_guard lock(call->mu);
        call->done = true;
      }
      call->cv.notify_one();
    }));
  });
  auto w = std::make_unique<rpc_wait>();
  w->call = std::move(call);
  return w;
}

std::vector<expert_transport::reply> rpc_transport::exchange(const std::vector<const owned<proto::ExpertRequest>*>& requests) {
  return send(requests)->wait();
}

bool rpc_transport::revive(int32_t shard, std::chrono::milliseconds wait) {
  impl& m = *impl_;
  const auto i = static_cast<size_t>(shard);
  try {
    m.on_loop([&]() -> kj::Promise<void> {
      const kj::TimePoint deadline = m.io->getTimer().now() + wait.count() * kj::MILLISECONDS;
      return m.connect(i, deadline).then([&m, i] {
        // a connection is accepted by the listening socket's backlog; a call proves a server answers
        return m.timed(m.cap(i).infoRequest().send().ignoreResult(), i);
      });
    });
    return true;
  } catch (const std::runtime_error&) {
    m.on_loop([&]() -> kj::Promise<void> {
      m.conns[i].broken = true;
      return kj::READY_NOW;
    });
    return false;
  }
}

void rpc_transport::hold(int32_t shard, const std::vector<int32_t>& keys) {
  impl& m = *impl_;
  const auto i = static_cast<size_t>(shard);
  m.on_loop([&]() -> kj::Promise<void> {
    auto r = m.cap(i).holdRequest();
    auto list = r.initExperts(static_cast<unsigned>(keys.size()));
    for (size_t k = 0; k < keys.size(); ++k) list.set(static_cast<unsigned>(k), keys[k]);
    return m.timed(r.send().ignoreResult(), i);
  });
}

rpc_transport::shard_info rpc_transport::info(int32_t shard) {
  impl& m = *impl_;
  const auto i = static_cast<size_t>(shard);
  shard_info out;
  m.on_loop([&]() -> kj::Promise<void> {
    return m.timed(m.cap(i).infoRequest().send().then([&out](capnp::Response<proto::ExpertShard::InfoResults>&& r) {
      out.model = r.getModel();
      out.layers = r.getLayers();
      out.experts = r.getExperts();
      out.width = r.getWidth();
      for (int32_t k : r.getHeld()) out.held.push_back(k);
      out.pid = r.getPid();
    }), i);
  });
  return out;
}

expert_placement placement_of(const std::vector<rpc_transport::shard_info>& shards) {
  if (shards.empty()) throw std::invalid_argument("no expert shards");
  const auto& first = shards.front();
  std::vector<std::vector<int32_t>> holders(static_cast<size_t>(first.layers) * first.experts);
  for (size_t s = 0; s < shards.size(); ++s) {
    const auto& i = shards[s];
    if (i.model != first.model || i.layers != first.layers || i.experts != first.experts) {
      throw std::invalid_argument(fmt::format("expert shards disagree on the model: shard 0 serves {} ({} layers x {} experts), "
                                              "shard {} serves {} ({} x {})", first.model, first.layers, first.experts, s,
                                              i.model, i.layers, i.experts));
    }
    for (int32_t k : i.held) {
      if (k >= 0 && static_cast<size_t>(k) < holders.size()) holders[static_cast<size_t>(k)].push_back(static_cast<int32_t>(s));
    }
  }
  return expert_placement::from_holders(first.layers, first.experts, static_cast<int32_t>(shards.size()), std::move(holders));
}

std::unique_ptr<expert_exchange> make_rpc_expert_exchange(std::shared_ptr<const model> m,
                                                          const std::vector<std::string>& addresses,
                                                          std::chrono::milliseconds wait, expert_exchange_options o) {
  auto t = std::make_unique<rpc_transport>(addresses, wait, wait);
  std::vector<rpc_transport::shard_info> infos;
  for (int32_t s = 0; s < t->shards(); ++s) infos.push_back(t->info(s));
  const model_config& c = m->config();
  for (size_t s = 0; s < infos.size(); ++s) {
    if (infos[s].layers != c.n_layer || infos[s].experts != c.n_expert || infos[s].width != c.n_embd) {
      throw std::runtime_error(fmt::format("expert shard at {} serves {} ({} layers x {} experts, width {}), not this "
                                           "model {} ({} x {}, width {}): start it with the same GGUF",
                                           addresses[s], infos[s].model, infos[s].layers, infos[s].experts, infos[s].width,
                                           c.name, c.n_layer, c.n_expert, c.n_embd));
    }
  }
  return std::make_unique<expert_exchange>(std::move(m), std::move(t), placement_of(infos), o);
}

}  // namespace tireless
