#include "gpu/sim/sim_profile.hpp"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tireless::sim {

step_shape shape_of(const step_batch& batch) {
  step_shape s;
  for (const sequence_step& q : batch.seqs) {
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    const int64_t start = q.start_pos;
    if (n == 1) {
      ++s.decode_seqs;
      s.decode_context += start + 1;
    } else {
      s.prefill_tokens += n;
      s.prefill_context += n * start + n * (n + 1) / 2;  // Σ (start + i + 1), i < n
    }
  }
  return s;
}

double step_cost::seconds(const step_shape& s) const {
  if (s.prefill_tokens == 0 && s.decode_seqs == 0) return 0.0;
  return c0 + c_prefill * static_cast<double>(s.prefill_tokens) +
         c_decode * static_cast<double>(s.decode_seqs) +
         c_context * static_cast<double>(s.decode_context) +
         c_prefill_ctx.value_or(c_context) * static_cast<double>(s.prefill_context);
}

namespace {

double busiest_load(const expert_parallel& ep, const expert_condition& c) {
  const int32_t live = std::max(1, ep.degree - c.down);
  return std::max(1.0, c.imbalance) * static_cast<double>(ep.degree) / live;
}

}  // namespace

expert_condition condition_at(const std::vector<expert_event>& events, int32_t degree, double t) {
  expert_condition c;
  for (const expert_event& e : events) {
    if (t < e.at_s || (e.for_s > 0 && t >= e.at_s + e.for_s)) continue;
    c.down += e.down;
    c.imbalance = std::max(c.imbalance, e.imbalance);
  }
  c.down = std::min(c.down, std::max(0, degree - 1));
  return c;
}

double exchange_seconds(const sim_profile& p, const step_shape& s, const expert_condition& c) {
  const expert_parallel& ep = p.ep;
  const auto tokens = static_cast<double>(s.prefill_tokens + s.decode_seqs);
  if (!ep.on() || tokens == 0) return 0.0;
  // The busiest device takes in `load` times the mean; every token's state goes out to
  // remote_copies devices and comes back.
  const double bytes_per_layer =
      tokens * ep.remote_copies * ep.hidden * (ep.dispatch_bytes + ep.combine_bytes) * busiest_load(ep, c);
  return ep.moe_layers * (2 * ep.link_latency_s + bytes_per_layer / ep.link_bytes_per_s);
}

double step_seconds(const sim_profile& p, const step_shape& s, const expert_condition& c) {
  const double base = p.cost.seconds(s);
  const expert_parallel& ep = p.ep;
  if (!ep.on() || base == 0.0) return base;
  const double per_token = p.cost.c_prefill * static_cast<double>(s.prefill_tokens) +
                           p.cost.c_decode * static_cast<double>(s.decode_seqs);
  const double compute = base + ep.expert_share * per_token * (busiest_load(ep, c) - 1.0);
  const double exchange = exchange_seconds(p, s, c);
  return ep.overlap ? std::max(compute, exchange) : compute + exchange;
}

