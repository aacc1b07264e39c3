// bench_forward: the bare forward loop's speed on a model (default: SmolLM2 Q4_1), for
// comparison with llama.cpp on the same file (bench/peer_llamacpp.py).
//
//   bench_forward [--model PATH] [--threads 1,2] [--reps 3] [--json PATH]
//
// Measures, per thread count, medians over repetitions:
//   decode_b1      tokens/s generating 128 tokens after a 16-token prompt, one sequence
//   prefill_512    tokens/s prefilling a 512-token prompt in one step
//   decode_b8/b32  aggregate tokens/s decoding 8 or 32 sequences (16-token prompts), 64 steps
// and the process's peak RSS.
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>

#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/sequence_runner.hpp"
#include "model/model.hpp"
#include "tools/default_model.hpp"

namespace {

using namespace tireless;

std::vector<token_id> prompt_of(int n, int salt) {
  std::vector<token_id> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = 1000 + (i * 7919 + salt * 104729) % 30000;
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Decode tokens/s of `batch` sequences generating `steps` tokens after `prompt` tokens.
double decode_rate(backend& b, int batch, int prompt, int steps) {
  std::vector<generation_request> reqs;
  for (int i = 0; i < batch; ++i) {
    generation_request r;
    r.prompt = prompt_of(prompt, i);
    r.max_tokens = steps + 1;  // the first token comes from the prefill
    reqs.push_back(std::move(r));
  }
  sequence_runner runner(b);
  runner.run(reqs);
  return runner.stats().decode_tokens / runner.stats().decode_seconds;
}

double prefill_rate(backend& b, int prompt) {
  generation_request r;
  r.prompt = prompt_of(prompt, 3);
  r.max_tokens = 1;
  sequence_runner runner(b);
  runner.run({r});
  return runner.stats().prefill_tokens / runner.stats().prefill_seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Speed of the bare forward loop on the CPU"};
  std::string model_path = default_model_path(), json_path;
  std::vector<int> threads{1, 2};
  int reps = 3;
  app.add_option("--model", model_path)->capture_default_str();
  app.add_option("--threads", threads)->delimiter(',');
  app.add_option("--reps", reps)->check(CLI::PositiveNumber);
  app.add_option("--json", json_path);
  CLI11_PARSE(app, argc, argv);

  auto m = model::load(model_path);
  std::map<std::string, std::map<int, double>> results;
  std::string kernels;
  double kv_pool_mb = 0;
  for (int t : threads) {
    cpu::cpu_backend_options opt;
    opt.threads = t;
    opt.max_context = 1024;
    opt.max_step_tokens = 512;
    opt.kv_blocks = 32 * ((16 + 130 + 15) / 16) + 64;  // 32 sequences of 146 tokens, or one of 513
    auto b = cpu::make_cpu_backend(m, opt);
    kernels = b->describe();
    kv_pool_mb = static_cast<double>(b->kv().n_blocks) * b->kv().bytes_per_block / 1e6;
    decode_rate(*b, 1, 16, 8);  // warm up
    std::map<std::string, std::vector<double>> runs;
    for (int r = 0; r < reps; ++r) {
      runs["decode_b1"].push_back(decode_rate(*b, 1, 16, 128));
      runs["prefill_512"].push_back(prefill_rate(*b, 512));
      runs["decode_b8"].push_back(decode_rate(*b, 8, 16, 64));
      runs["decode_b32"].push_back(decode_rate(*b, 32, 16, 64));
    }
    for (auto& [name, v] : runs) results[name][t] = median(v);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_mb = ru.ru_maxrss / 1024.0;

  std::printf("tireless %s, model %s\n", kernels.c_str(), m->config().name.c_str());
  std::printf("%-14s", "tokens/s");
  for (int t : threads) std::printf("  %2d thread%s", t, t == 1 ? " " : "s");
  std::printf("\n");
  for (auto& [name, by_threads] : results) {
    std::printf("%-14s", name.c_str());
    for (int t : threads) std::printf("  %10.1f", by_threads[t]);
    std::printf("\n");
  }
  const double file_mb = m->file().mapped_bytes() / 1e6;
  std::printf("peak RSS %.1f MB; bar: file %.1f MB + KV pool %.1f MB + 64 MB = %.1f MB: %s\n", rss_mb, file_mb,
              kv_pool_mb, file_mb + kv_pool_mb + 64, rss_mb <= file_mb + kv_pool_mb + 64 ? "met" : "MISSED");
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "{\n  \"engine\": \"tireless\",\n  \"kernels\": \"" << kernels << "\",\n  \"peak_rss_mb\": " << rss_mb
      << ",\n  \"model_file_mb\": " << file_mb << ",\n  \"kv_pool_mb\": " << kv_pool_mb
      << ",\n  \"tokens_per_second\": {";
    bool first = true;
    for (auto& [name, by_threads] : results) {
      f << (first ? "\n" : ",\n") << "    \"" << name << "\": {";
      bool first_t = true;
      for (int t : threads) {
        f << (first_t ? "" : ", ") << "\"" << t << "\": " << by_threads[t];
        first_t = false;
      }
      f << "}";
      first = false;
    }
    f << "\n  }\n}\n";
  }
}
