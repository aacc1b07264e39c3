// cuda_decode: the CUDA backend end to end. Three measures:
//   1. a real model (SmolLM2 by default; skipped when its file is absent): prefill tokens/s,
//      decode tokens/s at batch 1 and aggregate at larger batches, batch-1 decode's bytes read
//      per second (weights + KV) against the device's peak. SmolLM2 (98 MB, 30 layers of 576) is
//      far too small to be bound by memory on a GPU: a decode step is ~300 kernels of a few
//      microseconds.
//   2. the decode product chain alone at Llama-3-8B's shapes (norm + 8-bit quantization, QKV,
//      output, gate|up, SwiGLU, down: 8 kernels a layer, replayed from a CUDA graph), labelled
//      as such: no RoPE/KV writes, no attention, no split combine, no LM head.
//   3. the bar's measure: batch-1 decode through cuda_backend::execute, the whole forward (the
//      step's upload, embedding, every layer's kernels, final norm, LM head, argmax, the token's
//      download; decode steps replayed from CUDA graphs), on a synthetic Llama-3-8B-shaped model
//      in q4_0 (32 layers, 4096 wide, FFN 14336, GQA 8 KV heads, vocabulary 128,256: 4.2 GB of
//      weights read a token, LM head included; a 4.5 GB file with the embedding table) written
//      to a temporary GGUF file and removed once loaded; a short context (a 64-token prompt, 128
//      generated). Achieved bandwidth = weight bytes read per token / time per token.
//
//   build/bench/cuda_decode [--model PATH] [--batches 1,32,256] [--prompt 128] [--tokens 128]
//                           [--peak-gbs 4800] [--chain-layers 32] [--synthetic-layers 32]
//                           [--synthetic-dir DIR]
//
// Exit 77 where no CUDA device is present.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
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
  if (!std::filesystem::exists(path)) {
    std::printf("%s is absent (scripts/fetch-model): the real-model runs are skipped\n", path.c_str());
    return;
  }
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

// ---- a synthetic Llama-3-8B-shaped model, written as a GGUF file -------------------------------

// GGUF (version 3) written as a stream: the header, metadata and tensor infos, then each
// tensor's bytes from a generator, 32-byte aligned.
class gguf_stream {
 public:
  enum : uint32_t { u32 = 4, i32 = 5, f32 = 6, string = 8, array = 9 };
  struct tensor {
    std::string name;
    std::vector<uint64_t> dims;  // GGUF order: row width first
    tensor_type type;
    uint64_t bytes = 0;
  };

  void meta_u32(const std::string& key, uint32_t v) { key_of(key, u32), put(v); }
  void meta_f32(const std::string& key, float v) { key_of(key, f32), put(v); }
  void meta_string(const std::string& key, const std::string& v) { key_of(key, string), put_string(v); }
  void meta_strings(const std::string& key, const std::vector<std::string>& v) {
    key_of(key, array), put(uint32_t{string}), put(uint64_t{v.size()});
    for (const std::string& x : v) put_string(x);
  }
  void meta_i32s(const std::string& key, const std::vector<int32_t>& v) {
    key_of(key, array), put(uint32_t{i32}), put(uint64_t{v.size()});
    for (int32_t x : v) put(x);
  }
  void add(tensor t) { tensors_.push_back(std::move(t)); }

  // fill(t, out) writes tensor t's bytes (its GGUF blocks) into out.
  template <class Fill>
  void write(const std::filesystem::path& path, Fill fill) {
    std::vector<uint8_t> head;
    std::swap(head, out_);
    put_bytes("GGUF", 4);
    put(uint32_t{3});
    put(uint64_t{tensors_.size()});
    put(uint64_t{keys_});
    out_.insert(out_.end(), head.begin(), head.end());
    uint64_t offset = 0;
    for (const tensor& t : tensors_) {
      put_string(t.name);
      put(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put(d);
      put(static_cast<uint32_t>(t.type));
      put(offset);
      offset = (offset + t.bytes + 31) / 32 * 32;
    }
    out_.resize((out_.size() + 31) / 32 * 32, 0);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(out_.data()), static_cast<std::streamsize>(out_.size()));
    std::vector<uint8_t> data;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      data.assign((tensors_[i].bytes + 31) / 32 * 32, 0);
      fill(tensors_[i], data.data());
      f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    }
    if (!f) throw std::runtime_error("could not write " + path.string());
  }

 private:
  void key_of(const std::string& key, uint32_t type) {
    put_string(key);
    put(type);
    ++keys_;
  }
  template <class T>
  void put(T v) {
    put_bytes(&v, sizeof v);
  }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void put_string(const std::string& s) {
    put(uint64_t{s.size()});
    put_bytes(s.data(), s.size());
  }
  std::vector<uint8_t> out_;
  uint64_t keys_ = 0;
  std::vector<tensor> tensors_;
};