void validate(const sim_profile& p) {
  auto fail = [&](std::string_view what) {
    throw std::invalid_argument(fmt::format("sim profile '{}': {}", p.name, what));
  };
  const std::pair<const char*, double> costs[] = {
      {"c0", p.cost.c0},           {"c_prefill", p.cost.c_prefill}, {"c_decode", p.cost.c_decode},
      {"c_context", p.cost.c_context}, {"c_prefill_ctx", p.cost.c_prefill_ctx.value_or(0.0)}};
  for (auto [field, v] : costs) {
    if (!std::isfinite(v) || v < 0.0) fail(fmt::format("{} = {} must be a finite number of seconds >= 0", field, v));
  }
  if (p.kv.block_size <= 0) fail(fmt::format("kv block_size = {} must be positive", p.kv.block_size));
  if (p.kv.n_blocks <= 0) fail(fmt::format("kv n_blocks = {} must be positive", p.kv.n_blocks));
  if (p.kv.bytes_per_block <= 0) fail(fmt::format("kv bytes_per_block = {} must be positive", p.kv.bytes_per_block));
  if (p.limits.max_step_tokens <= 0) fail(fmt::format("max_step_tokens = {} must be positive", p.limits.max_step_tokens));
  if (p.limits.max_step_seqs <= 0) fail(fmt::format("max_step_seqs = {} must be positive", p.limits.max_step_seqs));
  if (p.limits.max_context <= 0) fail(fmt::format("max_context = {} must be positive", p.limits.max_context));
  if (p.n_vocab <= 0) fail(fmt::format("n_vocab = {} must be positive", p.n_vocab));
  if (p.ep.on()) {
    const expert_parallel& ep = p.ep;
    if (ep.moe_layers <= 0 || ep.hidden <= 0) fail("expert_parallel: moe_layers and hidden must be positive");
    const std::pair<const char*, double> ep_numbers[] = {
        {"remote_copies", ep.remote_copies},   {"dispatch_bytes", ep.dispatch_bytes},
        {"combine_bytes", ep.combine_bytes},   {"link_latency_s", ep.link_latency_s},
        {"expert_share", ep.expert_share}};
    for (auto [field, v] : ep_numbers) {
      if (!std::isfinite(v) || v < 0.0) fail(fmt::format("expert_parallel.{} = {} must be a finite number >= 0", field, v));
    }
    if (ep.remote_copies > ep.degree - 1) {
      fail(fmt::format("expert_parallel.remote_copies = {} is more than the {} other devices", ep.remote_copies, ep.degree - 1));
    }
    if (!(ep.link_bytes_per_s > 0) || !std::isfinite(ep.link_bytes_per_s)) {
      fail(fmt::format("expert_parallel.link_bytes_per_s = {} must be positive", ep.link_bytes_per_s));
    }
    if (ep.expert_share > 1.0) fail(fmt::format("expert_parallel.expert_share = {} must be at most 1", ep.expert_share));
  }
  if (p.first_sampled_token < 0 || p.first_sampled_token >= p.end_sampled_token || p.end_sampled_token > p.n_vocab) {
    fail(fmt::format("sampled tokens [{}, {}) must be a non-empty range inside the vocabulary [0, {})",
                     p.first_sampled_token, p.end_sampled_token, p.n_vocab));
  }
}

