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

// Integer dot product of block b (0 or 1) of row r of a cell with the matching activations.
int32_t block_dot(tensor_type type, const uint8_t* cell, int r, int b, const int8_t* a) {
  int32_t sum = 0;
  if (type == tensor_type::q8_0) {
    const auto* qs = reinterpret_cast<const int8_t*>(cell + r * 64);
    for (int e = 0; e < 16; ++e) sum += qs[b * 16 + e] * a[b * 16 + e];
    for (int e = 0; e < 16; ++e) sum += qs[32 + b * 16 + e] * a[32 + b * 16 + e];
    return sum;
  }
  const uint8_t* qs = cell + r * 32 + b * 16;
  const int offset = type == tensor_type::q4_0 ? 8 : 0;
  for (int e = 0; e < 16; ++e) {
    sum += ((qs[e] & 15) - offset) * a[b * 16 + e];
    sum += ((qs[e] >> 4) - offset) * a[32 + b * 16 + e];
  }
  return sum;
}

void matmul_q(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1, float* y,
              int64_t ldy) {
  const tensor_type type = w.type();
  const size_t cell = cell_bytes(type);
  const size_t qs_bytes = type == tensor_type::q8_0 ? 4 * 64 : 4 * 32;
  for (int64_t g = g0; g < g1; ++g) {
    for (int r = 0; r < 4 && g * 4 + r < w.rows(); ++r) {
      for (int64_t t = 0; t < n; ++t) {
        float acc = 0.0f;
        for (int64_t p = 0; p < w.pairs(); ++p) {
          const uint8_t* c = w.group(g) + p * cell;
          const int8_t* a = x.q + t * x.pairs * 64 + p * 64;
          for (int b = 0; b < 2; ++b) {
            const float dw = fp16_to_fp32(load_u16(c + qs_bytes + (r * 2 + b) * 2));
            const float da = x.d[t * x.pairs * 2 + p * 2 + b];
            acc = madd(static_cast<float>(block_dot(type, c, r, b, a)), dw * da, acc);
            if (type == tensor_type::q4_1) {
              const float mw = fp16_to_fp32(load_u16(c + qs_bytes + 16 + (r * 2 + b) * 2));
              acc = madd(mw, x.s[t * x.pairs * 2 + p * 2 + b], acc);
            }
          }
        }
        y[t * ldy + g * 4 + r] = acc;
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
