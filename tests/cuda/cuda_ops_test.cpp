// Every CUDA kernel against the CPU backend's result on the same inputs, with the tolerance its
// type needs (ggml's way: the normalized mean squared error of an op's output). Where the GPU
// computes what the CPU computes in the CPU's order (8-bit activations, the embedding, the KV
// writes) the comparison is exact. Skipped (GTEST_SKIP) where no CUDA device is present; not
// built without nvcc. Weights go up in their GGUF bytes, so a layout mistake (nibble order,
// scale offsets, the KV pool's order) shows as a large error, not a small one.
#if TIRELESS_HAVE_CUDA_KERNELS

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/packed_matrix.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "gpu/cuda/cuda_plan.hpp"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/weight_layout.hpp"
#include "model/sampler.hpp"
#include "tests/gpu/ggml_blocks.hpp"

namespace tireless::cuda {
namespace {

#define REQUIRE_DEVICE()                              \
  do {                                                \
    std::string why;                                  \
    if (!device_available(&why)) GTEST_SKIP() << why; \
  } while (0)

using test::random_floats;

template <class T>
device_buffer to_device(const std::vector<T>& v) {
  device_buffer b(std::max<size_t>(v.size() * sizeof(T), 1));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> from_device(const void* p, size_t n) {
  std::vector<T> v(n);
  copy_to_host(v.data(), p, n * sizeof(T));
  return v;
}

// Σ(a - b)² / Σ b²: ggml's measure of an op's error.
double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

// A weight matrix in its GGUF bytes, on the CPU (packed) and on the device (repacked).
struct matrix {
  tensor_type type;
  int64_t rows, cols;
  std::vector<std::byte> file;
  cpu::packed_matrix cpu;
  device_buffer memory;
  device_matrix dev;

  matrix(tensor_type t, int64_t r, int64_t c, uint32_t seed, float scale = 0.05f) : type(t), rows(r), cols(c) {
    const auto values = random_floats(static_cast<size_t>(r * c), seed, scale);
    for (int64_t i = 0; i < r; ++i) {
      const auto q = test::quantize(t, std::vector<float>(values.begin() + i * c, values.begin() + (i + 1) * c));
      file.insert(file.end(), q.begin(), q.end());
    }
    cpu = cpu::packed_matrix::pack(t, file.data(), r, c);
    const matrix_layout l = layout_of(t, r, c);
    std::vector<std::byte> host(l.bytes);
    repack_rows(l, file.data(), r, 0, host.data());
    memory = to_device(host);
    dev = view_of(l, memory.data());
  }
};

// The CPU backend's product: x quantized to 8 bits for quantized weights, its best kernels.
std::vector<float> cpu_product(const cpu::packed_matrix& w, const std::vector<float>& x, int64_t n) {
  static cpu::thread_pool pool(1);
  const cpu::isa_kernels& k = cpu::best_kernels();
  std::vector<float> y(static_cast<size_t>(n * w.rows()));
  cpu::q8_buffer q8(n, w.cols());
  cpu::q8_view xq;
  if (w.quantized()) xq = q8.quantize(pool, k, x.data(), n, w.cols(), w.cols());
  cpu::matmul(pool, k, w, x.data(), w.cols(), w.quantized() ? &xq : nullptr, n, y.data(), w.rows());
  return y;
}

// Room for n rows of quantized activations of `cols` values.
struct q8_device {
  device_buffer q, d, s;
  q8_rows rows;
  q8_device(int64_t n, int64_t cols) : q(n * cols), d(n * cols / 32 * 4), s(n * cols / 32 * 4) {
    rows = {q.as<int8_t>(), d.as<float>(), s.as<float>(), cols / 32};
  }
};

// The error each type's product may have against the CPU's. f16 and bf16 weights past the
// matvec go through cuBLAS with the activations rounded to the weights' type; the CPU keeps
// them in f32. Everything else computes the CPU's sums, perhaps in another order.
double tolerance(tensor_type t) {
  switch (t) {
    case tensor_type::f16: return 2e-6;
    case tensor_type::bf16: return 5e-5;
    default: return 1e-10;
  }
}

TEST(cuda_ops, activations_quantize_to_the_cpus_bits) {
  REQUIRE_DEVICE();
  const int64_t rows = 7, cols = 576, blocks = cols / 32;
  auto x = random_floats(rows * cols, 1, 3.0f);
  x[5] = 0.0f;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block: d = 0, q = 0
  x[200] = 127.5f;                                  // a block whose max is exactly hit
  const std::vector<int32_t> order{6, 0, 3, 3, 1, 2, 5};  // rows gathered, one twice
  auto dx = to_device(x), dorder = to_device(order);
  q8_device q(rows, cols);
  quantize_q8(dx.as<float>(), cols, rows, cols, dorder.as<int32_t>(), q.rows);
  synchronize();
  const auto gq = from_device<int8_t>(q.q.data(), rows * cols);
  const auto gd = from_device<float>(q.d.data(), rows * blocks), gs = from_device<float>(q.s.data(), rows * blocks);
  std::vector<float> gathered;
  for (int32_t r : order) gathered.insert(gathered.end(), x.begin() + r * cols, x.begin() + (r + 1) * cols);
  std::vector<int8_t> cq(rows * cols);
  std::vector<float> cd(rows * blocks), cs(rows * blocks);
  std::vector<int32_t> csum(rows * blocks);
  cpu::best_kernels().quantize_rows(gathered.data(), rows, cols, cols, cq.data(), cd.data(), cs.data(), csum.data(), blocks);
  EXPECT_EQ(gq, cq);
  EXPECT_EQ(std::memcmp(gd.data(), cd.data(), cd.size() * 4), 0);
  EXPECT_EQ(std::memcmp(gs.data(), cs.data(), cs.size() * 4), 0);
}

TEST(cuda_ops, rms_norm_matches_the_cpu_and_quantizes_its_own_output) {
  REQUIRE_DEVICE();
  // 4096 values: more than a block's 1024 threads; eps 1e-2: a kernel that dropped it would be
  // off by far more than the tolerance.
  for (const int n : {576, 4096}) {
    const int rows = 5;
    const float eps = 1e-2f;
    const auto x = random_floats(rows * n, 1), w = random_floats(n, 2);
    const std::vector<int32_t> order{4, 0, 2, 2, 1};
    auto dx = to_device(x), dw = to_device(w), dorder = to_device(order);
    device_buffer out(x.size() * 4);
    q8_device q(rows, n);
    rms_norm(dx.as<float>(), dw.as<float>(), out.as<float>(), rows, n, eps, nullptr, &q.rows, dorder.as<int32_t>());
    synchronize();
    const auto got = from_device<float>(out.data(), x.size());
    std::vector<float> want(x.size());
    for (int r = 0; r < rows; ++r) cpu::best_kernels().rms_norm(&x[order[r] * n], w.data(), &want[r * n], n, eps);
    EXPECT_LT(nmse(got, want), 1e-12) << n;
    // Its 8-bit copy is its own values quantized as the CPU quantizes them.
    std::vector<int8_t> cq(rows * n);
    std::vector<float> cd(rows * n / 32), cs(rows * n / 32);
    std::vector<int32_t> csum(rows * n / 32);
    cpu::best_kernels().quantize_rows(got.data(), rows, n, n, cq.data(), cd.data(), cs.data(), csum.data(), n / 32);
    EXPECT_EQ(from_device<int8_t>(q.q.data(), rows * n), cq);
  }
}

TEST(cuda_ops, silu_mul_reads_gate_and_up_side_by_side) {
  REQUIRE_DEVICE();
  const int rows = 3, ff = 1536;
  const auto gu = random_floats(rows * 2 * ff, 3, 4.0f);
  auto dgu = to_device(gu);
  device_buffer out(rows * ff * 4);
  q8_device q(rows, ff);
  silu_mul(dgu.as<float>(), dgu.as<float>() + ff, 2 * ff, rows, ff, out.as<float>(), &q.rows);
  synchronize();
  const auto got = from_device<float>(out.data(), rows * ff);
  std::vector<float> want(rows * ff);
  for (int r = 0; r < rows; ++r) cpu::best_kernels().silu_mul(&gu[r * 2 * ff], &gu[r * 2 * ff + ff], &want[r * ff], ff);
  EXPECT_LT(nmse(got, want), 1e-12);
}

TEST(cuda_ops, rope_turns_adjacent_pairs_as_the_cpu_does) {
  REQUIRE_DEVICE();
  const int rows = 3, heads = 9, hd = 64, ld = heads * hd + 8;  // rows wider than their heads
  const std::vector<int32_t> pos{0, 17, 4095};
  for (const int rope_dims : {64, 32}) {  // 32: a partial rotary, the rest of each head untouched
    auto x = random_floats(rows * ld, 5);
    auto dx = to_device(x), dp = to_device(pos);
    rope(dx.as<float>(), ld, rows, heads, hd, rope_dims, dp.as<int32_t>(), 100000.0f);
    synchronize();
    const auto got = from_device<float>(dx.data(), x.size());
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        const float* v = &x[r * ld + h * hd];
        const float* g = &got[r * ld + h * hd];
        for (int i = 0; i < rope_dims / 2; ++i) {
          const double theta = pos[r] * std::pow(100000.0, -2.0 * i / rope_dims);
          const float c = float(std::cos(theta)), s = float(std::sin(theta));
          EXPECT_NEAR(g[2 * i], v[2 * i] * c - v[2 * i + 1] * s, 1e-6);
          EXPECT_NEAR(g[2 * i + 1], v[2 * i] * s + v[2 * i + 1] * c, 1e-6);
        }
        for (int j = rope_dims; j < hd; ++j) EXPECT_EQ(g[j], v[j]) << rope_dims << " " << j;
      }
      for (int j = heads * hd; j < ld; ++j) EXPECT_EQ(got[r * ld + j], x[r * ld + j]);
    }
  }
}

class cuda_typed : public ::testing::TestWithParam<tensor_type> {};

TEST_P(cuda_typed, embedding_rows_are_the_cpus_dequantized_rows_bit_for_bit) {
  REQUIRE_DEVICE();
  const matrix table(GetParam(), 40, 576, 6, 1.0f);
  const std::vector<int32_t> ids{0, 39, 7, 7, 40};  // 40: outside the table
  auto di = to_device(ids);
  device_buffer out(ids.size() * 576 * 4);
  embed_rows(table.dev, di.as<int32_t>(), static_cast<int32_t>(ids.size()), out.as<float>());
  synchronize();
  const auto got = from_device<float>(out.data(), ids.size() * 576);
  std::vector<float> want(576);
  for (size_t k = 0; k + 1 < ids.size(); ++k) {
    table.cpu.dequantize_row(ids[k], want.data());
    EXPECT_EQ(std::memcmp(&got[k * 576], want.data(), 576 * 4), 0) << name(GetParam()) << " row " << ids[k];
  }
  EXPECT_TRUE(std::isnan(got[4 * 576])) << "an id outside the table reads nothing";
}

TEST_P(cuda_typed, products_match_the_cpu_backend_for_decode_and_prefill_sizes) {
  REQUIRE_DEVICE();
  const tensor_type t = GetParam();
  // Rows not a multiple of a warp's 2 or a tile's 64; SmolLM2's widths, and a 14,336-wide FFN
  // (activations past 48 KiB of shared memory in the matvec).
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1003, 576}, {77, 1536}, {37, 14336}}) {
    const matrix w(t, rows, cols, 7);
    static blas handle(nullptr);
    for (const int32_t n : {1, 2, 5, 8, 9, 33, 130}) {
      if (cols == 14336 && n > 9) continue;
      const auto x = random_floats(static_cast<size_t>(n * cols), 8 + n);
      auto dx = to_device(x);
      q8_device q(n, cols);
      if (is_quantized(t)) quantize_q8(dx.as<float>(), cols, n, cols, nullptr, q.rows);
      device_buffer halves(static_cast<size_t>(n * cols * 2));
      const product_scratch scratch{&handle, halves.data(), halves.size()};
      device_buffer y(static_cast<size_t>(n * rows * 4));
      matmul(w.dev, dx.as<float>(), cols, &q.rows, n, y.as<float>(), rows, false, scratch);
      synchronize();
      const auto got = from_device<float>(y.data(), static_cast<size_t>(n * rows));
      const auto want = cpu_product(w.cpu, x, n);
      // Past the matvec, quantized weights take mmq: the CPU's sums in the CPU's order, so the
      // same bits (an order that slipped would show here, not in a tolerance).
      const bool exact = is_quantized(t) && n > matvec_max_tokens;
      if (exact) {
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << name(t) << " " << rows << "x" << cols << ", " << n << " tokens";
      } else {
        EXPECT_LT(nmse(got, want), tolerance(t)) << name(t) << " " << rows << "x" << cols << ", " << n << " tokens";
      }
      // Accumulating adds the product to what is there (the residual stream).
      matmul(w.dev, dx.as<float>(), cols, &q.rows, n, y.as<float>(), rows, true, scratch);
      synchronize();
      auto twice = want;
      for (float& v : twice) v *= 2;
      const auto got_twice = from_device<float>(y.data(), static_cast<size_t>(n * rows));
      if (exact) {
        EXPECT_EQ(std::memcmp(got_twice.data(), twice.data(), twice.size() * 4), 0) << "accumulate, " << n << " tokens";
      } else {
        EXPECT_LT(nmse(got_twice, twice), tolerance(t)) << "accumulate";
      }
    }
  }
}

