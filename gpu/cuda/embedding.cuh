#pragma once
// The embedding gather: rows of a table in its GGUF type, dequantized (gpu/cuda/embedding.cu).
#include <cstdint>

#include "gpu/cuda/ops.hpp"

namespace tireless::cuda::detail {

// One block per output row; each thread dequantizes blocks of 32 columns (float types: single
// columns).
template <tensor_type T>
__global__ void embed_kernel(device_matrix table, const int32_t* ids, float* out);

}  // namespace tireless::cuda::detail
