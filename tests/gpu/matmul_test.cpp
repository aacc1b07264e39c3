#include "gpu/cpu/matmul.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "tests/gpu/ggml_blocks.hpp"

namespace tireless::cpu {
namespace {

struct problem {
  tensor_type type;
  int64_t rows, cols, tokens;
};

// Weights quantized in ggml's block format, packed, and their exact dequantized values.
struct weights {
  std::vector<std::byte> raw;
  std::vector<float> exact;
  packed_matrix packed;
};

weights make_weights(const problem& p, uint32_t seed) {
  weights w;
  w.raw = test::quantize(p.type, test::random_floats(p.rows * p.cols, seed, 0.05f));
  w.exact = test::dequantize(p.type, w.raw.data(), p.rows * p.cols);
  w.packed = packed_matrix::pack(p.type, w.raw.data(), p.rows, p.cols);
  return w;
}

std::vector<float> run(const isa_kernels& k, thread_pool& pool, const weights& w, const problem& p,
                       const std::vector<float>& x, int64_t first_token, int64_t n_tokens) {
  q8_buffer buf(p.tokens, p.cols);
  const float* xs = x.data() + first_token * p.cols;
  q8_view xq = buf.quantize(pool, k, xs, n_tokens, p.cols, p.cols);
  std::vector<float> y(n_tokens * p.rows, std::nanf(""));
  matmul(pool, k, w.packed, xs, p.cols, &xq, n_tokens, y.data(), p.rows);
  return y;
}

class matmul_test : public ::testing::TestWithParam<std::tuple<isa, problem>> {};

TEST_P(matmul_test, matches_the_dequantized_product_within_activation_rounding) {
  auto [which, p] = GetParam();
  if (!cpu_supports(which)) GTEST_SKIP() << "CPU lacks " << name(which);
  const auto& k = kernels_for(which);
  thread_pool pool(2);
  weights w = make_weights(p, 7);
  std::vector<float> x = test::random_floats(p.tokens * p.cols, 11);
  std::vector<float> y = run(k, pool, w, p, x, 0, p.tokens);
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t r = 0; r < p.rows; ++r) {
      // Each activation is rounded to a multiple of its block's max|x| / 127, so it is off
      // by at most max|x| / 254; the product is off by at most Σ |w| · that.
      // Float weights multiply float activations: only summation rounding.
      const int64_t block = is_quantized(p.type) ? 32 : p.cols;
      double exact = 0, bound = 0;
      for (int64_t c0 = 0; c0 < p.cols; c0 += block) {
        double amax = 0;
        for (int64_t c = c0; c < c0 + block; ++c) amax = std::max(amax, std::fabs(double(x[t * p.cols + c])));
        const double rounding = is_quantized(p.type) ? amax / 254.0 : amax * 1e-6;
        for (int64_t c = c0; c < c0 + block; ++c) {
          exact += double(w.exact[r * p.cols + c]) * x[t * p.cols + c];
          bound += std::fabs(double(w.exact[r * p.cols + c])) * rounding;
        }
      }
      const double tolerance = bound * 1.01 + 1e-5;
      ASSERT_NEAR(y[t * p.rows + r], exact, tolerance) << "row " << r << " token " << t;
    }
  }
}

TEST_P(matmul_test, a_token_gets_bit_identical_results_alone_or_in_a_batch) {
  auto [which, p] = GetParam();
  if (!cpu_supports(which)) GTEST_SKIP() << "CPU lacks " << name(which);
  const auto& k = kernels_for(which);
  thread_pool pool(2);
  weights w = make_weights(p, 3);
  std::vector<float> x = test::random_floats(p.tokens * p.cols, 5);
  std::vector<float> batch = run(k, pool, w, p, x, 0, p.tokens);
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::vector<float> alone = run(k, pool, w, p, x, t, 1);
    for (int64_t r = 0; r < p.rows; ++r) {
      ASSERT_EQ(alone[r], batch[t * p.rows + r]) << "row " << r << " token " << t;
    }
  }
}

