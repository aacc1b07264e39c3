// Every CUDA kernel against the CPU's result on the same inputs, with the tolerance its type
// needs. Skipped (GTEST_SKIP) where no CUDA device is present, and not built without nvcc.
#if TIRELESS_HAVE_CUDA_KERNELS

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/cpu/packed_matrix.hpp"
#include "gpu/cuda/ops.hpp"
#include "../gpu/ggml_blocks.hpp"

namespace tireless::cuda {
namespace {

#define REQUIRE_DEVICE()                                    \
  do {                                                      \
    std::string why;                                        \
    if (!device_available(&why)) GTEST_SKIP() << why;       \
  } while (0)

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

template <class T>
device_buffer to_device(const std::vector<T>& v) {
  device_buffer b(v.size() * sizeof(T));
  b.upload(v.data(), b.size());
  return b;
}

std::vector<float> from_device(const device_buffer& b, size_t n) {
  std::vector<float> v(n);
  b.download(v.data(), n * sizeof(float));
  return v;
}

TEST(cuda_ops, rms_norm_matches_the_cpu) {
  REQUIRE_DEVICE();
  // 4100: more values than a block's 1024 threads, not a multiple of 32. eps 1e-2: a kernel
  // that dropped it would be off by far more than the tolerance.
  for (const int n : {576, 4100}) {
    const int rows = 5;
    const float eps = 1e-2f;
    const auto x = random_floats(rows * n, 1), w = random_floats(n, 2);
    auto dx = to_device(x), dw = to_device(w);
    device_buffer out(x.size() * 4);
    rms_norm(dx.as<float>(), dw.as<float>(), out.as<float>(), rows, n, eps);
    synchronize();
    const auto got = from_device(out, x.size());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
      const double scale = 1.0 / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) {
        const double want = x[r * n + i] * scale * w[i];
        EXPECT_NEAR(got[r * n + i], want, 2e-6 * std::fabs(want) + 1e-6) << n << " " << r << " " << i;
      }
    }
  }
}

TEST(cuda_ops, silu_mul_matches_the_cpu) {
  REQUIRE_DEVICE();
  const auto g = random_floats(4096, 3, 4.0f), u = random_floats(4096, 4);
  auto dg = to_device(g), du = to_device(u);
  device_buffer out(g.size() * 4);
  silu_mul(dg.as<float>(), du.as<float>(), out.as<float>(), static_cast<int64_t>(g.size()));
  synchronize();
  const auto got = from_device(out, g.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(got[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5 + 1e-5 * std::fabs(got[i]));
}

TEST(cuda_ops, rope_turns_pairs_as_the_cpu_does) {
  REQUIRE_DEVICE();
  const int rows = 3, heads = 9, hd = 64;
  const std::vector<int32_t> pos{0, 17, 4095};
  for (const int rope_dims : {64, 32}) {  // 32: a partial rotary, the rest of each head untouched
    auto x = random_floats(rows * heads * hd, 5);
    auto dx = to_device(x);
    auto dp = to_device(pos);
    rope(dx.as<float>(), rows, heads, hd, rope_dims, dp.as<int32_t>(), 100000.0f);
    synchronize();
    const auto got = from_device(dx, x.size());
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        const float* v = &x[(r * heads + h) * hd];
        const float* g = &got[(r * heads + h) * hd];
        for (int i = 0; i < rope_dims / 2; ++i) {
          const double theta = pos[r] * std::pow(100000.0, -2.0 * i / rope_dims);
          const float c = float(std::cos(theta)), s = float(std::sin(theta));
          EXPECT_NEAR(g[2 * i], v[2 * i] * c - v[2 * i + 1] * s, 1e-5);
          EXPECT_NEAR(g[2 * i + 1], v[2 * i] * s + v[2 * i + 1] * c, 1e-5);
        }
        for (int j = rope_dims; j < hd; ++j) EXPECT_EQ(g[j], v[j]) << rope_dims << " " << j;
      }
    }
  }
}

class cuda_typed : public ::testing::TestWithParam<tensor_type> {};