namespace {

// SmolLM2-135M-Instruct Q4_1 on this machine's CPU (2 cores, AVX-512) with the real cpu
// backend, 2 threads. Fitted on 2026-11-29 by
//   build-sim/bench/sim_calibrate --threads 2 --reps 7
// to the fastest of 7 repetitions of 45 steps (prefill chunks of 32..512 tokens at positions
// 0..4096, decode batches of 1..256 sequences at contexts 16..4096, mixed steps): relative
// error rms 6.2%, worst 19%. The machine was shared (load average 2-4 on 2 cores): one step's
// repetitions spread by 90% of their median and the fit to medians is 14-20% rms off. A second
// run right after gave every coefficient within 4% of these; a run an hour earlier, under
// heavier load, fitted coefficients 1.8 times these (bench/results/sim_calibrate.txt). One
// context coefficient for all query tokens fits to 19% rms only: a decode token's attention
// costs ~3x a prefill token's per position (prefill reuses each key for up to 64 queries).
sim_profile cpu_smollm2() {
  sim_profile p;
  p.name = "cpu-smollm2";
  p.cost.c0 = 4.67e-3;
  p.cost.c_prefill = 4.217e-4;
  p.cost.c_decode = 6.035e-4;
  p.cost.c_context = 1.913e-6;
  p.cost.c_prefill_ctx = 6.676e-7;
  // Paged fp16 KV as the cpu backend keeps it: 30 layers × 3 KV heads × 64 dims × (K, V) ×
  // 2 bytes = 23,040 bytes per token. 4096 blocks of 16 tokens: 65,536 tokens, 1.5 GB.
  p.kv = {16, 4096, 16 * 23'040};
  p.limits = {512, 256, 8192};  // the cpu backend's step defaults; the model's 8k context
  p.n_vocab = 49'152;
  p.first_sampled_token = 17;  // ids 0..16 are SmolLM2's control tokens (<|endoftext|>, <|im_end|>, ...)
  p.end_sampled_token = 49'152;
  return p;
}

// One H200 serving its share of a Kimi-K2-like MoE (1T total / 32B active parameters, MLA) in
// a Mooncake-style deployment with large expert parallelism. One GPU cannot hold the model;
// the profile is the cost of the steps one GPU runs there. Sources, as cited in
// shared/FIGURES.md (F) or taken from elsewhere (marked):
//   [F-K2]    "Kimi K2: about 1T total parameters, 32B activated per token, 384 routed experts
//             ... Multi-head Latent Attention" (Moonshot AI release; LMSYS/Mooncake blog).
//   [F-serve] "Served on 128 H200 (4 prefill nodes + 12 decode nodes ... 96 redundant experts)
//             ... roughly 7k prefill and 3k decode tokens/s per GPU" (LMSYS/Mooncake blog
//             2025-07-20).
//   [F-H200]  "H200: 141 GB HBM3e, 4.8 TB/s memory bandwidth (NVIDIA); roughly 790 TFLOP/s
//             of dense bf16 matrix work in practice."
//   [blog §4] the same blog's benchmark, not in FIGURES.md: 2000-token inputs, 100-token
//             outputs, decode batch size 480 (taken as per GPU, as the DeepSeek-R1 deployment
//             blog of the same team reports its decode batch of 256 per device).
//   [K2 cfg]  Kimi-K2-Instruct's config.json, not in FIGURES.md: 61 layers, 64 attention
//             heads, q/k head dims 128 (no rope) + 64 (rope), v head dim 128, KV latent 512 +
//             64 rope dims, vocabulary 163,840, 128k (131,072) context.
namespace k2 {
constexpr double peak_flops = 790e12;        // [F-H200]
constexpr double hbm_bytes_per_s = 4.8e12;   // [F-H200]
constexpr double active_flops = 2 * 32e9;    // per token, two FLOP per active parameter [F-K2]
// Prefill attention per (query, attended position): 61 layers × 64 heads × 2 FLOP ×
// (192 q·k + 128 p·v) = 2.498 MFLOP [K2 cfg].
constexpr double attention_flops = 61.0 * 64 * 2 * (192 + 128);
// Estimate of MLA's KV per token: 61 layers × (512 + 64) latent dims × 2 bytes (bf16) =
// 70,272 bytes, the "~70 KB per token" usually quoted for K2-like models [K2 cfg].
constexpr double kv_bytes_per_token = 61.0 * (512 + 64) * 2;

// c0 = 5 ms: one read per step of the weights a decode GPU holds, ≈ 24 GB at 4.8 TB/s: ≈ 13 GB
// of experts (1T parameters at one byte each, FP8 as K2 is released (assumption), over 96
// decode GPUs, +25% for 96 redundant experts on 384 [F-serve, F-K2]) and ≈ 11 GB of attention,
// dense and shared-expert weights every GPU replicates under data-parallel attention (32B
// active less 8 routed experts × 60 MoE layers × 3 × 7168 × 2048 ≈ 21B [K2 cfg]).
constexpr double c0 = 24e9 / hbm_bytes_per_s;

// Prefill is bound by matrix work. The measured 7k tokens/s [F-serve] on 2000-token prompts
// [blog §4], in steps of 8192 tokens, leaves per token 1/7000 − c0/8192 = 142.2 µs for
// 64 GFLOP of weights plus on average 1000.5 attended positions × 2.498 MFLOP = 66.50 GFLOP:
// 467.6 TFLOP/s, an efficiency of 59% of the 790 TFLOP/s peak. Both prefill coefficients use
// that efficiency: c_prefill = 64 GFLOP / 467.6 TFLOP/s = 136.9 µs per token, c_prefill_ctx =
// 2.498 MFLOP / 467.6 TFLOP/s = 5.34 ns per attended position.
constexpr double prefill_step_tokens = 8192;
constexpr double prompt_mean_context = (2000 + 1) / 2.0;
constexpr double prefill_token_seconds = 1.0 / 7000 - c0 / prefill_step_tokens;
constexpr double prefill_flops_per_s =
    (active_flops + prompt_mean_context * attention_flops) / prefill_token_seconds;

// Decode attention is bound by reading the KV cache once per decode token: c_context =
// 70,272 bytes / 4.8 TB/s = 14.64 ns per attended position [F-H200].
constexpr double c_context = kv_bytes_per_token / hbm_bytes_per_s;

// c_decode is what remains of a decode step at the measured operating point: 480 sequences
// per GPU [blog §4] at 3k tokens/s [F-serve] make a 160 ms step; their tokens attend on
// average 2000 + 50.5 positions, 480 × 2050.5 × 14.64 ns = 14.41 ms; so c_decode =
// (160 − 5 − 14.41) ms / 480 = 292.9 µs per sequence (its matrix work at small per-expert
// batches, the expert all-to-all, the LM head and sampling).
constexpr double decode_batch = 480;
constexpr double decode_step_seconds = decode_batch / 3000;
constexpr double decode_mean_context = 2000 + (1 + 100) / 2.0;
constexpr double c_decode =
    (decode_step_seconds - c0 - decode_batch * decode_mean_context * c_context) / decode_batch;

// KV budget: 141 GB [F-H200] less ≈ 24 GB of weights (above) and ≈ 17 GB of activations,
// CUDA graphs and expert-exchange buffers (assumption) leaves ≈ 100 GB: blocks of 64 tokens
// (FlashMLA's page size) of 70,272 bytes each token, 22,235 blocks, 1.42M tokens, which holds
// the operating point's 480 × 2100 = 1.01M tokens.
constexpr int32_t block_size = 64;
constexpr int64_t bytes_per_block = block_size * static_cast<int64_t>(kv_bytes_per_token);
constexpr int32_t n_blocks = static_cast<int32_t>(100e9 / bytes_per_block);

// Expert parallelism over the decode fleet: 96 devices (12 decode nodes × 8 [F-serve]) hold
// the 384 routed experts; 60 MoE layers (61 less the first, dense [K2 cfg]); token states of
// 7168 elements [K2 cfg] dispatched in FP8 and combined in BF16 (DeepEP's convention,
// assumption). A token's 8 experts [F-K2] fall on 12 × (1 − (11/12)^8) ≈ 6.0 of the 12 nodes,
// 5.5 of them remote, and a state crosses the network once per node (forwarded inside it):
// remote_copies = 5.5 (assumption: no node-limited routing). Each device has one 400 Gb/s
// link, 50 GB/s each way, and a dispatch or combine costs 20 µs beyond its bytes
// (assumptions). Routed experts are 21B of the 32B active parameters (above): expert_share =
// 0.656 of the per-token terms. At the operating points the exchange hides behind compute (two
// micro-batches, overlap): decode, 480 × 5.5 × 7168 × 3 B × 60 = 3.4 GB, 68 + 2.4 ms under the
// 160 ms step; prefill, 141.9 µs a token against 142.9, level with it. So the calibrated costs
// above hold as they are; a hot expert, a device down or a slower link shows through.
constexpr int32_t ep_degree = 96;
constexpr int32_t ep_moe_layers = 60;
constexpr int32_t ep_hidden = 7168;
constexpr double ep_remote_copies = 5.5;
constexpr double ep_link_bytes_per_s = 50e9;
constexpr double ep_link_latency_s = 20e-6;
constexpr double ep_expert_share = 21.0 / 32.0;
}  // namespace k2

sim_profile h200_k2() {
  sim_profile p;
  p.name = "h200-k2";
  p.cost.c0 = k2::c0;
  p.cost.c_prefill = k2::active_flops / k2::prefill_flops_per_s;
  p.cost.c_decode = k2::c_decode;
  p.cost.c_context = k2::c_context;
  p.cost.c_prefill_ctx = k2::attention_flops / k2::prefill_flops_per_s;
  p.ep.degree = k2::ep_degree;
  p.ep.moe_layers = k2::ep_moe_layers;
  p.ep.hidden = k2::ep_hidden;
  p.ep.remote_copies = k2::ep_remote_copies;
  p.ep.link_bytes_per_s = k2::ep_link_bytes_per_s;
  p.ep.link_latency_s = k2::ep_link_latency_s;
  p.ep.expert_share = k2::ep_expert_share;
  p.kv = {k2::block_size, k2::n_blocks, k2::bytes_per_block};
  // 8192 tokens per step (half the 16k per device the same team ran its prefill at), 512
  // sequences (above the operating point's 480), K2's 128k context [K2 cfg].
  p.limits = {8192, 512, 131'072};
  p.n_vocab = 163'840;  // [K2 cfg]
  // K2's tokenizer keeps its control tokens ([BOS], [EOS], <|im_end|>, ...) at 163,584 and
  // above; the first 256 ids are left out as well, to stay clear of byte pieces.
  p.first_sampled_token = 256;
  p.end_sampled_token = 163'584;
  return p;
}

}  // namespace

// No cost at all: every step takes no time, for measuring what surrounds the model (the
// runtime's and the RPC layer's own overhead). The geometry of cpu-smollm2.
sim_profile zero() {
  sim_profile p = cpu_smollm2();
  p.name = "zero";
  p.cost = step_cost{};
  return p;
}

std::vector<std::string> profile_names() { return {"cpu-smollm2", "h200-k2", "zero"}; }

sim_profile named_profile(std::string_view name) {
  if (name == "cpu-smollm2") return cpu_smollm2();
  if (name == "h200-k2") return h200_k2();
  if (name == "zero") return zero();
  throw std::invalid_argument(fmt::format("unknown sim profile '{}'; the known profiles are: {}", name,
                                          fmt::join(profile_names(), ", ")));
}

}  // namespace tireless::sim
