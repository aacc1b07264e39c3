#include "gpu/cuda/device.cuh"
#include "gpu/cuda/matvec.cuh"
#include "gpu/cuda/quant.cuh"
#include "gpu/cuda/shapes.hpp"

#include <array>
#include <mutex>
#include <stdexcept>
#include <string>

namespace tireless::cuda::detail {

namespace {

constexpr int q_stride = matvec_q_stride;  // bytes of a staged 32-value block of int8 (16 of padding)
constexpr int f_stride = matvec_f_stride;  // floats of a staged 8-value chunk of f32 (4 of padding)

// A 16-lane-phase read of 16 bytes at a 48-byte (or 12-float) stride touches 8 distinct
// 4-bank groups: the staged activations are read without bank conflicts.

// Rows a warp takes: 2 up to 2 tokens; 4 beyond, so that an activation read from shared
// memory serves 4 rows (at 8 tokens and 2 rows, a warp would read ~8 bytes of shared memory
// per byte of weights: more than shared memory delivers while HBM streams the weights).
template <int NT>
constexpr int warp_rows() {
  return matvec_warp_rows(NT);
}

// Blocks per lane and row loaded before the first is used: two, but one where 4 rows' quants
// of two blocks and 8 tokens' sums would not fit in 128 registers (q8_0's 32-byte blocks at 4
// rows; 8 tokens).
template <tensor_type T, int NT>
constexpr int blocks_in_flight() {
  return warp_rows<NT>() == 4 && (T == tensor_type::q8_0 || NT == 8) ? 1 : 2;
}

// Activations are staged a chunk at a time: 512 / NT quant blocks (or 8-value chunks) of every
// token, at most ~28 KiB of shared memory whatever the token count, so that several blocks of
// up to 8 warps share a multiprocessor. Batch 1 stages up to 16,384 values at once: every matrix
// of an 8B model in one chunk. A multiple of 32 x blocks_in_flight: lanes step through a chunk
// in whole strides.
template <int NT>
constexpr int chunk_of() {
  return matvec_chunk(NT);
}
static_assert(chunk_of<8>() % 64 == 0, "a chunk is whole strides of 32 lanes x 2 blocks");

// The pair's group: the last g with offsets[g] <= p (offsets has groups + 1 entries).
__device__ __forceinline__ int group_of(const int32_t* offsets, int32_t groups, int32_t p) {
  int lo = 0, hi = groups;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= p) lo = mid; else hi = mid;
  }
  return lo;
}

// What a block computes: rows [row_base, row_base + row_limit) of the matrix (the first rows of
// those, by blockIdx.x), for tokens [tok0, tok_end) (at most NT of them).
struct target {
  int64_t tok0 = 0, tok_end = 0, row_base = 0, row_limit = 0;
};

// Dense: blockIdx.y = 0, the n tokens. Grouped (offsets): blockIdx.y counts the tiles of up to
// NT pairs of every group in turn (a group's pairs share its rows, read once per tile); false
// for the blocks past the last tile (the grid is sized for the worst spread of pairs).
template <int NT>
__device__ __forceinline__ bool find_target(const device_matrix& w, int32_t n, const int32_t* offsets, int32_t groups,
                                            int64_t rows_per_group, target& t) {
  if (!offsets) {
    t.row_limit = w.rows;
    t.tok_end = n;
    return true;
  }
  t.row_limit = rows_per_group;
  if (NT == 1) {  // a pair a tile: its group by bisection
    t.tok0 = blockIdx.y;
    if (t.tok0 >= n) return false;
    t.tok_end = t.tok0 + 1;
    t.row_base = static_cast<int64_t>(group_of(offsets, groups, static_cast<int32_t>(t.tok0))) * rows_per_group;
    return true;
  }
  int64_t left = blockIdx.y;
  for (int32_t g = 0; g < groups; ++g) {
    const int64_t first = offsets[g], count = offsets[g + 1] - first;
    const int64_t tiles = (count + NT - 1) / NT;
    if (left < tiles) {
      t.row_base = static_cast<int64_t>(g) * rows_per_group;
      t.tok0 = first + left * NT;
      t.tok_end = min(t.tok0 + NT, first + count);
      return true;
    }
    left -= tiles;
  }
  return false;
}

