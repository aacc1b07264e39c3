#include "gpu/cuda/device.cuh"
#include "gpu/cuda/embedding.cuh"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/quant.cuh"

#include <stdexcept>

namespace tireless::cuda {

namespace detail {

template <tensor_type T>
__global__ void embed_kernel(const uint8_t* table, int64_t row_bytes, int64_t cols, const int32_t* ids, float* out) {
  const uint8_t* row = table + static_cast<int64_t>(ids[blockIdx.x]) * row_bytes;
  float* o = out + static_cast<int64_t>(blockIdx.x) * cols;
  float v[32];
  for (int64_t b = threadIdx.x; b < cols / 32; b += blockDim.x) {
    load_block<T>(row, b, v);
#pragma unroll
    for (int e = 0; e < 32; ++e) o[b * 32 + e] = v[e];
  }
}

}  // namespace detail

void embed_rows(tensor_type type, const void* table, int64_t cols, const int32_t* ids, int32_t rows, float* out, void* stream) {
  if (rows <= 0) return;
  if (cols <= 0 || cols % 32 != 0) throw std::invalid_argument("embed_rows: the columns must be a positive multiple of 32");
  const auto* t = static_cast<const uint8_t*>(table);
  const int64_t rb = detail::row_bytes_of(type, cols);
  const cudaStream_t s = detail::stream_of(stream);
  switch (type) {
    case tensor_type::q4_0: detail::embed_kernel<tensor_type::q4_0><<<rows, 128, 0, s>>>(t, rb, cols, ids, out); break;
    case tensor_type::q4_1: detail::embed_kernel<tensor_type::q4_1><<<rows, 128, 0, s>>>(t, rb, cols, ids, out); break;
    case tensor_type::q8_0: detail::embed_kernel<tensor_type::q8_0><<<rows, 128, 0, s>>>(t, rb, cols, ids, out); break;
    case tensor_type::f16: detail::embed_kernel<tensor_type::f16><<<rows, 128, 0, s>>>(t, rb, cols, ids, out); break;
    case tensor_type::bf16: detail::embed_kernel<tensor_type::bf16><<<rows, 128, 0, s>>>(t, rb, cols, ids, out); break;
    case tensor_type::f32: detail::embed_kernel<tensor_type::f32><<<rows, 128, 0, s>>>(t, rb, cols, ids, out); break;
  }
  detail::check_launch("embed_rows");
}

}  // namespace tireless::cuda
