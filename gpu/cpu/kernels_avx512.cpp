// Kernels for AVX-512 (F, BW, VL, VNNI) with F16C and FMA. Compiled with those flags; only
// called after isa.cpp checked the CPU.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"

namespace tireless::cpu::avx512_impl {

#include "gpu/cpu/portable_kernels.inl"

namespace {

// Lanes of a 16 x int32 dot-product result belong to block 0 (lanes 0-3 and 8-11) or block 1
// (lanes 4-7 and 12-15) of a cell, following the kernel order of the bytes.
inline __m512i pair_lane_index(int b0, int b1) {
  return _mm512_setr_epi32(b0, b0, b0, b0, b1, b1, b1, b1, b0, b0, b0, b0, b1, b1, b1, b1);
}

inline __m512i unpack_q4(const uint8_t* qs) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(x, mask);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
}

template <tensor_type W>
constexpr int qs_row_bytes = W == tensor_type::q8_0 ? 64 : 32;

// A tile of 4 rows (one group) by T tokens. Per (row, token) the operations are the same
// for every T, which keeps results independent of the batch.
template <tensor_type W, int T>
void tile(const uint8_t* group, int64_t pairs, const q8_view& x, int64_t t0, float* y, int64_t ldy,
          int64_t r0, int64_t rows) {
  constexpr size_t qs_bytes = 4 * qs_row_bytes<W>;
  const size_t cell = cell_bytes(W);
  __m512 acc[4][T];
  __m256 acc_min[T];
  for (int t = 0; t < T; ++t) {
    acc_min[t] = _mm256_setzero_ps();
    for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_setzero_ps();
  }
  const __m512i da_index = pair_lane_index(0, 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const uint8_t* c = group + p * cell;
    const __m512 d_all = _mm512_zextps256_ps512(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + qs_bytes))));
    __m512i a[T];
    __m512 da[T];
    __m512i init[T];
    for (int t = 0; t < T; ++t) {
      const int64_t row = (t0 + t);
      a[t] = _mm512_loadu_si512(x.q + row * x.pairs * 64 + p * 64);
      const __m128 d2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.d + row * x.pairs * 2 + p * 2)));
      da[t] = _mm512_permutexvar_ps(da_index, _mm512_zextps128_ps512(d2));
      if constexpr (W == tensor_type::q4_0) {
        init[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), a[t]));
      } else if constexpr (W == tensor_type::q8_0) {
        init[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), a[t]));
      } else {
        init[t] = _mm512_setzero_si512();
      }
    }
    for (int r = 0; r < 4; ++r) {
      __m512i w;
      if constexpr (W == tensor_type::q8_0) {
        w = _mm512_xor_si512(_mm512_loadu_si512(c + r * 64), _mm512_set1_epi8(static_cast<char>(0x80)));
      } else {
        w = unpack_q4(c + r * 32);
      }
      const __m512 dw = _mm512_permutexvar_ps(pair_lane_index(2 * r, 2 * r + 1), d_all);
      for (int t = 0; t < T; ++t) {
        const __m512i isum = _mm512_dpbusd_epi32(init[t], w, a[t]);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, da[t]), acc[r][t]);
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
      float v = _mm512_reduce_add_ps(acc[r][t]);
      if constexpr (W == tensor_type::q4_1) v += mins[2 * r] + mins[2 * r + 1];
      y[(t0 + t) * ldy + r0 + r] = v;
    }
  }
}

template <tensor_type W>
void matmul_type(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1,
                 float* y, int64_t ldy) {
  constexpr int tile_tokens = 4;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w.group(g);
    int64_t t = 0;
    for (; t + tile_tokens <= n; t += tile_tokens)
      tile<W, tile_tokens>(group, w.pairs(), x, t, y, ldy, g * 4, w.rows());
    switch (n - t) {
      case 3: tile<W, 3>(group, w.pairs(), x, t, y, ldy, g * 4, w.rows()); break;
      case 2: tile<W, 2>(group, w.pairs(), x, t, y, ldy, g * 4, w.rows()); break;
      case 1: tile<W, 1>(group, w.pairs(), x, t, y, ldy, g * 4, w.rows()); break;
      default: break;
    }
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

}  // namespace tireless::cpu::avx512_impl

namespace tireless::cpu {

const isa_kernels& avx512_kernels() {
  static const isa_kernels k{isa::avx512, avx512_impl::quantize_rows_impl, avx512_impl::matmul_q,
                             avx512_impl::matmul_f_impl, avx512_impl::attention_impl,
                             avx512_impl::rms_norm_impl, avx512_impl::silu_mul_impl,
                             avx512_impl::floats_to_halves_impl};
  return k;
}

}  // namespace tireless::cpu
