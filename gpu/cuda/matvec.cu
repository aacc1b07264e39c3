#include "gpu/cuda/device.cuh"
#include "gpu/cuda/matvec.cuh"
#include "gpu/cuda/quant.cuh"

#include <array>
#include <mutex>
#include <stdexcept>
#include <string>

namespace tireless::cuda::detail {

namespace {

constexpr int rows_per_warp = 2;
constexpr int blocks_in_flight = 2;  // per lane and row, loaded before the first is used
constexpr int q_stride = 48;         // bytes of a staged 32-value block of int8 (16 of padding)
constexpr int f_stride = 12;         // floats of a staged 8-value chunk of f32 (4 of padding)

// A 16-lane-phase read of 16 bytes at a 48-byte (or 12-float) stride touches 8 distinct
// 4-bank groups: the staged activations are read without bank conflicts.

// The pair's group: the last g with offsets[g] <= p (offsets has groups + 1 entries).
__device__ __forceinline__ int group_of(const int32_t* offsets, int32_t groups, int32_t p) {
  int lo = 0, hi = groups;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

struct target {
  int64_t tok0 = 0, row_base = 0, row_limit = 0;
};

__device__ __forceinline__ bool find_target(const device_matrix& w, int32_t n, const int32_t* offsets, int32_t groups,
                                            int64_t rows_per_group, target& t) {
  t.row_limit = w.rows;
  if (!offsets) return true;
  t.tok0 = blockIdx.y;
  if (t.tok0 >= n) return false;
  t.row_base = static_cast<int64_t>(group_of(offsets, groups, static_cast<int32_t>(t.tok0))) * rows_per_group;
  t.row_limit = rows_per_group;
  return true;
}

// Quantized weights times int8 activations. Shared memory: [NT][nb] staged blocks of
// q_stride bytes, then d [NT][nb] and s [NT][nb] floats.
template <tensor_type T, int NT>
__global__ void __launch_bounds__(256) matvec_q8_kernel(device_matrix w, q8_rows x, int32_t n, float* y, int64_t ldy,
                                                        int accumulate, const int32_t* offsets, int32_t groups,
                                                        int64_t rows_per_group) {
  extern __shared__ __align__(16) uint8_t smem[];
  target tg;
  if (!find_target(w, n, offsets, groups, rows_per_group, tg)) return;  // the whole block
  const int64_t nb = w.cols / 32;
  uint8_t* xq = smem;
  float* xd = reinterpret_cast<float*>(smem + NT * nb * q_stride);
  float* xs = xd + NT * nb;
  for (int64_t i = threadIdx.x; i < NT * nb * 2; i += blockDim.x) {
    const int64_t t = i / (nb * 2), b = (i / 2) % nb, part = i % 2;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tg.tok0 + t < n) v = *reinterpret_cast<const uint4*>(x.q + ((tg.tok0 + t) * nb + b) * 32 + part * 16);
    *reinterpret_cast<uint4*>(xq + (t * nb + b) * q_stride + part * 16) = v;
  }
  for (int64_t i = threadIdx.x; i < NT * nb; i += blockDim.x) {
    const int64_t t = i / nb, b = i % nb;
    const bool valid = tg.tok0 + t < n;
    xd[i] = valid ? x.d[(tg.tok0 + t) * nb + b] : 0.0f;
    xs[i] = valid ? x.s[(tg.tok0 + t) * nb + b] : 0.0f;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * warps + warp) * rows_per_warp;
  if (r0 >= tg.row_limit) return;
  const bool second = r0 + 1 < tg.row_limit;
  const int64_t rows[rows_per_warp] = {tg.row_base + r0, tg.row_base + r0 + (second ? 1 : 0)};
  constexpr int qb = block_qs_bytes<T>();
  const auto* dq = static_cast<const unsigned short*>(w.d);
  const auto* mq = static_cast<const unsigned short*>(w.m);
  float acc[rows_per_warp][NT];
#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[rr][t] = 0.0f;
  }
  for (int64_t b0 = lane; b0 < nb; b0 += 32 * blocks_in_flight) {
    uint4 wq[blocks_in_flight][rows_per_warp][qb / 16];
    float wd[blocks_in_flight][rows_per_warp], wm[blocks_in_flight][rows_per_warp];
#pragma unroll
    for (int k = 0; k < blocks_in_flight; ++k) {
      const int64_t b = b0 + 32 * k;
      if (b >= nb) continue;
#pragma unroll
      for (int rr = 0; rr < rows_per_warp; ++rr) {
        const auto* q = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.qs) + rows[rr] * w.qs_row_bytes + b * qb);
#pragma unroll
        for (int c = 0; c < qb / 16; ++c) wq[k][rr][c] = __ldg(q + c);
        wd[k][rr] = half_bits_to_float(__ldg(dq + rows[rr] * nb + b));
        wm[k][rr] = T == tensor_type::q4_1 ? half_bits_to_float(__ldg(mq + rows[rr] * nb + b)) : 0.0f;
      }
    }
#pragma unroll
    for (int k = 0; k < blocks_in_flight; ++k) {
      const int64_t b = b0 + 32 * k;
      if (b >= nb) continue;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int4* xv = reinterpret_cast<const int4*>(xq + (t * nb + b) * q_stride);
        const int4 lo = xv[0], hi = xv[1];
        const int xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const float dx = xd[t * nb + b];
#pragma unroll
        for (int rr = 0; rr < rows_per_warp; ++rr) {
          int isum;
          if constexpr (T == tensor_type::q8_0) {
            isum = dot_q8(wq[k][rr][0], wq[k][rr][qb / 16 - 1], xw);
          } else {
            isum = dot_q4<T>(wq[k][rr][0], xw);
          }
          // As the CPU: acc += isum · (d_w · d_x), then (q4_1) acc += m_w · s_x.
          acc[rr][t] = fmaf(static_cast<float>(isum), __fmul_rn(wd[k][rr], dx), acc[rr][t]);
          if constexpr (T == tensor_type::q4_1) acc[rr][t] = fmaf(wm[k][rr], xs[t * nb + b], acc[rr][t]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[rr][t]);
      if (lane == 0 && (rr == 0 || second) && tg.tok0 + t < n) {
        float& out = y[(tg.tok0 + t) * ldy + r0 + rr];
        out = accumulate ? out + v : v;
      }
    }
  }
}

