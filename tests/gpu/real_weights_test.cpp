// The kernels on weights from model files: the tiny test models and, when present, SmolLM2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "gpu/cpu/matmul.hpp"
#include "model/gguf_file.hpp"
#include "tests/gpu/ggml_blocks.hpp"

namespace tireless::cpu {
namespace {

std::string smollm2() {
  return std::string(std::getenv("HOME")) + "/.cache/tireless/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

void check_tensor(const gguf_tensor& t, int64_t tokens) {
  const int64_t cols = t.shape[0], rows = std::min<int64_t>(t.shape[1], 256);
  packed_matrix w = packed_matrix::pack(t.type, t.data, rows, cols);
  std::vector<float> exact = test::dequantize(t.type, t.data, rows * cols);
  std::vector<float> x = test::random_floats(tokens * cols, 1);
  thread_pool pool(2);
  const isa_kernels& k = best_kernels();
  q8_buffer buf(tokens, 2048);
  q8_view xq = buf.quantize(pool, k, x.data(), tokens, cols, cols);
  std::vector<float> y(tokens * rows);
  matmul(pool, k, w, x.data(), cols, &xq, tokens, y.data(), rows);
  for (int64_t t0 = 0; t0 < tokens; ++t0) {
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0, bound = 0;
      for (int64_t c0 = 0; c0 < cols; c0 += 32) {
        double amax = 0;
        for (int64_t c = c0; c < c0 + 32; ++c) amax = std::max(amax, std::fabs(double(x[t0 * cols + c])));
        for (int64_t c = c0; c < c0 + 32; ++c) {
          want += double(exact[r * cols + c]) * x[t0 * cols + c];
          bound += std::fabs(double(exact[r * cols + c])) * amax / 254.0;
        }
      }
      ASSERT_NEAR(y[t0 * rows + r], want, bound * 1.01 + 1e-4) << t.name << " row " << r << " token " << t0;
    }
  }
}

TEST(real_weights, smollm2_matrices_multiply_like_their_dequantized_values) {
  if (!std::filesystem::exists(smollm2())) GTEST_SKIP() << "no SmolLM2 model";
  gguf_file f = gguf_file::open(smollm2());
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight",
                           "blk.5.ffn_up.weight", "token_embd.weight"}) {
    check_tensor(f.tensor(name), 7);
  }
}

}  // namespace
}  // namespace tireless::cpu
