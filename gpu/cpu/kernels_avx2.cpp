// Kernels for AVX2 with FMA and F16C. Compiled with those flags; only called after isa.cpp
// checked the CPU.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"

namespace tireless::cpu::avx2_impl {

#include "gpu/cpu/portable_kernels.inl"

namespace {

// How far ahead of the cell being multiplied to prefetch weights.
constexpr size_t prefetch_bytes = 4096;

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Half a group (8 rows, one per lane) by T tokens; per (row, token) the same operations
// for any T.
template <tensor_type W, int T>
void tile(const uint8_t* group, int64_t blocks, const q8_view& x, int64_t t0, float* y, int64_t ldy,
          int64_t r0, int half, int64_t rows, bool accumulate) {
  const size_t cell = cell_bytes(W), qs_bytes = cell_qs_bytes(W);
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* c = group + b * cell;
    for (size_t line = 0; line < cell; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(c + prefetch_bytes + line), _MM_HINT_T0);
    }
    __m256i w[8];
    if constexpr (W == tensor_type::q8_0) {
      for (int k = 0; k < 8; ++k) {
        const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + k * 64 + half * 32));
        w[k] = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));  // back to signed q
      }
    } else {
      for (int k = 0; k < 4; ++k) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + k * 64 + half * 32));
        w[k] = _mm256_and_si256(packed, nibble);
        w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + qs_bytes + half * 16)));
    __m256 mw = _mm256_setzero_ps();
    if constexpr (W == tensor_type::q4_1) {
      mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + qs_bytes + 32 + half * 16)));
    }
    for (int t = 0; t < T; ++t) {
      const int64_t at = (t0 + t) * x.blocks + b;
      const int8_t* a = x.q + at * 32;
      __m256i isum;
      if constexpr (W == tensor_type::q8_0) {
        isum = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
          const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(w[k], w[k]),
                                                    _mm256_sign_epi8(broadcast4(a + 4 * k), w[k]));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(prod, ones));
        }
      } else {
        // 8 products of a nibble (< 16) and an int8 fit an int16 lane: 8 · 2 · 15 · 127 < 2^15.
        __m256i sum16 = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(w[k], broadcast4(a + 4 * k)));
        isum = _mm256_madd_epi16(sum16, ones);
        if constexpr (W == tensor_type::q4_0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * x.qsum[at]));
      }
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[at])), acc[t]);
      if constexpr (W == tensor_type::q4_1) acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[at]), acc[t]);
    }
  }
  const int64_t first = r0 + half * 8;
  for (int t = 0; t < T; ++t) {
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[t]);
    float* out = y + (t0 + t) * ldy;
    for (int lane = 0; lane < 8 && first + lane < rows; ++lane) {
      out[first + lane] = accumulate ? out[first + lane] + v[lane] : v[lane];
    }
  }
}

template <tensor_type W>
void matmul_type(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1,
                 float* y, int64_t ldy, bool acc) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w.group(g);
    const int64_t r0 = g * group_rows;
    for (int half = 0; half < 2 && r0 + half * 8 < w.rows(); ++half) {
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) tile<W, 4>(group, w.blocks(), x, t, y, ldy, r0, half, w.rows(), acc);
      switch (n - t) {
        case 3: tile<W, 3>(group, w.blocks(), x, t, y, ldy, r0, half, w.rows(), acc); break;
        case 2: tile<W, 2>(group, w.blocks(), x, t, y, ldy, r0, half, w.rows(), acc); break;
        case 1: tile<W, 1>(group, w.blocks(), x, t, y, ldy, r0, half, w.rows(), acc); break;
        default: break;
      }
    }
  }
}

void matmul_q(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1, float* y,
              int64_t ldy, bool acc) {
  switch (w.type()) {
    case tensor_type::q4_0: matmul_type<tensor_type::q4_0>(w, x, n, g0, g1, y, ldy, acc); break;
    case tensor_type::q4_1: matmul_type<tensor_type::q4_1>(w, x, n, g0, g1, y, ldy, acc); break;
    case tensor_type::q8_0: matmul_type<tensor_type::q8_0>(w, x, n, g0, g1, y, ldy, acc); break;
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
