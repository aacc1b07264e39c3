#include "gpu/cuda/device.cuh"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/sampling.cuh"

namespace tireless::cuda {

namespace detail {

namespace {

// (v, i) beats (bv, bi): larger, or as large with a lower index.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

}  // namespace

__global__ void argmax_kernel(const float* logits, int32_t n, int32_t* out) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * n;
  float best = -INFINITY;
  int at = 0x7fffffff;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = row[i];
    if (beats(v, i, best, at)) best = v, at = i;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, off);
    const int i = __shfl_xor_sync(0xffffffffu, at, off);
    if (beats(v, i, best, at)) best = v, at = i;
  }
  __shared__ float values[32];
  __shared__ int index[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) values[warp] = best, index[warp] = at;
  __syncthreads();
  if (warp == 0) {
    best = lane < static_cast<int>(blockDim.x / 32) ? values[lane] : -INFINITY;
    at = lane < static_cast<int>(blockDim.x / 32) ? index[lane] : 0x7fffffff;
    for (int off = 16; off > 0; off >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, off);
      const int i = __shfl_xor_sync(0xffffffffu, at, off);
      if (beats(v, i, best, at)) best = v, at = i;
    }
    // Every logit NaN or -inf: token 0, as the CPU's scan from 0 keeps it.
    if (lane == 0) out[blockIdx.x] = at == 0x7fffffff ? 0 : at;
  }
}

}  // namespace detail

void argmax_rows(const float* logits, int32_t rows, int32_t n, int32_t* out, void* stream) {
  if (rows <= 0) return;
  if (n <= 0) throw std::invalid_argument("argmax_rows: rows of 0 logits");
  detail::argmax_kernel<<<rows, 1024, 0, detail::stream_of(stream)>>>(logits, n, out);
  detail::check_launch("argmax_rows");
}

}  // namespace tireless::cuda
