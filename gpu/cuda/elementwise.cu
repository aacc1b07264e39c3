#include "gpu/cuda/device.cuh"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/ops.hpp"

#include <algorithm>
#include <stdexcept>

namespace tireless::cuda {

namespace detail {
namespace {

// One warp per (row, block of 32 values): warps_total = rows * blocks.
__global__ void quantize_q8_kernel(const float* x, int64_t ldx, int32_t rows, int64_t blocks, const int32_t* row_of,
                                   int8_t* q, float* d, float* s) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= rows * blocks) return;  // whole warps leave together
  const int64_t r = warp / blocks, b = warp % blocks;
  const int64_t src = row_of ? row_of[r] : r;
  const float v = x[src * ldx + b * 32 + threadIdx.x % 32];
  quantize_block_warp(v, q + (r * blocks + b) * 32, d + r * blocks + b, s + r * blocks + b);
}

// One block per row; blockDim.x a multiple of 32, at most 1024. With q (n a multiple of 32),
// each warp takes blocks of 32 values in turn and also quantizes them.
__global__ void rms_norm_kernel(const float* x, const float* w, float* out, int32_t n, float eps, const int32_t* row_of,
                                int8_t* q, float* qd, float* qs) {
  const int64_t src = row_of ? row_of[blockIdx.x] : blockIdx.x;
  const float* row = x + src * n;
  float* o = out + static_cast<int64_t>(blockIdx.x) * n;
  float sum = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(row[i], row[i], sum);
  sum = warp_sum(sum);
  __shared__ float warp_sums[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < warps ? warp_sums[lane] : 0.0f;
    sum = warp_sum(sum);
    if (lane == 0) warp_sums[0] = sum;
  }
  __syncthreads();
  // As the CPU: 1 / sqrt(mean + eps), then x · scale · w, each rounded.
  const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(warp_sums[0], static_cast<float>(n)), eps)));
  if (!q) {
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(row[i], scale), w[i]);
    return;
  }
  const int64_t blocks = n / 32;
  for (int64_t b = warp; b < blocks; b += warps) {
    const int64_t i = b * 32 + lane;
    const float v = __fmul_rn(__fmul_rn(row[i], scale), w[i]);
    o[i] = v;
    const int64_t at = static_cast<int64_t>(blockIdx.x) * blocks + b;
    quantize_block_warp(v, q + at * 32, qd + at, qs + at);
  }
}

// One warp per (row, block of 32 values).
__global__ void silu_mul_q8_kernel(const float* g, const float* u, int64_t ld, int32_t rows, int64_t n, float* out,
                                   int8_t* q, float* qd, float* qs) {
  const int64_t blocks = n / 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= rows * blocks) return;
  const int64_t r = warp / blocks, b = warp % blocks, c = b * 32 + threadIdx.x % 32;
  const float v = silu_times(g[r * ld + c], u[r * ld + c]);
  out[r * n + c] = v;
  if (q) quantize_block_warp(v, q + (r * blocks + b) * 32, qd + r * blocks + b, qs + r * blocks + b);
}

__global__ void silu_mul_kernel(const float* g, const float* u, int64_t ld, int32_t rows, int64_t n, float* out) {
  const int64_t total = rows * n;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / n, c = k % n;
    out[k] = silu_times(g[r * ld + c], u[r * ld + c]);
  }
}

// One thread per (row, head, pair).
__global__ void rope_kernel(float* x, int64_t ld, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims,
                            const int32_t* pos, float base) {
  const int32_t half = rope_dims / 2;
  const int64_t total = static_cast<int64_t>(rows) * heads * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(k % half);
    const int64_t rh = k / half;
    const int64_t r = rh / heads, h = rh % heads;
    float c, s;
    rope_angle(pos[r], i, rope_dims, base, &c, &s);
    rope_turn(x + r * ld + h * head_dim + 2 * i, c, s);
  }
}

int grid_for(int64_t n, int threads) { return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535)); }
unsigned grid_for_warps(int64_t warps, int threads) { return static_cast<unsigned>((warps * 32 + threads - 1) / threads); }

void check_q8(const q8_rows& q, int64_t cols, const char* what) {
  if (cols % 32 != 0) throw std::invalid_argument(std::string(what) + ": quantized rows need a multiple of 32 values");
  if (q.blocks != cols / 32) throw std::invalid_argument(std::string(what) + ": the quantized rows' blocks do not match the width");
}

}  // namespace
}  // namespace detail

void quantize_q8(const float* x, int64_t ldx, int32_t rows, int64_t cols, const int32_t* row_of, const q8_rows& out,
                 void* stream) {
  if (rows <= 0) return;
  detail::check_q8(out, cols, "quantize_q8");
  const int64_t warps = rows * out.blocks;
  detail::quantize_q8_kernel<<<detail::grid_for_warps(warps, 256), 256, 0, detail::stream_of(stream)>>>(
      x, ldx, rows, out.blocks, row_of, out.q, out.d, out.s);
  detail::check_launch("quantize_q8");
}

void rms_norm(const float* x, const float* w, float* out, int32_t rows, int32_t n, float eps, void* stream, const q8_rows* q8,
              const int32_t* row_of) {
  if (rows <= 0) return;
  if (n <= 0) throw std::invalid_argument("rms_norm: rows of 0 values");
  if (q8) detail::check_q8(*q8, n, "rms_norm");
  const int threads = n >= 1024 ? 1024 : ((n + 31) / 32) * 32;
  detail::rms_norm_kernel<<<rows, threads, 0, detail::stream_of(stream)>>>(
      x, w, out, n, eps, row_of, q8 ? q8->q : nullptr, q8 ? q8->d : nullptr, q8 ? q8->s : nullptr);
  detail::check_launch("rms_norm");
}

void silu_mul(const float* g, const float* u, int64_t ld, int32_t rows, int64_t n, float* out, const q8_rows* q8,
              void* stream) {
  if (rows <= 0 || n <= 0) return;
  const cudaStream_t s = detail::stream_of(stream);
  if (q8) {
    detail::check_q8(*q8, n, "silu_mul");
    detail::silu_mul_q8_kernel<<<detail::grid_for_warps(rows * (n / 32), 256), 256, 0, s>>>(g, u, ld, rows, n, out, q8->q,
                                                                                           q8->d, q8->s);
  } else {
    detail::silu_mul_kernel<<<detail::grid_for(rows * n, 256), 256, 0, s>>>(g, u, ld, rows, n, out);
  }
  detail::check_launch("silu_mul");
}

void rope(float* x, int64_t ld, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims, const int32_t* pos,
          float base, void* stream) {
  if (rope_dims < 0 || rope_dims % 2 != 0 || rope_dims > head_dim) {
    throw std::invalid_argument("rope: rope_dims must be even, at least 0 and at most head_dim");
  }
  if (rows <= 0 || heads <= 0 || rope_dims == 0) return;
  const int64_t total = static_cast<int64_t>(rows) * heads * (rope_dims / 2);
  detail::rope_kernel<<<detail::grid_for(total, 256), 256, 0, detail::stream_of(stream)>>>(x, ld, rows, heads, head_dim,
                                                                                           rope_dims, pos, base);
  detail::check_launch("rope");
}

}  // namespace tireless::cuda
