#include "server/connection_manager.hpp"

#include <arpa/inet.h>
#include <capnp/rpc-twoparty.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "protocol/outcome_wire.hpp"
#include "server/read_buffered_stream.hpp"

namespace tireless {

namespace {

class log_task_errors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override { spdlog::debug("connection task: {}", e.getDescription().cStr()); }
};
log_task_errors connection_task_errors;

// The peer's address without its port ("" for a unix socket or where none is known).
std::string peer_of(kj::AsyncIoStream& stream) {
  sockaddr_storage addr{};
  kj::uint len = sizeof(addr);
  try {
    stream.getpeername(reinterpret_cast<sockaddr*>(&addr), &len);
  } catch (const kj::Exception&) {
    return {};
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

// The Inference service as one connection sees it: every call marks the connection active.
class connection_service final : public rpc::Inference::Server {
 public:
  connection_service(inference_service& core, std::shared_ptr<connection_activity> activity, kj::Timer& timer)
      : core_(core), activity_(std::move(activity)), timer_(timer) {}

 protected:
  kj::Promise<void> generate(GenerateContext context) override {
    called();
    return core_.generate(context, activity_);
  }
  kj::Promise<void> models(ModelsContext context) override {
    called();
    return core_.models(context);
  }
  kj::Promise<void> health(HealthContext context) override {
    called();
    return core_.health(context);
  }
  kj::Promise<void> stats(StatsContext context) override {
    called();
    return core_.stats(context);
  }

 private:
  void called() {
    activity_->last_call = timer_.now();
    ++activity_->calls;
  }
  inference_service& core_;
  std::shared_ptr<connection_activity> activity_;
  kj::Timer& timer_;
};

// A generation that ended before it began.
class refused_generation final : public rpc::Generation::Server {
 public:
  explicit refused_generation(tireless::outcome o) : o_(std::move(o)) {}

 protected:
  kj::Promise<void> cancel(CancelContext) override { return kj::READY_NOW; }
  kj::Promise<void> status(StatusContext context) override {
    context.getResults().setState(rpc::Generation::State::FINISHED);
    return kj::READY_NOW;
  }
  kj::Promise<void> outcome(OutcomeContext context) override {
    to_wire(o_, context.getResults().initOutcome());
    return kj::READY_NOW;
  }

 private:
  tireless::outcome o_;
};

// What a connection over a limit is served: every generate() ends in rejected(overloaded),
// so that the client reads why instead of seeing a bare reset.
class refusing_service final : public rpc::Inference::Server {
 public:
  refusing_service(tireless::outcome refusal, std::shared_ptr<connection_activity> activity, kj::Timer& timer)
      : refusal_(std::move(refusal)), activity_(std::move(activity)), timer_(timer), tasks_(connection_task_errors) {}

 protected:
  kj::Promise<void> generate(GenerateContext context) override {
    called();
    auto params = context.getParams();
    if (params.hasSink()) {
      auto req = params.getSink().doneRequest();
      to_wire(refusal_, req.initOutcome());
      tasks_.add(req.send().ignoreResult());
    }
    context.getResults().setGeneration(kj::heap<refused_generation>(refusal_));
    return kj::READY_NOW;
  }
  kj::Promise<void> models(ModelsContext) override {
    called();
    return KJ_EXCEPTION(OVERLOADED, refusal_.message);
  }
  kj::Promise<void> health(HealthContext context) override {
    called();
    auto h = context.getResults().initHealth();
    h.setOk(true);
    h.setAccepting(false);
    return kj::READY_NOW;
  }
  kj::Promise<void> stats(StatsContext) override {
    called();
    return KJ_EXCEPTION(OVERLOADED, refusal_.message);
  }

 private:
  void called() {
    activity_->last_call = timer_.now();
    ++activity_->calls;
  }
  tireless::outcome refusal_;
  std::shared_ptr<connection_activity> activity_;
  kj::Timer& timer_;
  kj::TaskSet tasks_;
};

}  // namespace

struct connection_manager::connection {
  connection(kj::Own<read_buffered_stream> s, const capnp::ReaderOptions& reader)
      : stream(kj::mv(s)), network(*stream, capnp::rpc::twoparty::Side::SERVER, reader) {}

  uint64_t id = 0;
  std::string peer;
  bool refused = false;
  kj::TimePoint opened = kj::origin<kj::TimePoint>();
  std::shared_ptr<connection_activity> activity = std::make_shared<connection_activity>();
  // Destroyed in reverse: the RPC system, then the network, then the socket.
  kj::Own<read_buffered_stream> stream;
  capnp::TwoPartyVatNetwork network;
  kj::Maybe<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
};

connection_manager::connection_manager(kj::Timer& timer, inference_service& service, connection_limits limits)
    : timer_(timer), service_(service), limits_(limits), tasks_(connection_task_errors) {
  service_.count_connections_with([this] { return open_count_; });
  sweeping_ = sweep().eagerlyEvaluate([](kj::Exception&& e) {
    spdlog::error("connection sweep failed: {}", e.getDescription().cStr());
  });
}

connection_manager::~connection_manager() {
  service_.count_connections_with(nullptr);
  sweeping_ = nullptr;
  connections_.clear();
}

kj::Promise<void> connection_manager::listen(kj::ConnectionReceiver& listener) {
  return listener.accept().then(
      [this, &listener](kj::Own<kj::AsyncIoStream>&& stream) {
        accept(kj::mv(stream));
        return listen(listener);
      },
      [this, &listener](kj::Exception&& e) {
        // Out of file descriptors, say: the server keeps listening once some are back.
        spdlog::warn("accepting a connection failed ({}); trying again in 100 ms", e.getDescription().cStr());
        return timer_.afterDelay(100 * kj::MILLISECONDS).then([this, &listener] { return listen(listener); });
      });
}

void connection_manager::accept(kj::Own<kj::AsyncIoStream> stream) {
  const std::string peer = peer_of(*stream);
  std::string refusal;
  const auto from_peer = per_peer_.find(peer);
  if (!peer.empty() && from_peer != per_peer_.end() && from_peer->second >= limits_.max_per_peer) {
    if (const uint64_t idle = longest_idle(&peer)) {
      close(idle, "evicted: its peer is at server.max_connections_per_peer and it was idle");
      ++counts_.evicted;
    } else {
      refusal = fmt::format("{} connections from {} are open (server.max_connections_per_peer); close one, "
                            "or retry later", from_peer->second, peer);
    }
  }
  if (refusal.empty() && open_count_ >= limits_.max_connections) {
    if (const uint64_t idle = longest_idle(nullptr)) {
      close(idle, "evicted: the server is at server.max_connections and it was idle");
      ++counts_.evicted;
    } else {
      refusal = fmt::format("{} connections are open, every one with a request running (server.max_connections); "
                            "retry later", open_count_);
    }
  }
  if (!refusal.empty() && refusing_count_ >= limits_.max_refusing) {
    ++counts_.dropped;
    spdlog::debug("dropping a connection from {}: {}", peer.empty() ? "a local peer" : peer, refusal);
    return;  // the stream closes here
  }

  auto c = kj::heap<connection>(kj::heap<read_buffered_stream>(kj::mv(stream)), limits_.reader);
  c->id = next_id_++;
  c->peer = peer;
  c->opened = timer_.now();
  c->activity->last_call = c->opened;
  const uint64_t id = c->id;
  if (refusal.empty()) {
    c->rpc = capnp::makeRpcServer(c->network, kj::heap<connection_service>(service_, c->activity, timer_));
    ++open_count_;
    if (!peer.empty()) ++per_peer_[peer];
    ++counts_.accepted;
  } else {
    spdlog::info("refusing a connection from {}: {}", peer.empty() ? "a local peer" : peer, refusal);
    outcome o;
    o.kind = outcome_kind::rejected;
    o.reason = "overloaded";
    o.message = std::move(refusal);
    o.retry_after_ms = limits_.retry_after_ms;
    c->refused = true;
    c->rpc = capnp::makeRpcServer(c->network, kj::heap<refusing_service>(std::move(o), c->activity, timer_));
    ++refusing_count_;
    ++counts_.refused;
  }
  // Removed on a later turn: never inside a continuation of its own network.
  tasks_.add(c->network.onDisconnect().then([this, id] { return kj::evalLater([this, id] { close(id, nullptr); }); },
                                            [this, id](kj::Exception&&) {
                                              return kj::evalLater([this, id] { close(id, nullptr); });
                                            }));
  connections_.emplace(id, kj::mv(c));
}

void connection_manager::close(uint64_t id, const char* why) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  connection& c = *it->second;
  if (why) spdlog::debug("closing connection {} ({}): {}", id, c.peer.empty() ? "local" : c.peer, why);
  if (c.refused) {
    --refusing_count_;
  } else {
    --open_count_;
    if (!c.peer.empty() && --per_peer_[c.peer] == 0) per_peer_.erase(c.peer);
  }
  connections_.erase(it);
}

uint64_t connection_manager::longest_idle(const std::string* peer) const {
  uint64_t best = 0;
  kj::TimePoint oldest = kj::origin<kj::TimePoint>();
  for (const auto& [id, c] : connections_) {
    if (c->refused || c->activity->live > 0) continue;
    if (peer && c->peer != *peer) continue;
    if (best == 0 || c->activity->last_call < oldest) {
      oldest = c->activity->last_call;
      best = id;
    }
  }
  return best;
}

kj::Promise<void> connection_manager::sweep() {
  const kj::Duration shortest = std::min({limits_.idle_timeout, limits_.handshake_timeout, limits_.refusal_linger});
  const kj::Duration period = std::clamp(shortest / 4, 20 * kj::MILLISECONDS, 1 * kj::SECONDS);
  return timer_.afterDelay(period).then([this] {
    const kj::TimePoint now = timer_.now();
    std::vector<std::pair<uint64_t, const char*>> closing;
    for (const auto& [id, c] : connections_) {
      const connection_activity& a = *c->activity;
      if (c->refused) {
        if ((a.calls > 0 && now - a.last_call >= limits_.refusal_linger) || now - c->opened >= limits_.handshake_timeout)
          closing.emplace_back(id, "refused, and told so");
      } else if (c->stream->bytes_read() == 0 && now - c->opened >= limits_.handshake_timeout) {
        closing.emplace_back(id, "nothing received within server.handshake_timeout_ms of connecting");
        ++counts_.closed_handshake;
      } else if (a.live == 0 && now - a.last_call >= limits_.idle_timeout) {
        closing.emplace_back(id, "idle for server.idle_timeout_ms");
        ++counts_.closed_idle;
      }
    }
    for (auto [id, why] : closing) close(id, why);
    return sweep();
  });
}

}  // namespace tireless
