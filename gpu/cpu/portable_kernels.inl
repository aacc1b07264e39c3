// Kernels written in portable C++ and compiled once per instruction set: included by each
// kernels_<isa>.cpp inside its own namespace, so the compiler vectorizes them for that set.
// Every loop keeps a fixed order of floating-point operations per output value, so a
// result never depends on how many other rows or tokens were computed alongside it.

inline float load_half(uint16_t h) { return fp16_to_fp32(h); }

inline float max_of(float a, float b) { return a > b ? a : b; }

// Converts n fp16 values to float.
inline void halves_to_floats(const uint16_t* src, float* dst, int n) {
  int i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

inline float madd(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(x) for x <= 0 (and -inf), relative error below 2e-7: Cody-Waite range reduction and a
// degree-6 polynomial, written so that loops over it vectorize.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = madd(n, -0.693359375f, x);
  r = madd(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = madd(p, r, 1.3981999507e-3f);
  p = madd(p, r, 8.3334519073e-3f);
  p = madd(p, r, 4.1665795894e-2f);
  p = madd(p, r, 1.6666665459e-1f);
  p = madd(p, r, 5.0000001201e-1f);
  p = madd(p * r, r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return p * scale;
}

void quantize_rows_impl(const float* x, int64_t n, int64_t cols, int64_t ldx, int8_t* q, float* d,
                        float* s, int32_t* qsum, int64_t blocks) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * ldx;
    for (int64_t b = 0; b < blocks; ++b) {
      float v[32];
      const int64_t c0 = b * 32;
      for (int e = 0; e < 32; ++e) v[e] = c0 + e < cols ? xr[c0 + e] : 0.0f;
      float amax = 0.0f;
      for (int e = 0; e < 32; ++e) amax = max_of(amax, __builtin_fabsf(v[e]));
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t* qb = q + (t * blocks + b) * 32;
      int32_t sum = 0;
      for (int e = 0; e < 32; ++e) {
        qb[e] = static_cast<int8_t>(__builtin_nearbyintf(v[e] * inv));
        sum += qb[e];
      }
      d[t * blocks + b] = scale;
      s[t * blocks + b] = scale * static_cast<float>(sum);
      qsum[t * blocks + b] = sum;
    }
  }
}

// One row of a float-typed matrix as floats.
inline void float_row(const packed_matrix& w, int64_t r, float* out) { w.dequantize_row(r, out); }

void matmul_f_impl(const packed_matrix& w, const float* x, int64_t ldx, int64_t n, int64_t g0,
                   int64_t g1, float* y, int64_t ldy, bool accumulate) {
  constexpr int lanes = 16;
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols() + lanes));
  const int64_t cols = w.cols();
  for (int64_t r = g0 * group_rows; r < std::min(g1 * group_rows, w.rows()); ++r) {
    float_row(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xr = x + t * ldx;
      float acc[lanes] = {};
      int64_t c = 0;
      for (; c + lanes <= cols; c += lanes) {
        for (int l = 0; l < lanes; ++l) acc[l] = madd(row[c + l], xr[c + l], acc[l]);
      }
      for (int l = 0; c + l < cols; ++l) acc[l] = madd(row[c + l], xr[c + l], acc[l]);
      float sum = 0.0f;
      for (int l = 0; l < lanes; ++l) sum += acc[l];
      y[t * ldy + r] = accumulate ? y[t * ldy + r] + sum : sum;
    }
  }
}

