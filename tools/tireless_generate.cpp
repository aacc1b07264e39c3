// tireless-generate: streams a model's answer to the terminal.
//
//   tireless-generate --chat "What is the capital of France?"
//   tireless-generate --prompt "Once upon a time" --max-tokens 64 --temperature 0.8 --seed 1
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "gpu/cpu/cpu_backend.hpp"
#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/sequence_runner.hpp"
#include "model/model.hpp"
#include "model/text_stopper.hpp"
#include "experts/rpc.hpp"
#include "scheduler/expert_load.hpp"
#include "tools/default_model.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Generate text with a GGUF model on the CPU or a GPU, streaming tokens as they come."};
  std::string model_path = tireless::default_model_path();
  std::string prompt, chat, system;
  tireless::generation_request req;
  req.max_tokens = 256;
  std::vector<std::string> stops;
  int threads = 0;
  bool quiet = false;
  app.add_option("-m,--model", model_path, "GGUF model file")->capture_default_str();
  auto* p = app.add_option("-p,--prompt", prompt, "raw prompt, sent as is");
  auto* c = app.add_option("-c,--chat", chat, "a user message, wrapped in the model's chat template");
  p->excludes(c);
  app.add_option("--system", system, "system message for --chat (default: the template's own)");
  app.add_option("-n,--max-tokens", req.max_tokens, "most tokens to generate")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--temperature", req.sampling.temperature, "0 is greedy")->check(CLI::Range(0.0, 100.0))->capture_default_str();
  app.add_option("--top-k", req.sampling.top_k, "0 keeps all tokens")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", req.sampling.top_p, "nucleus sampling mass, in (0, 1]")->check(CLI::Range(1e-6, 1.0));
  app.add_option("--seed", req.sampling.seed, "random seed for sampling");
  app.add_option("--stop", stops, "stop string (repeatable)");
  app.add_option("-t,--threads", threads, "CPU threads (0: one per core)")->check(CLI::NonNegativeNumber);
  app.add_flag("-q,--quiet", quiet, "no timing line on stderr");
  int expert_shards = 0;
  app.add_option("--expert-stats", expert_shards,
                 "MoE: print on stderr how evenly tokens fell on the experts and on this many shards (expert e on "
                 "shard e % N)")
      ->check(CLI::Range(1, 4096));
  std::vector<std::string> shard_addresses;
  bool f16 = false;
  int64_t rebalance_every = 0;
  int32_t replicas = 0;
  app.add_option("--expert-shard", shard_addresses,
                 "MoE: run the experts on this tireless-shard process (HOST:PORT; repeat for each shard)");
  bool int8 = false;
  auto* f16_flag = app.add_flag("--expert-f16", f16, "with --expert-shard: f16 activations on the wire (f32 otherwise: exact)");
  app.add_flag("--expert-int8", int8, "with --expert-shard: int8 activations with a scale per row")->excludes(f16_flag);
  app.add_option("--rebalance-every", rebalance_every,
                 "with --expert-shard: replicate hot experts every N tokens (EPLB), at most --replicas per shard and layer")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--replicas", replicas, "with --rebalance-every: replicas each shard may take per layer")
      ->check(CLI::NonNegativeNumber);
  std::string backend_kind = "cpu";
  std::vector<int32_t> cuda_devices;
  app.add_option("--backend", backend_kind, "cpu, cuda, or auto (cuda where a GPU can be used)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  app.add_option("--cuda-device", cuda_devices, "with --backend cuda: CUDA device ids (several: a MoE's experts over them)");
  bool overlap = false;
  app.add_flag("--overlap", overlap,
               "with --expert-shard: split each step of several sequences into two micro-batches, one's attention here "
               "while the other's experts run on the shards (ping-pong)");
  int batch = 1;
  app.add_option("--batch", batch,
                 "generate this many sequences of the prompt at once (the first one is printed; tok/s counts them all)")
      ->check(CLI::Range(1, 256))->capture_default_str();
  int64_t revive_wait_ms = 30'000;
  app.add_option("--revive-wait-ms", revive_wait_ms,
                 "with --expert-shard: how long to wait for a shard to answer at start, and for a failed one to come back "
                 "before fencing it")
      ->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (prompt.empty() && chat.empty()) {
    std::cerr << "tireless-generate: give --prompt TEXT or --chat MESSAGE\n";
    return 2;
  }

  try {
    auto m = tireless::model::load(model_path);
    std::string text = prompt;
    std::vector<tireless::token_id> stop_tokens;
    if (!chat.empty()) {
      std::vector<tireless::chat_message> messages;
      if (!system.empty()) messages.push_back({"system", system});
      messages.push_back({"user", chat});
      text = m->chat().apply(messages, true);
      stop_tokens = m->chat().stop_tokens();
    } else if (auto eos = m->tok().eos()) {
      stop_tokens = {*eos};
    }
    req.prompt = m->tok().encode(text, true);
    req.stop_tokens = stop_tokens;
    tireless::cpu::cpu_backend_options opt;
    opt.threads = threads;
    opt.max_context = std::min<int32_t>(m->config().n_ctx_train,
                                        static_cast<int32_t>(req.prompt.size()) + req.max_tokens);
    std::unique_ptr<tireless::expert_exchange> exchange;
    if (!shard_addresses.empty()) {
      tireless::expert_exchange_options eo;
      eo.activations = f16 ? tireless::proto::Activations::F16
                       : int8 ? tireless::proto::Activations::INT8
                              : tireless::proto::Activations::F32;
      eo.rebalance_every = rebalance_every * m->config().n_layer;
      eo.replicas_per_shard = replicas;
      eo.revive_wait = std::chrono::milliseconds(revive_wait_ms);
      exchange = tireless::make_rpc_expert_exchange(m, shard_addresses, eo.revive_wait, eo);
      opt.experts = exchange.get();
      opt.overlap = overlap;
    }
    opt.max_step_seqs = std::max(opt.max_step_seqs, batch);
    opt.kv_blocks = batch * ((opt.max_context + opt.block_size - 1) / opt.block_size);
    if (backend_kind == "auto") backend_kind = tireless::cuda::cuda_available() && !exchange ? "cuda" : "cpu";
    std::unique_ptr<tireless::backend> backend;
    if (backend_kind == "cuda") {
      if (exchange) throw std::runtime_error("--expert-shard runs with the cpu backend; drop --backend cuda");
      tireless::cuda::cuda_backend_options co;
      co.devices = cuda_devices;
      co.block_size = opt.block_size;
      co.kv_blocks = opt.kv_blocks;
      co.max_step_tokens = opt.max_step_tokens;
      co.max_step_seqs = opt.max_step_seqs;
      co.max_context = opt.max_context;
      co.sampling_threads = threads;
      backend = tireless::cuda::make_cuda_backend(m, co);
    } else {
      backend = tireless::cpu::make_cpu_backend(m, opt);
    }
    tireless::text_stopper stopper(m->tok(), stop_tokens, stops);
    tireless::sequence_runner runner(*backend);
    const auto started = std::chrono::steady_clock::now();
    auto out = runner.run(std::vector<tireless::generation_request>(static_cast<size_t>(batch), req),
                          [&](size_t i, tireless::token_id t) {
      if (i != 0) return true;
      auto piece = stopper.push(t);
      std::fwrite(piece.text.data(), 1, piece.text.size(), stdout);
      std::fflush(stdout);
      return !piece.stopped;
    });
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const std::string rest = out[0].stopped ? std::string() : stopper.finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    const auto& s = runner.stats();
    if (!quiet) {
      std::fprintf(stderr, "[%s | prompt %lld tokens, %.1f tok/s | generated %zu tokens, %.1f tok/s]\n",
                   backend->describe().c_str(), static_cast<long long>(s.prefill_tokens),
                   s.prefill_tokens / std::max(s.prefill_seconds, 1e-9), out[0].tokens.size(),
                   s.decode_tokens / std::max(s.decode_seconds, 1e-9));
    }
    if (expert_shards > 0) {
      const std::vector<int64_t> counts = backend->expert_tokens();
      if (counts.empty()) {
        std::fprintf(stderr, "expert stats: %s is not a mixture of experts\n", model_path.c_str());
      } else {
        const int32_t n_expert = m->config().n_expert;
        const auto load = tireless::summarize_expert_load(counts, n_expert,
                                                          tireless::round_robin_placement(n_expert, expert_shards));
        std::fprintf(stderr, "expert stats: %lld token-expert pairs; max/mean per layer: experts %.2f (worst %.2f), "
                     "%d shards %.2f (worst %.2f); tokens per expert:", static_cast<long long>(load.routed),
                     load.expert_imbalance, load.expert_imbalance_worst, expert_shards, load.shard_imbalance,
                     load.shard_imbalance_worst);
        for (int64_t n : load.per_expert) std::fprintf(stderr, " %lld", static_cast<long long>(n));
        std::fputc('\n', stderr);
      }
    }
    if (exchange) {
      const tireless::expert_exchange_stats x = exchange->stats();
      const double tokens = static_cast<double>(std::max<int64_t>(x.tokens, 1));
      std::fprintf(stderr, "expert shards: %d (%d live, %d fenced); %lld layer calls; %.0f request + %.0f reply bytes per "
                   "token row on the wire; dispatch overhead %.1f us per layer call (shards computing: %.1f us); "
                   "%lld failures, %lld revivals, %lld replicas, last recovery %.1f ms; shard imbalance %.3f (max/mean per layer, "
                   "since the last of %lld rebalances); pairs per shard:", x.shards, x.live, x.fenced,
                   static_cast<long long>(x.calls), x.bytes_out / tokens, x.bytes_in / tokens,
                   1e6 * x.dispatch_seconds / std::max<int64_t>(x.calls, 1),
                   1e6 * x.shard_seconds / std::max<int64_t>(x.calls, 1), static_cast<long long>(x.failures),
                   static_cast<long long>(x.revivals), static_cast<long long>(x.replicas), 1e3 * x.last_recovery_seconds, x.shard_imbalance(),
                   static_cast<long long>(x.rebalances));
      for (int64_t n : x.per_shard_pairs) std::fprintf(stderr, " %lld", static_cast<long long>(n));
      std::fprintf(stderr, "\nexpert overlap: %s, %lld of %lld layer calls overlapped; over %.2f s: waiting for shards %.1f%%, "
                   "each shard idle", overlap ? "on" : "off", static_cast<long long>(x.overlapped_calls),
                   static_cast<long long>(x.calls), wall, 100.0 * x.wait_seconds / wall);
      for (double busy : x.per_shard_seconds) std::fprintf(stderr, " %.1f%%", 100.0 * (1.0 - busy / wall));
      std::fputc('\n', stderr);
    }
  } catch (const std::exception& e) {
    std::cerr << "tireless-generate: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
