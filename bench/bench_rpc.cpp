// bench_rpc: what the Cap'n Proto RPC front of a running tireless-serve costs. Closed-loop
// clients (threads × connections × requests in flight per connection, one kj event loop per
// thread) send tiny generate requests over loopback and time each from send to done().
// Prints one table row: outcomes per second in the measured window, request-to-outcome
// latency, and that latency minus the runtime's own total time (Outcome.timings.totalMs),
// i.e. what the RPC layer, the bridge and the client add.
//
//   bench_rpc --port 7433 --key sk-premium-demo --threads 2 --connections 4 --inflight 8
//
// --hold N keeps N long generations (key --hold-key) running on one more connection, to keep
// a tier's queue full while the measured requests are refused. bench/run_bench_rpc.sh starts
// the server and runs the scenarios.
#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "protocol/outcome_wire.hpp"

#include "protocol/tireless.capnp.h"

namespace {

using namespace tireless;
using clock_type = std::chrono::steady_clock;

// How long held generations get to take their places before the measured requests start.
constexpr auto hold_settle = std::chrono::milliseconds(300);

struct bench_options {
  std::string host = "127.0.0.1";
  unsigned port = 7433;
  std::string key = "sk-premium-demo";
  int threads = 2;
  int connections = 4;  // per thread
  int inflight = 8;     // requests outstanding per connection
  double seconds = 5.0;
  double warmup = 1.0;
  int prompt_tokens = 4;
  std::string chat;  // non-empty: the measured requests are this one user message (text)
  int max_tokens = 1;
  std::string expect = "completed";  // an outcome kind, "rejected" or "rejected:REASON"
  std::string label;
  int hold = 0;
  std::string hold_key = "sk-premium-demo";
  int hold_max_tokens = 4000;
  bool header = false;
  int server_pid = 0;  // when given, the server's CPU use in the window is reported
};

// What done() brought.
struct arrival {
  clock_type::time_point at;
  std::string kind;      // completed, rejected:overloaded, cancelled, failed
  double server_ms = 0;  // Outcome.timings.totalMs
};

std::string kind_of(proto::Outcome::Reader o) {
  const outcome x = from_wire(o);
  if (x.kind == outcome_kind::rejected) return "rejected:" + x.reason;
  switch (x.kind) {
    case outcome_kind::completed: return "completed";
    case outcome_kind::cancelled: return "cancelled";
    default: return "failed";
  }
}

class bench_sink final : public rpc::TokenSink::Server {
 public:
  explicit bench_sink(kj::Own<kj::PromiseFulfiller<arrival>> done) : done_(kj::mv(done)) {}
  ~bench_sink() {
    if (done_->isWaiting()) done_->reject(KJ_EXCEPTION(DISCONNECTED, "sink dropped before done()"));
  }

 protected:
  kj::Promise<void> tokens(TokensContext) override { return kj::READY_NOW; }
  kj::Promise<void> sync(SyncContext) override { return kj::READY_NOW; }
  kj::Promise<void> done(DoneContext context) override {
    const auto o = context.getParams().getOutcome();
    done_->fulfill(arrival{clock_type::now(), kind_of(o), o.getTimings().getTotalMs()});
    return kj::READY_NOW;
  }

 private:
  kj::Own<kj::PromiseFulfiller<arrival>> done_;
};

struct connection {
  explicit connection(kj::Own<kj::AsyncIoStream> s)
      : stream(kj::mv(s)), client(*stream), inference(client.bootstrap().castAs<rpc::Inference>()) {}
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyClient client;
  rpc::Inference::Client inference;
};

struct thread_result {
  std::vector<double> latency_ms;   // sent and done inside the window
  std::vector<double> overhead_ms;  // latency minus the runtime's totalMs
  std::map<std::string, int64_t> kinds;  // done inside the window
  int64_t errors = 0;
  std::string first_error;
};

struct window {
  clock_type::time_point from, to;
};

// One request after another on one connection until the window closes.
class lane {
 public:
  lane(rpc::Inference::Client inference, rpc::GenerateRequest::Reader request, window w, thread_result* r)
      : inference_(kj::mv(inference)), request_(request), w_(w), r_(r) {}

  kj::Promise<void> run() {
    if (clock_type::now() >= w_.to) return kj::READY_NOW;
    auto call = inference_.generateRequest();
    call.setRequest(request_);
    auto done = kj::newPromiseAndFulfiller<arrival>();
    call.setSink(kj::heap<bench_sink>(kj::mv(done.fulfiller)));
    const auto sent = clock_type::now();
    auto returned = call.send();
    rpc::Generation::Client generation = returned.getGeneration();  // dropping it cancels
    return returned
        .then([outcome = kj::mv(done.promise)](capnp::Response<rpc::Inference::GenerateResults>&&) mutable {
          return kj::mv(outcome);
        })
        .then(
            [this, sent, generation = kj::mv(generation)](arrival a) mutable {
              record(sent, a);
              // Released one request later: when the last reference to a generation's state
              // is the one the runtime holds, the server destroys kj objects on a runtime
              // thread and crashes (reported); releasing at once makes that likely.
              previous_ = kj::mv(generation);
              return run();
            },
            [this](kj::Exception&& e) -> kj::Promise<void> {
              if (r_->errors++ == 0) r_->first_error = e.getDescription().cStr();
              return kj::READY_NOW;  // the connection is probably gone: stop this lane
            });
  }

