#include "server/inference_service.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <thread>

#include "protocol/outcome_wire.hpp"

namespace tireless {

namespace {

class log_errors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override { spdlog::debug("rpc task failed: {}", e.getDescription().cStr()); }
};
log_errors task_errors;

}  // namespace


// One generation's delivery to its client, touched only on the loop's thread.
struct inference_service::generation_state {
  uint64_t id = 0;
  std::string tenant;
  std::string api_key;
  kj::Maybe<rpc::TokenSink::Client> sink;  // let go of once the outcome has reached it
  std::string pending_text;
  std::vector<int32_t> pending_ids;
  std::vector<token_logprob> pending_logprobs;
  int32_t generated = 0;
  bool sending = false;    // a tokens() call is in flight
  int32_t unsynced = 0;    // tokens sent to the client, not yet confirmed by a sync()
  bool syncing = false;    // a sync() call is in flight
  bool sync_supported = true;
  bool broken = false;     // the client went away
  std::optional<outcome> final;
  bool done_sent = false;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> waiters;  // outcome() calls
  // Runs once, when the outcome has reached the client (or cannot): the service lets go.
  std::function<void()> on_delivered;

  void delivered() {
    sink = nullptr;
    if (auto f = std::move(on_delivered)) {
      on_delivered = nullptr;
      f();
    }
  }
};

namespace {

using state_ptr = std::shared_ptr<inference_service::generation_state>;

// Confirms delivered tokens with sync(): once it returns, the client has handled them, and
// the runtime may send that many more (its window). Without sync (an older client), tokens
// count as taken once the transport accepted them.
void confirm(state_ptr s, runtime& rt, kj::TaskSet& tasks);

// The client is gone: its request stops, and nothing more is sent.
void client_gone(const state_ptr& s, runtime& rt) {
  s->broken = true;
  if (!s->final) rt.cancel(s->id);
  if (s->final) s->delivered();  // its outcome can never reach it now
}

// Sends what is pending: one tokens() chunk at a time (later tokens merge into the next
// chunk); then, at the end, done().
void pump(state_ptr s, runtime& rt, kj::TaskSet& tasks) {
  if (s->sending || s->broken) return;
  KJ_IF_MAYBE (sink, s->sink) {
    if (!s->pending_ids.empty() || !s->pending_text.empty()) {
      s->sending = true;
      auto req = sink->tokensRequest();
      auto chunk = req.initChunk();
      chunk.setText(s->pending_text);
      auto ids = chunk.initIds(static_cast<unsigned>(s->pending_ids.size()));
      for (unsigned i = 0; i < s->pending_ids.size(); ++i) ids.set(i, s->pending_ids[i]);
      if (!s->pending_logprobs.empty()) {
        auto lps = chunk.initLogprobs(static_cast<unsigned>(s->pending_logprobs.size()));
        for (unsigned i = 0; i < s->pending_logprobs.size(); ++i) to_wire(s->pending_logprobs[i], lps[i]);
      }
      const auto n = static_cast<int32_t>(s->pending_ids.size());
      s->pending_text.clear();
      s->pending_ids.clear();
      s->pending_logprobs.clear();
      tasks.add(req.send().then(
          [s, &rt, &tasks, n]() mutable {
            s->sending = false;
            s->unsynced += n;
            confirm(s, rt, tasks);
            pump(s, rt, tasks);
          },
          [s, &rt](kj::Exception&&) {
            s->sending = false;
            client_gone(s, rt);
          }));
      return;
    }
    if (s->final && !s->done_sent) {
      s->done_sent = true;
      auto req = sink->doneRequest();
      to_wire(*s->final, req.initOutcome());
      tasks.add(req.send().ignoreResult().then([s] { s->delivered(); }, [s](kj::Exception&&) { s->delivered(); }));
    }
  } else if (s->final) {
    s->delivered();  // no sink: the outcome is for generation.outcome() alone
  }
}

void confirm(state_ptr s, runtime& rt, kj::TaskSet& tasks) {
  if (s->unsynced == 0 || s->syncing || s->broken) return;
  if (!s->sync_supported) {
    if (!s->final) rt.acknowledge(s->id, s->unsynced);
    s->unsynced = 0;
    return;
  }
  KJ_IF_MAYBE (sink, s->sink) {
    s->syncing = true;
    const int32_t n = s->unsynced;
    tasks.add(sink->syncRequest().send().ignoreResult().then(
        [s, &rt, &tasks, n]() {
          s->syncing = false;
          s->unsynced -= n;
          if (!s->final) rt.acknowledge(s->id, n);
          confirm(s, rt, tasks);
          pump(s, rt, tasks);  // done() may have waited for this sync
        },
        [s, &rt, &tasks](kj::Exception&& e) {
          s->syncing = false;
          if (e.getType() == kj::Exception::Type::UNIMPLEMENTED) {
            s->sync_supported = false;
            confirm(s, rt, tasks);
            return;
          }
          client_gone(s, rt);
        }));
  }
}

class generation_impl final : public rpc::Generation::Server {
 public:
  generation_impl(state_ptr s, runtime& rt) : s_(std::move(s)), rt_(rt) {}
  ~generation_impl() {
    if (!s_->final) rt_.cancel(s_->id);  // dropping the Generation cancels the request
  }