// y[t][r] (+)= v for lane 0 of the warp, the rows and tokens that exist.
template <int R, int NT>
__device__ __forceinline__ void write_rows(float (&acc)[R][NT], const target& tg, int64_t r0, bool working, float* y,
                                           int64_t ldy, int accumulate) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(acc[rr][t]);
      if (lane == 0 && working && r0 + rr < tg.row_limit && tg.tok0 + t < tg.tok_end) {
        float& out = y[(tg.tok0 + t) * ldy + r0 + rr];
        out = accumulate ? out + v : v;
      }
    }
  }
}

// Quantized weights times int8 activations. A warp takes R rows, its lanes the rows' blocks in
// turn (BF in flight). Shared memory, per chunk of cb = min(chunk_of<NT>(), blocks) blocks:
// [NT][cb] staged blocks of q_stride bytes, then d [NT][cb] and s [NT][cb] floats. The first
// weights of each chunk are loaded before its activations are staged, so the loads are in
// flight across the barrier.
// From 4 tokens on, at most 128 registers: two blocks of 8 warps a multiprocessor.
template <tensor_type T, int NT>
__global__ void __launch_bounds__(256, NT >= 4 ? 2 : 1)
    matvec_q8_kernel(device_matrix w, q8_rows x, int32_t n, float* y, int64_t ldy, int accumulate,
                     const int32_t* offsets, int32_t groups, int64_t rows_per_group) {
  constexpr int R = warp_rows<NT>(), BF = blocks_in_flight<T, NT>(), CB = chunk_of<NT>();
  constexpr int qb = block_qs_bytes<T>(), parts = qb / 16;
  extern __shared__ __align__(16) uint8_t smem[];
  target tg;
  if (!find_target<NT>(w, n, offsets, groups, rows_per_group, tg)) return;  // the whole block
  const int64_t nb = w.cols / 32;
  const int cb = static_cast<int>(min(static_cast<int64_t>(CB), nb));
  uint8_t* xq = smem;
  float* xd = reinterpret_cast<float*>(smem + NT * cb * q_stride);
  float* xs = xd + NT * cb;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * warps + warp) * R;
  // A warp past the last row loads nothing but still stages and meets every barrier.
  const bool working = r0 < tg.row_limit;
  int64_t rows[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) rows[rr] = tg.row_base + min(r0 + rr, tg.row_limit - 1);  // tails re-read the last
  const auto* dq = static_cast<const unsigned short*>(w.d);
  const auto* mq = static_cast<const unsigned short*>(w.m);
  float acc[R][NT];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[rr][t] = 0.0f;
  }
  uint4 wq[BF][R][parts];
  float wd[BF][R], wm[BF][R];
  // The weights of blocks b0, b0 + 32, ... (BF of them) below `end`, into registers.
  const auto load = [&](int64_t b0, int64_t end) {
#pragma unroll
    for (int k = 0; k < BF; ++k) {
      const int64_t b = b0 + 32 * k;
      if (b >= end) continue;
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const auto* q = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.qs) + rows[rr] * w.qs_row_bytes + b * qb);
#pragma unroll
        for (int c = 0; c < parts; ++c) wq[k][rr][c] = __ldg(q + c);
        wd[k][rr] = half_bits_to_float(__ldg(dq + rows[rr] * nb + b));
        wm[k][rr] = T == tensor_type::q4_1 ? half_bits_to_float(__ldg(mq + rows[rr] * nb + b)) : 0.0f;
      }
    }
  };

  for (int64_t c0 = 0; c0 < nb; c0 += CB) {
    const int64_t c1 = min(c0 + CB, nb);
    const int len = static_cast<int>(c1 - c0);
    if (working) load(c0 + lane, c1);
    if (c0 > 0) __syncthreads();  // every warp is done with the previous chunk
    for (int i = threadIdx.x; i < NT * len * 2; i += blockDim.x) {
      const int t = i / (len * 2), j = (i / 2) % len, part = i % 2;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (tg.tok0 + t < tg.tok_end) v = *reinterpret_cast<const uint4*>(x.q + ((tg.tok0 + t) * nb + c0 + j) * 32 + part * 16);
      *reinterpret_cast<uint4*>(xq + (t * cb + j) * q_stride + part * 16) = v;
    }
    for (int i = threadIdx.x; i < NT * len; i += blockDim.x) {
      const int t = i / len, j = i % len;
      const bool valid = tg.tok0 + t < tg.tok_end;
      xd[t * cb + j] = valid ? x.d[(tg.tok0 + t) * nb + c0 + j] : 0.0f;
      xs[t * cb + j] = valid ? x.s[(tg.tok0 + t) * nb + c0 + j] : 0.0f;
    }
    __syncthreads();
    if (!working) continue;
    for (int64_t b0 = c0 + lane; b0 < c1; b0 += 32 * BF) {
      if (b0 != c0 + lane) load(b0, c1);  // the chunk's first were loaded before the barrier
#pragma unroll
      for (int k = 0; k < BF; ++k) {
        const int64_t b = b0 + 32 * k;
        if (b >= c1) continue;
        const int j = static_cast<int>(b - c0);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const int4* xv = reinterpret_cast<const int4*>(xq + (t * cb + j) * q_stride);
          const int4 lo = xv[0], hi = xv[1];
          const int xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          const float dx = xd[t * cb + j];
#pragma unroll
          for (int rr = 0; rr < R; ++rr) {
            int isum;
            if constexpr (T == tensor_type::q8_0) {
              isum = dot_q8(wq[k][rr][0], wq[k][rr][parts - 1], xw);
            } else {
              isum = dot_q4<T>(wq[k][rr][0], xw);
            }
            // As the CPU: acc += isum · (d_w · d_x), then (q4_1) acc += m_w · s_x.
            acc[rr][t] = fmaf(static_cast<float>(isum), __fmul_rn(wd[k][rr], dx), acc[rr][t]);
            if constexpr (T == tensor_type::q4_1) acc[rr][t] = fmaf(wm[k][rr], xs[t * cb + j], acc[rr][t]);
          }
        }
      }
    }
  }
  write_rows<R, NT>(acc, tg, r0, working, y, ldy, accumulate);
}