 private:
  void record(clock_type::time_point sent, const arrival& a) {
    if (a.at < w_.from || a.at > w_.to) return;
    ++r_->kinds[a.kind];
    if (sent < w_.from) return;
    const double ms = std::chrono::duration<double, std::milli>(a.at - sent).count();
    r_->latency_ms.push_back(ms);
    r_->overhead_ms.push_back(ms - a.server_ms);
  }

  rpc::Inference::Client inference_;
  rpc::GenerateRequest::Reader request_;
  window w_;
  thread_result* r_;
  kj::Maybe<rpc::Generation::Client> previous_;
};

void fill_request(rpc::GenerateRequest::Builder r, const std::string& key, int prompt_tokens, int max_tokens) {
  r.setApiKey(key);
  auto tokens = r.getInput().initTokens(static_cast<unsigned>(prompt_tokens));
  for (int i = 0; i < prompt_tokens; ++i) tokens.set(static_cast<unsigned>(i), 100 + i);
  r.setMaxTokens(max_tokens);
}

void run_thread(const bench_options& o, window w, bool with_holds, thread_result& result) {
  auto io = kj::setupAsyncIo();
  auto address = io.provider->getNetwork().parseAddress(o.host, o.port).wait(io.waitScope);
  capnp::MallocMessageBuilder templates(64);
  auto request = templates.initRoot<rpc::GenerateRequest>();
  fill_request(request, o.key, o.prompt_tokens, o.max_tokens);
  if (!o.chat.empty()) {
    auto messages = request.getInput().initMessages(1);
    messages[0].setRole("user");
    messages[0].setContent(o.chat);
  }

  // Long generations that keep the server busy; dropped (cancelled) when the window closes.
  thread_result hold_result;
  capnp::MallocMessageBuilder hold_template(64);
  std::vector<kj::Own<connection>> connections;
  std::vector<kj::Own<lane>> lanes;
  kj::Vector<kj::Promise<void>> holds;
  if (with_holds && o.hold > 0) {
    auto hold = hold_template.initRoot<rpc::GenerateRequest>();
    fill_request(hold, o.hold_key, o.prompt_tokens, o.hold_max_tokens);
    connections.push_back(kj::heap<connection>(address->connect().wait(io.waitScope)));
    for (int i = 0; i < o.hold; ++i) {
      lanes.push_back(kj::heap<lane>(connections.back()->inference, hold.asReader(), w, &hold_result));
      holds.add(lanes.back()->run().eagerlyEvaluate(nullptr));
    }
    // Let them take their places (running, queued) before the measured requests arrive.
    io.provider->getTimer().afterDelay(hold_settle.count() * kj::MILLISECONDS).wait(io.waitScope);
  }

  kj::Vector<kj::Promise<void>> running;
  for (int c = 0; c < o.connections; ++c) {
    connections.push_back(kj::heap<connection>(address->connect().wait(io.waitScope)));
    for (int i = 0; i < o.inflight; ++i) {
      lanes.push_back(kj::heap<lane>(connections.back()->inference, request.asReader(), w, &result));
      running.add(lanes.back()->run());
    }
  }
  kj::joinPromises(running.releaseAsArray()).wait(io.waitScope);
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

bool expected(const std::string& kind, const std::string& expect) {
  return kind == expect || (expect == "rejected" && kind.rfind("rejected:", 0) == 0);
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// User + system CPU seconds of another process (utime and stime of /proc/PID/stat); 0 if unknown.
double cpu_seconds(int pid) {
  if (pid <= 0) return 0;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char line[1024] = {};
  const size_t n = std::fread(line, 1, sizeof line - 1, f);
  std::fclose(f);
  const std::string stat(line, n);
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  unsigned long utime = 0, stime = 0;
  // After "pid (comm)": state and fields 4..13, then utime (14) and stime (15).
  if (std::sscanf(stat.c_str() + close + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                  &stime) != 2) {
    return 0;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

thread_result merge(const std::vector<thread_result>& results) {
  thread_result all;
  for (const auto& r : results) {
    all.latency_ms.insert(all.latency_ms.end(), r.latency_ms.begin(), r.latency_ms.end());
    all.overhead_ms.insert(all.overhead_ms.end(), r.overhead_ms.begin(), r.overhead_ms.end());
    for (const auto& [k, n] : r.kinds) all.kinds[k] += n;
    all.errors += r.errors;
    if (all.first_error.empty()) all.first_error = r.first_error;
  }
  return all;
}

// One table row; true when every outcome was the expected kind and there were some.
bool print_row(const bench_options& o, thread_result all, double server_cores, double client_cores) {
  int64_t wanted = 0, other = 0;
  std::string unexpected;
  for (const auto& [k, n] : all.kinds) {
    if (expected(k, o.expect)) {
      wanted += n;
    } else {
      other += n;
      unexpected += " " + k + "=" + std::to_string(n);
    }
  }
  if (all.errors > 0) unexpected += " errors=" + std::to_string(all.errors) + " (" + all.first_error + ")";
  if (unexpected.empty()) unexpected = "-";
  if (o.header) {
    std::printf("%-29s %-7s %9s %7s %7s %7s %7s %7s %7s %6s %6s %7s %7s  %s\n", "scenario", "T×C×P", "outcome/s",
                "p50 ms", "p90 ms", "p99 ms", "max ms", "rpc p50", "rpc p99", "server", "client", "srv µs", "cli µs",
                "unexpected outcomes");
  }
  const double p50 = percentile(all.latency_ms, 0.50), p90 = percentile(all.latency_ms, 0.90),
               p99 = percentile(all.latency_ms, 0.99), pmax = percentile(all.latency_ms, 1.0);
  const double r50 = percentile(all.overhead_ms, 0.50), r99 = percentile(all.overhead_ms, 0.99);
  const std::string shape =
      std::to_string(o.threads) + "×" + std::to_string(o.connections) + "×" + std::to_string(o.inflight);
  const double rate = static_cast<double>(wanted + other) / o.seconds;
  const double us_per_outcome = rate > 0 ? 1e6 / rate : 0;  // × cores = CPU µs per outcome
  std::printf("%-29s %-7s %9.0f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %6.2f %6.2f %7.0f %7.0f  %s\n", o.label.c_str(),
              shape.c_str(), static_cast<double>(wanted) / o.seconds, p50, p90, p99, pmax, r50, r99, server_cores,
              client_cores, server_cores * us_per_outcome, client_cores * us_per_outcome, unexpected.c_str());
  return all.errors == 0 && other == 0 && wanted > 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Requests and refusals per second, and latency, of a running tireless-serve over RPC"};
  bench_options o;
  app.add_option("--host", o.host)->capture_default_str();
  app.add_option("--port", o.port)->capture_default_str();
  app.add_option("--key", o.key, "API key of the measured requests")->capture_default_str();
  app.add_option("--threads", o.threads, "client threads, one kj event loop each")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--connections", o.connections, "connections per thread")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--inflight", o.inflight, "requests in flight per connection")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seconds", o.seconds, "measured window")->capture_default_str();
  app.add_option("--warmup", o.warmup, "seconds before the window")->capture_default_str();
  app.add_option("--prompt-tokens", o.prompt_tokens)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-tokens", o.max_tokens)->capture_default_str();
  app.add_option("--chat", o.chat, "send this user message (text, tokenized by the server) instead of token ids");
  app.add_option("--expect", o.expect, "completed, rejected or rejected:REASON; others are counted apart")->capture_default_str();
  app.add_option("--label", o.label, "the row's name");
  app.add_option("--hold", o.hold, "long generations kept running meanwhile")->capture_default_str();
  app.add_option("--hold-key", o.hold_key)->capture_default_str();
  app.add_option("--hold-max-tokens", o.hold_max_tokens)->capture_default_str();
  app.add_flag("--header", o.header, "print the table's header first");
  app.add_option("--server-pid", o.server_pid, "the server's process id, to report its CPU use");
  CLI11_PARSE(app, argc, argv);

  const auto start = clock_type::now();
  const auto hold_lead = o.hold > 0 ? hold_settle : std::chrono::milliseconds(0);
  const window w{start + hold_lead + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(o.warmup)),
                 start + hold_lead + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(o.warmup + o.seconds))};
  std::vector<thread_result> results(static_cast<size_t>(o.threads));
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      try {
        run_thread(o, w, t == 0, results[static_cast<size_t>(t)]);
      } catch (const kj::Exception& e) {
        results[static_cast<size_t>(t)].errors++;
        results[static_cast<size_t>(t)].first_error = e.getDescription().cStr();
      }
    });
  }
  // CPU use inside the window, in cores (2.0: both cores of a 2-core machine all the time).
  std::this_thread::sleep_until(w.from);
  const double client0 = cpu_seconds(), server0 = cpu_seconds(o.server_pid);
  std::this_thread::sleep_until(w.to);
  const double client_cores = (cpu_seconds() - client0) / o.seconds;
  const double server_cores = (cpu_seconds(o.server_pid) - server0) / o.seconds;
  for (auto& t : threads) t.join();

  return print_row(o, merge(results), server_cores, client_cores) ? 0 : 1;
}
