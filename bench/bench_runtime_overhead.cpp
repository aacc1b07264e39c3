// bench_runtime_overhead: what the runtime itself costs per step, with the sim backend at
// zero step cost (every cost coefficient 0), N sequences decoding at once.
//
//   bench_runtime_overhead [--seqs 1,64,256,1024] [--steps 2000] [--reps 3] [--prompt 128]
//
// Two ways, interleaved per repetition (core, actors/sim shard, actors/detached shard):
//   core    the CAF-free step in a tight loop on one thread: batch_scheduler propose →
//           wire (KvRequest) → plan_kv on a block_manager → wire (KvReply) → finalize →
//           wire (StepRequest) → sim execute → wire (StepReply) → commit → one TokenChunk
//           message per token. Timed per phase; µs/step excludes execute.
//   actors  the runtime's actors (admission, engine, kv_manager, shard supervisor, one
//           session per request, through the runtime's intake) on a real threaded
//           actor_system set up as runtime::start does (2 workers), from a TOML config.
//           runtime::start takes only named sim profiles, so the pipeline is wired here as
//           runtime::start wires it, with a zero-cost profile. "sim shard": the shard as runtime::start runs a
//           sim backend (scheduled actor; the reply goes through the actor clock);
//           "detached shard": as it runs the cpu backend (own thread). Wall µs/step from the
//           engine's step counter; CPU µs/step from the process's CPU time (all threads).
// Sequences never finish while measured (max_tokens well beyond the steps run).
#include <caf/all.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "actors/messages.hpp"
#include "actors/pipeline.hpp"
#include "actors/intake.hpp"
#include "actors/wire.hpp"
#include "config/resolved_limits.hpp"
#include "gpu/sim/sim_backend.hpp"
#include "scheduler/batch_scheduler.hpp"

