// tireless-shard: a process that holds some of a mixture-of-experts model's experts and
// serves them over Cap'n Proto RPC (the ExpertShard interface of protocol/runtime.capnp) to
// the attention shards of tireless-serve or tireless-generate (backend.expert_shard_addresses).
//
//   tireless-shard --model moe.gguf --listen 127.0.0.1:7501 --shard 0 --of 2
//   tireless-shard --model moe.gguf --listen 0.0.0.0:7502 --experts 1,3,5,7 --supervise
//
// --supervise keeps the listening socket in a parent process and runs the shard in a child:
// a child that crashes is restarted on the same socket (clients reconnect to the same address),
// unless it crashed more than --max-restarts times within --restart-window-ms: then the
// supervisor gives up (exit 1) and the clients fence the shard, moving its experts elsewhere.
#include <CLI/CLI.hpp>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <netdb.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <thread>

#include "experts/expert_service.hpp"
#include "experts/rpc.hpp"
#include "model/model.hpp"
#include "tools/default_model.hpp"

namespace {

// host:port -> a listening TCP socket (port 0: any free port). Throws with the reason.
int listen_on(const std::string& address, std::string& bound) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("--listen " + address + ": expected HOST:PORT");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    throw std::invalid_argument("--listen " + address + ": " + ::gai_strerror(rc));
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::freeaddrinfo(res);
    throw std::runtime_error("cannot listen on " + address + ": " + why);
  }
  ::freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char h[NI_MAXHOST], p[NI_MAXSERV];
  ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
  bound = (ss.ss_family == AF_INET6 ? "[" + std::string(h) + "]" : std::string(h)) + ":" + p;
  return fd;
}

struct options {
  std::string model_path;
  std::vector<int32_t> experts;
  int shard = -1, of = 0, threads = 1;
  int64_t max_tokens = 512;
};

// The shard itself: loads the model, packs its experts, serves on `fd` until SIGTERM/SIGINT.
int serve(const options& o, int fd) {
  auto lm = tireless::model::load(o.model_path);
  const auto& c = lm->config();
  std::vector<int32_t> experts = o.experts;
  if (o.of > 0) {
    for (int32_t e = o.shard; e < c.n_expert; e += o.of) experts.push_back(e);
  }
  auto service = std::make_shared<tireless::expert_service>(lm, o.threads, o.max_tokens * std::max(c.n_expert_used, 1),
                                                             experts);
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  auto io = kj::setupAsyncIo();
  capnp::TwoPartyServer server(tireless::make_expert_shard_server(service));
  auto listener = io.lowLevelProvider->wrapListenSocketFd(fd);
  std::fprintf(stderr, "tireless-shard[%d]: %s, %zu of %d experts per layer, serving\n", ::getpid(), c.name.c_str(),
               experts.empty() ? static_cast<size_t>(c.n_expert) : experts.size(), c.n_expert);
  server.listen(*listener)
      .exclusiveJoin(io.unixEventPort.onSignal(SIGTERM).ignoreResult())
      .exclusiveJoin(io.unixEventPort.onSignal(SIGINT).ignoreResult())
      .wait(io.waitScope);
  return 0;
}

volatile sig_atomic_t g_stop = 0;
volatile pid_t g_child = 0;

void forward(int sig) {
  g_stop = 1;
  if (g_child > 0) ::kill(g_child, sig);
}

// Runs serve() in children, restarting one that dies, until too many die within the window.
int supervise(const options& o, int fd, int max_restarts, std::chrono::milliseconds window) {
  struct sigaction sa{};
  sa.sa_handler = forward;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  std::deque<std::chrono::steady_clock::time_point> crashes;
  for (;;) {
    const pid_t child = ::fork();
    if (child < 0) throw std::runtime_error("fork failed");
    if (child == 0) {
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the supervisor
      if (::getppid() == 1) std::_Exit(0);
      std::_Exit(serve(o, fd));
    }
    g_child = child;
    if (g_stop) ::kill(child, SIGTERM);  // a signal that came before g_child was set
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
      if (g_stop) ::kill(child, SIGTERM);
    }
    g_child = 0;
    if (g_stop || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) return 0;
    const auto now = std::chrono::steady_clock::now();
    crashes.push_back(now);
    while (!crashes.empty() && now - crashes.front() > window) crashes.pop_front();
    const std::string how = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                                : "exit status " + std::to_string(WEXITSTATUS(status));
    if (static_cast<int>(crashes.size()) > max_restarts) {
      std::fprintf(stderr, "tireless-shard: the shard died (%s) %zu times within %lld ms; giving up\n", how.c_str(),
                   crashes.size(), static_cast<long long>(window.count()));
      return 1;
    }
    std::fprintf(stderr, "tireless-shard: the shard (pid %d) died (%s); restarting it\n", child, how.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Serve some of a mixture-of-experts model's experts over Cap'n Proto RPC."};
  options o;
  o.model_path = tireless::default_model_path();
  std::string listen = "127.0.0.1:7501", port_file;
  bool supervised = false;
  int max_restarts = 5;
  int64_t window_ms = 60'000;
  app.add_option("-m,--model", o.model_path, "the MoE GGUF (the same file the attention shard loads)")->capture_default_str();
  app.add_option("--listen", listen, "HOST:PORT to serve on (port 0: any free port)")->capture_default_str();
  auto* shard = app.add_option("--shard", o.shard, "this shard's index: holds experts e with e % --of == --shard")
                    ->check(CLI::NonNegativeNumber);
  auto* of = app.add_option("--of", o.of, "how many shards share the experts")->check(CLI::PositiveNumber);
  auto* experts = app.add_option("--experts", o.experts, "or: the experts it holds, in every layer (e.g. 0,3,5)")
                      ->delimiter(',');
  shard->needs(of);
  of->needs(shard);
  experts->excludes(shard);
  app.add_option("-t,--threads", o.threads, "CPU threads for the experts")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "most tokens one call carries (the engine's max_step_tokens)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound HOST:PORT here once listening");
  app.add_flag("--supervise", supervised, "restart the shard when it dies, on the same socket");
  app.add_option("--max-restarts", max_restarts, "with --supervise: give up after more deaths than this")
      ->capture_default_str();
  app.add_option("--restart-window-ms", window_ms, "... within this window")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.of > 0 && o.shard >= o.of) {
    std::cerr << "tireless-shard: --shard " << o.shard << " must be below --of " << o.of << "\n";
    return 2;
  }
  try {
    {
      auto lm = tireless::model::load(o.model_path);  // fail early, before listening, on a bad file
      if (!lm->config().is_moe()) {
        std::cerr << "tireless-shard: " << o.model_path << " is not a mixture of experts (no ffn_*_exps tensors); "
                  << "make one with tools/upcycle_moe.py\n";
        return 2;
      }
      for (int32_t e : o.experts) {
        if (e < 0 || e >= lm->config().n_expert) {
          std::cerr << "tireless-shard: expert " << e << " is not in the model (it has " << lm->config().n_expert << ")\n";
          return 2;
        }
      }
    }
    std::string bound;
    const int fd = listen_on(listen, bound);
    std::fprintf(stderr, "tireless-shard: listening on %s\n", bound.c_str());
    if (!port_file.empty()) {
      std::ofstream(port_file + ".tmp") << bound << "\n";
      std::rename((port_file + ".tmp").c_str(), port_file.c_str());
    }
    if (supervised) return supervise(o, fd, max_restarts, std::chrono::milliseconds(window_ms));
    return serve(o, fd);
  } catch (const std::exception& e) {
    std::cerr << "tireless-shard: " << e.what() << "\n";
    return 1;
  }
}
