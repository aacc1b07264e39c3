// cuda_decode: the CUDA backend end to end on a real model (SmolLM2 by default): prefill
// tokens/s, decode tokens/s at batch 1 and aggregate at larger batches, and batch-1 decode's
// bytes read per second (weights + KV) against the device's peak. SmolLM2 (98 MB, 30 layers of
// 576) is far too small to be bound by memory on a GPU: each decode step is ~300 kernels of a
// few microseconds. So the bar's measure, batch-1 decode at >= 60% of HBM bandwidth, is taken on
// the same decode product chain at Llama-3-8B's shapes (32 layers, 4096 wide, FFN 14336, GQA
// 8 KV heads; q4_0: 3.9 GB of weights a token), replayed from a CUDA graph as the backend's
// decode steps are: norm + 8-bit quantization, QKV, output, gate|up, SwiGLU, down (attention
// left out: at short contexts it reads little).
//
//   build/bench/cuda_decode [--model PATH] [--batches 1,32,256] [--prompt 128] [--tokens 128]
//                           [--peak-gbs 4800] [--chain-layers 32]
//
// Exit 77 where no CUDA device is present.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gpu/cuda/cuda_backend.hpp"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/weight_layout.hpp"
#include "gpu/sequence_runner.hpp"
#include "model/model.hpp"

