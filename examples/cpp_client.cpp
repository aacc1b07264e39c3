// A C++ client of tireless-serve: sends one chat message and prints the answer as it streams,
// then the outcome. The client implements TokenSink; the server calls it as tokens arrive.
//
//   build/examples/cpp_client 127.0.0.1 7433 sk-premium-demo "Name three primary colors." [DEADLINE_S]
//
// Retries as clients/python does: a refusal for load (overloaded, quota, shutting down) with a
// retry hint is retried no sooner than the hint says, with its retry token (the room reserved
// for it); one without a hint, after a capped exponential backoff with full jitter; none past
// the total deadline (default 60 s). Exits 0 when the answer completed, 1 otherwise (the
// outcome is printed either way).
#include <capnp/ez-rpc.h>
#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "protocol/reason_names.hpp"
#include "protocol/tireless.capnp.h"

namespace {

using namespace tireless;

// Receives the streamed tokens and, once, the outcome (copied into `outcome`).
class printing_sink final : public rpc::TokenSink::Server {
 public:
  printing_sink(capnp::MallocMessageBuilder& outcome, bool& printed, kj::Own<kj::PromiseFulfiller<void>> done)
      : outcome_(outcome), printed_(printed), done_(kj::mv(done)) {}
  ~printing_sink() {
    if (done_->isWaiting()) done_->reject(KJ_EXCEPTION(DISCONNECTED, "the server went away before the outcome"));
  }

 protected:
  // A `-> stream` method: returning (here at once) grants the server room for more.
  kj::Promise<void> tokens(TokensContext context) override {
    const auto text = context.getParams().getChunk().getText();
    std::fwrite(text.begin(), 1, text.size(), stdout);
    std::fflush(stdout);
    printed_ = printed_ || text.size() > 0;
    return kj::READY_NOW;
  }

  // Every earlier tokens() call has returned: the server may send more.
  kj::Promise<void> sync(SyncContext) override { return kj::READY_NOW; }
  kj::Promise<void> done(DoneContext context) override {
    outcome_.setRoot(context.getParams().getOutcome());
    done_->fulfill();
    return kj::READY_NOW;
  }

 private:
  capnp::MallocMessageBuilder& outcome_;
  bool& printed_;
  kj::Own<kj::PromiseFulfiller<void>> done_;
};

std::string rejection_name(proto::Rejection::Reason r) {
  std::string name(proto::reason_name(r));
  std::replace(name.begin(), name.end(), '_', ' ');
  return name;
}

void print_outcome(proto::Outcome::Reader o) {
  switch (o.which()) {
    case proto::Outcome::COMPLETED: std::printf("[completed]\n"); break;
    case proto::Outcome::REJECTED: {
      const auto r = o.getRejected();
      std::printf("[rejected: %s — %s", rejection_name(r.getReason()).c_str(), r.getMessage().cStr());
      if (r.getRetryAfterMs() >= 0) std::printf("; retry after %lld ms", static_cast<long long>(r.getRetryAfterMs()));
      std::printf("]\n");
      break;
    }
    case proto::Outcome::CANCELLED: std::printf("[cancelled]\n"); break;
    case proto::Outcome::FAILED: std::printf("[failed: %s]\n", o.getFailed().getMessage().cStr()); break;
  }
  for (auto d : o.getDegradations()) std::printf("[degraded: %s]\n", d.cStr());
  const auto u = o.getUsage();
  const auto t = o.getTimings();
  if (t.getTimeToFirstTokenMs() < 0) return;  // no token was generated
  std::printf("[%d prompt + %d completion tokens; first token %.0f ms, total %.0f ms]\n", u.getPromptTokens(),
              u.getCompletionTokens(), t.getTimeToFirstTokenMs(), t.getTotalMs());
}

// One attempt: sends the message (with the retry token of an earlier refusal, if any), streams
// the answer, and leaves the outcome in `outcome`.
bool attempt(capnp::EzRpcClient& client, const char* key, const char* text, uint64_t retry_token,
             capnp::MallocMessageBuilder& outcome) {
  auto& wait_scope = client.getWaitScope();
  auto call = client.getMain<rpc::Inference>().generateRequest();
  auto request = call.initRequest();
  request.setApiKey(key);
  auto message = request.getInput().initMessages(1)[0];
  message.setRole("user");
  message.setContent(text);
  request.setMaxTokens(128);
  request.setRetryToken(retry_token);
  bool printed = false;
  auto done = kj::newPromiseAndFulfiller<void>();
  call.setSink(kj::heap<printing_sink>(outcome, printed, kj::mv(done.fulfiller)));
  // Keep the Generation until the end: dropping it cancels the request.
  auto generation = call.send().wait(wait_scope).getGeneration();
  done.promise.wait(wait_scope);
  if (printed) std::printf("\n");
  return printed;
}

// How long to wait before retry number `n` after `o`, or -1 when it is not worth retrying.
double retry_wait_s(proto::Outcome::Reader o, int n, std::mt19937_64& rng) {
  if (!o.isRejected()) return o.isFailed() ? std::uniform_real_distribution<double>(0, std::min(30.0, 0.5 * (1 << n)))(rng) : -1;
  const auto r = o.getRejected();
  const auto why = r.getReason();
  if (why != proto::Rejection::Reason::OVERLOADED && why != proto::Rejection::Reason::QUOTA_EXCEEDED &&
      why != proto::Rejection::Reason::SHUTTING_DOWN) {
    return -1;  // invalid, unauthenticated, prompt too long: retrying cannot help
  }
  if (r.getRetryAfterMs() < 0) {
    return why == proto::Rejection::Reason::QUOTA_EXCEEDED
               ? -1
               : std::uniform_real_distribution<double>(0, std::min(30.0, 0.5 * (1 << n)))(rng);
  }
  const double told = r.getRetryAfterMs() / 1000.0;  // never sooner; a little jitter above it
  return told + std::uniform_real_distribution<double>(0, std::min(0.1 * told, 1.0))(rng);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s HOST PORT API_KEY MESSAGE [DEADLINE_S]\n", argv[0]);
    return 2;
  }
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(argc == 6 ? std::atof(argv[5]) : 60.0);
  std::mt19937_64 rng(std::random_device{}());
  try {
    capnp::EzRpcClient client(argv[1], static_cast<unsigned>(std::atoi(argv[2])));
    uint64_t token = 0;
    for (int n = 0;; ++n) {
      capnp::MallocMessageBuilder outcome;
      const bool printed = attempt(client, argv[3], argv[4], token, outcome);
      const auto o = outcome.getRoot<proto::Outcome>().asReader();
      const double wait = printed ? -1 : retry_wait_s(o, n, rng);
      if (wait < 0 || n >= 8 || clock::now() + std::chrono::duration<double>(wait) >= deadline) {
        print_outcome(o);
        return o.isCompleted() ? 0 : 1;
      }
      token = o.isRejected() ? o.getRejected().getRetryToken() : 0;
      std::fprintf(stderr, "[refused (%s); retrying in %.0f ms]\n",
                   o.isRejected() ? rejection_name(o.getRejected().getReason()).c_str() : "failed", wait * 1000);
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
  } catch (const kj::Exception& e) {
    std::fprintf(stderr, "cpp_client: %s\n", e.getDescription().cStr());
    return 1;
  }
}