// Llama-3-8B's shapes with `layers` layers, every matrix (LM head too) in q4_0 with random
// quants and scales of 2^-10 (finite sums all the way), norms of ones; a ChatML vocabulary of
// 128,256 made-up tokens (the bench feeds token ids, the tokenizer is never used).
void write_synthetic_llama(const std::filesystem::path& path, int layers) {
  const uint64_t e = 4096, ff = 14336, kv = 1024, vocab = 128256;
  gguf_stream g;
  g.meta_string("general.architecture", "llama");
  g.meta_string("general.name", "synthetic Llama-3-8B shapes (q4_0)");
  g.meta_u32("llama.embedding_length", static_cast<uint32_t>(e));
  g.meta_u32("llama.block_count", static_cast<uint32_t>(layers));
  g.meta_u32("llama.attention.head_count", 32);
  g.meta_u32("llama.attention.head_count_kv", 8);
  g.meta_u32("llama.feed_forward_length", static_cast<uint32_t>(ff));
  g.meta_u32("llama.context_length", 8192);
  g.meta_f32("llama.rope.freq_base", 500000.0f);
  g.meta_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  std::vector<std::string> tokens{"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  std::vector<int32_t> types{3, 3, 3};
  for (uint64_t i = tokens.size(); i < vocab; ++i) tokens.push_back("t" + std::to_string(i)), types.push_back(1);
  g.meta_string("tokenizer.ggml.model", "gpt2");
  g.meta_strings("tokenizer.ggml.tokens", tokens);
  g.meta_i32s("tokenizer.ggml.token_type", types);
  g.meta_strings("tokenizer.ggml.merges", {});
  g.meta_string("tokenizer.chat_template",
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}");
  const auto q4 = [](std::string name, uint64_t cols, uint64_t rows) {
    return gguf_stream::tensor{std::move(name), {cols, rows}, tensor_type::q4_0, rows * cols / 32 * 18};
  };
  const auto norm = [](std::string name, uint64_t n) {
    return gguf_stream::tensor{std::move(name), {n}, tensor_type::f32, n * 4};
  };
  g.add(q4("token_embd.weight", e, vocab));
  g.add(norm("output_norm.weight", e));
  g.add(q4("output.weight", e, vocab));
  for (int l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    g.add(norm(p + "attn_norm.weight", e));
    g.add(q4(p + "attn_q.weight", e, e));
    g.add(q4(p + "attn_k.weight", e, kv));
    g.add(q4(p + "attn_v.weight", e, kv));
    g.add(q4(p + "attn_output.weight", e, e));
    g.add(norm(p + "ffn_norm.weight", e));
    g.add(q4(p + "ffn_gate.weight", e, ff));
    g.add(q4(p + "ffn_up.weight", e, ff));
    g.add(q4(p + "ffn_down.weight", ff, e));
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  g.write(path, [&](const gguf_stream::tensor& t, uint8_t* out) {
    if (t.type == tensor_type::f32) {  // a norm
      const float one = 1.0f;
      for (uint64_t i = 0; i + 4 <= t.bytes; i += 4) std::memcpy(out + i, &one, 4);
      return;
    }
    for (uint64_t b = 0; b < t.bytes; b += 18) {  // q4_0 blocks: fp16 d, then 16 bytes of quants
      out[b] = 0x00, out[b + 1] = 0x14;       // d = 2^-10
      for (int k = 0; k < 16; k += 8) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        std::memcpy(out + b + 2 + k, &state, 8);
      }
    }
  });
}

// Batch-1 decode through the backend's execute on the synthetic 8B-shaped model.
void synthetic_run(const std::filesystem::path& dir, int layers, int prompt, int tokens, double peak) {
  const std::filesystem::path path = dir / "tireless-cuda-decode-synthetic-8b.gguf";
  const auto t0 = clk::now();
  write_synthetic_llama(path, layers);
  const double write_s = seconds_since(t0);
  std::shared_ptr<const model> m;
  try {
    m = model::load(path);
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
  cuda::cuda_backend_options o;
  o.max_context = prompt + tokens;
  o.max_step_seqs = 1;
  o.max_step_tokens = prompt;
  o.kv_blocks = (o.max_context + o.block_size - 1) / o.block_size;
  std::unique_ptr<backend> be;
  try {
    be = cuda::make_cuda_backend(m, o);
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
  std::filesystem::remove(path);  // uploaded; the mapping goes with the model
  const int64_t weights = decode_weight_bytes(*m);
  std::printf("\n%s: %s (file written in %.1f s)\n", m->config().name.c_str(), be->describe().c_str(), write_s);
  generation_request r;
  r.prompt = prompt_of(prompt, 0, m->config().n_vocab);
  r.max_tokens = tokens;
  sequence_runner(*be).run({r});  // warm: the 1-sequence graph captured
  sequence_runner runner(*be);
  runner.run({r});
  const runner_stats& s = runner.stats();
  const double step = s.decode_seconds / static_cast<double>(s.decode_tokens);
  const double gbs = static_cast<double>(weights) / step / 1e9;
  std::printf("batch-1 decode, the whole forward through cuda_backend::execute (%d layers, q4_0, %.2f GB of weights a "
              "token with the LM head; prompt %d, %d generated, CUDA graphs):\n  %.3f ms/token, %.0f tok/s, %.0f GB/s "
              "= %.1f%% of %.0f GB/s\n",
              layers, weights / 1e9, prompt, tokens, 1e3 * step, 1.0 / step, gbs, 100.0 * gbs / peak, peak);
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
  // Labelled apart from the whole forward's line (synthetic_run), which scripts/gpu-check reads.
  std::printf("\nthe product chain alone at Llama-3-8B's shapes (%d layers, q4_0, %.2f GB of weights a token; 8 kernels "
              "a layer: no RoPE/KV writes, attention, combine or LM head; CUDA graph):\n  %.3f ms/token, %.0f tok/s, "
              "%.0f GB/s, %.1f%% of %.0f GB/s\n",
              layers, bytes / 1e9, 1e3 * per_token, 1.0 / per_token, gbs, 100.0 * gbs / peak, peak);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tireless: the CUDA backend's decode and prefill speed, and batch-1 decode's memory bandwidth"};
  std::string model_path =
      std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::vector<int> batches{1, 32, 256};
  int prompt = 128, tokens = 128, layers = 32, iters = 50, synthetic_layers = 32;
  std::string synthetic_dir = std::filesystem::temp_directory_path().string();
  double peak = 4800;
  app.add_option("--model", model_path)->capture_default_str();
  app.add_option("--batches", batches, "sequences decoded at once")->delimiter(',');
  app.add_option("--prompt", prompt)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--tokens", tokens, "generated per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--peak-gbs", peak, "the device's memory bandwidth, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--chain-layers", layers, "layers of the 8B-shaped product chain; 0: skip it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chain-iters", iters)->check(CLI::PositiveNumber);
  app.add_option("--synthetic-layers", synthetic_layers,
                 "layers of the synthetic 8B-shaped model run through the backend (a 4.5 GB file at 32); 0: skip it")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--synthetic-dir", synthetic_dir, "where its temporary GGUF file goes")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!cuda::cuda_available(&why)) {
    std::printf("cuda_decode: skipped: %s\n", why.c_str());
    return 77;
  }
  try {
    model_runs(model_path, batches, prompt, tokens, peak);
    if (layers > 0) chain_run(layers, peak, iters);
    if (synthetic_layers > 0) synthetic_run(synthetic_dir, synthetic_layers, 64, 128, peak);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
