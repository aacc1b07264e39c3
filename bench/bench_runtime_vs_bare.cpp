// bench_runtime_vs_bare: throughput of the real model through the whole runtime
// (runtime::start, cpu or cuda backend, N concurrent requests) against the bare forward loop
// (sequence_runner) on the same batch: the same prompts, max_tokens and number of
// concurrent sequences, greedy, no stop tokens (every sequence makes exactly max_tokens).
// The runtime's overhead per step: its extra wall time over the bare loop's, per step it ran.
//
//   bench_runtime_vs_bare [--model PATH] [--seqs 8,32] [--tokens 64] [--prompt 32] [--reps 5]
//                         [--threads 2] [--only bare|runtime] [--backend cpu|cuda]
//
// Two ways, interleaved in each repetition and rotated between repetitions:
//   bare        sequence_runner on a cpu backend with the options runtime::start derives
//   runtime     runtime::start + generate() (CAF workers that do not poll, as runtime::start
//               sets them up; an earlier "no-polling" third way diagnosed that and is gone)
// Each run builds its own backend, so only one thread pool exists at a time. tokens/s =
// generated tokens / wall time from the first submission to the last outcome (prefill
// included). Context switches and CPU time are the whole process's during the run.
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <future>
#include <map>

#include <fmt/format.h>

#include "config/resolved_limits.hpp"
#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/sequence_runner.hpp"
#include "model/model.hpp"
#include "tireless/runtime.hpp"

