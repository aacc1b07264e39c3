// Kernels written in portable C++ and compiled once per instruction set: included by each
// kernels_<isa>.cpp inside its own namespace, so the compiler vectorizes them for that set.
// Every loop keeps a fixed order of floating-point operations per output value, so a
// result never depends on how many other rows or tokens were computed alongside it.

inline float load_half(uint16_t h) { return fp16_to_fp32(h); }

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
                        float* s, int64_t pairs) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * ldx;
    for (int64_t b = 0; b < pairs * 2; ++b) {
      float v[32];
      const int64_t c0 = b * 32;
      for (int e = 0; e < 32; ++e) v[e] = c0 + e < cols ? xr[c0 + e] : 0.0f;
      float amax = 0.0f;
      for (int e = 0; e < 32; ++e) amax = __builtin_fmaxf(amax, __builtin_fabsf(v[e]));
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t qv[32];
      int32_t sum = 0;
      for (int e = 0; e < 32; ++e) {
        qv[e] = static_cast<int8_t>(__builtin_nearbyintf(v[e] * inv));
        sum += qv[e];
      }
      int8_t* cell = q + t * pairs * 64 + (b / 2) * 64;
      const int half = static_cast<int>(b % 2);
      __builtin_memcpy(cell + half * 16, qv, 16);
      __builtin_memcpy(cell + 32 + half * 16, qv + 16, 16);
      d[t * pairs * 2 + b] = scale;
      s[t * pairs * 2 + b] = scale * static_cast<float>(sum);
    }
  }
}

// One row of a float-typed matrix as floats.
inline void float_row(const packed_matrix& w, int64_t r, float* out) { w.dequantize_row(r, out); }

void matmul_f_impl(const packed_matrix& w, const float* x, int64_t ldx, int64_t n, int64_t g0,
                   int64_t g1, float* y, int64_t ldy) {
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
      y[t * ldy + r] = sum;
    }
  }
}

void attention_impl(const attention_args& a) {
  const int bs = a.block_size, hd = a.head_dim, heads = a.heads;
  const int n_rows = a.n_new * heads;
  float* kt = a.scratch;       // [hd][bs], keys transposed
  float* vf = kt + hd * bs;    // [bs][hd]
  float* sc = vf + bs * hd;    // [bs]
  float* m = a.scratch + attention_scratch_floats(bs, hd, 0, 0);
  float* l = m + n_rows;
  for (int i = 0; i < n_rows; ++i) {
    m[i] = -__builtin_inff();
    l[i] = 0.0f;
  }
  for (int i = 0; i < a.n_new; ++i) {
    float* o = a.out + i * a.out_stride + a.first_head * hd;
    for (int e = 0; e < heads * hd; ++e) o[e] = 0.0f;
  }
  const int last_pos = a.start_pos + a.n_new - 1;
  const int n_blocks = last_pos / bs + 1;
  float kv[512];
  assert(hd <= 512);
  for (int kb = 0; kb < n_blocks; ++kb) {
    const int first_key = kb * bs;
    const int valid = std::min(bs, last_pos + 1 - first_key);
    const int64_t phys = a.block_table[kb];
    const uint16_t* kp = a.k_base + phys * a.block_stride;
    const uint16_t* vp = a.v_base + phys * a.block_stride;
    for (int j = 0; j < bs; ++j) {
      if (j < valid) {
        halves_to_floats(kp + j * hd, kv, hd);
        for (int e = 0; e < hd; ++e) kt[e * bs + j] = kv[e];
        halves_to_floats(vp + j * hd, vf + j * hd, hd);
      } else {
        for (int e = 0; e < hd; ++e) kt[e * bs + j] = 0.0f;
        for (int e = 0; e < hd; ++e) vf[j * hd + e] = 0.0f;
      }
    }
    const int i0 = std::max(0, first_key - a.start_pos);
    for (int i = i0; i < a.n_new; ++i) {
      const int n_valid = std::min(bs, a.start_pos + i + 1 - first_key);
      for (int hh = 0; hh < heads; ++hh) {
        const int row = i * heads + hh;
        const float* qv = a.q + i * a.q_stride + (a.first_head + hh) * hd;
        float* o = a.out + i * a.out_stride + (a.first_head + hh) * hd;
        for (int j = 0; j < bs; ++j) sc[j] = 0.0f;
        for (int e = 0; e < hd; ++e) {
          const float qe = qv[e];
          for (int j = 0; j < bs; ++j) sc[j] = madd(qe, kt[e * bs + j], sc[j]);
        }
        float bmax = -__builtin_inff();
        for (int j = 0; j < n_valid; ++j) {
          sc[j] *= a.scale;
          bmax = __builtin_fmaxf(bmax, sc[j]);
        }
        const float m_new = __builtin_fmaxf(m[row], bmax);
        const float corr = m[row] == -__builtin_inff() ? 0.0f : exp_nonpositive(m[row] - m_new);
        float sum = 0.0f;
        for (int j = 0; j < bs; ++j) {
          sc[j] = j < n_valid ? exp_nonpositive(sc[j] - m_new) : 0.0f;
          sum += sc[j];
        }
        l[row] = madd(l[row], corr, sum);
        m[row] = m_new;
        for (int e = 0; e < hd; ++e) o[e] *= corr;
        for (int j = 0; j < bs; ++j) {
          const float p = sc[j];
          for (int e = 0; e < hd; ++e) o[e] = madd(p, vf[j * hd + e], o[e]);
        }
      }
    }
  }
  for (int i = 0; i < a.n_new; ++i) {
    for (int hh = 0; hh < heads; ++hh) {
      float* o = a.out + i * a.out_stride + (a.first_head + hh) * hd;
      const float inv = 1.0f / l[i * heads + hh];
      for (int e = 0; e < hd; ++e) o[e] *= inv;
    }
  }
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