 protected:
  kj::Promise<void> cancel(CancelContext) override {
    rt_.cancel(s_->id);
    return kj::READY_NOW;
  }
  kj::Promise<void> status(StatusContext context) override {
    auto r = context.getResults();
    r.setState(s_->final ? rpc::Generation::State::FINISHED : rpc::Generation::State::RUNNING);
    r.setTokens(s_->generated);
    return kj::READY_NOW;
  }
  kj::Promise<void> outcome(OutcomeContext context) override {
    if (s_->final) {
      to_wire(*s_->final, context.getResults().initOutcome());
      return kj::READY_NOW;
    }
    auto pf = kj::newPromiseAndFulfiller<void>();
    s_->waiters.push_back(kj::mv(pf.fulfiller));
    auto s = s_;
    return pf.promise.then([s, context]() mutable { to_wire(*s->final, context.getResults().initOutcome()); });
  }

 private:
  state_ptr s_;
  runtime& rt_;
};

outcome refused(std::string_view reason, std::string message) {
  outcome o;
  o.kind = outcome_kind::rejected;
  o.reason = std::string(reason);
  o.message = std::move(message);
  return o;
}

}  // namespace

inference_service::inference_service(runtime& rt, kj_bridge& bridge, const runtime_config& config,
                                     service_info info, decode_limits limits)
    : rt_(rt),
      bridge_(bridge),
      info_(std::move(info)),
      limits_(std::move(limits)),
      tasks_(task_errors),
      loop_thread_(std::this_thread::get_id()) {
  for (const tenant_settings& t : config.tenants) {
    for (const std::string& k : t.keys) tenant_of_key_[k] = t.name;
  }
}

inference_service::~inference_service() = default;

size_t inference_service::unfinished() const { return live_.size(); }

void inference_service::finished(const std::string& tenant, const outcome& o) {
  auto count = [&o](tenant_counters& c) {
    switch (o.kind) {
      case outcome_kind::completed: ++c.completed; break;
      case outcome_kind::rejected: ++c.rejected; break;
      case outcome_kind::cancelled: ++c.cancelled; break;
      case outcome_kind::failed: ++c.failed; break;
    }
    c.prompt_tokens += o.prompt_tokens;
    c.completion_tokens += o.completion_tokens;
  };
  count(all_);
  if (!tenant.empty()) count(counters_[tenant]);
}

void inference_service::keep(const std::shared_ptr<generation_state>& s, std::weak_ptr<connection_activity> conn) {
  live_[s->id] = s;
  const uint64_t id = s->id;
  s->on_delivered = [this, id, conn] {
    live_.erase(id);
    if (auto c = conn.lock()) --c->live;
  };
}

void inference_service::deliver(const std::shared_ptr<generation_state>& s, const outcome& o) {
  if (s->final) return;
  s->final = o;
  finished(s->tenant, o);
  if (observe_) observe_(s->api_key, o);
  for (auto& w : s->waiters) w->fulfill();
  s->waiters.clear();
  if (s->broken) {
    s->delivered();
    return;
  }
  pump(s, rt_, tasks_);
}