TEST_P(cuda_typed, embedding_rows_are_the_cpus_dequantized_rows) {
  REQUIRE_DEVICE();
  const tensor_type t = GetParam();
  const int64_t n_rows = 40, cols = 576;
  const auto values = random_floats(n_rows * cols, 6);
  std::vector<std::byte> table;
  for (int64_t r = 0; r < n_rows; ++r) {
    const std::vector<float> row(values.begin() + r * cols, values.begin() + (r + 1) * cols);
    const auto q = test::quantize(t, row);
    table.insert(table.end(), q.begin(), q.end());
  }
  const cpu::packed_matrix cpu = cpu::packed_matrix::pack(t, table.data(), n_rows, cols);
  const std::vector<int32_t> ids{0, 39, 7, 7};
  auto dt = to_device(table);
  auto di = to_device(ids);
  device_buffer out(ids.size() * cols * 4);
  embed_rows(t, dt.data(), n_rows, cols, di.as<int32_t>(), static_cast<int32_t>(ids.size()), out.as<float>());
  synchronize();
  const auto got = from_device(out, ids.size() * cols);
  std::vector<float> want(cols);
  for (size_t k = 0; k < ids.size(); ++k) {
    cpu.dequantize_row(ids[k], want.data());
    // nvcc fuses q * d + m into one rounding; the CPU rounds twice: a last-bit difference at most.
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_NEAR(got[k * cols + c], want[c], 1e-6f * std::fabs(want[c]) + 1e-7f) << name(t) << " row " << ids[k] << " col " << c;
    }
  }
}

void check_matvec(tensor_type t, int64_t rows, int64_t cols);

TEST_P(cuda_typed, matvec_matches_the_cpus_dequantized_product) {
  REQUIRE_DEVICE();
  check_matvec(GetParam(), 1003, 1536);  // rows not a multiple of a block's 4; SmolLM2's FFN width
  check_matvec(GetParam(), 37, 14336);   // a 14,336-wide FFN: x past 48 KiB of shared memory
}

void check_matvec(tensor_type t, int64_t rows, int64_t cols) {
  const auto values = random_floats(rows * cols, 7, 0.05f), x = random_floats(cols, 8);
  std::vector<std::byte> w;
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = test::quantize(t, std::vector<float>(values.begin() + r * cols, values.begin() + (r + 1) * cols));
    w.insert(w.end(), q.begin(), q.end());
  }
  const cpu::packed_matrix cpu = cpu::packed_matrix::pack(t, w.data(), rows, cols);
  auto dw = to_device(w);
  auto dx = to_device(x);
  device_buffer y(rows * 4);
  matvec(t, dw.data(), rows, cols, dx.as<float>(), y.as<float>());
  synchronize();
  const auto got = from_device(y, rows);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    cpu.dequantize_row(r, row.data());
    double want = 0, mag = 0;
    for (int64_t c = 0; c < cols; ++c) want += double(row[c]) * x[c], mag += std::fabs(double(row[c]) * x[c]);
    // Float sums in another order: relative to the sum of magnitudes, as ggml's op tests compare.
    EXPECT_NEAR(got[r], want, 1e-5 * mag + 1e-6) << name(t) << " " << cols << " columns, row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(types, cuda_typed,
                         ::testing::Values(tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0, tensor_type::f16,
                                           tensor_type::bf16, tensor_type::f32),
                         [](const auto& info) { return std::string(name(info.param)); });

TEST(cuda_ops, bad_shapes_are_refused_before_any_launch) {
  EXPECT_THROW(matvec(tensor_type::q4_1, nullptr, 4, 33, nullptr, nullptr), std::invalid_argument);
  EXPECT_THROW(embed_rows(tensor_type::q8_0, nullptr, 10, 100, nullptr, 1, nullptr), std::invalid_argument);
  EXPECT_THROW(rope(nullptr, 1, 1, 64, -2, nullptr, 10000.0f), std::invalid_argument);
  EXPECT_NO_THROW(rope(nullptr, 1, 1, 64, 0, nullptr, 10000.0f));  // nothing to turn
  EXPECT_THROW(rope(nullptr, 1, 1, 64, 65, nullptr, 10000.0f), std::invalid_argument);
}

}  // namespace
}  // namespace tireless::cuda

#endif