// Float weights (cols a multiple of 8) times f32 activations: lanes take 8-value chunks.
// Shared memory: [NT][cols / 8] chunks of f_stride floats.
template <tensor_type T, int NT>
__global__ void __launch_bounds__(256) matvec_f_kernel(device_matrix w, const float* x, int64_t ldx, int32_t n, float* y,
                                                       int64_t ldy, int accumulate, const int32_t* offsets,
                                                       int32_t groups, int64_t rows_per_group) {
  extern __shared__ __align__(16) uint8_t smem[];
  target tg;
  if (!find_target(w, n, offsets, groups, rows_per_group, tg)) return;
  const int64_t nc = w.cols / 8;
  float* xf = reinterpret_cast<float*>(smem);
  for (int64_t i = threadIdx.x; i < NT * w.cols; i += blockDim.x) {
    const int64_t t = i / w.cols, c = i % w.cols;
    xf[(t * nc + c / 8) * f_stride + c % 8] = tg.tok0 + t < n ? x[(tg.tok0 + t) * ldx + c] : 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * warps + warp) * rows_per_warp;
  if (r0 >= tg.row_limit) return;
  const bool second = r0 + 1 < tg.row_limit;
  const int64_t rows[rows_per_warp] = {tg.row_base + r0, tg.row_base + r0 + (second ? 1 : 0)};
  float acc[rows_per_warp][NT];
#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[rr][t] = 0.0f;
  }
  for (int64_t c = lane; c < nc; c += 32) {
    float wv[rows_per_warp][8];
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
      const uint8_t* row = static_cast<const uint8_t*>(w.qs) + rows[rr] * w.qs_row_bytes;
      if constexpr (T == tensor_type::f32) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(row) + 2 * c);
        const float4 b = __ldg(reinterpret_cast<const float4*>(row) + 2 * c + 1);
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) wv[rr][e] = v[e];
      } else {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(row) + c);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const auto lo = static_cast<uint16_t>(words[e] & 0xFFFFu), hi = static_cast<uint16_t>(words[e] >> 16);
          wv[rr][2 * e] = T == tensor_type::f16 ? half_bits_to_float(lo) : bf16_bits_to_float(lo);
          wv[rr][2 * e + 1] = T == tensor_type::f16 ? half_bits_to_float(hi) : bf16_bits_to_float(hi);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4* xv = reinterpret_cast<const float4*>(xf + (t * nc + c) * f_stride);
      const float4 a = xv[0], b = xv[1];
      const float xe[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[rr][t] = fmaf(wv[rr][e], xe[e], acc[rr][t]);
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[rr][t]);
      if (lane == 0 && (rr == 0 || second) && tg.tok0 + t < n) {
        float& out = y[(tg.tok0 + t) * ldy + r0 + rr];
        out = accumulate ? out + v : v;
      }
    }
  }
}

