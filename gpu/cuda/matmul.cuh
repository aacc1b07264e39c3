#pragma once
// Which product runs (gpu/cuda/matmul.cu): the decode matvec up to matvec_max_tokens tokens, the
// int8 tensor-core product (mmq) for quantized weights beyond, cuBLAS for float weights beyond
// (f16/bf16: the activations converted to the weights' type first, f32 accumulation; f32: SGEMM).
#include <cstdint>

namespace tireless::cuda::detail {

// dst[r][c] = src[r * lds + c] rounded to fp16 (to_bf16: bfloat16), rows x cols.
__global__ void to_halves_kernel(const float* src, int64_t lds, int64_t rows, int64_t cols, uint16_t* dst, int to_bf16);

}  // namespace tireless::cuda::detail