TEST_P(cuda_typed, grouped_products_give_each_pair_its_experts_rows) {
  REQUIRE_DEVICE();
  const tensor_type t = GetParam();
  const int32_t experts = 4;
  const int64_t rows_per = 96, cols = 256;
  const matrix w(t, experts * rows_per, cols, 9);
  // Decode (a pair a tile), a few pairs an expert (tiles of 4 pairs, one expert with three
  // tiles), and prefill (mmq for quantized experts).
  for (const std::vector<int32_t>& counts :
       {std::vector<int32_t>{1, 0, 2, 1}, std::vector<int32_t>{5, 0, 9, 2}, std::vector<int32_t>{70, 0, 3, 60}}) {
    std::vector<int32_t> offsets(experts + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
    const int32_t pairs = offsets.back();
    const auto x = random_floats(static_cast<size_t>(pairs * cols), 10);
    auto dx = to_device(x), doff = to_device(offsets);
    q8_device q(pairs, cols);
    if (is_quantized(t)) quantize_q8(dx.as<float>(), cols, pairs, cols, nullptr, q.rows);
    device_buffer y(static_cast<size_t>(pairs * rows_per * 4));
    grouped_matmul(w.dev, rows_per, experts, doff.as<int32_t>(), dx.as<float>(), cols, &q.rows, pairs, y.as<float>(),
                   rows_per, product_scratch{});
    synchronize();
    const auto got = from_device<float>(y.data(), static_cast<size_t>(pairs * rows_per));
    std::vector<float> want;
    for (int32_t e = 0; e < experts; ++e) {
      if (counts[e] == 0) continue;
      const auto part = cpu::packed_matrix::pack(t, w.file.data() + e * rows_per * row_bytes(t, cols), rows_per, cols);
      const std::vector<float> xe(x.begin() + offsets[e] * cols, x.begin() + offsets[e + 1] * cols);
      const auto ye = cpu_product(part, xe, counts[e]);
      want.insert(want.end(), ye.begin(), ye.end());
    }
    if (is_quantized(t) && pairs > 2 * experts + matvec_max_tokens) {  // mmq: bit for bit
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << name(t) << ", " << pairs << " pairs";
    } else {
      EXPECT_LT(nmse(got, want), 1e-10) << name(t) << ", " << pairs << " pairs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(types, cuda_typed,
                         ::testing::Values(tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0, tensor_type::f16,
                                           tensor_type::bf16, tensor_type::f32),
                         [](const auto& info) { return std::string(name(info.param)); });

// ---- paged attention -------------------------------------------------------------------------

// A step as the backend uploads it, with its device copy.
struct device_step {
  step_inputs in;
  device_buffer words;
  step_view view;
  device_step(const step_batch& b, const step_shape& shape) : in(pack_step(b, shape)), words(to_device(in.words)) {
    const int32_t* w = words.as<int32_t>();
    view = {w, w + in.tokens_at, w + in.pos_at, w + in.row_seq_at, w + in.seq_start_at, w + in.seq_len_at,
            w + in.seq_row_at, w + in.items_at, w + in.outs_at, w + in.table_at, in.rows, in.seqs, in.items, in.outs};
  }
};

struct attention_fixture {
  attention_shape a;
  kv_cache kv;
  device_buffer k, v;
  int64_t ld() const { return (a.n_head + 2 * a.n_head_kv) * a.head_dim; }
  attention_fixture(int heads, int kv_heads, int hd, int bs, int blocks, int layers) {
    a.n_head = heads;
    a.n_head_kv = kv_heads;
    a.head_dim = hd;
    a.rope_dims = hd;
    a.rope_base = 10000.0f;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    kv.n_layer = layers;
    kv.n_blocks = blocks;
    kv.block_size = bs;
    kv.n_head_kv = kv_heads;
    kv.head_dim = hd;
    const size_t bytes = static_cast<size_t>(kv.layer_stride() * layers * 2);
    k = device_buffer(bytes);
    v = device_buffer(bytes);
    k.zero();
    v.zero();
    kv.k = k.as<uint16_t>();
    kv.v = v.as<uint16_t>();
  }
};

sequence_step chunk(uint64_t id, const std::vector<token_id>& tokens, int32_t start, int32_t n,
                    const std::vector<int32_t>& table) {
  sequence_step s;
  s.seq_id = id;
  s.tokens = std::span<const token_id>(tokens).subspan(static_cast<size_t>(start), static_cast<size_t>(n));
  s.start_pos = start;
  s.block_table = table;
  return s;
}

// The CPU's RoPE (cpu_backend.cpp's rope_rows, with lay_out's angles).
void cpu_rope(float* x, int heads, int hd, int rope_dims, int32_t pos, float base) {
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < rope_dims / 2; ++i) {
      const double theta = pos * std::pow(static_cast<double>(base), -2.0 * i / rope_dims);
      const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
      float* p = x + h * hd + 2 * i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

TEST(cuda_ops, kv_writes_land_where_the_cpu_backend_puts_them) {
  REQUIRE_DEVICE();
  attention_fixture f(9, 3, 64, 16, 12, 2);
  const std::vector<token_id> tokens(40, 1);
  const std::vector<int32_t> t0{7, 2, 11}, t1{5, 0};
  step_batch b;
  b.seqs.push_back(chunk(1, tokens, 0, 37, t0));  // three blocks, scattered
  b.seqs.push_back(chunk(2, tokens, 17, 1, t1));  // one decode token, block 0 slot 1
  const step_shape shape{16, 3, 3};
  device_step st(b, shape);
  const int64_t ld = f.ld();
  auto qkv = random_floats(static_cast<size_t>(38 * ld), 21);
  auto dqkv = to_device(qkv);
  rope_store_kv(dqkv.as<float>(), ld, st.view, f.a, f.kv, 1, nullptr);
  synchronize();
  // The CPU backend's layout: [layer][block][kv_head] then keys [head_dim][slot], values [slot][head_dim].
  const int64_t bs = 16, hd = 64, kvd = 192, qd = 576;
  std::vector<uint16_t> k_want(static_cast<size_t>(f.kv.layer_stride() * 2), 0), v_want = k_want;
  for (int32_t r = 0; r < 38; ++r) {
    float* row = &qkv[r * ld];
    const int32_t pos = r < 37 ? r : 17;
    const auto& table = r < 37 ? t0 : t1;
    cpu_rope(row, 9 + 3, 64, 64, pos, 10000.0f);  // q and k heads are contiguous
    const int64_t block = table[pos / bs], slot = pos % bs;
    for (int64_t h = 0; h < 3; ++h) {
      const int64_t head = f.kv.layer_stride() + block * f.kv.block_stride() + h * bs * hd;
      for (int64_t e = 0; e < hd; ++e) {
        k_want[head + e * bs + slot] = cpu::fp32_to_fp16(row[qd + h * hd + e]);
        v_want[head + slot * hd + e] = cpu::fp32_to_fp16(row[qd + kvd + h * hd + e]);
      }
    }
  }
  const auto k_got = from_device<uint16_t>(f.k.data(), k_want.size()), v_got = from_device<uint16_t>(f.v.data(), v_want.size());
  EXPECT_EQ(v_got, v_want);
  int64_t k_off = 0;
  for (size_t i = 0; i < k_want.size(); ++i) k_off += std::abs(int(k_got[i]) - int(k_want[i])) > 1;
  EXPECT_EQ(k_off, 0) << "keys more than one fp16 step away from the CPU's";
  // And q turned in place as the CPU turns it.
  const auto q_got = from_device<float>(dqkv.data(), qkv.size());
  double worst = 0;
  for (int32_t r = 0; r < 38; ++r) {
    for (int64_t c = 0; c < qd; ++c) worst = std::max(worst, std::fabs(double(q_got[r * ld + c]) - qkv[r * ld + c]));
  }
  EXPECT_LT(worst, 1e-5);
}

struct attention_case {
  int heads, kv_heads, hd, bs;
  int32_t context;  // positions sequence a has before its decode token
};

// One mixed step against the CPU kernel on the same pool: sequence a decodes one token after
// `context` positions, b brings a chunk of 9 after 20, c a new prompt of 5; their blocks
// scattered over the pool. With 1, 3 and 16 key splits (each item using those its context
// needs: 16 for a long one, one for c's).
void expect_attention_of_the_cpu(const attention_case& k) {
  const int heads = k.heads, kv_heads = k.kv_heads, hd = k.hd, bs = k.bs, group = heads / kv_heads;
  const auto blocks_of = [&](int32_t positions) { return (positions + bs - 1) / bs; };
  const int32_t na = blocks_of(k.context + 1), nb = blocks_of(29), nc = blocks_of(5), blocks = na + nb + nc + 3;
  std::vector<int32_t> pool(static_cast<size_t>(blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(static_cast<uint32_t>(hd * 131 + bs)));
  const std::vector<int32_t> ta(pool.begin(), pool.begin() + na), tb(pool.begin() + na, pool.begin() + na + nb),
      tc(pool.begin() + na + nb, pool.begin() + na + nb + nc);
  attention_fixture f(heads, kv_heads, hd, bs, blocks, 1);
  const int64_t ld = f.ld();
  const std::vector<token_id> tokens(static_cast<size_t>(k.context + 40), 1);
  const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) + ", head_dim " +
                           std::to_string(hd) + ", blocks of " + std::to_string(bs) + ", context " + std::to_string(k.context);
  // Earlier steps: a's first `context` positions, b's first 20.
  step_batch history;
  history.seqs.push_back(chunk(1, tokens, 0, k.context, ta));
  history.seqs.push_back(chunk(2, tokens, 0, 20, tb));
  const step_shape shape{bs, kv_heads, group};
  device_step hs(history, shape);
  auto hq = to_device(random_floats(static_cast<size_t>((k.context + 20) * ld), 30 + hd + bs));
  rope_store_kv(hq.as<float>(), ld, hs.view, f.a, f.kv, 0, nullptr);
  step_batch b;
  b.seqs.push_back(chunk(1, tokens, k.context, 1, ta));
  b.seqs.push_back(chunk(2, tokens, 20, 9, tb));
  b.seqs.push_back(chunk(3, tokens, 0, 5, tc));
  device_step st(b, shape);
  const auto qkv = random_floats(static_cast<size_t>(15 * ld), 40 + hd + bs);
  auto dqkv = to_device(qkv);
  rope_store_kv(dqkv.as<float>(), ld, st.view, f.a, f.kv, 0, nullptr);
  synchronize();
  // The CPU kernel on the same pool (the same layout: downloaded as is) and the same q.
  const auto k_pool = from_device<uint16_t>(f.k.data(), static_cast<size_t>(f.kv.layer_stride()));
  const auto v_pool = from_device<uint16_t>(f.v.data(), static_cast<size_t>(f.kv.layer_stride()));
  const auto q = from_device<float>(dqkv.data(), qkv.size());
  const int qd = heads * hd;
  std::vector<float> want(static_cast<size_t>(15 * qd), 0.0f);
  const int32_t rows_of[] = {0, 1, 10}, n_of[] = {1, 9, 5}, start_of[] = {k.context, 20, 0};
  const std::vector<int32_t>* tables[] = {&ta, &tb, &tc};
  for (int s = 0; s < 3; ++s) {
    for (int h = 0; h < kv_heads; ++h) {
      cpu::attention_args a{};
      a.q = &q[rows_of[s] * ld];
      a.q_stride = ld;
      a.out = &want[rows_of[s] * qd];
      a.out_stride = qd;
      a.n_new = n_of[s];
      a.start_pos = start_of[s];
      a.first_head = h * group;
      a.heads = group;
      a.head_dim = hd;
      a.block_size = bs;
      a.block_table = tables[s]->data();
      a.k_base = k_pool.data() + h * bs * hd;
      a.v_base = v_pool.data() + h * bs * hd;
      a.block_stride = f.kv.block_stride();
      a.scale = f.a.scale;
      cpu::best_kernels().attention(a);
    }
  }
  for (const int32_t splits : {1, 3, 16}) {
    device_buffer out(want.size() * 4), partial(attention_partial_floats(st.in.items, splits, hd) * 4);
    out.zero();
    paged_attention(dqkv.as<float>(), ld, out.as<float>(), qd, st.view, f.a, f.kv, 0, splits, partial.as<float>());
    synchronize();
    EXPECT_LT(nmse(from_device<float>(out.data(), want.size()), want), 1e-11) << what << ", splits " << splits;
  }
}

TEST(cuda_ops, paged_attention_of_a_mixed_step_matches_the_cpu_kernel) {
  REQUIRE_DEVICE();
  for (const attention_case& k : {
           attention_case{9, 3, 64, 16, 37},     // SmolLM2's heads
           attention_case{9, 3, 128, 16, 37},
           attention_case{9, 3, 16, 16, 37},
           attention_case{8, 2, 256, 16, 700},   // head_dim 256: 80 KiB of shared memory (opt-in), 22 key tiles
           attention_case{32, 8, 128, 8, 1500},  // Llama-3-8B's GQA (4 heads: a decode row per warp), blocks of 8
           attention_case{8, 2, 64, 32, 3000},   // blocks of 32, 94 key tiles: 16 splits of 6
           attention_case{4, 4, 128, 64, 2100},  // blocks of 64, no GQA
           attention_case{16, 2, 64, 16, 300},   // groups of 8: two decode rows a warp
       }) {
    expect_attention_of_the_cpu(k);
  }
}

TEST(cuda_ops, copied_kv_blocks_are_whole_blocks_of_every_layer) {
  REQUIRE_DEVICE();
  attention_fixture f(4, 2, 32, 8, 6, 3);
  const size_t n = static_cast<size_t>(f.kv.layer_stride() * 3);
  std::vector<uint16_t> k(n), v(n);
  std::iota(k.begin(), k.end(), uint16_t{0});
  std::iota(v.begin(), v.end(), uint16_t{7});
  f.k.upload(k.data(), n * 2);
  f.v.upload(v.data(), n * 2);
  const std::vector<int32_t> pairs{1, 4, 4, 5};  // in order: 1 -> 4, then 4 (now 1's) -> 5
  auto dp = to_device(pairs);
  copy_kv_blocks(f.kv, dp.as<int32_t>(), 2);
  synchronize();
  const int64_t bsz = f.kv.block_stride();
  for (int layer = 0; layer < 3; ++layer) {
    for (int64_t i = 0; i < bsz; ++i) {
      const int64_t base = layer * f.kv.layer_stride();
      k[base + 4 * bsz + i] = k[base + 1 * bsz + i];
      v[base + 4 * bsz + i] = v[base + 1 * bsz + i];
      k[base + 5 * bsz + i] = k[base + 4 * bsz + i];
      v[base + 5 * bsz + i] = v[base + 4 * bsz + i];
    }
  }
  EXPECT_EQ(from_device<uint16_t>(f.k.data(), n), k);
  EXPECT_EQ(from_device<uint16_t>(f.v.data(), n), v);
}

// ---- sampling and mixture of experts ---------------------------------------------------------

TEST(cuda_ops, greedy_choice_is_the_cpu_samplers_with_ties_to_the_lower_id) {
  REQUIRE_DEVICE();
  const int rows = 4, n = 49152;
  auto logits = random_floats(static_cast<size_t>(rows * n), 50);
  logits[1 * n + 300] = logits[1 * n + 30000] = 9.0f;  // a tie
  logits[2 * n + n - 1] = 12.0f;                       // the last id
  logits[3 * n + 0] = 11.0f;                           // the first id
  auto dl = to_device(logits);
  device_buffer out(rows * 4);
  argmax_rows(dl.as<float>(), rows, n, out.as<int32_t>());
  synchronize();
  const auto got = from_device<int32_t>(out.data(), rows);
  sampler_scratch scratch;
  for (int r = 0; r < rows; ++r) {
    const std::span<const float> row(&logits[r * n], n);
    EXPECT_EQ(got[r], sample(row, sampling_params{}, 0, scratch)) << r;
  }
  EXPECT_EQ(got[1], 300);
}

TEST(cuda_ops, routing_grouping_and_combining_follow_the_cpu_backend) {
  REQUIRE_DEVICE();
  const int rows = 37, n_exp = 8, k = 2, width = 64;
  auto logits = random_floats(static_cast<size_t>(rows * n_exp), 60);
  logits[5 * n_exp + 2] = logits[5 * n_exp + 6] = 5.0f;  // a tie for the top: expert 2 first
  std::vector<int32_t> row_seq(rows, 0);
  row_seq[36] = -1;  // a padding row: routed, not counted
  auto dl = to_device(logits), drs = to_device(row_seq);
  device_buffer chosen(rows * k * 4), gates(rows * k * 4), counts(n_exp * 8), offsets((n_exp + 1) * 4),
      pair_row(rows * k * 4), slot_pair(rows * k * 4);
  counts.zero();
  moe_route(dl.as<float>(), rows, n_exp, k, drs.as<int32_t>(), chosen.as<int32_t>(), gates.as<float>(),
            counts.as<unsigned long long>());
  moe_group(chosen.as<int32_t>(), rows, k, n_exp, offsets.as<int32_t>(), pair_row.as<int32_t>(), slot_pair.as<int32_t>());
  synchronize();
  const auto got_chosen = from_device<int32_t>(chosen.data(), rows * k);
  const auto got_gates = from_device<float>(gates.data(), rows * k);
  std::vector<unsigned long long> want_counts(n_exp, 0);
  for (int r = 0; r < rows; ++r) {  // cpu_backend::moe_route
    const float* l = &logits[r * n_exp];
    const float top = *std::max_element(l, l + n_exp);
    std::vector<int32_t> c;
    std::vector<float> g;
    for (int j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t x = 0; x < n_exp; ++x) {
        if (std::find(c.begin(), c.end(), x) != c.end()) continue;
        if (best < 0 || l[x] > l[best]) best = x;
      }
      c.push_back(best);
      g.push_back(std::exp(l[best] - top));
    }
    float sum = 0;
    for (float v : g) sum += v;
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(got_chosen[r * k + j], c[j]) << "row " << r;
      EXPECT_NEAR(got_gates[r * k + j], g[j] / sum, 1e-6f) << "row " << r;  // expf: within an ulp or two
      if (row_seq[r] >= 0) ++want_counts[c[j]];
    }
  }
  EXPECT_EQ(got_chosen[5 * k], 2);
  EXPECT_EQ(from_device<unsigned long long>(counts.data(), n_exp), want_counts);
  // Pairs grouped by expert: each expert's pairs in its slice, every slot once.
  const auto off = from_device<int32_t>(offsets.data(), n_exp + 1);
  const auto prow = from_device<int32_t>(pair_row.data(), rows * k), spair = from_device<int32_t>(slot_pair.data(), rows * k);
  EXPECT_EQ(off[0], 0);
  EXPECT_EQ(off[n_exp], rows * k);
  for (int s = 0; s < rows * k; ++s) {
    const int p = spair[s], e = got_chosen[s];
    EXPECT_GE(p, off[e]);
    EXPECT_LT(p, off[e + 1]);
    EXPECT_EQ(prow[p], s / k);
  }
  // The combine: x += Σ_j gate_j · y[pair of slot j], the CPU's order of sums.
  const auto y = random_floats(static_cast<size_t>(rows * k * width), 61);
  const auto x0 = random_floats(static_cast<size_t>(rows * width), 62);
  auto dy = to_device(y), dx = to_device(x0);
  moe_combine(dy.as<float>(), width, slot_pair.as<int32_t>(), gates.as<float>(), rows, k, width, dx.as<float>(), width);
  synchronize();
  const auto got = from_device<float>(dx.data(), x0.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < width; ++c) {
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += got_gates[r * k + j] * y[spair[r * k + j] * width + c];
      ASSERT_EQ(got[r * width + c], x0[r * width + c] + sum) << r << " " << c;
    }
  }
}

TEST(cuda_ops, bad_shapes_are_refused_before_any_launch) {
  const device_matrix q{tensor_type::q4_1, 4, 64, 40, nullptr, nullptr, nullptr};
  q8_rows narrow{nullptr, nullptr, nullptr, 1};
  EXPECT_THROW(matmul(q, nullptr, 64, nullptr, 1, nullptr, 4, false, {}), std::invalid_argument);  // no activations
  int8_t dummy = 0;
  narrow.q = &dummy;
  EXPECT_THROW(matmul(q, nullptr, 64, &narrow, 1, nullptr, 4, false, {}), std::invalid_argument);  // 32 values for 64
  EXPECT_THROW(quantize_q8(nullptr, 40, 1, 40, nullptr, narrow), std::invalid_argument);
  EXPECT_THROW(rope(nullptr, 64, 1, 1, 64, -2, nullptr, 10000.0f), std::invalid_argument);
  EXPECT_NO_THROW(rope(nullptr, 64, 1, 1, 64, 0, nullptr, 10000.0f));  // nothing to turn
  EXPECT_THROW(rope(nullptr, 64, 1, 1, 64, 65, nullptr, 10000.0f), std::invalid_argument);
  EXPECT_THROW(moe_group(nullptr, 1, 1, 2000, nullptr, nullptr, nullptr), std::invalid_argument);
  attention_shape a;
  a.n_head = 4, a.n_head_kv = 3, a.head_dim = 64;
  kv_cache kv;
  EXPECT_THROW(rope_store_kv(nullptr, 0, step_view{}, a, kv, 0), std::invalid_argument);
}

}  // namespace
}  // namespace tireless::cuda

#endif
