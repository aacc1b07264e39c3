// tireless-chat: talk to a running tireless-serve from a terminal (or a pipe). Each line read is
// a user message; the whole conversation is sent each turn and the answer streams back.
//
//   tireless-chat [--host 127.0.0.1] [--port 7433] [--key sk-premium-demo] [--system TEXT]
//                 [--max-tokens N] [--temperature 0.7] [--top-p 0.9] [--top-k 40] [--min-p 0.05]
//                 [--repeat-penalty 1.1] [--seed N]
//
// It samples as a person expects a chat to (the defaults of ollama's and llama.cpp's CLIs:
// temperature, top-k/top-p/min-p and a mild repetition penalty; a new seed each turn unless
// --seed is given); --temperature 0 is greedy.
//
// "/quit" or end of input ends the chat, "/reset" forgets the conversation. Refusals,
// degradations and cut-short answers are printed in brackets; a refused or failed turn is
// left out of the conversation.
#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "protocol/reason_names.hpp"
#include "protocol/tireless.capnp.h"

namespace {

using namespace tireless;

struct chat_message {
  std::string role, content;
};

// One turn's answer as it arrives.
struct turn {
  std::string text;
  capnp::MallocMessageBuilder outcome{64};
};

class printing_sink final : public rpc::TokenSink::Server {
 public:
  printing_sink(std::shared_ptr<turn> t, kj::Own<kj::PromiseFulfiller<void>> done)
      : turn_(std::move(t)), done_(kj::mv(done)) {}
  ~printing_sink() {
    if (done_->isWaiting()) done_->reject(KJ_EXCEPTION(DISCONNECTED, "the server went away before the answer ended"));
  }

