// The server target: tireless-serve in its own process, started per run with a copy of the
// base config whose admission.policy is the run's (or a server that is already running), and
// driven over Cap'n Proto RPC from one kj event loop in this thread.
#include <capnp/rpc-twoparty.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <kj/async-io.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "protocol/outcome_wire.hpp"
#include "protocol/tireless.capnp.h"
#include "target.hpp"
#include "wall_clock_session.hpp"

namespace tireless::load {

namespace {

using clock_type = std::chrono::steady_clock;


class sink final : public rpc::TokenSink::Server {
 public:
  explicit sink(target_session::outcome_fn done) : done_(std::move(done)) {}

 protected:
  kj::Promise<void> tokens(TokensContext) override { return kj::READY_NOW; }
  kj::Promise<void> done(DoneContext context) override {
    if (done_) std::exchange(done_, nullptr)(from_wire(context.getParams().getOutcome()));
    return kj::READY_NOW;
  }

 private:
  target_session::outcome_fn done_;
};

// A tireless-serve process: started with a config, stopped with SIGTERM.
class server_process {
 public:
  server_process(const std::filesystem::path& serve, const std::filesystem::path& config,
                 const std::filesystem::path& log) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(out[1], 1);
      const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err >= 0) dup2(err, 2);
      execl(serve.c_str(), serve.c_str(), "--config", config.c_str(), "--port", "0", "--log-level", "info",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    stdout_ = out[0];
    address_ = wait_for_listening(log);
  }
  ~server_process() { stop(); }

  const std::string& address() const { return address_; }
  bool exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_ = WIFSIGNALED(status) ? fmt::format("tireless-serve was killed by signal {}", WTERMSIG(status))
                                  : fmt::format("tireless-serve exited with status {}", WEXITSTATUS(status));
    }
    return pid_ <= 0;
  }
  const std::string& exit_description() const { return exit_; }
  // SIGTERM, then SIGKILL if it has not exited after `grace` (the driver has disconnected
  // first, so nothing is left running).
  void stop(std::chrono::seconds grace = std::chrono::seconds(15)) {
    if (!exited()) {
      kill(pid_, SIGTERM);
      const auto until = clock_type::now() + grace;
      while (!exited() && clock_type::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!exited()) {
        std::fprintf(stderr, "\nwarning: tireless-serve (pid %d) did not exit within %lld s of SIGTERM; killed\n",
                     static_cast<int>(pid_), static_cast<long long>(grace.count()));
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
      }
    }
    if (stdout_ >= 0) close(stdout_);
    stdout_ = -1;
  }

 private:
  std::string wait_for_listening(const std::filesystem::path& log) {
    std::string seen;
    const auto until = clock_type::now() + std::chrono::seconds(120);
    while (clock_type::now() < until) {
      pollfd p{stdout_, POLLIN, 0};
      if (poll(&p, 1, 200) > 0) {
        char buf[512];
        const ssize_t n = read(stdout_, buf, sizeof buf);
        if (n <= 0) break;
        seen.append(buf, static_cast<size_t>(n));
        const auto at = seen.find("listening on ");
        const auto eol = at == std::string::npos ? at : seen.find('\n', at);
        if (eol != std::string::npos) return seen.substr(at + 13, eol - at - 13);
      }
      if (exited()) break;
    }
    stop(std::chrono::seconds(1));
    throw std::runtime_error(fmt::format("tireless-serve did not print \"listening on\"; its log: {}", log.string()));
  }

  pid_t pid_ = -1;
  int stdout_ = -1;
  std::string exit_;
  std::string address_;
};

std::pair<std::string, unsigned> split_host_port(const std::string& a) {
  const auto colon = a.rfind(':');
  return {a.substr(0, colon), static_cast<unsigned>(std::stoul(a.substr(colon + 1)))};
}

// The base config with the run's policy, the model path made absolute and, when asked, the
// tenants' quotas removed; validated before use.
std::filesystem::path write_config_copy(const scenario& s, admission_policy policy, bool lift_quotas,
                                        const std::filesystem::path& file) {
  toml::table doc = toml::parse_file(s.config_path.string());
  if (!doc["admission"].is_table()) doc.insert_or_assign("admission", toml::table{});
  doc["admission"].as_table()->insert_or_assign("policy", std::string(to_string(policy)));
  if (!doc["model"].is_table()) doc.insert_or_assign("model", toml::table{});
  doc["model"].as_table()->insert_or_assign("path", std::filesystem::absolute(s.config.model.path).string());
  if (lift_quotas) {
    if (toml::array* tenants = doc["tenants"].as_array()) {
      for (auto& t : *tenants) {
        if (toml::table* tt = t.as_table()) {
          for (const char* k : {"requests_per_minute", "tokens_per_minute", "max_concurrent"}) tt->erase(k);
        }
      }
    }
  }
  std::filesystem::create_directories(file.parent_path());
  {
    std::ofstream out(file);
    out << "# Written by tireless-load from " << s.config_path.string() << ": admission.policy = \""
        << to_string(policy) << "\"" << (lift_quotas ? ", tenant quotas removed" : "") << ".\n"
        << doc << "\n";
  }
  (void)load_config(file);  // throws config_error naming the key
  return file;
}

class server_session final : public wall_clock_session, public kj::TaskSet::ErrorHandler {
 public:
  server_session(kj::AsyncIoContext& io, std::unique_ptr<server_process> server, const std::string& address,
                 std::filesystem::path log = {})
      : wall_clock_session(io), server_(std::move(server)), log_(std::move(log)) {
    const auto [host, port] = split_host_port(address);
    conn_ = std::make_unique<connection>(io, host, port, *this);
  }
  ~server_session() override {
    conn_.reset();  // drops every Generation (cancelling what is left) and disconnects
    io_.waitScope.poll();
    server_.reset();
  }

