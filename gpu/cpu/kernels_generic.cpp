// Kernels in portable C++, for CPUs without AVX2 (and as the reference the vector sets are
// tested against).
#include <algorithm>
#include <cassert>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"

namespace tireless::cpu::generic_impl {

#include "gpu/cpu/portable_kernels.inl"

namespace {

// The integer dot product of row `lane` of a cell with a block of activations, and the
// correction that makes the weights signed (q4_0: nibble - 8; q8_0: stored q + 128).
int32_t block_dot(tensor_type type, const uint8_t* cell, int lane, const int8_t* a, int32_t qsum) {
  int32_t sum = 0;
  if (type == tensor_type::q8_0) {
    for (int e = 0; e < 32; ++e) sum += cell[((e / 4) * 16 + lane) * 4 + e % 4] * a[e];
    return sum - 128 * qsum;
  }
  for (int e = 0; e < 16; ++e) {
    const uint8_t byte = cell[((e / 4) * 16 + lane) * 4 + e % 4];
    sum += (byte & 15) * a[e] + (byte >> 4) * a[e + 16];
  }
  return type == tensor_type::q4_0 ? sum - 8 * qsum : sum;
}

void matmul_q(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1, float* y,
              int64_t ldy, bool accumulate) {
  const tensor_type type = w.type();
  const size_t cell = cell_bytes(type), qs_bytes = cell_qs_bytes(type);
  for (int64_t g = g0; g < g1; ++g) {
    for (int lane = 0; lane < group_rows && g * group_rows + lane < w.rows(); ++lane) {
      for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t b = 0; b < w.blocks(); ++b) {
          const uint8_t* c = w.group(g) + b * cell;
          const int64_t at = t * x.blocks + b;
          const int32_t isum = block_dot(type, c, lane, x.q + at * 32, x.qsum[at]);
          const float dw = fp16_to_fp32(load_u16(c + qs_bytes + lane * 2));
          acc = madd(static_cast<float>(isum), dw * x.d[at], acc);
          if (type == tensor_type::q4_1) {
            acc = madd(fp16_to_fp32(load_u16(c + qs_bytes + 32 + lane * 2)), x.s[at], acc);
          }
        }
        float& out = y[t * ldy + g * group_rows + lane];
        out = accumulate ? out + acc : acc;
      }
    }
  }
}

}  // namespace

}  // namespace tireless::cpu::generic_impl

namespace tireless::cpu {

const isa_kernels& generic_kernels() {
  static const isa_kernels k{isa::generic, generic_impl::quantize_rows_impl, generic_impl::matmul_q,
                             generic_impl::matmul_f_impl, generic_impl::attention_impl,
                             generic_impl::rms_norm_impl, generic_impl::silu_mul_impl,
                             generic_impl::floats_to_halves_impl};
  return k;
}

}  // namespace tireless::cpu
