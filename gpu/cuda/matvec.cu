#include "gpu/cuda/device.cuh"
#include "gpu/cuda/matvec.cuh"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/quant.cuh"

#include <stdexcept>
#include <string>

namespace tireless::cuda {

namespace detail {

template <tensor_type T>
__global__ void matvec_kernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const float* x, float* y) {
  // x staged with one float of padding per 32: lane l reads xs[b * 33 + e] with b = l + 32k,
  // bank (b + e) % 32, so the 32 lanes of a warp hit 32 different banks.
  extern __shared__ float xs[];
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xs[i + i / 32] = x[i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * matvec_rows_per_block + warp;
  if (r >= rows) return;
  const uint8_t* row = w + r * row_bytes;
  float sum = 0.0f, v[32];
  for (int64_t b = lane; b < cols / 32; b += 32) {
    load_block<T>(row, b, v);
#pragma unroll
    for (int e = 0; e < 32; ++e) sum += v[e] * xs[b * 33 + e];
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) y[r] = sum;
}

}  // namespace detail

void matvec(tensor_type type, const void* w, int64_t rows, int64_t cols, const float* x, float* y, void* stream) {
  if (rows <= 0) return;
  if (cols <= 0 || cols % 32 != 0) throw std::invalid_argument("matvec: the columns must be a positive multiple of 32");
  // The device's limit for one block's shared memory (opted in above 48 KiB; 227 KiB on an H200).
  static const int max_shared = [] {
    int device = 0, bytes = 48 * 1024;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    return bytes;
  }();
  const auto* m = static_cast<const uint8_t*>(w);
  const int64_t rb = detail::row_bytes_of(type, cols);
  const auto blocks = static_cast<unsigned>((rows + detail::matvec_rows_per_block - 1) / detail::matvec_rows_per_block);
  const int threads = 32 * detail::matvec_rows_per_block;
  const size_t shared = static_cast<size_t>(cols + cols / 32) * sizeof(float);
  if (shared > static_cast<size_t>(max_shared)) {
    throw std::invalid_argument("matvec: " + std::to_string(cols) + " columns need " + std::to_string(shared) +
                                " bytes of shared memory, more than this device's " + std::to_string(max_shared));
  }
  const cudaStream_t s = detail::stream_of(stream);
  auto launch = [&](auto kernel) {
    if (shared > 48 * 1024) {  // cheap: an attribute of the function, set again only when asked more
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
    default: throw std::invalid_argument("matvec: unsupported tensor type");
  }
  detail::check_launch("matvec");
}

}  // namespace tireless::cuda