// Attention for R query rows (R consecutive (token, head) rows of the task) over the keys
// their tokens see, with online softmax, block by block. HD and BS are the head size and
// block size when known at compile time, 0 when given at run time. Each row's arithmetic is
// the same whatever rows share its tile and however many blocks the tile visits (a block a
// row cannot see leaves its state exactly unchanged), so results do not depend on batching.
template <int HD, int BS, int R>
void attention_rows(const attention_args& a, int first_row) {
  constexpr int max_hd = HD ? HD : 256, max_bs = BS ? BS : 64;
  const int hd = HD ? HD : a.head_dim, bs = BS ? BS : a.block_size;
  const float* q[R];
  float* out[R];
  int pos[R];
  for (int r = 0; r < R; ++r) {
    const int row = first_row + r, i = row / a.heads, hh = row % a.heads;
    q[r] = a.q + i * a.q_stride + (a.first_head + hh) * hd;
    out[r] = a.out + i * a.out_stride + (a.first_head + hh) * hd;
    pos[r] = a.start_pos + i;
  }
  float acc[R][max_hd];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    m[r] = -__builtin_inff();
    l[r] = 0.0f;
    for (int e = 0; e < hd; ++e) acc[r][e] = 0.0f;
  }
  const int last_pos = pos[R - 1];
  float kv[max_hd > max_bs ? max_hd : max_bs];
  for (int kb = 0; kb <= last_pos / bs; ++kb) {
    const int first_key = kb * bs;
    const int64_t phys = a.block_table[kb];
    const uint16_t* kp = a.k_base + phys * a.block_stride;  // [hd][bs]
    const uint16_t* vp = a.v_base + phys * a.block_stride;  // [bs][hd]
    // Scores, two partial sums per row (even and odd dimensions) to overlap FMA latency.
    float s0[R][max_bs], s1[R][max_bs];
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < bs; ++j) s0[r][j] = s1[r][j] = 0.0f;
    }
    for (int e = 0; e < hd; e += 2) {
      float k0[max_bs], k1[max_bs];
      halves_to_floats(kp + e * bs, k0, bs);
      halves_to_floats(kp + (e + 1) * bs, k1, bs);
      for (int r = 0; r < R; ++r) {
        const float q0 = q[r][e], q1 = q[r][e + 1];
        for (int j = 0; j < bs; ++j) {
          s0[r][j] = madd(q0, k0[j], s0[r][j]);
          s1[r][j] = madd(q1, k1[j], s1[r][j]);
        }
      }
    }
    int most_valid = 0;
    float p[R][max_bs];
    for (int r = 0; r < R; ++r) {
      const int n_valid = std::min(bs, pos[r] + 1 - first_key);
      most_valid = std::max(most_valid, n_valid);
      float bmax = -__builtin_inff();
      for (int j = 0; j < bs; ++j) {
        p[r][j] = (s0[r][j] + s1[r][j]) * a.scale;
        if (j < n_valid) bmax = max_of(bmax, p[r][j]);
      }
      const float m_new = max_of(m[r], bmax);
      const float corr = m[r] == -__builtin_inff() ? 0.0f : exp_nonpositive(m[r] - m_new);
      float sum = 0.0f;
      for (int j = 0; j < bs; ++j) {
        p[r][j] = j < n_valid ? exp_nonpositive(p[r][j] - m_new) : 0.0f;
        sum += p[r][j];
      }
      l[r] = madd(l[r], corr, sum);
      m[r] = m_new;
      for (int e = 0; e < hd; ++e) acc[r][e] *= corr;
    }
    for (int j = 0; j < most_valid; ++j) {
      halves_to_floats(vp + j * hd, kv, hd);
      for (int r = 0; r < R; ++r) {
        const float pj = p[r][j];
        for (int e = 0; e < hd; ++e) acc[r][e] = madd(pj, kv[e], acc[r][e]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const float inv = 1.0f / l[r];
    for (int e = 0; e < hd; ++e) out[r][e] = acc[r][e] * inv;
  }
}

template <int HD, int BS>
void attention_tiles(const attention_args& a) {
  constexpr int R = 4;
  const int n_rows = a.n_new * a.heads;
  int row = 0;
  for (; row + R <= n_rows; row += R) attention_rows<HD, BS, R>(a, row);
  switch (n_rows - row) {
    case 3: attention_rows<HD, BS, 3>(a, row); break;
    case 2: attention_rows<HD, BS, 2>(a, row); break;
    case 1: attention_rows<HD, BS, 1>(a, row); break;
    default: break;
  }
}

void attention_impl(const attention_args& a) {
  assert(a.head_dim % 2 == 0 && a.head_dim <= 256 && a.block_size <= 64);
  if (a.block_size == 16) {
    switch (a.head_dim) {
      case 64: return attention_tiles<64, 16>(a);
      case 128: return attention_tiles<128, 16>(a);
      case 32: return attention_tiles<32, 16>(a);
      case 16: return attention_tiles<16, 16>(a);
      default: break;
    }
  }
  if (a.block_size == 32 && a.head_dim == 64) return attention_tiles<64, 32>(a);
  attention_tiles<0, 0>(a);
}

void rms_norm_impl(const float* x, const float* w, float* out, int64_t n, float eps) {
  constexpr int lanes = 16;
  float acc[lanes] = {};
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int l = 0; l < lanes; ++l) acc[l] = madd(x[i + l], x[i + l], acc[l]);
  }
  for (int l = 0; i + l < n; ++l) acc[l] = madd(x[i + l], x[i + l], acc[l]);
  float sum = 0.0f;
  for (int l = 0; l < lanes; ++l) sum += acc[l];
  const float scale = 1.0f / __builtin_sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] * scale * w[j];
}

void silu_mul_impl(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float e = exp_nonpositive(-__builtin_fabsf(g[i]));
    const float sigmoid = g[i] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    out[i] = g[i] * sigmoid * u[i];
  }
}

void floats_to_halves_impl(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
  }
#endif
  for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}
