// Kernels for AVX-512 (F, BW, VL, VNNI) with F16C and FMA. Compiled with those flags; only
// called after isa.cpp checked the CPU.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "gpu/cpu/half.hpp"
#include "gpu/cpu/isa_kernels.hpp"

namespace tireless::cpu::avx512_impl {

#include "gpu/cpu/portable_kernels.inl"

namespace {

// How far ahead of the cell being multiplied to prefetch weights.
constexpr size_t prefetch_bytes = 4096;

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// A tile of one group (16 rows, one per lane) by T tokens. Per (row, token) the operations
// are the same for every T, which keeps results independent of the batch.
template <tensor_type W, int T>
void tile(const uint8_t* group, int64_t blocks, const q8_view& x, int64_t t0, float* y, int64_t ldy,
          int64_t r0, int64_t rows, bool accumulate) {
  const size_t cell = cell_bytes(W), qs_bytes = cell_qs_bytes(W);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* c = group + b * cell;
    // The weights stream through once per token tile: fetch ahead of the hardware prefetcher.
    for (size_t line = 0; line < cell; line += 64) {
      if (prefetch_bytes) _mm_prefetch(reinterpret_cast<const char*>(c + prefetch_bytes + line), _MM_HINT_T0);
    }
    __m512i w[8];
    if constexpr (W == tensor_type::q8_0) {
      for (int k = 0; k < 8; ++k) w[k] = _mm512_loadu_si512(c + k * 64);
    } else {
      for (int k = 0; k < 4; ++k) {
        const __m512i packed = _mm512_loadu_si512(c + k * 64);
        w[k] = _mm512_and_si512(packed, nibble);
        w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + qs_bytes)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (W == tensor_type::q4_1) {
      mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + qs_bytes + 32)));
    }
    for (int t = 0; t < T; ++t) {
      const int64_t at = (t0 + t) * x.blocks + b;
      const int8_t* a = x.q + at * 32;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      if constexpr (W == tensor_type::q4_0) s0 = _mm512_set1_epi32(-8 * x.qsum[at]);
      if constexpr (W == tensor_type::q8_0) s0 = _mm512_set1_epi32(-128 * x.qsum[at]);
      for (int k = 0; k < 8; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[k], broadcast4(a + 4 * k));
        s1 = _mm512_dpbusd_epi32(s1, w[k + 1], broadcast4(a + 4 * k + 4));
      }
      const __m512i isum = _mm512_add_epi32(s0, s1);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[at])), acc[t]);
      if constexpr (W == tensor_type::q4_1) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[at]), acc[t]);
    }
  }
  const __mmask16 live = rows - r0 >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (rows - r0)) - 1u);
  for (int t = 0; t < T; ++t) {
    float* out = y + (t0 + t) * ldy + r0;
    const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(live, out), acc[t]) : acc[t];
    _mm512_mask_storeu_ps(out, live, v);
  }
}

