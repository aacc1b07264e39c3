#pragma once
// The products of decode: up to matvec_max_tokens tokens times a weight matrix, the weights read
// once for all of them (gpu/cuda/matvec.cu). A warp takes two rows; its lanes take the rows'
// 32-value blocks in turn, two blocks in flight, each block's quants one 16-byte load (q8_0:
// two); the tokens' activations are staged in shared memory. Quantized weights meet int8
// activations (dp4a), float weights f32 activations. Grouped (MoE): blockIdx.y is a pair, its
// expert found in the groups' offsets.
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda/ops.hpp"

namespace tireless::cuda::detail {

// Launches y (+)= W x for n <= matvec_max_tokens tokens (grouped: n pairs, one token each);
// false where the tokens' activations do not fit in shared memory (the caller then takes the
// matrix-matrix path).
bool launch_matvec(const device_matrix& w, const float* x, int64_t ldx, const q8_rows* xq, int32_t n, float* y,
                   int64_t ldy, bool accumulate, const int32_t* offsets, int32_t groups, int64_t rows_per_group,
                   cudaStream_t s);

// The device's multiprocessors (cached per device).
int multiprocessors();

}  // namespace tireless::cuda::detail