// Launches kernel<T, NT> for the smallest NT in {1, 2, 4, 8} holding n tokens.
template <template <tensor_type, int> class K, tensor_type T>
struct by_tokens {
  static const void* pick(int nt) {
    switch (nt) {
      case 1: return K<T, 1>::get();
      case 2: return K<T, 2>::get();
      case 4: return K<T, 4>::get();
      default: return K<T, 8>::get();
    }
  }
};

template <tensor_type T, int NT>
struct q8_kernel {
  static const void* get() { return reinterpret_cast<const void*>(&matvec_q8_kernel<T, NT>); }
};
template <tensor_type T, int NT>
struct f_kernel {
  static const void* get() { return reinterpret_cast<const void*>(&matvec_f_kernel<T, NT>); }
};

const void* kernel_for(tensor_type t, int nt) {
  switch (t) {
    case tensor_type::q4_0: return by_tokens<q8_kernel, tensor_type::q4_0>::pick(nt);
    case tensor_type::q4_1: return by_tokens<q8_kernel, tensor_type::q4_1>::pick(nt);
    case tensor_type::q8_0: return by_tokens<q8_kernel, tensor_type::q8_0>::pick(nt);
    case tensor_type::f16: return by_tokens<f_kernel, tensor_type::f16>::pick(nt);
    case tensor_type::bf16: return by_tokens<f_kernel, tensor_type::bf16>::pick(nt);
    case tensor_type::f32: return by_tokens<f_kernel, tensor_type::f32>::pick(nt);
  }
  throw std::invalid_argument("matvec: unsupported tensor type");
}

}  // namespace

int multiprocessors() {
  static std::mutex mu;
  static std::array<int, 64> cached{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= static_cast<int>(cached.size())) return 132;
  if (cached[device] == 0) {
    check(cudaDeviceGetAttribute(&cached[device], cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  }
  return cached[device];
}

bool launch_matvec(const device_matrix& w, const float* x, int64_t ldx, const q8_rows* xq, int32_t n, float* y,
                   int64_t ldy, bool accumulate, const int32_t* offsets, int32_t groups, int64_t rows_per_group,
                   cudaStream_t s) {
  if (n <= 0) return true;
  const bool quantized = is_quantized(w.type);
  if (!offsets && n > matvec_max_tokens) return false;
  if (offsets && n > 65535) return false;  // one pair per grid row
  const int nt = offsets ? 1 : n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
  const size_t shared = quantized ? static_cast<size_t>(nt) * (w.cols / 32) * (q_stride + 8)
                                  : static_cast<size_t>(nt) * (w.cols / 8) * f_stride * 4;
  if (shared > static_cast<size_t>(max_shared_per_block())) return false;
  const void* kernel = kernel_for(w.type, nt);
  allow_shared(kernel, static_cast<int>(shared), "matvec");
  const int64_t rows = offsets ? rows_per_group : w.rows;
  // Enough blocks to fill the device twice, up to 8 warps (16 rows) a block.
  const int64_t pairs_of_rows = (rows + rows_per_warp - 1) / rows_per_warp;
  int warps = 8;
  while (warps > 2 && pairs_of_rows / warps < 2 * multiprocessors()) warps /= 2;
  const dim3 grid(static_cast<unsigned>((pairs_of_rows + warps - 1) / warps), offsets ? static_cast<unsigned>(n) : 1u);
  const int acc = accumulate ? 1 : 0;
  if (quantized) {
    q8_rows xr = *xq;
    void* args[] = {const_cast<device_matrix*>(&w), &xr, &n, &y, &ldy, const_cast<int*>(&acc), &offsets, &groups,
                    &rows_per_group};
    check(cudaLaunchKernel(kernel, grid, dim3(32 * warps), args, shared, s), "matvec");
  } else {
    void* args[] = {const_cast<device_matrix*>(&w), &x, &ldx, &n, &y, &ldy, const_cast<int*>(&acc), &offsets, &groups,
                    &rows_per_group};
    check(cudaLaunchKernel(kernel, grid, dim3(32 * warps), args, shared, s), "matvec");
  }
  return true;
}

}  // namespace tireless::cuda::detail