namespace {

using namespace tireless;
using clk = std::chrono::steady_clock;

struct bench_options {
  std::string model_path =
      std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int tokens = 64, prompt = 32, threads = 2;
  std::string backend = "cpu";
};

std::vector<token_id> prompt_of(int n, int salt) {
  std::vector<token_id> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = 1000 + (i * 7919 + salt * 104729) % 30000;
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

runtime_config config_for(const bench_options& o, int n) {
  return parse_config(fmt::format(R"(
[model]
path = "{}"
[backend]
kind = "{}"
threads = {}
[kv]
block_size = 16
memory_mb = {}
[engine]
max_step_tokens = 512
max_step_seqs = {}
[[tiers]]
name = "bench"
priority = 1
ttft_ms = 60000
tpot_ms = 60000
queue_bound = {}
)", o.model_path, o.backend, o.threads,
                                  // SmolLM2 keeps 23,040 bytes of KV a token: every sequence's
                                  // positions with a quarter to spare, no preemption
                                  std::max<int64_t>(256, int64_t{n} * (o.prompt + o.tokens) * 23040 * 5 / 4 >> 20),
                                  std::max(64, n), std::max(64, n)),
                      "bench_runtime_vs_bare");
}

struct run_result {
  double tokens_per_second = 0, cpu_seconds = 0;
  int64_t tokens = 0, steps = 0, context_switches = 0;
};

// Times the run of `body` (which returns generated tokens and steps).
template <class F>
run_result measure(F body) {
  rusage u0{}, u1{};
  getrusage(RUSAGE_SELF, &u0);
  const auto t0 = clk::now();
  run_result out = body();
  const double seconds = std::chrono::duration<double>(clk::now() - t0).count();
  getrusage(RUSAGE_SELF, &u1);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  out.tokens_per_second = static_cast<double>(out.tokens) / seconds;
  out.cpu_seconds = sec(u1.ru_utime) + sec(u1.ru_stime) - sec(u0.ru_utime) - sec(u0.ru_stime);
  out.context_switches = (u1.ru_nvcsw + u1.ru_nivcsw) - (u0.ru_nvcsw + u0.ru_nivcsw);
  return out;
}

run_result run_runtime(const bench_options& o, int n) {
  auto rt = runtime::start(config_for(o, n));
  run_result out = measure([&] {
    run_result r;
    std::vector<std::future<outcome>> done;
    for (int i = 0; i < n; ++i) {
      request q;
      q.prompt_tokens = prompt_of(o.prompt, i);
      q.max_tokens = o.tokens;
      done.push_back(rt->generate(std::move(q)));
    }
    for (auto& f : done) {
      const outcome x = f.get();
      if (x.kind != outcome_kind::completed) throw std::runtime_error("a request did not complete: " + x.message);
      r.tokens += x.completion_tokens;
    }
    return r;
  });
  out.steps = rt->stats().steps;
  rt->shutdown(std::chrono::milliseconds(0));
  return out;
}

// The backend runtime::start makes from config_for(), and the limits it resolves.
std::shared_ptr<backend> backend_for(const runtime_config& c, const std::shared_ptr<const model>& m,
                                     resolved_limits& lim) {
  const model_config& mc = m->config();
  lim = resolve_limits(c, {mc.n_ctx_train, int64_t{mc.n_layer} * mc.kv_dim() * 2 * 2});
  if (c.backend.kind == backend_kind::cuda) {
    cuda::cuda_backend_options go;
    go.block_size = c.kv.block_size;
    go.kv_blocks = lim.kv_blocks;
    go.max_step_tokens = c.engine.max_step_tokens;
    go.max_step_seqs = c.engine.max_step_seqs;
    go.max_context = lim.max_context;
    return std::shared_ptr<backend>(cuda::make_cuda_backend(m, go));
  }
  cpu::cpu_backend_options bo;
  bo.threads = c.backend.threads;
  bo.block_size = c.kv.block_size;
  bo.kv_blocks = lim.kv_blocks;
  bo.max_step_tokens = c.engine.max_step_tokens;
  bo.max_step_seqs = c.engine.max_step_seqs;
  bo.max_context = lim.max_context;
  return std::shared_ptr<backend>(cpu::make_cpu_backend(m, bo));
}

run_result run_bare(const bench_options& o, int n, const std::shared_ptr<const model>& m) {
  resolved_limits lim;
  const auto be = backend_for(config_for(o, n), m, lim);
  std::vector<generation_request> reqs;
  for (int i = 0; i < n; ++i) {
    generation_request r;
    r.prompt = prompt_of(o.prompt, i);
    r.max_tokens = o.tokens;
    reqs.push_back(std::move(r));
  }
  sequence_runner runner(*be);
  return measure([&] {
    run_result r;
    for (const auto& x : runner.run(reqs)) r.tokens += static_cast<int64_t>(x.tokens.size());
    r.steps = runner.stats().steps;
    return r;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Throughput through the runtime vs the bare forward loop (real model, cpu or cuda backend)"};
  bench_options o;
  std::vector<int> seqs{8, 32};
  int reps = 5;
  std::string only;
  app.add_option("--model", o.model_path)->capture_default_str();
  app.add_option("--seqs", seqs, "concurrent sequences")->delimiter(',');
  app.add_option("--tokens", o.tokens, "max_tokens of every request")->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt tokens of every request")->capture_default_str();
  app.add_option("--threads", o.threads)->capture_default_str();
  app.add_option("--reps", reps)->capture_default_str();
  app.add_option("--only", only, "run one way only (for a profiler)")
      ->check(CLI::IsMember({"bare", "runtime"}));
  app.add_option("--backend", o.backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (std::string why; o.backend == "cuda" && !cuda::cuda_available(&why)) {
    std::printf("bench_runtime_vs_bare: skipped: %s\n", why.c_str());
    return 77;
  }

  const auto m = model::load(o.model_path);
  const char* names[] = {"bare", "runtime"};
  auto run = [&](int way, int n) {
    return way == 0 ? run_bare(o, n, m) : run_runtime(o, n);
  };
  for (int way = 0; way < 2; ++way) {  // warm up: page in the model, KV pages, code
    if (only.empty() || only == names[way]) run(way, seqs.front());
  }
  std::map<int, std::vector<run_result>> results[2];
  for (int r = 0; r < reps; ++r) {
    for (int n : seqs) {
      for (int k = 0; k < 2; ++k) {
        const int way = (k + r) % 2;
        if (only.empty() || only == names[way]) results[way][n].push_back(run(way, n));
      }
      std::fprintf(stderr, "rep %d, %d sequences done\n", r + 1, n);
    }
  }
  std::printf("%s, %s backend, %d threads; %d-token prompts, max_tokens %d, greedy; %d repetitions, order rotated\n",
              m->config().name.c_str(), o.backend.c_str(), o.threads, o.prompt, o.tokens, reps);
  for (int n : seqs) {
    std::printf("\n%d sequences\n%-11s %-36s %8s %8s %6s %10s %8s %12s\n", n, "", "tokens/s, each repetition", "median",
                "vs bare", "steps", "ctx sw/s", "CPU ms/tok", "us/step more");
    const auto& bare = results[0][n];
    for (int way = 0; way < 2; ++way) {
      const auto& runs = results[way][n];
      if (runs.empty()) continue;
      std::vector<double> tps, ratio, switches, cpu, overhead;
      std::string each;
      for (size_t i = 0; i < runs.size(); ++i) {
        const run_result& x = runs[i];
        tps.push_back(x.tokens_per_second);
        each += fmt::format("{:.0f} ", x.tokens_per_second);
        if (i < bare.size()) {
          ratio.push_back(x.tokens_per_second / bare[i].tokens_per_second);
          // Wall time beyond the bare loop's, per step this run took.
          const double extra = static_cast<double>(x.tokens) / x.tokens_per_second -
                               static_cast<double>(bare[i].tokens) / bare[i].tokens_per_second;
          overhead.push_back(1e6 * extra / static_cast<double>(std::max<int64_t>(x.steps, 1)));
        }
        const double seconds = static_cast<double>(x.tokens) / x.tokens_per_second;
        switches.push_back(static_cast<double>(x.context_switches) / seconds);
        cpu.push_back(1e3 * x.cpu_seconds / static_cast<double>(x.tokens));
      }
      std::printf("%-11s %-36s %8.1f %8.3f %6lld %10.0f %8.2f %12s\n", names[way], each.c_str(), median(tps),
                  median(ratio), static_cast<long long>(runs.back().steps), median(switches), median(cpu),
                  way == 0 ? "" : fmt::format("{:.0f}", median(overhead)).c_str());
    }
  }
  std::printf("\nvs bare: median over repetitions of tokens/s divided by bare's in the same repetition; the "
              "runtime's cost is 1 minus it. steps: of the last run. us/step more: the runtime's wall time beyond "
              "bare's in the same repetition, per runtime step (the runtime's overhead per step).\n");
}