namespace {

using namespace tireless;
using clk = std::chrono::steady_clock;

double seconds_since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

std::vector<token_id> prompt_of(int n, int salt, int32_t n_vocab) {
  std::vector<token_id> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = static_cast<token_id>(1000 + (i * 7919 + salt * 104729) % (n_vocab - 1000));
  return p;
}

// Bytes one decode step reads from the weights: every matrix of the layers and the LM head.
int64_t decode_weight_bytes(const model& m) {
  int64_t bytes = 0;
  const model_tensors& t = m.tensors();
  for (const layer_tensors& l : t.layers) {
    for (const gguf_tensor* x : {l.wq, l.wk, l.wv, l.wo, l.ffn_gate, l.ffn_up, l.ffn_down, l.ffn_gate_inp, l.ffn_gate_exps,
                                 l.ffn_up_exps, l.ffn_down_exps, l.attn_norm, l.ffn_norm}) {
      if (x) bytes += static_cast<int64_t>(x->n_bytes);
    }
  }
  bytes += static_cast<int64_t>((m.config().tied_embeddings ? t.token_embd : t.output)->n_bytes);
  return bytes;
}

void model_runs(const std::string& path, const std::vector<int>& batches, int prompt, int tokens, double peak) {
  const auto m = model::load(path);
  const model_config& c = m->config();
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  cuda::cuda_backend_options o;
  o.max_context = prompt + tokens;
  o.max_step_seqs = max_batch;
  o.max_step_tokens = std::max(2048, max_batch);
  o.kv_blocks = max_batch * ((o.max_context + o.block_size - 1) / o.block_size);
  auto be = cuda::make_cuda_backend(m, o);
  std::printf("%s: %s\n", c.name.c_str(), be->describe().c_str());
  const int64_t weights = decode_weight_bytes(*m);
  const double kv_token = double(c.n_layer) * c.kv_dim() * 2 * 2;
  std::printf("prompts of %d tokens, %d generated each, greedy; prefill in steps of %d tokens\n", prompt, tokens,
              o.max_step_tokens);
  std::printf("%6s %14s %14s %12s %12s %10s\n", "batch", "prefill tok/s", "decode tok/s", "ms/decode", "GB/s (b=1)",
              "of peak");
  for (int b : batches) {
    std::vector<generation_request> reqs;
    for (int i = 0; i < b; ++i) {
      generation_request r;
      r.prompt = prompt_of(prompt, i, c.n_vocab);
      r.max_tokens = tokens;
      reqs.push_back(std::move(r));
    }
    sequence_runner(*be).run(reqs);  // warm: graphs captured for every bucket this batch meets
    sequence_runner runner(*be);
    runner.run(reqs);
    const runner_stats& s = runner.stats();
    const double decode_steps = static_cast<double>(s.decode_tokens) / b;
    const double step = s.decode_seconds / decode_steps;
    std::string gbs = "", share = "";
    if (b == 1) {
      // Each step reads every weight once and the KV of the positions so far (on average half
      // the context past the prompt).
      const double kv = kv_token * (prompt + tokens / 2.0);
      const double rate = (static_cast<double>(weights) + kv) / step / 1e9;
      gbs = fmt::format("{:.0f}", rate);
      share = fmt::format("{:.1f}%", 100.0 * rate / peak);
    }
    std::printf("%6d %14.0f %14.0f %12.3f %12s %10s\n", b, s.prefill_tokens / s.prefill_seconds,
                s.decode_tokens / s.decode_seconds, 1e3 * step, gbs.c_str(), share.c_str());
  }
}

// One decode token through `layers` layers of Llama-3-8B's products, batch 1, q4_0 weights.
void chain_run(int layers, double peak, int iters) {
  const int64_t e = 4096, ff = 14336, qkv = 4096 + 2 * 1024;
  std::mt19937 g(5);
  struct weight {
    cuda::device_buffer mem;
    cuda::device_matrix m;
  };
  int64_t bytes = 0;
  const auto make = [&](int64_t rows, int64_t cols) {
    const cuda::matrix_layout l = cuda::layout_of(tensor_type::q4_0, rows, cols);
    std::vector<uint64_t> words((l.bytes + 7) / 8);
    uint64_t state = g() | 1;
    for (uint64_t& v : words) {  // xorshift: 3.9 GB of quants in about a second
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      v = state;
    }
    auto* host = reinterpret_cast<uint8_t*>(words.data());
    for (size_t i = l.d_offset; i + 1 < l.bytes; i += 2) host[i + 1] = 0x14;  // scales ~2^-10: finite sums
    weight w{cuda::device_buffer(l.bytes), {}};
    w.mem.upload(host, l.bytes);
    w.m = cuda::view_of(l, w.mem.data());
    bytes += static_cast<int64_t>(row_bytes(tensor_type::q4_0, cols)) * rows;
    return w;
  };
  std::vector<weight> w;
  for (int l = 0; l < layers; ++l) {
    w.push_back(make(qkv, e));
    w.push_back(make(e, e));
    w.push_back(make(2 * ff, e));
    w.push_back(make(e, ff));
  }
  std::vector<float> ones(static_cast<size_t>(ff), 1.0f), x0(static_cast<size_t>(e));
  for (float& v : x0) v = std::uniform_real_distribution<float>(-1, 1)(g);
  cuda::device_buffer norm(ones.size() * 4), x(e * 4), h(e * 4), qkv_out(qkv * 4), gu(2 * ff * 4), act(ff * 4),
      q(ff), d(ff / 32 * 4), s(ff / 32 * 4);
  norm.upload(ones.data(), norm.size());
  x.upload(x0.data(), x.size());
  const auto q8 = [&](int64_t cols) { return cuda::q8_rows{q.as<int8_t>(), d.as<float>(), s.as<float>(), cols / 32}; };
  cuda::stream st;
  void* sh = st.handle();
  const cuda::product_scratch none{};
  const auto token = [&] {
    for (int l = 0; l < layers; ++l) {
      const auto hq = q8(e), fq = q8(ff);
      cuda::rms_norm(x.as<float>(), norm.as<float>(), h.as<float>(), 1, static_cast<int32_t>(e), 1e-5f, sh, &hq);
      cuda::matmul(w[4 * l].m, h.as<float>(), e, &hq, 1, qkv_out.as<float>(), qkv, false, none, sh);
      cuda::quantize_q8(qkv_out.as<float>(), qkv, 1, e, nullptr, hq, sh);  // stands for the attention output
      cuda::matmul(w[4 * l + 1].m, qkv_out.as<float>(), e, &hq, 1, x.as<float>(), e, true, none, sh);
      cuda::rms_norm(x.as<float>(), norm.as<float>(), h.as<float>(), 1, static_cast<int32_t>(e), 1e-5f, sh, &hq);
      cuda::matmul(w[4 * l + 2].m, h.as<float>(), e, &hq, 1, gu.as<float>(), 2 * ff, false, none, sh);
      cuda::silu_mul(gu.as<float>(), gu.as<float>() + ff, 2 * ff, 1, ff, act.as<float>(), &fq, sh);
      cuda::matmul(w[4 * l + 3].m, act.as<float>(), ff, &fq, 1, x.as<float>(), e, true, none, sh);
    }
  };
  token();  // as launched once (lazy set-up), then captured
  st.synchronize();
  cuda::graph graph;
  graph.begin_capture(sh);
  token();
  graph.end_capture(sh);
  graph.launch(sh);
  st.synchronize();
  const auto t0 = clk::now();
  for (int i = 0; i < iters; ++i) graph.launch(sh);
  st.synchronize();
  const double per_token = seconds_since(t0) / iters;
  const double gbs = static_cast<double>(bytes) / per_token / 1e9;
  std::printf("\nbatch-1 decode product chain at Llama-3-8B's shapes (%d layers, q4_0, %.2f GB of weights a token, "
              "CUDA graph):\n  %.3f ms/token, %.0f tok/s, %.0f GB/s = %.1f%% of %.0f GB/s\n",
              layers, bytes / 1e9, 1e3 * per_token, 1.0 / per_token, gbs, 100.0 * gbs / peak, peak);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tireless: the CUDA backend's decode and prefill speed, and batch-1 decode's memory bandwidth"};
  std::string model_path =
      std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::vector<int> batches{1, 32, 256};
  int prompt = 128, tokens = 128, layers = 32, iters = 50;
  double peak = 4800;
  app.add_option("--model", model_path)->capture_default_str();
  app.add_option("--batches", batches, "sequences decoded at once")->delimiter(',');
  app.add_option("--prompt", prompt)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--tokens", tokens, "generated per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--peak-gbs", peak, "the device's memory bandwidth, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--chain-layers", layers, "layers of the 8B-shaped product chain; 0: skip it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chain-iters", iters)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!cuda::cuda_available(&why)) {
    std::printf("cuda_decode: skipped: %s\n", why.c_str());
    return 77;
  }
  try {
    model_runs(model_path, batches, prompt, tokens, peak);
    if (layers > 0) chain_run(layers, peak, iters);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
