#pragma once
// The matrix-vector product of decode, weights in their GGUF type (gpu/cuda/matvec.cu).
#include <cstdint>

#include "gpu/tensor_type.hpp"

namespace tireless::cuda::detail {

inline constexpr int matvec_rows_per_block = 4;  // a warp a row

// y[r] = row r · x; warp w of block b takes row b * matvec_rows_per_block + w, its lanes the
// row's 32-column blocks in turn; x is staged in shared memory (cols floats).
template <tensor_type T>
__global__ void matvec_kernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const float* x, float* y);

}  // namespace tireless::cuda::detail
