#include "gpu/cuda/device.cuh"
#include "gpu/cuda/elementwise.cuh"
#include "gpu/cuda/ops.hpp"

#include <algorithm>
#include <stdexcept>

namespace tireless::cuda {

namespace detail {

__global__ void rms_norm_kernel(const float* x, const float* w, float* out, int32_t n, float eps) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  float* o = out + static_cast<int64_t>(blockIdx.x) * n;
  float sum = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) sum += row[i] * row[i];
  // Warp sums, then the warps' sums.
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __shared__ float warp_sums[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) warp_sums[0] = sum;
  }
  __syncthreads();
  const float scale = rsqrtf(warp_sums[0] / static_cast<float>(n) + eps);
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = row[i] * scale * w[i];
}

__global__ void silu_mul_kernel(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = g[i];
    out[i] = v / (1.0f + expf(-v)) * u[i];
  }
}

__global__ void rope_kernel(float* x, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims, const int32_t* pos,
                            float base) {
  const int32_t half = rope_dims / 2;
  const int64_t total = static_cast<int64_t>(rows) * heads * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(k % half);
    const int64_t rh = k / half;  // row * heads + head
    const int32_t r = static_cast<int32_t>(rh / heads);
    // As the CPU backend: the angle in double, its cosine and sine rounded to float.
    const double theta = pos[r] * pow(static_cast<double>(base), -2.0 * i / rope_dims);
    double sd, cd;
    sincos(theta, &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sd);
    float* v = x + rh * head_dim;
    const float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

}  // namespace detail

namespace {

int grid_for(int64_t n, int threads) { return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535)); }

}  // namespace

void rms_norm(const float* x, const float* w, float* out, int32_t rows, int32_t n, float eps, void* stream) {
  if (rows <= 0) return;
  if (n <= 0) throw std::invalid_argument("rms_norm: rows of 0 values");
  const int threads = n >= 1024 ? 1024 : ((n + 31) / 32) * 32;
  detail::rms_norm_kernel<<<rows, threads, 0, detail::stream_of(stream)>>>(x, w, out, n, eps);
  detail::check_launch("rms_norm");
}

void silu_mul(const float* g, const float* u, float* out, int64_t n, void* stream) {
  if (n <= 0) return;
  detail::silu_mul_kernel<<<grid_for(n, 256), 256, 0, detail::stream_of(stream)>>>(g, u, out, n);
  detail::check_launch("silu_mul");
}

void rope(float* x, int32_t rows, int32_t heads, int32_t head_dim, int32_t rope_dims, const int32_t* pos, float base,
          void* stream) {
  if (rope_dims < 0 || rope_dims % 2 != 0 || rope_dims > head_dim) {
    throw std::invalid_argument("rope: rope_dims must be even, at least 0 and at most head_dim");
  }
  if (rows <= 0 || heads <= 0 || rope_dims == 0) return;
  const int64_t total = static_cast<int64_t>(rows) * heads * (rope_dims / 2);
  detail::rope_kernel<<<grid_for(total, 256), 256, 0, detail::stream_of(stream)>>>(x, rows, heads, head_dim, rope_dims, pos,
                                                                                    base);
  detail::check_launch("rope");
}

}  // namespace tireless::cuda
