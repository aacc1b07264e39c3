// A C++ client of tireless-serve: sends one chat message and prints the answer as it streams,
// then the outcome. The client implements TokenSink; the server calls it as tokens arrive.
//
//   build/examples/cpp_client 127.0.0.1 7433 sk-premium-demo "Name three primary colors."
//
// Exits 0 when the answer completed, 1 otherwise (the outcome is printed either way).
#include <capnp/ez-rpc.h>
#include <capnp/message.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s HOST PORT API_KEY MESSAGE\n", argv[0]);
    return 2;
  }
  try {
    capnp::EzRpcClient client(argv[1], static_cast<unsigned>(std::atoi(argv[2])));
    auto& wait_scope = client.getWaitScope();
    auto inference = client.getMain<rpc::Inference>();

    auto call = inference.generateRequest();
    auto request = call.initRequest();
    request.setApiKey(argv[3]);
    auto message = request.getInput().initMessages(1)[0];
    message.setRole("user");
    message.setContent(argv[4]);
    request.setMaxTokens(128);

    capnp::MallocMessageBuilder outcome;
    bool printed = false;
    auto done = kj::newPromiseAndFulfiller<void>();
    call.setSink(kj::heap<printing_sink>(outcome, printed, kj::mv(done.fulfiller)));
    // Keep the Generation until the end: dropping it cancels the request.
    auto generation = call.send().wait(wait_scope).getGeneration();
    done.promise.wait(wait_scope);
    if (printed) std::printf("\n");
    const auto o = outcome.getRoot<proto::Outcome>().asReader();
    print_outcome(o);
    return o.isCompleted() ? 0 : 1;
  } catch (const kj::Exception& e) {
    std::fprintf(stderr, "cpp_client: %s\n", e.getDescription().cStr());
    return 1;
  }
}