  void submit(const planned_request& r, outcome_fn done) override {
    connection& c = *conn_;
    auto call = c.inference.generateRequest();
    auto q = call.initRequest();
    if (r.tenant_key) q.setApiKey(*r.tenant_key);
    const bool system = r.system_tokens > 0;
    auto messages = q.getInput().initMessages(system ? 2 : 1);
    if (system) {
      messages[0].setRole("system");
      messages[0].setContent(filler_text(r.system_tokens, 0x5eed0000ull + static_cast<uint64_t>(r.cls + 1)));
    }
    // The chat template and the instruction take ~20 tokens (~30 with the model's default system message).
    const int32_t own = std::max(1, r.prompt_tokens - r.system_tokens - (system ? 20 : 30));
    messages[system ? 1 : 0].setRole("user");
    messages[system ? 1 : 0].setContent("Write a long, detailed story that uses these words:" + filler_text(own, r.content_seed));
    q.setMaxTokens(r.max_tokens);
    if (r.retry_token != 0) q.setRetryToken(r.retry_token);
    if (r.timeout_ms > 0) q.setTimeoutMs(r.timeout_ms);
    const uint64_t id = c.next_id++;
    call.setSink(kj::heap<sink>([&c, id, done = std::move(done)](const outcome& o) {
      c.finished.insert(id);
      c.generations.erase(id);  // as a client does once it has its answer
      done(o);
    }));
    c.tasks.add(call.send().then([&c, id](capnp::Response<rpc::Inference::GenerateResults>&& response) {
      // Keep the Generation until the outcome: dropping it cancels the request.
      if (!c.finished.erase(id)) c.generations.emplace(id, response.getGeneration());
    }));
  }

  std::optional<target_probe> probe() override {
    try {
      auto h = conn_->inference.healthRequest().send().wait(io_.waitScope).getHealth();
      if (!h.getOk() && broken_.empty()) broken_ = fmt::format("health(): {}", h.getProblem().cStr());
      return target_probe{h.getQueued(), h.getRunning(), -1, {}};
    } catch (const kj::Exception& e) {
      broken_ = fmt::format("health(): {}", e.getDescription().cStr());
      return std::nullopt;
    }
  }

  std::string broken() override {
    if (server_ && server_->exited()) return server_->exit_description() + fmt::format(" (log: {})", log_.string());
    return broken_;
  }

 private:
  struct connection {
    connection(kj::AsyncIoContext& io, const std::string& host, unsigned port, kj::TaskSet::ErrorHandler& errors)
        : stream(io.provider->getNetwork().parseAddress(host, port).wait(io.waitScope)->connect().wait(io.waitScope)),
          client(*stream),
          inference(client.bootstrap().castAs<rpc::Inference>()),
          tasks(errors) {}
    kj::Own<kj::AsyncIoStream> stream;
    capnp::TwoPartyClient client;
    rpc::Inference::Client inference;
    std::unordered_map<uint64_t, rpc::Generation::Client> generations;
    std::unordered_set<uint64_t> finished;  // outcomes that came before generate() returned
    uint64_t next_id = 0;
    kj::TaskSet tasks;
  };

  void taskFailed(kj::Exception&& e) override {  // an RPC failed: only a disconnect matters
    if (e.getType() == kj::Exception::Type::DISCONNECTED && broken_.empty()) {
      broken_ = fmt::format("disconnected: {}", e.getDescription().cStr());
    }
  }

  std::unique_ptr<server_process> server_;
  std::unique_ptr<connection> conn_;
  std::string broken_;
  std::filesystem::path log_;
};

class server_target final : public target {
 public:
  server_target(const scenario& s, std::filesystem::path serve, std::filesystem::path out_dir)
      : s_(s), serve_(std::move(serve)), out_dir_(std::move(out_dir)), io_(std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo())) {
    if (s_.address.empty() && !std::filesystem::exists(serve_)) {
      throw std::runtime_error(fmt::format("tireless-serve not found at {}: build it, or pass --serve PATH", serve_.string()));
    }
  }

  std::unique_ptr<target_session> open(admission_policy policy, bool lift_quotas, const std::string& label) override {
    if (!s_.address.empty()) return std::make_unique<server_session>(*io_, nullptr, s_.address);
    const auto config = write_config_copy(s_, policy, lift_quotas, out_dir_ / "server" / (label + ".toml"));
    const auto log = out_dir_ / "server" / (label + ".log");
    auto server = std::make_unique<server_process>(serve_, config, log);
    const std::string address = server->address();
    return std::make_unique<server_session>(*io_, std::move(server), address, log);
  }
  bool virtual_time() const override { return false; }
  bool switches_policy() const override { return s_.address.empty(); }
  std::string describe() const override {
    if (!s_.address.empty()) return fmt::format("the running server at {} (its policy as configured)", s_.address);
    return fmt::format("{} --config <{} with the run's policy>", serve_.string(), s_.config_path.string());
  }

 private:
  const scenario& s_;
  std::filesystem::path serve_, out_dir_;
  std::unique_ptr<kj::AsyncIoContext> io_;  // one event loop for this thread, for every session
};

}  // namespace

std::unique_ptr<target> make_server_target(const scenario& s, std::filesystem::path serve,
                                           std::filesystem::path out_dir) {
  return std::make_unique<server_target>(s, std::move(serve), std::move(out_dir));
}

}  // namespace tireless::load
