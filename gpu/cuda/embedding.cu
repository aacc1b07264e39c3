#include "gpu/cuda/device.cuh"
#include "gpu/cuda/embedding.cuh"
#include "gpu/cuda/ops.hpp"
#include "gpu/cuda/quant.cuh"

#include <stdexcept>

namespace tireless::cuda {

namespace detail {

template <tensor_type T>
__global__ void embed_kernel(device_matrix table, const int32_t* ids, float* out) {
  const int64_t cols = table.cols;
  float* o = out + static_cast<int64_t>(blockIdx.x) * cols;
  const int32_t id = ids[blockIdx.x];
  if (id < 0 || id >= table.rows) {  // never read outside the table: a NaN row says the id was wrong
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = __int_as_float(0x7fc00000);
    return;
  }
  if constexpr (quantized_type<T>) {
    float v[32];
    for (int64_t b = threadIdx.x; b < cols / 32; b += blockDim.x) {
      dequantize_block<T>(table, id, b, v);
#pragma unroll
      for (int e = 0; e < 32; ++e) o[b * 32 + e] = v[e];
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = float_element<T>(table, id, c);
  }
}

}  // namespace detail

void embed_rows(const device_matrix& table, const int32_t* ids, int32_t rows, float* out, void* stream) {
  if (rows <= 0) return;
  if (table.cols <= 0 || (is_quantized(table.type) && table.cols % 32 != 0)) {
    throw std::invalid_argument("embed_rows: a quantized table's columns must be a positive multiple of 32");
  }
  const cudaStream_t s = detail::stream_of(stream);
  switch (table.type) {
    case tensor_type::q4_0: detail::embed_kernel<tensor_type::q4_0><<<rows, 128, 0, s>>>(table, ids, out); break;
    case tensor_type::q4_1: detail::embed_kernel<tensor_type::q4_1><<<rows, 128, 0, s>>>(table, ids, out); break;
    case tensor_type::q8_0: detail::embed_kernel<tensor_type::q8_0><<<rows, 128, 0, s>>>(table, ids, out); break;
    case tensor_type::f16: detail::embed_kernel<tensor_type::f16><<<rows, 128, 0, s>>>(table, ids, out); break;
    case tensor_type::bf16: detail::embed_kernel<tensor_type::bf16><<<rows, 128, 0, s>>>(table, ids, out); break;
    case tensor_type::f32: detail::embed_kernel<tensor_type::f32><<<rows, 128, 0, s>>>(table, ids, out); break;
    default: throw std::invalid_argument("embed_rows: unsupported tensor type");
  }
  detail::check_launch("embed_rows");
}

}  // namespace tireless::cuda