TEST_P(matmul_test, vector_sets_agree_with_the_portable_kernels) {
  auto [which, p] = GetParam();
  if (!cpu_supports(which)) GTEST_SKIP() << "CPU lacks " << name(which);
  thread_pool pool(1);
  weights w = make_weights(p, 9);
  std::vector<float> x = test::random_floats(p.tokens * p.cols, 13);
  std::vector<float> got = run(kernels_for(which), pool, w, p, x, 0, p.tokens);
  std::vector<float> want = run(generic_kernels(), pool, w, p, x, 0, p.tokens);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << "at " << i;
  }
}

const problem problems[] = {
    {tensor_type::q4_0, 64, 128, 7},  {tensor_type::q4_1, 64, 576, 9},
    {tensor_type::q8_0, 40, 256, 5},  {tensor_type::q4_1, 13, 32, 6},
    {tensor_type::q4_0, 6, 96, 3},    {tensor_type::q8_0, 7, 160, 1},
    {tensor_type::f16, 10, 64, 5},    {tensor_type::f32, 9, 48, 4},
    {tensor_type::bf16, 12, 64, 3},    {tensor_type::q4_1, 48, 64, 21},
    {tensor_type::q4_0, 33, 96, 17},
};

std::string problem_name(const ::testing::TestParamInfo<std::tuple<isa, problem>>& info) {
  const auto& [which, p] = info.param;
  return std::string(name(which)) + "_" + std::string(name(p.type)) + "_" +
         std::to_string(p.rows) + "x" + std::to_string(p.cols) + "_t" + std::to_string(p.tokens);
}

INSTANTIATE_TEST_SUITE_P(all_sets, matmul_test,
                         ::testing::Combine(::testing::Values(isa::generic, isa::avx2, isa::avx512),
                                            ::testing::ValuesIn(problems)),
                         problem_name);

}  // namespace
}  // namespace tireless::cpu

namespace tireless::cpu {
namespace {

// The kernels compute exactly Σ_c W[r][c] · x̂[t][c], where x̂ is x rounded to 8 bits per
// 32-value block (scale max|x| / 127, round half to even); only float summation order differs.
TEST(matmul_numerics, equal_the_product_with_activations_rounded_to_8_bits) {
  for (isa which : {isa::generic, isa::avx2, isa::avx512}) {
    if (!cpu_supports(which)) continue;
    for (tensor_type type : {tensor_type::q4_0, tensor_type::q4_1, tensor_type::q8_0}) {
      const int64_t rows = 8, cols = 192, tokens = 5;
      const auto raw = test::quantize(type, test::random_floats(rows * cols, 21, 0.05f));
      const auto exact = test::dequantize(type, raw.data(), rows * cols);
      const packed_matrix w = packed_matrix::pack(type, raw.data(), rows, cols);
      const auto x = test::random_floats(tokens * cols, 23);
      thread_pool pool(1);
      q8_buffer buf(tokens, cols);
      const q8_view xq = buf.quantize(pool, kernels_for(which), x.data(), tokens, cols, cols);
      std::vector<float> y(tokens * rows);
      matmul(pool, kernels_for(which), w, x.data(), cols, &xq, tokens, y.data(), rows);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, magnitude = 0;
          for (int64_t c0 = 0; c0 < cols; c0 += 32) {
            float amax = 0;
            for (int64_t c = c0; c < c0 + 32; ++c) amax = std::max(amax, std::fabs(x[t * cols + c]));
            const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            for (int64_t c = c0; c < c0 + 32; ++c) {
              const double xr = std::nearbyint(x[t * cols + c] * inv) * double(d);
              want += double(exact[r * cols + c]) * xr;
              magnitude += std::fabs(double(exact[r * cols + c]) * xr);
            }
          }
          ASSERT_NEAR(y[t * rows + r], want, 1e-5 * magnitude + 1e-6)
              << name(which) << " " << name(type) << " row " << r << " token " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tireless::cpu