// Float weights (cols a multiple of 8) times f32 activations: lanes take 8-value chunks, R rows
// a warp. Shared memory, per chunk of cc = min(chunk_of<NT>(), cols / 8) chunks: [NT][cc]
// chunks of f_stride floats. As above, each chunk's first weights are loaded before its
// activations are staged.
template <tensor_type T, int NT>
__global__ void __launch_bounds__(256, NT >= 4 ? 2 : 1)
    matvec_f_kernel(device_matrix w, const float* x, int64_t ldx, int32_t n, float* y, int64_t ldy, int accumulate,
                    const int32_t* offsets, int32_t groups, int64_t rows_per_group) {
  constexpr int R = warp_rows<NT>(), CC = chunk_of<NT>();
  constexpr int words = T == tensor_type::f32 ? 2 : 1;  // 16-byte loads per 8 values
  extern __shared__ __align__(16) uint8_t smem[];
  target tg;
  if (!find_target<NT>(w, n, offsets, groups, rows_per_group, tg)) return;
  const int64_t nc = w.cols / 8;
  const int cc = static_cast<int>(min(static_cast<int64_t>(CC), nc));
  float* xf = reinterpret_cast<float*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * warps + warp) * R;
  const bool working = r0 < tg.row_limit;
  const uint4* rows[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int64_t r = tg.row_base + min(r0 + rr, tg.row_limit - 1);
    rows[rr] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.qs) + r * w.qs_row_bytes);
  }
  float acc[R][NT];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[rr][t] = 0.0f;
  }
  uint4 raw[R][words];
  const auto load = [&](int64_t c) {
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
#pragma unroll
      for (int k = 0; k < words; ++k) raw[rr][k] = __ldg(rows[rr] + words * c + k);
    }
  };

  for (int64_t c0 = 0; c0 < nc; c0 += CC) {
    const int64_t c1 = min(c0 + CC, nc);
    const int len = static_cast<int>(c1 - c0);
    if (working && c0 + lane < c1) load(c0 + lane);
    if (c0 > 0) __syncthreads();
    for (int i = threadIdx.x; i < NT * len * 8; i += blockDim.x) {
      const int t = i / (len * 8), e = i % (len * 8);
      xf[(t * cc + e / 8) * f_stride + e % 8] = tg.tok0 + t < tg.tok_end ? x[(tg.tok0 + t) * ldx + c0 * 8 + e] : 0.0f;
    }
    __syncthreads();
    if (!working) continue;
    for (int64_t c = c0 + lane; c < c1; c += 32) {
      if (c != c0 + lane) load(c);
      float wv[R][8];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        if constexpr (T == tensor_type::f32) {
          const uint32_t u[8] = {raw[rr][0].x, raw[rr][0].y, raw[rr][0].z, raw[rr][0].w,
                                 raw[rr][words - 1].x, raw[rr][words - 1].y, raw[rr][words - 1].z, raw[rr][words - 1].w};
#pragma unroll
          for (int e = 0; e < 8; ++e) wv[rr][e] = __uint_as_float(u[e]);
        } else {
          const uint32_t u[4] = {raw[rr][0].x, raw[rr][0].y, raw[rr][0].z, raw[rr][0].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const auto lo = static_cast<uint16_t>(u[e] & 0xFFFFu), hi = static_cast<uint16_t>(u[e] >> 16);
            wv[rr][2 * e] = T == tensor_type::f16 ? half_bits_to_float(lo) : bf16_bits_to_float(lo);
            wv[rr][2 * e + 1] = T == tensor_type::f16 ? half_bits_to_float(hi) : bf16_bits_to_float(hi);
          }
        }
      }
      const int j = static_cast<int>(c - c0);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xv = reinterpret_cast<const float4*>(xf + (t * cc + j) * f_stride);
        const float4 a = xv[0], b = xv[1];
        const float xe[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[rr][t] = fmaf(wv[rr][e], xe[e], acc[rr][t]);
        }
      }
    }
  }
  write_rows<R, NT>(acc, tg, r0, working, y, ldy, accumulate);
}

