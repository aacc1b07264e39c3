#pragma once
// The embedding gather: rows of a table in its GGUF type, dequantized (gpu/cuda/embedding.cu).
#include <cstdint>

#include "gpu/tensor_type.hpp"

namespace tireless::cuda::detail {

// One block per output row; each thread dequantizes blocks of 32 columns.
template <tensor_type T>
__global__ void embed_kernel(const uint8_t* table, int64_t n_rows, int64_t row_bytes, int64_t cols, const int32_t* ids,
                             float* out);

}  // namespace tireless::cuda::detail
