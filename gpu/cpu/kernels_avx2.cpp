// Kernels for AVX2 with FMA and F16C. Compiled with those flags; only called after isa.cpp
// checked the CPU.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"

namespace tireless::cpu::avx2_impl {

#include "gpu/cpu/portable_kernels.inl"

namespace {

// Eight int32 lanes of a cell's dot product: lanes 0-3 belong to block 0, 4-7 to block 1.
inline __m256i pair_lane_index(int b0, int b1) {
  return _mm256_setr_epi32(b0, b0, b0, b0, b1, b1, b1, b1);
}

inline __m256i sum_pairs(__m256i lo16, __m256i hi16) {
  return _mm256_madd_epi16(_mm256_add_epi16(lo16, hi16), _mm256_set1_epi16(1));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// A tile of 4 rows (one group) by T tokens; per (row, token) the same operations for any T.
template <tensor_type W, int T>
void tile(const uint8_t* group, int64_t pairs, const q8_view& x, int64_t t0, float* y, int64_t ldy,
          int64_t r0, int64_t rows) {
  constexpr size_t qs_bytes = W == tensor_type::q8_0 ? 4 * 64 : 4 * 32;
  const size_t cell = cell_bytes(W);
  __m256 acc[4][T];
  __m256 acc_min[T];
  for (int t = 0; t < T; ++t) {
    acc_min[t] = _mm256_setzero_ps();
    for (int r = 0; r < 4; ++r) acc[r][t] = _mm256_setzero_ps();
  }
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint8_t* c = group + p * cell;
    const __m256 d_all = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + qs_bytes)));
    __m256i a_lo[T], a_hi[T], corr[T];
    __m256 da[T];
    for (int t = 0; t < T; ++t) {
      const int8_t* ap = x.q + (t0 + t) * x.pairs * 64 + p * 64;
      a_lo[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ap));
      a_hi[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ap + 32));
      const __m128 d2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.d + (t0 + t) * x.pairs * 2 + p * 2)));
      da[t] = _mm256_permutevar8x32_ps(_mm256_zextps128_ps256(d2), pair_lane_index(0, 1));
      if constexpr (W == tensor_type::q4_0) {
        const __m256i eight = _mm256_set1_epi8(8);
        corr[t] = sum_pairs(_mm256_maddubs_epi16(eight, a_lo[t]), _mm256_maddubs_epi16(eight, a_hi[t]));
      }
    }
    for (int r = 0; r < 4; ++r) {
      const __m256 dw = _mm256_permutevar8x32_ps(d_all, pair_lane_index(2 * r, 2 * r + 1));
      if constexpr (W == tensor_type::q8_0) {
        const __m256i w_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * 64));
        const __m256i w_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * 64 + 32));
        const __m256i abs_lo = _mm256_sign_epi8(w_lo, w_lo), abs_hi = _mm256_sign_epi8(w_hi, w_hi);
        const __m256i ones = _mm256_set1_epi16(1);
        for (int t = 0; t < T; ++t) {
          const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_lo, _mm256_sign_epi8(a_lo[t], w_lo)), ones);
          const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_hi, _mm256_sign_epi8(a_hi[t], w_hi)), ones);
          const __m256i isum = _mm256_add_epi32(lo, hi);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da[t]), acc[r][t]);
        }
      } else {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * 32));
        const __m256i w_lo = _mm256_and_si256(q, nibble);
        const __m256i w_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
        for (int t = 0; t < T; ++t) {
          __m256i isum = sum_pairs(_mm256_maddubs_epi16(w_lo, a_lo[t]), _mm256_maddubs_epi16(w_hi, a_hi[t]));
          if constexpr (W == tensor_type::q4_0) isum = _mm256_sub_epi32(isum, corr[t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da[t]), acc[r][t]);
        }
      }
    }
    if constexpr (W == tensor_type::q4_1) {
      const __m256 m_all = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + qs_bytes + 16)));
      for (int t = 0; t < T; ++t) {
        const __m256 s2 = _mm256_castpd_ps(_mm256_broadcast_sd(
            reinterpret_cast<const double*>(x.s + (t0 + t) * x.pairs * 2 + p * 2)));
        acc_min[t] = _mm256_fmadd_ps(m_all, s2, acc_min[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    alignas(32) float mins[8];
    _mm256_store_ps(mins, acc_min[t]);
    for (int r = 0; r < 4 && r0 + r < rows; ++r) {
      float v = hsum(acc[r][t]);
      if constexpr (W == tensor_type::q4_1) v += mins[2 * r] + mins[2 * r + 1];
      y[(t0 + t) * ldy + r0 + r] = v;
    }
  }
}

template <tensor_type W>
void matmul_type(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1,
                 float* y, int64_t ldy) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w.group(g);
    int64_t t = 0;
    for (; t + 2 <= n; t += 2) tile<W, 2>(group, w.pairs(), x, t, y, ldy, g * 4, w.rows());
    if (t < n) tile<W, 1>(group, w.pairs(), x, t, y, ldy, g * 4, w.rows());
  }
}

void matmul_q(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1, float* y,
              int64_t ldy) {
  switch (w.type()) {
    case tensor_type::q4_0: matmul_type<tensor_type::q4_0>(w, x, n, g0, g1, y, ldy); break;
    case tensor_type::q4_1: matmul_type<tensor_type::q4_1>(w, x, n, g0, g1, y, ldy); break;
    case tensor_type::q8_0: matmul_type<tensor_type::q8_0>(w, x, n, g0, g1, y, ldy); break;
    default: break;
  }
}

}  // namespace

}  // namespace tireless::cpu::avx2_impl

namespace tireless::cpu {

const isa_kernels& avx2_kernels() {
  static const isa_kernels k{isa::avx2, avx2_impl::quantize_rows_impl, avx2_impl::matmul_q,
                             avx2_impl::matmul_f_impl, avx2_impl::attention_impl,
                             avx2_impl::rms_norm_impl, avx2_impl::silu_mul_impl,
                             avx2_impl::floats_to_halves_impl};
  return k;
}

}  // namespace tireless::cpu