kj::Promise<void> inference_service::generate(generate_context context,
                                              const std::shared_ptr<connection_activity>& conn) {
  ++received_;
  auto params = context.getParams();
  auto s = std::make_shared<generation_state>();
  if (params.hasSink()) s->sink = params.getSink();
  // The connection counts this generation until its outcome has reached the client.
  ++conn->live;

  // A request that cannot even be read (it breaks the message's limits) is bad input too.
  std::variant<decoded_request, request_problem> decoded = request_problem{"invalid", ""};
  try {
    auto request = params.getRequest();
    decoded = decode_request(request, limits_);
    s->api_key = request.getApiKey();
    if (auto it = tenant_of_key_.find(s->api_key); it != tenant_of_key_.end()) s->tenant = it->second;
  } catch (const kj::Exception& e) {
    decoded = request_problem{"invalid", fmt::format("the request could not be read ({}); send a smaller or "
                                                     "well-formed request", e.getDescription().cStr())};
  }
  if (std::holds_alternative<decoded_request>(decoded) && !params.hasSink()) {
    decoded = request_problem{"invalid", "sink is missing: pass a TokenSink to receive the tokens and the outcome"};
  }

  auto local_refusal = [&](outcome o) {
    s->id = next_local_id_--;
    keep(s, conn);
    deliver(s, o);
  };
  if (auto* problem = std::get_if<request_problem>(&decoded)) {
    spdlog::debug("refused a malformed request: {}", problem->message);
    local_refusal(refused(problem->reason, problem->message));
  } else if (!accepting_) {
    local_refusal(refused("shutting_down", "the server is shutting down"));
  } else {
    auto& d = std::get<decoded_request>(decoded);
    std::weak_ptr<generation_state> weak = s;
    // Both callbacks run on runtime threads: they only post to the loop. They hold the state
    // weakly: they are destroyed on the runtime's threads, where its kj objects must never be
    // destroyed; live_ (loop thread only) keeps it until its outcome reached the client.
    in_submit_ = true;
    s->id = rt_.submit(
        std::move(d.req),
        [this, weak](const token_event& e) {
          bridge_.post([this, weak, e] {
            auto s = weak.lock();
            if (!s || s->final) return;
            s->pending_text += e.text;
            s->pending_ids.insert(s->pending_ids.end(), e.tokens.begin(), e.tokens.end());
            s->pending_logprobs.insert(s->pending_logprobs.end(), e.logprobs.begin(), e.logprobs.end());
            s->generated += static_cast<int32_t>(e.tokens.size());
            pump(s, rt_, tasks_);
          });
        },
        [this, weak](const outcome& o) {
          // Refused inside submit() (a bad key, a full door) we are on the loop's thread:
          // keep it for below instead of a round trip through the bridge.
          if (std::this_thread::get_id() == loop_thread_ && in_submit_) {
            refused_now_ = o;
            return;
          }
          bridge_.post([this, weak, o] {
            if (auto s = weak.lock()) deliver(s, o);
          });
        });
    in_submit_ = false;
    keep(s, conn);
    if (refused_now_) {
      outcome o = std::move(*refused_now_);
      refused_now_.reset();
      deliver(s, o);
    }
  }
  context.getResults().setGeneration(kj::heap<generation_impl>(s, rt_));
  return kj::READY_NOW;
}

kj::Promise<void> inference_service::models(models_context context) {
  auto list = context.getResults().initModels(1);
  list[0].setName(info_.model_name);
  list[0].setDescription(info_.description);
  list[0].setContextLength(info_.context_length);
  list[0].setVocabSize(info_.vocab_size);
  return kj::READY_NOW;
}

kj::Promise<void> inference_service::health(health_context context) {
  return runtime_stats_promise(rt_).then([this, context](runtime_stats s) mutable {
    auto h = context.getResults().initHealth();
    h.setOk(s.backend_problem.empty());
    h.setProblem(s.backend_problem);
    h.setAccepting(accepting_);
    h.setRunning(s.running);
    h.setQueued(s.queued_in_admission + s.waiting_in_engine);
    h.setKvFreeBlocks(s.kv_blocks_free);
    h.setKvTotalBlocks(s.kv_blocks_total);
    h.setOpenStreams(static_cast<int32_t>(live_.size()));
    h.setConnections(connections_ ? connections_() : 0);
  });
}

kj::Promise<void> inference_service::stats(stats_context context) {
  const std::string key = context.getParams().getApiKey();
  std::string tenant;
  if (auto it = tenant_of_key_.find(key); it != tenant_of_key_.end()) tenant = it->second;
  return runtime_stats_promise(rt_).then([this, context, tenant](runtime_stats s) mutable {
    auto r = context.getResults().initStats();
    r.setTenant(tenant);
    if (!tenant.empty()) {
      const tenant_counters& c = counters_[tenant];
      r.setCompleted(c.completed);
      r.setRejected(c.rejected);
      r.setCancelled(c.cancelled);
      r.setFailed(c.failed);
      r.setPromptTokens(c.prompt_tokens);
      r.setCompletionTokens(c.completion_tokens);
    }
    r.setServerRunning(s.running);
    r.setServerQueued(s.queued_in_admission + s.waiting_in_engine);
    r.setServerReceived(received_);
    r.setServerCompleted(all_.completed);
    r.setServerRejected(all_.rejected);
    r.setServerCancelled(all_.cancelled);
    r.setServerFailed(all_.failed);
    r.setServerOpen(static_cast<int32_t>(live_.size()));
    r.setShardRestarts(s.shard_restarts);
    const std::pair<const char*, int64_t> boxes[] = {{"engine", s.max_mailbox_engine},
                                                     {"admission", s.max_mailbox_admission},
                                                     {"kv_manager", s.max_mailbox_kv_manager}};
    auto list = r.initMailboxes(3);
    for (unsigned i = 0; i < 3; ++i) {
      list[i].setActor(boxes[i].first);
      list[i].setMaxSize(boxes[i].second);
    }
    r.setMailboxBound(s.door_capacity);
    r.setKvFreeBlocks(s.kv_blocks_free);
    r.setKvTotalBlocks(s.kv_blocks_total);
  });
}

}  // namespace tireless