namespace {

using namespace tireless;
using clk = std::chrono::steady_clock;

struct setup {
  int n = 1, prompt = 128, steps = 2000;
  int block_size = 16;
  int max_tokens() const { return 2 * steps + 512; }
  int max_context() const { return prompt + max_tokens(); }
  int max_step_tokens() const { return std::max(2048, n); }
  int n_blocks() const { return n * ((max_context() + block_size - 1) / block_size + 1); }
};

sim::sim_profile zero_cost_profile(const setup& s) {
  sim::sim_profile p = sim::named_profile("cpu-smollm2");
  p.cost = {};
  p.kv.block_size = s.block_size;
  p.kv.n_blocks = s.n_blocks();
  p.limits = {s.max_step_tokens(), s.n, s.max_context()};
  return p;
}

std::vector<token_id> prompt_of(int n, int salt) {
  std::vector<token_id> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = 1000 + (i * 7919 + salt * 104729) % 30000;
  return p;
}

double since_us(clk::time_point t) { return std::chrono::duration<double, std::micro>(clk::now() - t).count(); }
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

const char* phase_names[] = {"propose", "wire kv request", "plan_kv", "wire kv reply", "finalize",
                             "wire step request", "commit", "wire step reply", "token messages", "execute (sim)"};
constexpr int n_phases = 10;

struct core_run {
  double us_per_step = 0, us_per_token = 0;
  double phase_us[n_phases] = {};
};

// The CAF-free step loop in one thread. `phase_us`: per step, execute last (not in us_per_step).
core_run run_core(const setup& s) {
  auto profile = zero_cost_profile(s);
  sim::sim_backend be(profile);
  block_manager blocks({s.n_blocks(), s.block_size, true, 0});
  batch_scheduler sched({s.max_step_tokens(), s.n, 3, s.max_context(), s.block_size});
  for (int i = 0; i < s.n; ++i) {
    sched.add({static_cast<seq_id>(i + 1), 1, static_cast<uint64_t>(i), prompt_of(s.prompt, i), {}, s.max_tokens(), {}, 0});
  }
  step_storage storage;
  step_result result, result_in;
  uint64_t step_id = 0;
  double t[n_phases] = {};
  int64_t tokens = 0;
  auto step = [&](bool timed) {
    auto mark = clk::now();
    auto lap = [&](int phase) {
      const auto now = clk::now();
      if (timed) t[phase] += std::chrono::duration<double, std::micro>(now - mark).count();
      mark = now;
    };
    kv_request req = sched.propose();
    lap(0);
    auto req_msg = to_wire(req);
    kv_request req_in = from_wire(req_msg.get());
    lap(1);
    kv_reply reply = plan_kv(blocks, req_in);
    lap(2);
    auto reply_msg = to_wire(reply);
    kv_reply reply_in = from_wire(reply_msg.get());
    lap(3);
    step_batch batch = sched.finalize(reply_in);
    lap(4);
    auto step_msg = to_wire(++step_id, batch, reply_in.copies, sched.take_forgotten());
    unpack(step_msg.get(), storage);
    lap(5);
    be.execute(storage.batch, result);
    lap(9);
    auto result_msg = to_wire(step_id, result, 0.0);
    unpack(result_msg.get(), result_in);
    lap(7);
    auto events = sched.commit(result_in);
    lap(6);
    for (const scheduler_event& e : events) {
      if (e.what != scheduler_event::kind::tokens) continue;
      auto m = to_wire(e.seq, e.tokens, -1);  // as the engine builds it
      (void)m;
      if (timed) tokens += static_cast<int64_t>(e.tokens.size());
    }
    lap(8);
  };
  // Warm up until every sequence decodes, then a few more steps.
  while (sched.counts().running < s.n || sched.counts().waiting > 0) step(false);
  for (int i = 0; i < 16; ++i) step(false);
  for (int i = 0; i < s.steps; ++i) step(true);
  core_run out;
  double outside = 0;
  for (int p = 0; p < n_phases; ++p) {
    out.phase_us[p] = t[p] / s.steps;
    if (p != 9) outside += t[p];
  }
  out.us_per_step = outside / s.steps;
  out.us_per_token = outside / static_cast<double>(std::max<int64_t>(tokens, 1));
  return out;
}

struct actor_run {
  double us_per_step = 0, us_per_token = 0, cpu_us_per_step = 0;
  bool held = true;  // all N running and none finished during the window
};

runtime_config config_for(const setup& s) {
  return parse_config(fmt::format(R"(
[backend]
kind = "sim"
real_time = false
max_context = {}
[kv]
block_size = {}
blocks = {}
watermark = 0.0
[engine]
max_step_tokens = {}
max_step_seqs = {}
[[tiers]]
name = "bench"
priority = 1
ttft_ms = 60000
tpot_ms = 60000
queue_bound = {}
sheddable = false
)", s.max_context(), s.block_size, s.n_blocks(), s.max_step_tokens(), s.n, 2 * s.n), "bench_runtime_overhead");
}

// The runtime's actors and intake on a real actor system, N requests decoding. As
// runtime::start wires them, with the zero-cost sim backend in place of the configured one.
actor_run run_actors(const setup& s, bool simulated_shard) {
  caf::actor_system_config sys_cfg;
  configure_actor_system(sys_cfg);
  caf::actor_system sys{sys_cfg};
  const runtime_config cfg = config_for(s);
  const sim::sim_profile profile = zero_cost_profile(s);
  const resolved_limits lim =
      resolve_limits(cfg, {profile.limits.max_context, profile.kv.bytes_per_block / profile.kv.block_size});
  pipeline_options po = make_pipeline_options(cfg, lim, std::make_shared<sim::sim_backend>(profile));
  po.shard.simulated = simulated_shard;
  const pipeline p = spawn_pipeline(sys, po);
  intake entry(sys, cfg, lim, nullptr, p, door_capacity(cfg, po));

  std::atomic<int64_t> tokens{0}, outcomes{0};
  for (int i = 0; i < s.n; ++i) {
    request r;
    r.prompt_tokens = prompt_of(s.prompt, i);
    r.max_tokens = s.max_tokens();
    entry.submit(
        std::move(r), [&](const token_event& e) { tokens += static_cast<int64_t>(e.tokens.size()); },
        [&](const outcome&) { ++outcomes; });
  }
  actor_run out;
  {
    caf::scoped_actor self{sys};
    auto view = [&] {
      engine_stats v;
      self->request(p.engine, caf::infinite, stats_atom::value).receive([&](const engine_stats& e) { v = e; },
                                                                       [](caf::error&) {});
      return v;
    };
    while (view().running < s.n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t warm = view().steps + 16;
    while (view().steps < warm) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto t0 = clk::now();
    const double c0 = cpu_seconds();
    const engine_stats v0 = view();
    const int64_t tok0 = tokens.load();
    engine_stats v1 = v0;
    while ((v1 = view()).steps - v0.steps < s.steps) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const double wall = since_us(t0), cpu = (cpu_seconds() - c0) * 1e6;
    const double steps = static_cast<double>(v1.steps - v0.steps);
    out.us_per_step = wall / steps;
    out.cpu_us_per_step = cpu / steps;
    out.us_per_token = wall / static_cast<double>(std::max<int64_t>(tokens.load() - tok0, 1));
    out.held = v0.running == s.n && v1.running == s.n && outcomes.load() == 0;
  }
  entry.close();
  entry.cancel_all();
  entry.wait_idle(std::chrono::seconds(60));
  stop_pipeline(p);
  entry.detach();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The runtime's own cost per step (sim backend, zero step cost)"};
  std::vector<int> seqs{1, 64, 256, 1024};
  setup base;
  int reps = 3;
  std::string only;
  app.add_option("--seqs", seqs)->delimiter(',');
  app.add_option("--only", only, "run one way only (for a profiler): core, sim or detached")
      ->check(CLI::IsMember({"core", "sim", "detached"}));
  app.add_option("--steps", base.steps, "steps measured per run")->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  app.add_option("--prompt", base.prompt, "prompt tokens per sequence")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::map<int, std::vector<core_run>> core;
  std::map<int, std::vector<actor_run>> sim_shard, detached_shard;
  for (int r = 0; r < reps; ++r) {
    for (int n : seqs) {
      setup s = base;
      s.n = n;
      core[n].push_back(only.empty() || only == "core" ? run_core(s) : core_run{});
      sim_shard[n].push_back(only.empty() || only == "sim" ? run_actors(s, true) : actor_run{});
      detached_shard[n].push_back(only.empty() || only == "detached" ? run_actors(s, false) : actor_run{});
      std::fprintf(stderr, "rep %d: %d sequences done\n", r + 1, n);
    }
  }
  auto med = [](const auto& runs, auto field) {
    std::vector<double> v;
    for (const auto& x : runs) v.push_back(x.*field);
    return median(v);
  };
  std::printf("medians of %d repetitions, %d steps each, prompts of %d tokens, context %d..%d\n", reps, base.steps,
              base.prompt, base.prompt, base.prompt + base.steps + 64);
  std::printf("%6s | %12s %12s | %27s | %27s\n", "", "core", "", "actors, sim shard", "actors, detached shard");
  std::printf("%6s | %12s %12s | %8s %8s %9s | %8s %8s %9s\n", "seqs", "us/step", "us/token", "us/step", "us/tok",
              "cpu us/st", "us/step", "us/tok", "cpu us/st");
  bool held = true;
  for (int n : seqs) {
    for (const auto& x : sim_shard[n]) held = held && x.held;
    for (const auto& x : detached_shard[n]) held = held && x.held;
    std::printf("%6d | %12.1f %12.3f | %8.1f %8.3f %9.1f | %8.1f %8.3f %9.1f\n", n, med(core[n], &core_run::us_per_step),
                med(core[n], &core_run::us_per_token), med(sim_shard[n], &actor_run::us_per_step),
                med(sim_shard[n], &actor_run::us_per_token), med(sim_shard[n], &actor_run::cpu_us_per_step),
                med(detached_shard[n], &actor_run::us_per_step), med(detached_shard[n], &actor_run::us_per_token),
                med(detached_shard[n], &actor_run::cpu_us_per_step));
  }
  std::printf("every actor run held all sequences running through its window: %s\n", held ? "yes" : "NO");
  std::printf("\ncore loop by phase, us/step (median over repetitions)\n%-20s", "phase");
  for (int n : seqs) std::printf(" %9d", n);
  std::printf("\n");
  for (int p = 0; p < n_phases; ++p) {
    std::printf("%-20s", phase_names[p]);
    for (int n : seqs) {
      std::vector<double> v;
      for (const auto& x : core[n]) v.push_back(x.phase_us[p]);
      std::printf(" %9.1f", median(v));
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}
