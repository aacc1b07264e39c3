#include "gpu/cuda/device.cuh"
#include "gpu/cuda/matvec.cuh"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/quant.cuh"

#include <stdexcept>

namespace tireless::cuda {

namespace detail {

template <tensor_type T>
__global__ void matvec_kernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const float* x, float* y) {
  extern __shared__ float xs[];
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = x[i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * matvec_rows_per_block + warp;
  if (r >= rows) return;
  const uint8_t* row = w + r * row_bytes;
  float sum = 0.0f, v[32];
  for (int64_t b = lane; b < cols / 32; b += 32) {
    load_block<T>(row, b, v);
#pragma unroll
    for (int e = 0; e < 32; ++e) sum += v[e] * xs[b * 32 + e];
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) y[r] = sum;
}

}  // namespace detail

void matvec(tensor_type type, const void* w, int64_t rows, int64_t cols, const float* x, float* y, void* stream) {
  if (rows <= 0) return;
  if (cols <= 0 || cols % 32 != 0) throw std::invalid_argument("matvec: the columns must be a positive multiple of 32");
  if (cols * 4 > 96 * 1024) throw std::invalid_argument("matvec: more than 24,576 columns do not fit in shared memory");
  const auto* m = static_cast<const uint8_t*>(w);
  const int64_t rb = detail::row_bytes_of(type, cols);
  const auto blocks = static_cast<unsigned>((rows + detail::matvec_rows_per_block - 1) / detail::matvec_rows_per_block);
  const int threads = 32 * detail::matvec_rows_per_block;
  const size_t shared = static_cast<size_t>(cols) * sizeof(float);
  const cudaStream_t s = detail::stream_of(stream);
  auto launch = [&](auto kernel) {
    if (shared > 48 * 1024) {
      detail::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
                    "matvec: shared memory");
    }
    kernel<<<blocks, threads, shared, s>>>(m, rb, rows, cols, x, y);
  };
  switch (type) {
    case tensor_type::q4_0: launch(detail::matvec_kernel<tensor_type::q4_0>); break;
    case tensor_type::q4_1: launch(detail::matvec_kernel<tensor_type::q4_1>); break;
    case tensor_type::q8_0: launch(detail::matvec_kernel<tensor_type::q8_0>); break;
    case tensor_type::f16: launch(detail::matvec_kernel<tensor_type::f16>); break;
    case tensor_type::bf16: launch(detail::matvec_kernel<tensor_type::bf16>); break;
    case tensor_type::f32: launch(detail::matvec_kernel<tensor_type::f32>); break;
  }
  detail::check_launch("matvec");
}

}  // namespace tireless::cuda