template <tensor_type W>
void matmul_type(const packed_matrix& w, const q8_view& x, int64_t n, int64_t g0, int64_t g1,
                 float* y, int64_t ldy, bool acc) {
  constexpr int tile_tokens = 8;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w.group(g);
    const int64_t r0 = g * group_rows;
    int64_t t = 0;
    for (; t + tile_tokens <= n; t += tile_tokens) tile<W, tile_tokens>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc);
    switch (n - t) {
      case 7: tile<W, 7>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      case 6: tile<W, 6>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      case 5: tile<W, 5>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      case 4: tile<W, 4>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      case 3: tile<W, 3>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      case 2: tile<W, 2>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      case 1: tile<W, 1>(group, w.blocks(), x, t, y, ldy, r0, w.rows(), acc); break;
      default: break;
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

// exp(x) for x <= 0, lane by lane: the same operations as exp_nonpositive, so a lane's
// result equals the scalar function's.
inline __m512 exp_nonpositive_v(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// attention_rows for head size 64 and blocks of 16 tokens, in AVX-512: one block's scores
// of a row fill one register. Same per-row arithmetic for every R (see attention_rows).
template <int R>
void attention_rows_64x16(const attention_args& a, int first_row) {
  constexpr int hd = 64, bs = 16;
  const float* q[R];
  float* out[R];
  int pos[R];
  for (int r = 0; r < R; ++r) {
    const int row = first_row + r, i = row / a.heads, hh = row % a.heads;
    q[r] = a.q + i * a.q_stride + (a.first_head + hh) * hd;
    out[r] = a.out + i * a.out_stride + (a.first_head + hh) * hd;
    pos[r] = a.start_pos + i;
  }
  __m512 acc[R][4];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    m[r] = -__builtin_inff();
    l[r] = 0.0f;
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const __m512 scale = _mm512_set1_ps(a.scale);
  const int last_pos = pos[R - 1];
  for (int kb = 0; kb <= last_pos / bs; ++kb) {
    const int first_key = kb * bs;
    const int64_t phys = a.block_table[kb];
    const uint16_t* kp = a.k_base + phys * a.block_stride;
    const uint16_t* vp = a.v_base + phys * a.block_stride;
    __m512 s0[R], s1[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
    for (int e = 0; e < hd; e += 2) {
      const __m512 k0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp + e * bs)));
      const __m512 k1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp + (e + 1) * bs)));
      for (int r = 0; r < R; ++r) {
        s0[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][e]), k0, s0[r]);
        s1[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][e + 1]), k1, s1[r]);
      }
    }
    alignas(64) float p[R][bs];
    int most_valid = 0;
    for (int r = 0; r < R; ++r) {
      const int n_valid = std::clamp(pos[r] + 1 - first_key, 0, bs);
      most_valid = std::max(most_valid, n_valid);
      const __mmask16 valid = static_cast<__mmask16>((1u << n_valid) - 1u);
      const __m512 sc = _mm512_mul_ps(_mm512_add_ps(s0[r], s1[r]), scale);
      const float bmax = _mm512_mask_reduce_max_ps(valid, sc);
      const float m_new = max_of(m[r], bmax);
      const float corr = m[r] == -__builtin_inff() ? 0.0f : exp_nonpositive(m[r] - m_new);
      const __m512 pr = _mm512_maskz_mov_ps(valid, exp_nonpositive_v(_mm512_sub_ps(sc, _mm512_set1_ps(m_new))));
      _mm512_store_ps(p[r], pr);
      float sum = 0.0f;
      for (int j = 0; j < bs; ++j) sum += p[r][j];
      l[r] = madd(l[r], corr, sum);
      m[r] = m_new;
      const __m512 c = _mm512_set1_ps(corr);
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_mul_ps(acc[r][k], c);
    }
    for (int j = 0; j < most_valid; ++j) {
      __m512 v[4];
      for (int k = 0; k < 4; ++k)
        v[k] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vp + j * hd + 16 * k)));
      for (int r = 0; r < R; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r][j]);
        for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_fmadd_ps(pj, v[k], acc[r][k]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(out[r] + 16 * k, _mm512_mul_ps(acc[r][k], inv));
  }
}

void silu_mul(const float* g, const float* u, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = exp_nonpositive_v(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __m512 one = _mm512_set1_ps(1.0f), denom = _mm512_add_ps(one, e);
    const __mmask16 positive = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
    const __m512 sigmoid = _mm512_div_ps(_mm512_mask_blend_ps(positive, e, one), denom);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(x, sigmoid), _mm512_loadu_ps(u + i)));
  }
  if (i < n) silu_mul_impl(g + i, u + i, out + i, n - i);
}

// Quantizes each 32-value block to int8 with scale max|x| / 127 (see quantize_rows_impl,
// whose results these equal).
void quantize_rows(const float* x, int64_t n, int64_t cols, int64_t ldx, int8_t* q, float* d,
                   float* s, int32_t* qsum, int64_t blocks) {
  if (cols % 32 != 0) return quantize_rows_impl(x, n, cols, ldx, q, d, s, qsum, blocks);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + t * ldx + b * 32;
      const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512 iv = _mm512_set1_ps(inv);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      int8_t* qb = q + (t * blocks + b) * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(q1));
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      const float scale = amax / 127.0f;
      d[t * blocks + b] = scale;
      s[t * blocks + b] = scale * static_cast<float>(sum);
      qsum[t * blocks + b] = sum;
    }
  }
}

void attention(const attention_args& a) {
  if (a.head_dim != 64 || a.block_size != 16) return attention_impl(a);
  constexpr int R = 4;
  const int n_rows = a.n_new * a.heads;
  int row = 0;
  for (; row + R <= n_rows; row += R) attention_rows_64x16<R>(a, row);
  switch (n_rows - row) {
    case 3: attention_rows_64x16<3>(a, row); break;
    case 2: attention_rows_64x16<2>(a, row); break;
    case 1: attention_rows_64x16<1>(a, row); break;
    default: break;
  }
}

}  // namespace

}  // namespace tireless::cpu::avx512_impl

namespace tireless::cpu {

const isa_kernels& avx512_kernels() {
  static const isa_kernels k{isa::avx512, avx512_impl::quantize_rows, avx512_impl::matmul_q,
                             avx512_impl::matmul_f_impl, avx512_impl::attention,
                             avx512_impl::rms_norm_impl, avx512_impl::silu_mul,
                             avx512_impl::floats_to_halves_impl};
  return k;
}

}  // namespace tireless::cpu
