#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"
#include "tests/gpu/ggml_blocks.hpp"

namespace tireless::cpu {
namespace {

// A paged KV cache for one KV head: blocks scattered in a pool by a shuffled block table.
struct paged_kv {
  int head_dim, block_size, n_blocks;
  std::vector<int32_t> table;
  std::vector<uint16_t> k, v;  // pool, [block][head_dim][slot] and [block][slot][head_dim]
  std::vector<float> k_exact, v_exact;  // [position][head_dim], the fp16-rounded values

  paged_kv(int hd, int bs, int positions, uint32_t seed) : head_dim(hd), block_size(bs) {
    n_blocks = (positions + bs - 1) / bs;
    table.resize(n_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    for (auto& b : table) b = b * 2 + 1;  // leave unused blocks between
    k.assign(static_cast<size_t>(2 * n_blocks + 2) * bs * hd, fp32_to_fp16(1e4f));  // poison
    v = k;
    auto kv = test::random_floats(2 * positions * hd, seed + 1);
    for (int p = 0; p < positions; ++p) {
      const int64_t block = table[p / bs], slot = p % bs;
      for (int e = 0; e < hd; ++e) {
        const uint16_t kh = fp32_to_fp16(kv[p * hd + e]), vh = fp32_to_fp16(kv[(positions + p) * hd + e]);
        k[block * bs * hd + e * bs + slot] = kh;
        v[block * bs * hd + slot * hd + e] = vh;
        k_exact.push_back(fp16_to_fp32(kh));
        v_exact.push_back(fp16_to_fp32(vh));
      }
    }
  }
};

attention_args args_for(const paged_kv& kv, const std::vector<float>& q, std::vector<float>& out,
                        int n_new, int start_pos, int heads) {
  attention_args a{};
  a.q = q.data();
  a.q_stride = heads * kv.head_dim;
  a.out = out.data();
  a.out_stride = heads * kv.head_dim;
  a.n_new = n_new;
  a.start_pos = start_pos;
  a.first_head = 0;
  a.heads = heads;
  a.head_dim = kv.head_dim;
  a.block_size = kv.block_size;
  a.block_table = kv.table.data();
  a.k_base = kv.k.data();
  a.v_base = kv.v.data();
  a.block_stride = static_cast<int64_t>(kv.block_size) * kv.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  return a;
}

struct shape {
  int head_dim, block_size, heads, n_new, start_pos;
};

class attention_test : public ::testing::TestWithParam<std::tuple<isa, shape>> {};

TEST_P(attention_test, matches_causal_softmax_attention_over_the_paged_cache) {
  auto [which, s] = GetParam();
  if (!cpu_supports(which)) GTEST_SKIP() << "CPU lacks " << name(which);
  const int positions = s.start_pos + s.n_new;
  paged_kv kv(s.head_dim, s.block_size, positions, 17);
  auto q = test::random_floats(s.n_new * s.heads * s.head_dim, 19);
  std::vector<float> out(q.size(), std::nanf(""));
  kernels_for(which).attention(args_for(kv, q, out, s.n_new, s.start_pos, s.heads));
  for (int i = 0; i < s.n_new; ++i) {
    for (int h = 0; h < s.heads; ++h) {
      const float* qv = &q[(i * s.heads + h) * s.head_dim];
      const int keys = s.start_pos + i + 1;
      std::vector<double> w(keys);
      double top = -1e300, total = 0;
      for (int p = 0; p < keys; ++p) {
        double dot = 0;
        for (int e = 0; e < s.head_dim; ++e) dot += double(qv[e]) * kv.k_exact[p * s.head_dim + e];
        w[p] = dot / std::sqrt(double(s.head_dim));
        top = std::max(top, w[p]);
      }
      for (auto& x : w) total += (x = std::exp(x - top));
      for (int e = 0; e < s.head_dim; ++e) {
        double want = 0;
        for (int p = 0; p < keys; ++p) want += w[p] / total * kv.v_exact[p * s.head_dim + e];
        ASSERT_NEAR(out[(i * s.heads + h) * s.head_dim + e], want, 2e-5)
            << "token " << i << " head " << h << " dim " << e;
      }
    }
  }
}

TEST_P(attention_test, a_row_is_bit_identical_whatever_is_computed_with_it) {
  auto [which, s] = GetParam();
  if (!cpu_supports(which)) GTEST_SKIP() << "CPU lacks " << name(which);
  paged_kv kv(s.head_dim, s.block_size, s.start_pos + s.n_new, 23);
  auto q = test::random_floats(s.n_new * s.heads * s.head_dim, 29);
  std::vector<float> all(q.size());
  kernels_for(which).attention(args_for(kv, q, all, s.n_new, s.start_pos, s.heads));
  const int row = s.heads * s.head_dim;
  for (int i = 0; i < s.n_new; ++i) {  // each token alone, as a decode step would run it
    std::vector<float> qi(q.begin() + i * row, q.begin() + (i + 1) * row), one(row);
    kernels_for(which).attention(args_for(kv, qi, one, 1, s.start_pos + i, s.heads));
    for (int e = 0; e < row; ++e) ASSERT_EQ(one[e], all[i * row + e]) << "token " << i << " at " << e;
  }
}

const shape shapes[] = {
    {64, 16, 3, 1, 0},  {64, 16, 3, 1, 40},  {64, 16, 3, 37, 5},  {64, 16, 1, 20, 100},
    {16, 16, 2, 9, 3},  {32, 16, 4, 18, 30}, {64, 32, 3, 33, 2},  {48, 8, 2, 11, 13},
};

std::string shape_name(const ::testing::TestParamInfo<std::tuple<isa, shape>>& info) {
  const auto& [which, s] = info.param;
  return std::string(name(which)) + "_hd" + std::to_string(s.head_dim) + "_bs" +
         std::to_string(s.block_size) + "_h" + std::to_string(s.heads) + "_n" +
         std::to_string(s.n_new) + "_at" + std::to_string(s.start_pos);
}

INSTANTIATE_TEST_SUITE_P(all_sets, attention_test,
                         ::testing::Combine(::testing::Values(isa::generic, isa::avx2, isa::avx512),
                                            ::testing::ValuesIn(shapes)),
                         shape_name);

}  // namespace
}  // namespace tireless::cpu