// Launches kernel<T, NT> for NT in {1, 2, 4, 8}.
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
  const matvec_launch l =
      plan_matvec(quantized, offsets ? rows_per_group : w.rows, w.cols, n, offsets ? groups : 0, multiprocessors());
  if (l.blocks_y > 65535) return false;
  if (l.shared > max_shared_per_block()) return false;
  const void* kernel = kernel_for(w.type, l.nt);
  allow_shared(kernel, static_cast<int>(l.shared), "matvec");
  const dim3 grid(static_cast<unsigned>(l.blocks_x), static_cast<unsigned>(l.blocks_y));
  const int acc = accumulate ? 1 : 0;
  if (quantized) {
    q8_rows xr = *xq;
    void* args[] = {const_cast<device_matrix*>(&w), &xr, &n, &y, &ldy, const_cast<int*>(&acc), &offsets, &groups,
                    &rows_per_group};
    check(cudaLaunchKernel(kernel, grid, dim3(32 * l.warps), args, static_cast<size_t>(l.shared), s), "matvec");
  } else {
    void* args[] = {const_cast<device_matrix*>(&w), &x, &ldx, &n, &y, &ldy, const_cast<int*>(&acc), &offsets, &groups,
                    &rows_per_group};
    check(cudaLaunchKernel(kernel, grid, dim3(32 * l.warps), args, static_cast<size_t>(l.shared), s), "matvec");
  }
  return true;
}

}  // namespace tireless::cuda::detail