 protected:
  kj::Promise<void> tokens(TokensContext context) override {
    const auto text = context.getParams().getChunk().getText();
    turn_->text.append(text.begin(), text.size());
    std::fwrite(text.begin(), 1, text.size(), stdout);
    std::fflush(stdout);
    return kj::READY_NOW;
  }
  // Every earlier tokens() call has returned: the server may send more.
  kj::Promise<void> sync(SyncContext) override { return kj::READY_NOW; }
  kj::Promise<void> done(DoneContext context) override {
    turn_->outcome.setRoot(context.getParams().getOutcome());
    done_->fulfill();
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<turn> turn_;
  kj::Own<kj::PromiseFulfiller<void>> done_;
};

std::string rejection_name(proto::Rejection::Reason r) {
  std::string name(proto::reason_name(r));
  std::replace(name.begin(), name.end(), '_', ' ');
  return name;
}

// What a person should know about the outcome, one bracketed line each; none for a plain answer.
std::vector<std::string> notes(proto::Outcome::Reader o) {
  std::vector<std::string> out;
  for (auto d : o.getDegradations()) out.push_back(std::string("[degraded: ") + d.cStr() + "]");
  switch (o.which()) {
    case proto::Outcome::COMPLETED:
      if (o.getCompleted().getReason() == proto::Completion::Reason::MAX_TOKENS) {
        out.push_back("[cut short: max tokens reached]");
      } else if (o.getCompleted().getReason() == proto::Completion::Reason::CONTEXT_FULL) {
        out.push_back("[cut short: the context is full; /reset starts over]");
      }
      break;
    case proto::Outcome::REJECTED: {
      const auto r = o.getRejected();
      std::string line = std::string("[rejected: ") + rejection_name(r.getReason()) + " — " + r.getMessage().cStr();
      if (r.getRetryAfterMs() >= 0) line += "; retry after " + std::to_string(r.getRetryAfterMs()) + " ms";
      out.push_back(line + "]");
      break;
    }
    case proto::Outcome::CANCELLED:
      out.push_back(o.getCancelled().getReason() == proto::Cancellation::Reason::DEADLINE
                        ? "[cancelled: the request's deadline passed]"
                        : "[cancelled]");
      break;
    case proto::Outcome::FAILED: out.push_back(std::string("[failed: ") + o.getFailed().getMessage().cStr() + "]"); break;
  }
  return out;
}

struct chat_options {
  std::string host = "127.0.0.1";
  unsigned port = 7433;
  std::string key = "sk-premium-demo";
  std::string system;
  int32_t max_tokens = -1;
  float temperature = 0.7f, top_p = 0.9f, min_p = 0.05f, repeat_penalty = 1.1f;
  int32_t top_k = 40;
  int64_t seed = -1;  // -1: a new one each turn
};

// Sends the conversation, streams the answer to stdout; the outcome is in the returned turn.
std::shared_ptr<turn> ask(rpc::Inference::Client& inference, kj::WaitScope& wait_scope, const chat_options& o,
                          const std::vector<chat_message>& history) {
  auto call = inference.generateRequest();
  auto request = call.initRequest();
  request.setApiKey(o.key);
  request.setMaxTokens(o.max_tokens);
  auto sampling = request.initSampling();
  sampling.setTemperature(o.temperature);
  sampling.setTopP(o.top_p);
  sampling.setTopK(o.top_k);
  sampling.setMinP(o.min_p);
  sampling.setRepetitionPenalty(o.repeat_penalty);
  sampling.setSeed(o.seed >= 0 ? static_cast<uint64_t>(o.seed) : (uint64_t{std::random_device{}()} << 32) | std::random_device{}());
  auto messages = request.getInput().initMessages(static_cast<unsigned>(history.size()));
  for (unsigned i = 0; i < history.size(); ++i) {
    messages[i].setRole(history[i].role);
    messages[i].setContent(history[i].content);
  }
  auto t = std::make_shared<turn>();
  auto done = kj::newPromiseAndFulfiller<void>();
  call.setSink(kj::heap<printing_sink>(t, kj::mv(done.fulfiller)));
  auto generation = call.send().wait(wait_scope).getGeneration();  // dropping it cancels
  done.promise.wait(wait_scope);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Chat with a running tireless-serve"};
  chat_options o;
  app.add_option("--host", o.host, "server host")->capture_default_str();
  app.add_option("--port", o.port, "server port")->capture_default_str()->check(CLI::Range(1, 65535));
  app.add_option("--key", o.key, "API key")->capture_default_str();
  app.add_option("--system", o.system, "system message that starts the conversation");
  app.add_option("--max-tokens", o.max_tokens, "most tokens per answer; -1: the server's default")
      ->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature; 0 is greedy")
      ->capture_default_str()->check(CLI::Range(0.0, 2.0));
  app.add_option("--top-p", o.top_p, "nucleus mass, in (0, 1]")->capture_default_str()->check(CLI::Range(1e-6, 1.0));
  app.add_option("--top-k", o.top_k, "most likely tokens kept; 0: all")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--min-p", o.min_p, "drop tokens under this share of the best one's probability")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--repeat-penalty", o.repeat_penalty, "penalty on tokens already in the conversation; 1: off")
      ->capture_default_str()->check(CLI::Range(0.01, 10.0));
  app.add_option("--seed", o.seed, "sampling seed for every turn (reproducible answers); default: a new one each turn");
  CLI11_PARSE(app, argc, argv);

  const bool interactive = isatty(STDIN_FILENO);
  try {
    auto io = kj::setupAsyncIo();
    auto address = io.provider->getNetwork().parseAddress(o.host, o.port).wait(io.waitScope);
    auto connection = address->connect().wait(io.waitScope);
    capnp::TwoPartyClient client(*connection);
    auto inference = client.bootstrap().castAs<rpc::Inference>();

    std::vector<chat_message> history;
    if (!o.system.empty()) history.push_back({"system", o.system});
    if (interactive) std::printf("connected to %s:%u; /quit or Ctrl-D ends, /reset starts over\n", o.host.c_str(), o.port);
    std::string line;
    while (true) {
      if (interactive) {
        std::printf("> ");
        std::fflush(stdout);
      }
      if (!std::getline(std::cin, line) || line == "/quit") break;
      if (line.empty()) continue;
      if (line == "/reset") {
        history.resize(o.system.empty() ? 0 : 1);
        std::printf("[conversation cleared]\n");
        continue;
      }
      history.push_back({"user", line});
      const auto answer = ask(inference, io.waitScope, o, history);
      if (!answer->text.empty()) std::printf("\n");
      const auto outcome = answer->outcome.getRoot<proto::Outcome>().asReader();
      for (const std::string& note : notes(outcome)) std::printf("%s\n", note.c_str());
      if (outcome.isCompleted()) {
        history.push_back({"assistant", answer->text});
      } else {
        history.pop_back();  // unanswered: not part of the conversation
      }
      std::fflush(stdout);
    }
    if (interactive) std::printf("\n");
    return 0;
  } catch (const kj::Exception& e) {
    std::fprintf(stderr, "\ntireless-chat: %s\n", e.getDescription().cStr());
    return 1;
  }
}
